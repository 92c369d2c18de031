"""The self-contained HTML report of a score folder (report.html): inline CSS and SVG, thumbnails
as data: URIs, no network. Per score column: the histogram with the thresholds, the kept share as
a function of the threshold, and thumbnails with captions just above and just below each
threshold; then the dropped rows per reason with examples.

A small script marks the page once every image has loaded (body data-images="ok N" or
"broken N of M"), which the browser test reads back with chromium --dump-dom."""
from __future__ import annotations

import html
import os
from typing import Dict, List, Optional

W, H = 640, 180  # chart size in SVG units
PAD = 36

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
.cap { color: #333; max-height: 6em; overflow: hidden; } .meta { color: #777; word-break: break-all; }
.note { color: #a60; }
"""

SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images', ok === imgs.length ? 'ok ' + ok : 'broken ' + ok + ' of ' + imgs.length);
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
    from ..score.outputs import position
    return PAD + (W - 2 * PAD) * (position(min(max(v, lo), hi), lo, hi) if hi > lo else 0.5)


def _axis(lo: float, hi: float, ylabel: str) -> List[str]:
    from ..score.outputs import step
    parts = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>']
    for i in range(5):
        v = step(lo, hi, i, 4)
        x = _x(v, lo, hi)
        parts.append(f'<text x="{x:.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle">{v:.4g}</text>')
    parts.append(f'<text x="4" y="12" font-size="10">{_e(ylabel)}</text>')
    return parts


def _threshold_lines(cuts: List[tuple], lo: float, hi: float) -> List[str]:
    parts = []
    for value, label, color in cuts:
        x = _x(min(max(value, lo), hi), lo, hi)
        parts.append(f'<line x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{H - PAD}" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="5,3"><title>{_e(label)}</title></line>')
        parts.append(f'<text x="{x + 3:.1f}" y="24" font-size="10" fill="{color}">{_e(label)}</text>')
    return parts


def histogram_svg(hist: dict, cuts: List[tuple]) -> str:
    edges, counts = hist["edges"], hist["counts"]
    lo, hi = edges[0], edges[-1]
    top = max(counts) or 1
    parts = _axis(lo, hi, "rows")
    for i, c in enumerate(counts):
        x0, x1 = _x(edges[i], lo, hi), _x(edges[i + 1], lo, hi)
        h = (H - PAD - 14) * c / top
        parts.append(f'<rect x="{x0:.1f}" y="{H - PAD - h:.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
                     f'height="{h:.1f}" fill="#69c"><title>{edges[i]:.4g} .. {edges[i + 1]:.4g}: {c}</title></rect>')
    parts += _threshold_lines(cuts, lo, hi)
    return f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{"".join(parts)}</svg>'


def kept_share_svg(hist: dict, cuts: List[tuple], minimum: bool) -> str:
    """Share of the rows with a value that a minimum (or maximum) at x would keep."""
    edges, counts = hist["edges"], hist["counts"]
    total = sum(counts) or 1
    lo, hi = edges[0], edges[-1]
    points = []
    for i, x in enumerate(edges):
        kept = sum(counts[i:]) if minimum else sum(counts[:i])
        points.append(f"{_x(x, lo, hi):.1f},{(H - PAD) - (H - PAD - 14) * kept / total:.1f}")
    parts = _axis(lo, hi, f"share kept by {'a minimum' if minimum else 'a maximum'} at x")
    for frac in (0.25, 0.5, 0.75, 1.0):
        y = (H - PAD) - (H - PAD - 14) * frac
        parts.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - PAD}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{PAD - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{frac:.0%}</text>')
    parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#284" stroke-width="2"/>')
    parts += _threshold_lines(cuts, lo, hi)
    return f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{"".join(parts)}</svg>'


def _card(e: dict, column: Optional[str]) -> str:
    state = "kept" if e["kept"] else "dropped"
    img = (f'<img src="{e["thumb"]}" alt="{_e(e["key"])}">' if e.get("thumb")
           else f'<div class="note">{_e(e.get("media_note") or "no preview")}</div>')
    value = e["values"].get(column) if column else None
    head = f"{column} = {value:.5g}" if value is not None else (e.get("reason") or "")
    if column is None and e["values"]:
        head += " (" + ", ".join(f"{c}={v:.4g}" for c, v in e["values"].items()) + ")"
    caption = e.get("caption")
    return (f'<div class="card {state}" title="{_e(e.get("message") or "")}">{img}<div><b>{_e(head)}</b> '
            f'({state})</div><div class="cap">{_e(caption if caption is not None else "(no caption)")}</div>'
            f'<div class="meta">{_e(e["key"])} in {_e(os.path.basename(e["url"]))}</div></div>')


def _grid(examples: List[dict], column: Optional[str]) -> str:
    if not examples:
        return '<p class="meta">no rows on this side</p>'
    return '<div class="grid">' + "".join(_card(e, column) for e in examples) + "</div>"


def render(data: Dict) -> str:
    result = data["result"]
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>wdsfilter report: {_e(result.scores_dir)}</title><style>{CSS}</style></head><body>",
           f"<h1>Scores in {_e(result.scores_dir)}</h1>",
           f"<p>{result.rows} rows in {result.shards} finished shard(s); <b>{result.kept} of {result.rows} kept</b>"
           f" ({'by every threshold below' if result.thresholds else 'every scored row: no threshold given'}).</p>"]
    if result.thresholds:
        out.append("<table><tr><th>threshold</th><th>as given</th><th>kept</th><th>dropped</th>"
                   "<th>without a value</th></tr>")
        for t, c in zip(result.thresholds, result.counts):
            ties = ""
            if t.share is not None and c["kept"] > t.rank:
                ties = f" ({c['kept'] - t.rank} tie with the cut value and are kept too)"
            out.append(f"<tr><td>{_e(t.describe())}</td><td>{_e(t.given)}{_e(ties)}</td><td class=n>{c['kept']}</td>"
                       f"<td class=n>{result.rows - c['kept']}</td><td class=n>{c['no_score']}</td></tr>")
        out.append("</table>")
    for column, st in data["columns"].items():
        out.append(f"<h2>{_e(column)}</h2>")
        hist = st.get("histogram")
        if not hist:
            out.append('<p class="meta">no values</p>')
            continue
        out.append(f'<p class="meta">n={st["count"]}, min={st["min"]:.4g}, mean={st["mean"]:.4g}, '
                   f'max={st["max"]:.4g}</p>')
        mine = [t for t in result.thresholds if t.column == column]
        cuts = [(t.value, f"{'min' if t.minimum else 'max'} {t.value:.4g}", "#c22" if t.minimum else "#82c")
                for t in mine]
        minimum = not mine or any(t.minimum for t in mine)
        out.append('<div class="charts">' + histogram_svg(hist, cuts) + kept_share_svg(hist, cuts, minimum) + "</div>")
        for s in data["sections"]:
            if s["column"] != column:
                continue
            out.append(f"<h3>{_e(s['label'])}</h3>")
            if s["cut"] is None:
                out.append("<p>highest:</p>" + _grid(s["above"], column) + "<p>lowest:</p>" + _grid(s["below"], column))
            else:
                out.append(f"<p>at or just above {s['cut']:.6g}:</p>" + _grid(s["above"], column)
                           + f"<p>just below {s['cut']:.6g}:</p>" + _grid(s["below"], column))
    out.append("<h2>Dropped, by reason</h2>")
    if not result.reasons:
        out.append("<p>nothing was dropped</p>")
    else:
        out.append("<table>" + "".join(f"<tr><td class=n>{n}</td><td>{_e(r)}</td></tr>"
                                       for r, n in result.reasons.items()) + "</table>")
        for reason, examples in data["dropped"].items():
            out.append(f"<h3>{_e(reason)} ({result.reasons.get(reason, 0)})</h3>" + _grid(examples, None))
    from .report_masked import masked_section
    out += masked_section(data.get("masked") or [])
    out += _ledger(data.get("failures") or {})
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out)


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
    out.append("</table>")
    for reason, examples in failures.get("examples", {}).items():
        if examples:
            out.append(f"<h3>{_e(reason)}</h3>" + _grid(examples, None))
    return out


def write_report(data: Dict, path: str) -> str:
    from ..writing import write_text_atomic
    return write_text_atomic(path, render(data))
