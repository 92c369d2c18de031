"""Each score column's section: its statistics, histogram and kept-share charts (charts.py), and
the rows nearest each threshold on either side as cards (or, without a threshold, the highest and
lowest rows); whole-number columns of a few values that no threshold names (frame counts) get one
line together instead."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..charts import histogram_svg, kept_share_svg
from ..html import escape, grid
from ..media import Nearest, number
from ..statistics import one_value_text, summarize_files
from .base import Section

PER_SIDE = 6  # thumbnails on each side of a threshold
BINS = 40


class ScoreColumns(Section):
    def __init__(self, context):
        super().__init__(context)
        self.sides: List[tuple] = []  # (column, label, cut, above: Nearest, below: Nearest)
        for t in context.thresholds:
            if not t.numeric:  # a text column's rule has no cut to show rows beside
                continue
            self.sides.append((t.column, f"{t.describe()} ({t.given})", t.value, Nearest(PER_SIDE), Nearest(PER_SIDE)))
        for c in context.numeric:  # no threshold: the highest and the lowest rows show the range
            if not any(t.column == c for t in context.thresholds):
                self.sides.append((c, f"{c}: highest and lowest", None, Nearest(PER_SIDE), Nearest(PER_SIDE)))
        self.stats: Dict[str, dict] = {}
        self.counts: List[str] = []
        self.shown: List[dict] = []

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        example = None
        for column, _, cut, above, below in self.sides:
            v = number(row.get(column))
            if v is None:
                continue
            example = example or self.context.example(shard, row, reason)
            if cut is None:
                above.push(v, example)
                below.push(-v, example)
            else:
                (above if v >= cut else below).push(-abs(v - cut), example)

    def finish(self, result) -> None:
        numeric = self.context.numeric
        self.stats = summarize_files([s.score_file for s in self.context.run.shards], numeric, {}, BINS)["columns"]
        self.counts = count_columns(self.stats, self.context.thresholds)
        self.shown = [{"column": column, "label": label, "cut": cut, "above": above.examples(),
                       "below": below.examples()}
                      for column, label, cut, above, below in self.sides if column not in self.counts]

    def examples(self) -> List[dict]:
        return [e for s in self.shown for e in s["above"] + s["below"]]

    def render(self, result) -> List[str]:
        out = []
        if self.counts:
            out.append('<p class="counts"><b>Counts</b> (whole-number columns of a few values, no threshold): '
                       + "; ".join(escape(count_line(c, self.stats[c], result.rows)) for c in self.counts) + "</p>")
        for column in self.context.numeric:
            if column not in self.counts:
                out += self._column(column, self.stats.get(column, {}), result)
        return out

    def _column(self, column: str, st: dict, result) -> List[str]:
        out = [f"<h2>{escape(column)}</h2>"]
        hist = st.get("histogram")
        if not hist:
            return out + ['<p class="meta">no values</p>']
        one = one_value_text(hist)
        if one:  # no charts: an axis of no width, its ends labelled with values no row has
            out.append(f'<p class="meta">{escape(one)}</p>')
        else:
            out.append(f'<p class="meta">n={st["count"]}, min={st["min"]:.4g}, mean={st["mean"]:.4g}, '
                       f'max={st["max"]:.4g}</p>')
        mine = [t for t in result.thresholds if t.column == column and t.numeric]
        cuts = [(t.value, f"{'min' if t.minimum else 'max'} {t.value:.4g}", "#c22" if t.minimum else "#82c")
                for t in mine]
        minimum = not mine or any(t.minimum for t in mine)
        if not one:
            out.append('<div class="charts">' + histogram_svg(hist, cuts) + kept_share_svg(hist, cuts, minimum)
                       + "</div>")
        for s in self.shown:
            if s["column"] != column:
                continue
            out.append(f"<h3>{escape(s['label'])}</h3>")
            if s["cut"] is None:
                out.append("<p>highest:</p>" + grid(s["above"], column) + "<p>lowest:</p>" + grid(s["below"], column))
            else:
                out.append(f"<p>at or just above {s['cut']:.6g}:</p>" + grid(s["above"], column)
                           + f"<p>just below {s['cut']:.6g}:</p>" + grid(s["below"], column))
        return out


def count_columns(stats: Dict[str, dict], thresholds: Sequence) -> List[str]:
    """Columns the report gives one line, not a section: whole numbers of a few values (one
    histogram bin per value: frame counts, ocr_frames, clip_frames) that no threshold names."""
    return [c for c, st in stats.items() if (st.get("histogram") or {}).get("per_value")
            and not any(t.column == c for t in thresholds)]


def count_line(column: str, st: dict, rows: int) -> str:
    """One line for a count column (ocr_frames, clip_frames): its values by rows, most rows first
    ("3 in 118 rows, 1 in 2 rows")."""
    hist = st["histogram"]
    lo = hist["edges"][0] + 0.5  # one bin per value, from the lowest value - 0.5
    values = sorted(((n, round(lo + i)) for i, n in enumerate(hist["counts"]) if n), key=lambda x: (-x[0], x[1]))
    text = ", ".join(f"{v} in {n} row{'s' * (n != 1)}" for n, v in values[:6])
    if len(values) > 6:
        text += f", {len(values) - 6} other values in {sum(n for n, _ in values[6:])} rows"
    missing = rows - st["count"]
    return f"{column}: {text}" + (f" (no value in {missing})" if missing > 0 else "")
