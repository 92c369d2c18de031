"""Exact order statistics of a score column over a whole run, streaming over the score files.

`--top clip_score=30%` needs the value v such that 30% of the scored rows are >= v. Sorting all
rows would hold the column in memory; instead each pass over the files narrows the value range
that holds the wanted rank (a histogram of BINS bins, with each bin's own minimum and maximum),
until the range holds at most COLLECT values, which the last pass collects and sorts. Memory is
one read batch plus the histogram, whatever the number of rows; a few passes suffice (4096 bins
shrink the candidates 4096-fold per pass for spread-out values).

The rank is exact: the value returned is the k-th smallest value read, no interpolation.

A run whose column fits in IN_MEMORY_ROWS rows is read once instead (runfolder.tables.column_numbers:
8 bytes a row) and the rank taken with numpy's partition (`share_value`): the same value, one read
of each file instead of a pass per narrowing. Where the column is held already, in pieces with NaN
for missing values (`wdsfilter filter` keeps each file's threshold columns to count them),
`share_of_chunks` takes the rank from them without a copy of the column: one histogram pass, then
the values of the one bin that holds the rank, partitioned.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Tuple

BINS = 4096
COLLECT = 1 << 16
IN_MEMORY_ROWS = 1 << 26  # a column of up to 64 M rows (512 MiB of float64) is held whole; more streams

Source = Callable[[], Iterable["object"]]  # a fresh iterator of float64 numpy arrays per pass


def _region(values, lo: float, hi: float):
    return values[(values >= lo) & (values <= hi)]


def _binning(lo: float, hi: float):
    """values in [lo, hi] -> their bin, 0..BINS-1. Any mapping that keeps the order will do (each
    bin's own minimum and maximum are recorded); arithmetic is some 50x faster than a binary search
    over the edges. Halves, so that a span from near -max to near +max does not overflow; the
    search stays for a span too narrow to divide by (a few subnormals)."""
    import numpy as np
    half_span = hi * 0.5 - lo * 0.5
    scale = BINS / half_span if half_span > 0 else math.inf
    if not math.isfinite(scale):
        edges = np.linspace(lo, hi, BINS + 1)
        return lambda v: np.clip(np.searchsorted(edges, v, side="right") - 1, 0, BINS - 1)
    half_lo = lo * 0.5
    return lambda v: np.clip(((v * 0.5 - half_lo) * scale).astype(np.int64), 0, BINS - 1)


def count_range(source: Source) -> Tuple[int, float, float]:
    """(count, min, max) of the values (min and max are nan when there are none)."""
    n, lo, hi = 0, math.inf, -math.inf
    for values in source():
        if len(values):
            n += len(values)
            lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
    return (n, lo, hi) if n else (0, math.nan, math.nan)


def kth_smallest(source: Source, k: int, stats: Tuple[int, float, float] = None) -> float:
    """The k-th smallest value (1-based) of everything `source` yields."""
    import numpy as np
    n, lo, hi = stats or count_range(source)
    if not 1 <= k <= n:
        raise ValueError(f"rank {k} is outside 1..{n}")
    below, count = 0, n  # values under the region [lo, hi], and inside it
    while True:
        if lo == hi:
            return lo
        if count <= COLLECT:
            inside = np.concatenate([_region(v, lo, hi) for v in source()] or [np.empty(0)])
            return float(np.partition(inside, k - below - 1)[k - below - 1])
        if math.isinf(lo) or math.isinf(hi):  # the bins need finite ends: an infinite end is peeled off
            end = lo if math.isinf(lo) else hi
            at_end = sum(int((v == end).sum()) for v in source())
            if end == lo:
                if k - below <= at_end:
                    return lo
                below += at_end
                count -= at_end
                lo = min(float(v[(v > lo) & (v <= hi)].min()) for v in source() if ((v > lo) & (v <= hi)).any())
            else:
                if k - below > count - at_end:
                    return hi
                count -= at_end
                hi = max(float(v[(v >= lo) & (v < hi)].max()) for v in source() if ((v >= lo) & (v < hi)).any())
            continue
        bin_of = _binning(lo, hi)
        counts = np.zeros(BINS, dtype=np.int64)
        mins = np.full(BINS, np.inf)
        maxs = np.full(BINS, -np.inf)
        for values in source():
            inside = _region(values, lo, hi)
            bins = bin_of(inside)
            counts += np.bincount(bins, minlength=BINS)
            np.minimum.at(mins, bins, inside)
            np.maximum.at(maxs, bins, inside)
        cumulative = np.cumsum(counts)
        b = int(np.searchsorted(cumulative, k - below))  # first bin whose cumulative count reaches the rank
        new_below = below + (int(cumulative[b - 1]) if b else 0)
        new = (float(mins[b]), float(maxs[b]), int(counts[b]))
        if new == (lo, hi, count):  # a range too narrow to split (adjacent floats): peel off its minimum
            at_lo = sum(int((v == lo).sum()) for v in source())
            if k - below <= at_lo:
                return lo
            below += at_lo
            count -= at_lo
            lo = min((float(v[(v > lo) & (v <= hi)].min()) for v in source() if ((v > lo) & (v <= hi)).any()))
            continue
        below = new_below
        lo, hi, count = new


def share_rank(n: int, percent: float) -> int:
    """k = ceil(percent% of n) rows, at least 1: the rank a --top/--bottom share asks for."""
    return max(1, math.ceil(n * percent / 100.0 - 1e-9))


def top_share_value(source: Source, percent: float, stats: Tuple[int, float, float] = None) -> Tuple[float, int]:
    """(v, k): v is the k-th largest value, k = ceil(percent% of the values); keeping values >= v
    keeps at least percent% of them (more when values tie with v)."""
    n = (stats or count_range(source))[0]
    k = share_rank(n, percent)
    return kth_smallest(source, n - k + 1, stats), k


def bottom_share_value(source: Source, percent: float, stats: Tuple[int, float, float] = None) -> Tuple[float, int]:
    """(v, k): v is the k-th smallest value; keeping values <= v keeps at least percent% of them."""
    n = (stats or count_range(source))[0]
    k = share_rank(n, percent)
    return kth_smallest(source, k, stats), k


def share_value(values, percent: float, top: bool) -> Tuple[float, int]:
    """top_share_value (top) or bottom_share_value of values held in memory (a float64 numpy
    array with no NaN, reordered in place): the same (v, k)."""
    n = len(values)
    if not n:
        raise ValueError("no values")
    k = share_rank(n, percent)
    i = n - k if top else k - 1  # the k-th largest is the (n - k + 1)-th smallest
    values.partition(i)
    return float(values[i]), k


SAMPLE = 1 << 16  # values looked at to bracket the rank before the one pass over the column


def share_of_chunks(chunks, percent: float, top: bool) -> Tuple[float, int, int]:
    """(v, k, n) of a --top (top) or --bottom share over float64 arrays held in memory, NaN for a
    missing value (left out of n): the (v, k) of share_value over the values, n the values counted.
    The arrays are not changed. An evenly spaced sample of SAMPLE values brackets the rank with a
    margin; one pass counts the values under the bracket and keeps those inside it, and the rank is
    taken there with numpy's partition (exact). Memory beyond the arrays: the bracket's values, a
    few per cent of the column; a bracket that misses the rank (values in an adversarial order)
    costs one copy of the column, partitioned whole."""
    import numpy as np
    chunks = [c for c in chunks if len(c)]
    total = sum(len(c) for c in chunks)
    step = max(1, total // SAMPLE)
    sample = np.concatenate([c[::step] for c in chunks] or [np.empty(0)])
    sample = np.sort(sample[~np.isnan(sample)])
    counted = [(len(c) - int(np.count_nonzero(np.isnan(c))), c) for c in chunks]
    n = sum(m for m, _ in counted)
    if not n:
        return math.nan, 0, 0
    k = share_rank(n, percent)
    rank = n - k + 1 if top else k  # 1-based, among the values in ascending order
    if len(sample):
        m = len(sample)
        at, margin = (rank - 0.5) / n * m, 4 * math.sqrt(m) + 8
        lo = sample[max(0, int(at - margin))] if at - margin > 0 else -math.inf
        hi = sample[min(m - 1, int(at + margin))] if at + margin < m - 1 else math.inf
        below = sum(int(np.count_nonzero(c < lo)) for _, c in counted)
        if below < rank:
            with np.errstate(invalid="ignore"):
                inside = np.concatenate([c[(c >= lo) & (c <= hi)] for _, c in counted])
            if rank - below <= len(inside):
                return float(np.partition(inside, rank - below - 1)[rank - below - 1]), k, n
    values = np.concatenate([c[~np.isnan(c)] for _, c in counted])  # the bracket missed: the whole column
    return float(np.partition(values, rank - 1)[rank - 1]), k, n
