"""The self-contained HTML report of a score folder (report.html): inline CSS and SVG, thumbnails
as data: URIs, no network. Per score column: the histogram with the thresholds, the kept share as
a function of the threshold, and thumbnails with captions just above and just below each
threshold; then the dropped rows per reason with examples.

Axes carry round values (nice_ticks) and the histogram's y axis counts rows; each example's card
says what became of its row and by which rule ("dropped: clip_score < 0.21"); whole-number columns
without a threshold (frame counts) get one line, not a section. A small script marks the page once
every image has loaded (SCRIPT), which the browser test reads back with chromium --dump-dom."""
from __future__ import annotations

import html
import math
import os
from typing import Dict, List, Optional, Tuple

from ..shards import shown_url

W, H = 640, 190  # chart size in SVG units
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 20, 30  # margins: the y labels, the x labels, the axis titles

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg { background: #fafafa; border: 1px solid #e4e4e4; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; margin: 6px 0 14px; }
.card { width: 170px; border: 1px solid #ddd; border-radius: 4px; padding: 4px; font-size: 12px; }
.card.kept { border-color: #3a8; } .card.dropped { border-color: #d55; }
.card img { display: block; max-width: 160px; max-height: 160px; margin: 0 auto 4px; }
.verdict { color: #555; } .dropped .verdict { color: #b33; }
.cap { color: #333; max-height: 6em; overflow: hidden; } .meta { color: #777; word-break: break-all; }
.note { color: #a60; } .counts { color: #444; }
"""

# Once every image has loaded: body data-images ("ok N" or "broken N of M": the thumbnails the
# browser decoded) and data-overlaps (how many pairs of texts in one chart overlap: axis labels,
# titles, threshold labels), which the browser test reads back with chromium --dump-dom.
SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images', ok === imgs.length ? 'ok ' + ok : 'broken ' + ok + ' of ' + imgs.length);
  var overlaps = [];
  Array.prototype.forEach.call(document.querySelectorAll('svg'), function (svg) {
    var boxes = Array.prototype.map.call(svg.querySelectorAll('text'), function (t) {
      return [t.getBoundingClientRect(), t.textContent];
    });
    for (var i = 0; i < boxes.length; i++) for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i][0], b = boxes[j][0];
      if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
        overlaps.push(boxes[i][1] + ' / ' + boxes[j][1]);
    }
  });
  document.body.setAttribute('data-overlaps', overlaps.length + (overlaps.length ? ': ' + overlaps.join('; ') : ''));
});
"""

# Bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE, isolates, marks) in a key, a caption or a
# file name would reorder the text after them, the shard's name included: shown escaped (\u202e).
BIDI = dict.fromkeys([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
BIDI = {c: f"\\u{c:04x}" for c in BIDI}


def _e(text, limit: int = 4000) -> str:
    """Text as HTML, bidi controls escaped, cut to `limit` characters (a key or a message may be
    as long as a file holds: the report stays a few KB per example)."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        text = text[:limit] + f" ... ({len(text)} characters)"
    return html.escape(text.translate(BIDI))


def _x(v: float, lo: float, hi: float) -> float:
    from .statistics import position
    return LEFT + (W - LEFT - RIGHT) * (position(min(max(v, lo), hi), lo, hi) if hi > lo else 0.5)


def _y(share: float) -> float:
    """The height of `share` (0 at the x axis, 1 at the top of the plot)."""
    return (H - BOTTOM) - (H - BOTTOM - TOP) * share


NICE = (1, 2, 2.5, 5, 10)


def nice_ticks(lo: float, hi: float, most: int = 6, integer: bool = False) -> List[Tuple[float, str]]:
    """(value, label) of at most `most` round values from lo to hi: multiples of a step that is
    1, 2, 2.5 or 5 times a power of ten (0.1, 0.25, 0.5, 2, 500, ...), labelled with the digits
    the step needs; integer: steps of 1 or more, without 2.5. A range too narrow to divide (a
    column of one value) gets its one value; one whose width overflows, 5 steps labelled short."""
    span = hi - lo
    if not math.isfinite(span):
        from .statistics import step
        return [(step(lo, hi, i, 4), f"{step(lo, hi, i, 4):.3g}") for i in range(5)]
    if span <= 2e-9 * max(1.0, abs(lo)):  # histogram_bins widens a one-value column by 1e-9
        return [(lo, f"{lo:.6g}")]
    raw = span / (most - 1)  # a step this large or larger leaves at most `most` values in the range
    exp = math.floor(math.log10(raw))
    for m in NICE:
        if integer and m == 2.5:
            continue
        if m * 10.0 ** exp >= raw * (1 - 1e-9):
            break
    if m == 10:
        m, exp = 1, exp + 1
    size = max(m * 10.0 ** exp, 1.0) if integer else m * 10.0 ** exp
    digits = 0 if integer else max(0, -exp + (1 if m == 2.5 else 0))
    out = []
    for k in range(math.ceil(lo / size - 1e-9), math.floor(hi / size + 1e-9) + 1):
        v = k * size + 0.0  # -0.0 reads "0"
        if abs(v) < 1e7 and digits <= 6:
            label = f"{v:.{digits}f}"
        else:  # as many significant digits as the step needs: 1e+308, 5e+307, 1.2345e-07
            sig = math.floor(math.log10(abs(v))) - exp + 1 + (m == 2.5) if v else 1
            label = f"{v:.{min(max(sig, 1), 17)}g}"
        out.append((v, label))
    return out


def _x_axis(lo: float, hi: float, integer: bool) -> List[str]:
    parts = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#999"/>']
    for v, label in nice_ticks(lo, hi, 7, integer):
        x = _x(v, lo, hi)
        parts.append(f'<line x1="{x:.1f}" y1="{H - BOTTOM}" x2="{x:.1f}" y2="{H - BOTTOM + 4}" stroke="#999"/>'
                     f'<text class="tick x" x="{x:.1f}" y="{H - BOTTOM + 15}" font-size="10" '
                     f'text-anchor="middle">{label}</text>')
    return parts


def _y_axis(ticks: List[Tuple[float, str]], top: float, title: str) -> List[str]:
    """Grid lines and labels of the y axis (values 0 .. top), its title above the plot's left corner."""
    parts = [f'<text class="axis-title" x="4" y="11" font-size="10">{_e(title)}</text>']
    for v, label in ticks:
        y = _y(v / top)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#e6e6e6"/>'
                     f'<text class="tick y" x="{LEFT - 5}" y="{y + 3.5:.1f}" font-size="10" '
                     f'text-anchor="end">{label}</text>')
    return parts


def _threshold_lines(cuts: List[tuple], lo: float, hi: float) -> List[str]:
    """Each threshold's dashed line, then the labels over every line (a minimum and a maximum on
    one axis: labels one above the other, each with a halo, readable over bars and lines)."""
    lines, labels = [], []
    for i, (value, label, color) in enumerate(cuts):
        x = _x(min(max(value, lo), hi), lo, hi)
        right = x > W - RIGHT - 90  # near the right edge the label goes left of its line
        lines.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="5,3"><title>{_e(label)}</title></line>')
        labels.append(f'<text class="cut" x="{x - 3 if right else x + 3:.1f}" y="{TOP + 10 + 12 * i}" font-size="10" '
                      f'fill="{color}" text-anchor="{"end" if right else "start"}" stroke="#fafafa" stroke-width="3" '
                      f'paint-order="stroke">{_e(label)}</text>')
    return lines + labels


def _svg(parts: List[str], kind: str) -> str:
    return f'<svg class="{kind}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{"".join(parts)}</svg>'


def histogram_svg(hist: dict, cuts: List[tuple]) -> str:
    """Rows per bin: bars, the y axis in rows (round counts up to a round top), the x axis in round
    values of the column, the thresholds."""
    edges, counts = hist["edges"], hist["counts"]
    lo, hi = edges[0], edges[-1]
    ticks = nice_ticks(0, max(max(counts), 1), 5, integer=True)
    size = ticks[1][0] - ticks[0][0] if len(ticks) > 1 else 1
    top = max(size * math.ceil(max(counts) / size), 1)  # the axis ends on a tick
    ticks = [(i * size, f"{int(i * size):,}") for i in range(int(top // size) + 1)]
    parts = _y_axis(ticks, top, "rows per bin") + _x_axis(lo, hi, bool(hist.get("per_value")))
    for i, c in enumerate(counts):
        x0, x1 = _x(edges[i], lo, hi), _x(edges[i + 1], lo, hi)
        parts.append(f'<rect x="{x0:.1f}" y="{_y(c / top):.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
                     f'height="{_y(0) - _y(c / top):.1f}" fill="#69c"><title>{edges[i]:.4g} .. {edges[i + 1]:.4g}: '
                     f'{c} rows</title></rect>')
    return _svg(parts + _threshold_lines(cuts, lo, hi), "histogram")


def kept_share_svg(hist: dict, cuts: List[tuple], minimum: bool) -> str:
    """Share of the rows with a value that a minimum (or maximum) at x would keep."""
    edges, counts = hist["edges"], hist["counts"]
    total = sum(counts) or 1
    lo, hi = edges[0], edges[-1]
    points = []
    for i, x in enumerate(edges):
        kept = sum(counts[i:]) if minimum else sum(counts[:i])
        points.append(f"{_x(x, lo, hi):.1f},{_y(kept / total):.1f}")
    ticks = [(f, f"{f:.0%}") for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    parts = _y_axis(ticks, 1.0, f"share kept by {'a minimum' if minimum else 'a maximum'} at x")
    parts += _x_axis(lo, hi, bool(hist.get("per_value")))
    parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#284" stroke-width="2"/>')
    return _svg(parts + _threshold_lines(cuts, lo, hi), "kept-share")


def verdict(e: dict) -> str:
    """What became of an example's row: "kept", or "dropped: " and the rule that dropped it (the
    threshold, "clip_score < 0.21"; a dedup mark; why it was not scored)."""
    if e.get("verdict"):  # a section's own words (dedup: "survivor", "eval match: exact:x.jpg")
        return e["verdict"]
    return "kept" if e["kept"] else f"dropped: {e.get('reason') or 'no reason recorded'}"


def _card(e: dict, column: Optional[str]) -> str:
    state = "kept" if e["kept"] else "dropped"
    img = (f'<img src="{e["thumb"]}" alt="{_e(e["key"])}">' if e.get("thumb")
           else f'<div class="note">{_e(e.get("media_note") or "no preview")}</div>')
    value = e["values"].get(column) if column else None
    head = f"{column} = {value:.5g}" if value is not None else \
        ", ".join(f"{c} = {v:.4g}" for c, v in e["values"].items())
    caption = e.get("caption")
    return (f'<div class="card {state}" title="{_e(e.get("message") or "")}">{img}'
            + (f'<div><b>{_e(head)}</b></div>' if head else "")
            + f'<div class="verdict">{_e(verdict(e))}</div>'
            f'<div class="cap">{_e(caption if caption is not None else "(no caption)")}</div>'
            f'<div class="meta">{_e(e["key"])} in {_e(os.path.basename(shown_url(e["url"])))}</div></div>')


def _grid(examples: List[dict], column: Optional[str]) -> str:
    if not examples:
        return '<p class="meta">no rows on this side</p>'
    return '<div class="grid">' + "".join(_card(e, column) for e in examples) + "</div>"


def render(data: Dict) -> str:
    """The page: the counts, each score column's section, the one line of the count columns, then
    the sections of what was dropped, tmars' largest drops, the failure ledger and the run's dedup. A new section is a
    function returning lines, added to the list below."""
    result = data["result"]
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>wdsfilter report: {_e(result.scores_dir)}</title><style>{CSS}</style></head><body>",
           f"<h1>Scores in {_e(result.scores_dir)}</h1>"]
    out += _totals(result)
    out += _count_columns(data.get("count_columns") or {}, result.rows)
    for column, st in data["columns"].items():
        out += _column(column, st, result, data["sections"])
    out += _dropped(result, data["dropped"])
    out += _masked(data.get("masked") or [])
    out += _ledger(data.get("failures") or {})
    out += _dedup(data.get("dedup"))
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out)


def _totals(result) -> List[str]:
    ruled = result.thresholds or result.dedup is not None
    out = [f"<p>{result.rows} rows in {result.shards} finished shard(s); <b>{result.kept} of {result.rows} kept</b>"
           f" ({'by every rule below' if ruled else 'every scored row: no rule given'}).</p>"]
    if ruled:
        out.append("<table><tr><th>rule</th><th>as given</th><th>kept</th><th>dropped</th>"
                   "<th>without a value</th></tr>")
        for t, c in zip(result.thresholds, result.counts):
            ties = ""
            if t.share is not None and c["kept"] > t.rank:
                ties = f" ({c['kept'] - t.rank} tie with the cut value and are kept too)"
            out.append(f"<tr><td>{_e(t.describe())}</td><td>{_e(t.given)}{_e(ties)}</td><td class=n>{c['kept']}</td>"
                       f"<td class=n>{result.rows - c['kept']}</td><td class=n>{c['no_score']}</td></tr>")
        if result.dedup is not None:  # the dedup's marks, a rule like the others (runfolder/dedup.py)
            d = result.dedup
            out.append(f"<tr><td>one survivor per duplicate group, no eval match ({d['duplicate']} duplicates, "
                       f"{d['eval_match']} eval matches)</td><td>--dedup</td><td class=n>{d['kept']}</td>"
                       f"<td class=n>{result.rows - d['kept']}</td><td class=n>0</td></tr>")
        out.append("</table>")
        if result.selection:
            out.append(f'<p class="meta">In training: <code>{_e(result.selection.loader_call(result.scores_dir))}'
                       f'</code></p>')
    return out


def count_line(column: str, st: dict, rows: int) -> str:
    """One line for a count column (collect.count_columns: ocr_frames, clip_frames): its values
    by rows, most rows first ("3 in 118 rows, 1 in 2 rows")."""
    hist = st["histogram"]
    lo = hist["edges"][0] + 0.5  # one bin per value, from the lowest value - 0.5
    values = sorted(((n, round(lo + i)) for i, n in enumerate(hist["counts"]) if n), key=lambda x: (-x[0], x[1]))
    text = ", ".join(f"{v} in {n} row{'s' * (n != 1)}" for n, v in values[:6])
    if len(values) > 6:
        text += f", {len(values) - 6} other values in {sum(n for n, _ in values[6:])} rows"
    missing = rows - st["count"]
    return f"{column}: {text}" + (f" (no value in {missing})" if missing > 0 else "")


def _count_columns(columns: Dict[str, dict], rows: int) -> List[str]:
    if not columns:
        return []
    return ['<p class="counts"><b>Counts</b> (whole-number columns of a few values, no threshold): '
            + "; ".join(_e(count_line(c, st, rows)) for c, st in columns.items()) + "</p>"]


def _column(column: str, st: dict, result, sections: List[dict]) -> List[str]:
    """A score column's section: its statistics, histogram and kept-share charts, the examples
    beside each threshold (or its highest and lowest rows)."""
    out = [f"<h2>{_e(column)}</h2>"]
    hist = st.get("histogram")
    if not hist:
        return out + ['<p class="meta">no values</p>']
    from .statistics import one_value_text
    one = one_value_text(hist)
    if one:  # no charts: an axis of no width, its ends labelled with values no row has
        out.append(f'<p class="meta">{_e(one)}</p>')
    else:
        out.append(f'<p class="meta">n={st["count"]}, min={st["min"]:.4g}, mean={st["mean"]:.4g}, '
                   f'max={st["max"]:.4g}</p>')
    mine = [t for t in result.thresholds if t.column == column and t.numeric]
    cuts = [(t.value, f"{'min' if t.minimum else 'max'} {t.value:.4g}", "#c22" if t.minimum else "#82c")
            for t in mine]
    minimum = not mine or any(t.minimum for t in mine)
    if not one:
        out.append('<div class="charts">' + histogram_svg(hist, cuts) + kept_share_svg(hist, cuts, minimum) + "</div>")
    for s in sections:
        if s["column"] != column:
            continue
        out.append(f"<h3>{_e(s['label'])}</h3>")
        if s["cut"] is None:
            out.append("<p>highest:</p>" + _grid(s["above"], column) + "<p>lowest:</p>" + _grid(s["below"], column))
        else:
            out.append(f"<p>at or just above {s['cut']:.6g}:</p>" + _grid(s["above"], column)
                       + f"<p>just below {s['cut']:.6g}:</p>" + _grid(s["below"], column))
    return out


def _dropped(result, dropped: Dict[str, List[dict]]) -> List[str]:
    out = ["<h2>Dropped, by reason</h2>"]
    if not result.reasons:
        return out + ["<p>nothing was dropped</p>"]
    out.append("<table>" + "".join(f"<tr><td class=n>{n}</td><td>{_e(r)}</td></tr>"
                                   for r, n in result.reasons.items()) + "</table>")
    for reason, examples in dropped.items():
        out.append(f"<h3>{_e(reason)} ({result.reasons.get(reason, 0)})</h3>" + _grid(examples, None))
    return out


def _masked(pairs: List[dict]) -> List[str]:
    """tmars: the rows whose clip_score drops most with their text masked (masked.py)."""
    from .sections.masked import masked_section
    return masked_section(pairs)


def _dedup(section: Optional[dict]) -> List[str]:
    """The run's dedup (RUN_DIR/dedup/, when `wdsfilter dedup` ran): report/dedup.py's section."""
    if not section:
        return []
    from .sections.dedup import section_html
    return section_html(section)


def _ledger(failures: Dict) -> List[str]:
    """The failure ledger's section: not scored, by reason, transient or not (score/ledger.py)."""
    by_reason = failures.get("by_reason") or {}
    if not by_reason:
        return []
    out = ["<h2>Failure ledger (failures.parquet)</h2><table><tr><th>samples</th><th>shards</th><th>reason</th>"
           "<th>kind</th></tr>"]
    out += [f"<tr><td class=n>{s['samples']}</td><td class=n>{s['shards']}</td><td>{_e(r)}</td>"
            f"<td>{'transient: wdsfilter score --retry-failed' if s['transient'] else 'data'}</td></tr>"
            for r, s in by_reason.items()]
    out.append("</table><p class=\"meta\">Rejected and failed samples are shown above, under \"Dropped, by "
               "reason\"; partly scored ones (kept) below.</p>")
    for reason, examples in failures.get("examples", {}).items():
        if examples:
            out.append(f"<h3>{_e(reason)} (partly scored)</h3>" + _grid(examples, None))
    return out


def write_report(data: Dict, path: str) -> str:
    from ..writing import write_text_atomic
    return write_text_atomic(path, render(data))
