"""Statistics of a run's score columns, read back from its score tables (their format and I/O:
wdsfilter/runfolder/tables.py): counts, kept and dropped per threshold, per-column statistics,
histograms (as text for the terminal, as a PNG, and their axes for report.html).

Computed from the score files themselves, so a resumed run reports the whole dataset, not just
the part it scored.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..storage.atomic import atomic_path
from ..runfolder.keep import keep_reason
from ..runfolder.tables import read_table
from ..core.thresholds import Thresholds, is_missing


# -- summary over score files -------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> bool:
    """A number the statistics and histograms count: not NaN (a missing score) and not infinite
    (a scorer's log(0)): an infinity would make the range, the mean and every histogram bin NaN."""
    return _is_number(v) and math.isfinite(v)


def _numeric(values: Iterable[Any]) -> List[float]:
    return [float(v) for v in values if _finite(v)]


def summarize_files(paths: Sequence[str], columns: Sequence[str], thresholds=None, bins: int = 20) -> dict:
    """Counts, kept/dropped per threshold (minimum and maximum) and per-column statistics with
    histograms, read back from the score files (two passes over the score columns: range, then
    histogram). Integer columns with few values get one bin per value. thresholds: a
    thresholds.Thresholds, or a resolved wdsfilter.Selection (its text rules count in `kept` too)."""
    counts = _RowCounts(thresholds)
    stats: Dict[str, dict] = {}
    for path in paths:
        t = read_table(path, list(dict.fromkeys(["status", "reason", *columns, *counts.rule_columns])))
        counts.add(t)
        for col in columns:
            _add_values(stats.setdefault(col, _new_column()), t.get(col, []))
    for col, st in stats.items():
        _finish_column(st, paths, col, bins)
    return {**counts.to_dict(), "columns": stats}


class _RowCounts:
    """The rows of a run's score files counted: by status, by drop reason, kept by the one keep
    rule with the given thresholds (the run's, its shares resolved; not the `kept` column, which a
    share resolved at the end of the run did not decide), and kept, dropped or without a value by
    each minimum and maximum."""

    def __init__(self, thresholds):
        selection = hasattr(thresholds, "row_rules")  # a resolved Selection: its text rules count too
        self.rules = thresholds.row_rules() if selection else list((thresholds or Thresholds()).bounds())
        bounds = (thresholds.bounds if selection else thresholds or Thresholds()).bounds()
        self.per_bound = [(b, {"min" if b.minimum else "max": b.value, "kept": 0, "dropped": 0, "no_score": 0})
                          for b in bounds]
        self.rule_columns = [r.column for r in self.rules]
        self.rows = self.kept = 0
        self.status: Counter = Counter()
        self.reasons: Counter = Counter()

    def add(self, t: Dict[str, list]) -> None:
        """One score file's columns (status, reason and the rules' columns at least)."""
        n = len(t["status"])
        self.rows += n
        self.status.update(t["status"])
        for r in t["reason"]:
            if r:
                self.reasons.update(str(r).split(";"))
        if self.rules:
            judged = [c for c in dict.fromkeys(["status", "reason", *self.rule_columns]) if c in t]
            self.kept += sum(1 for i in range(n) if keep_reason({c: t[c][i] for c in judged}, self.rules) is None)
        else:  # no threshold: the rule asks the status only
            self.kept += sum(1 for s in t["status"] if keep_reason({"status": s}) is None)
        for bound, th in self.per_bound:
            for v in t.get(bound.column, [None] * n):
                th["no_score" if is_missing(v) else "kept" if bound.passes(v) else "dropped"] += 1

    def to_dict(self) -> dict:
        return {"rows": self.rows, "status": dict(self.status), "reasons": dict(self.reasons.most_common()),
                "kept": self.kept, "dropped": self.rows - self.kept,
                "thresholds": {b.column: th for b, th in self.per_bound if b.minimum},
                "max_thresholds": {b.column: th for b, th in self.per_bound if not b.minimum}}


def _finish_column(st: dict, paths: Sequence[str], col: str, bins: int) -> None:
    """A column's statistics once every file is counted: its mean and histogram (a second read of
    the column), its running sums dropped."""
    if st["kind"] == "number" and st["count"]:
        # The sum of values near sys.float_info.max (a scorer's sentinel) overflows; the sum of
        # the values scaled by 2**-64 (exact) cannot, and their mean scaled back is finite.
        total = st["sum"]
        st["mean"] = total / st["count"] if math.isfinite(total) else st["scaled"] / st["count"] * _SCALE
        lo, hi, n_bins, per_value = histogram_bins(st["min"], st["max"], st["integer"], bins)
        st["histogram"] = {"edges": [step(lo, hi, i, n_bins) for i in range(n_bins + 1)],
                           "counts": _bin_counts(paths, col, lo, hi, n_bins)}
        if per_value:
            st["histogram"]["per_value"] = True
        if st["min"] == st["max"]:  # a range of no width: the terminal, PNG and report say it in words
            st["histogram"]["one_value"] = st["min"]
    for internal in ("sum", "scaled", "integer"):
        st.pop(internal, None)


def _new_column() -> dict:
    return {"count": 0, "min": None, "max": None, "sum": 0.0, "scaled": 0.0, "true": 0, "false": 0, "kind": None,
            "integer": True}  # scaled: the sum of the values * 2**-64, which cannot overflow


_SCALE = 2.0 ** 64


def position(v: float, lo: float, hi: float) -> float:
    """Where v lies from lo (0) to hi (1), finite for any finite lo < hi, even where hi - lo
    overflows (-max .. max): the halves' difference cannot."""
    return (v - lo) / (hi - lo) if math.isfinite(hi - lo) else (v / 2 - lo / 2) / (hi / 2 - lo / 2)


def step(lo: float, hi: float, i: int, n: int) -> float:
    """The i-th of n + 1 equal steps from lo to hi, without computing hi - lo (it may overflow)."""
    if math.isfinite(hi - lo):
        return lo + (hi - lo) * i / n
    return lo * (1 - i / n) + hi * (i / n) if i < n else hi


def _add_values(st: dict, values: Iterable[Any]) -> None:
    """Count one file's values of a column into its statistics (booleans, or finite numbers:
    count, sum, range, whether all are integers; infinities only counted, as `infinite`). A
    column of other values (a hash's text) is kind "other"; one of only None/NaN keeps kind None."""
    for v in values:
        if is_missing(v):
            continue
        if isinstance(v, bool):
            st["kind"] = st["kind"] or "bool"
            st["true" if v else "false"] += 1
            st["count"] += 1
        elif _is_number(v) and math.isinf(v):  # counted apart: summary.json stays JSON (no Infinity)
            st["kind"] = "number"
            st["infinite"] = st.get("infinite", 0) + 1
        elif _finite(v):
            st["kind"] = "number"
            st["integer"] = st["integer"] and isinstance(v, int)
            st["count"] += 1
            st["sum"] += float(v)
            st["scaled"] += float(v) / _SCALE
            st["min"] = v if st["min"] is None else min(st["min"], v)
            st["max"] = v if st["max"] is None else max(st["max"], v)
        else:
            st["kind"] = st["kind"] or "other"


def histogram_bins(lowest, highest, integer: bool, bins: int) -> Tuple[float, float, int, bool]:
    """(lo, hi, number of bins, one bin per value?) for values from `lowest` to `highest`: `bins`
    equal bins, or one bin per value for integers with at most `bins` values (ocr_frames)."""
    lo, hi = float(lowest), float(highest)
    n_bins = bins
    per_value = integer and hi - lo + 1 <= bins
    if per_value:
        n_bins, lo, hi = int(hi - lo) + 1, lo - 0.5, hi + 0.5
    if hi == lo:  # one value: one bin of (almost) no width, above it (below it at the largest float)
        n_bins = 1
        hi = lo + 1e-9 if lo + 1e-9 > lo else math.nextafter(lo, math.inf)
        if math.isinf(hi):
            hi, lo = lo, math.nextafter(lo, -math.inf)
    return lo, hi, n_bins, per_value


def _bin_counts(paths: Sequence[str], col: str, lo: float, hi: float, n_bins: int) -> List[int]:
    """The second pass: a column's values counted into `n_bins` equal bins from `lo` to `hi`."""
    counts = [0] * n_bins
    for path in paths:
        for v in _numeric(read_table(path, [col]).get(col, [])):
            counts[max(0, min(n_bins - 1, int(position(v, lo, hi) * n_bins)))] += 1
    return counts


def one_value_text(hist: dict) -> Optional[str]:
    """"all 1024 values are 0" for a column of one value (None otherwise): its histogram would be
    one bar on an axis of no width, whose end labels (0 .. 1e-09) are values no row has."""
    if "one_value" not in hist:
        return None
    n = sum(hist["counts"])
    return f"all {n} values are {hist['one_value']:.6g}" if n > 1 else f"one value: {hist['one_value']:.6g}"


def text_histogram(hist: dict, width: int = 40) -> List[str]:
    if one_value_text(hist):
        return [f"    {one_value_text(hist)}"]
    counts, edges = hist["counts"], hist["edges"]
    top = max(counts) or 1
    lines = []
    for i, c in enumerate(counts):
        bar = "#" * max(1 if c else 0, round(c / top * width))
        label = (f"{edges[i] + 0.5:>9.4g}{'':13}" if hist.get("per_value")
                 else f"{edges[i]:>9.4g} .. {edges[i + 1]:<9.4g}")
        lines.append(f"    {label} {c:>8}  {bar}")
    return lines


def plot_histograms(stats: Dict[str, dict], thresholds: Thresholds, path: str) -> Optional[str]:
    """One panel per numeric score column, threshold lines drawn (red: minimum, purple: maximum);
    None when there is nothing to plot. Drawn with PIL, which the core already needs: a few
    milliseconds, where importing matplotlib alone took seconds at start-up of every summary."""
    from PIL import Image, ImageDraw
    minima, maxima = thresholds.minima, thresholds.maxima
    numeric = [(c, s) for c, s in stats.items() if s.get("histogram")]
    if not numeric:
        return None
    width, panel, margin, top = 560, 180, 40, 24
    img = Image.new("RGB", (width, panel * len(numeric)), "white")
    draw = ImageDraw.Draw(img)
    for k, (col, st) in enumerate(numeric):
        y0 = k * panel
        edges, counts = st["histogram"]["edges"], st["histogram"]["counts"]
        lo, hi = edges[0], edges[-1]
        left, right, bottom = margin, width - 10, y0 + panel - 20
        peak = max(counts) or 1
        bounds = ", ".join(b for b in (f"min {minima[col]:g}" if col in minima else "",
                                       f"max {maxima[col]:g}" if col in maxima else "") if b)
        if one_value_text(st["histogram"]):  # no axis: its ends would be values no row has
            draw.text((left, y0 + 6), f"{col}" + (f"  [{bounds}]" if bounds else ""), fill="black")
            draw.text((left, (y0 + top + bottom) // 2), one_value_text(st["histogram"]), fill="black")
            continue

        def x_of(v: float) -> float:
            return left + (right - left) * (position(v, lo, hi) if hi > lo else 0.5)

        for c, a, b in zip(counts, edges, edges[1:]):
            if c:
                draw.rectangle([x_of(a), bottom - (bottom - y0 - top) * c / peak, max(x_of(a), x_of(b) - 1), bottom],
                               fill=(90, 130, 200))
        draw.line([left, bottom, right, bottom], fill="black")
        for v, colour in ((minima.get(col), (220, 30, 30)), (maxima.get(col), (140, 40, 160))):
            if v is not None and lo <= v <= hi:
                draw.line([x_of(v), y0 + top, x_of(v), bottom], fill=colour, width=2)
        draw.text((left, y0 + 6), f"{col} (n={st['count']}, mean={st['mean']:.4g})" + (f"  [{bounds}]" if bounds else ""),
                  fill="black")
        draw.text((left, bottom + 4), f"{lo:.4g}", fill="black")
        draw.text((right - 40, bottom + 4), f"{hi:.4g}", fill="black")
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path
