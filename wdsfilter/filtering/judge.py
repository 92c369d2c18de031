"""A shard's score rows counted against the thresholds: rows, kept, drops per reason, and per
threshold kept/dropped/without a score; what `wdsfilter filter` reports.

Two ways to the same counts: row by row (`count_rows`, over apply.judge_shard, which the HTML report
needs to see every row) and a whole Parquet table at once with numpy over pyarrow's columns
(`count_table`), which `filter` uses when no report looks at the rows: 4 million rows in 400 files
are counted at the speed of the file reads, not of a Python loop per row. Which row is kept, and
every reason's text, is still decided by the one rule (rules.drop_reason and thresholds.Bound):
the table path only picks the rows each reason applies to (tests/test_filter_judge.py holds the
two paths to the same counts, reasons in the same order).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


@dataclass
class ShardCounts:
    rows: int = 0
    kept: int = 0
    reasons: List[Tuple[str, int]] = field(default_factory=list)  # drop reason -> rows, in order of first row
    thresholds: List[Dict[str, int]] = field(default_factory=list)  # per threshold: kept, dropped, no_score

    def add_to(self, result, reasons: Counter) -> None:
        """Into a FilterResult and its Counter of reasons (a reason first seen earlier keeps its place)."""
        result.rows += self.rows
        result.kept += self.kept
        for reason, n in self.reasons:
            reasons[reason] += n
        for total, mine in zip(result.counts, self.thresholds):
            for name, n in mine.items():
                total[name] += n


def count_rows(judged: Iterable[tuple], thresholds: Sequence) -> ShardCounts:
    """Counts of (row, reason) pairs, reason None for a kept row (apply.judge_shard)."""
    out = ShardCounts(thresholds=[{"kept": 0, "dropped": 0, "no_score": 0} for _ in thresholds])
    reasons: Counter = Counter()
    for row, reason in judged:
        out.rows += 1
        if reason is None:
            out.kept += 1
        else:
            reasons[reason] += 1
        for t, c in zip(thresholds, out.thresholds):
            ok = t.passes(row.get(t.column))
            c["no_score" if ok is None else "kept" if ok else "dropped"] += 1
    out.reasons = list(reasons.items())
    return out


def count_table(path: str, thresholds: Sequence) -> Optional[ShardCounts]:
    """The counts of count_rows(judge_shard(...)) for one Parquet score file, read column-wise;
    None for a file whose rows lack keys, or that this fast path cannot read as written (count it
    row by row: the run folder's reader names what is damaged)."""
    table = read_shard_table(path, [t.column for t in thresholds])
    return None if table is None else table.count(thresholds)


@dataclass
class ShardTable:
    """What count_table needs of one Parquet score file, read once: what does not depend on the
    thresholds' values (rows, the rows kept by their status and key, the drops that come first)
    and the threshold columns as float64 (NaN: no value). `wdsfilter filter --top` reads every
    file once into these, resolves its shares from `numbers` and counts from them."""
    rows: int
    first_seen: List[Tuple[int, str, int]]  # (first row, reason, rows) of the drops before the thresholds
    open_rows: object  # bool numpy array: rows still kept after status and duplicate keys
    numbers: Dict[str, object]  # threshold column -> float64 numpy array, NaN where missing

    def count(self, thresholds: Sequence) -> ShardCounts:
        """ShardCounts of this file against resolved thresholds (rules.Threshold)."""
        import numpy as np
        n = self.rows
        open_rows, first_seen = self.open_rows.copy(), list(self.first_seen)
        out = ShardCounts(rows=n)
        for t in thresholds:
            values = self.numbers[t.column]
            missing = np.isnan(values)
            with np.errstate(invalid="ignore"):  # NaN compares False
                passes = (values >= t.value if t.minimum else values <= t.value) & ~missing
            kept, no_score = int(passes.sum()), int(missing.sum())
            out.thresholds.append({"kept": kept, "dropped": n - kept - no_score, "no_score": no_score})
            for rows, value in ((open_rows & missing, None), (open_rows & ~missing & ~passes, True)):
                if rows.any():
                    i = int(np.argmax(rows))
                    first_seen.append((i, t.bound.drop_reason(None if value is None else values[i].item()),
                                       int(rows.sum())))
            open_rows &= passes
        out.kept = int(open_rows.sum())
        out.reasons = [(reason, rows) for _, reason, rows in sorted(first_seen, key=lambda x: x[0])]
        return out


def read_shard_table(path: str, columns: Sequence[str]) -> Optional[ShardTable]:
    """A ShardTable of one Parquet score file with `columns` (the threshold columns); None where
    count_table would be None."""
    from ..runfolder.tables import _arrow_errors
    try:
        return _read_shard_table(path, columns)
    except _arrow_errors():
        return None


def _read_shard_table(path: str, columns: Sequence[str]) -> Optional[ShardTable]:
    import numpy as np

    from ..runfolder.keep import KEPT_STATUSES
    from ..runfolder.tables import open_parquet, unique_keys
    from .rules import drop_reason
    from .apply import DUPLICATE
    # The keys are read only when the writer did not record that none repeats (most of the read).
    read_keys = not unique_keys(path)
    wanted = list(dict.fromkeys([*(["key"] if read_keys else []), "status", *columns]))
    # a Parquet file of another schema is the reader's one-line error (check_schema); strings as
    # codes: no Python str per row
    pf = open_parquet(path, dictionary=["key", "status"])
    present = set(pf.schema_arrow.names)
    table = pf.read(columns=[c for c in wanted if c in present], use_threads=False)
    n = table.num_rows
    if read_keys and ("key" not in table.column_names or table.column("key").null_count):
        return None  # rows without a key: judge_shard's own way (each such row a duplicate of the first)
    table = table.unify_dictionaries()
    first_seen: List[Tuple[int, str, int]] = []  # (first row, reason, rows)
    # A key repeated in a shard is judged once, at its first row (as judge_shard does).
    open_rows = np.ones(n, dtype=bool)
    keys, names = _codes(table, "key", n) if read_keys else (None, None)
    if read_keys and (names is None or len(names) < n):
        open_rows[:] = False
        open_rows[np.unique(keys, return_index=True)[1]] = True
        first_seen.append((int(np.argmin(open_rows)), DUPLICATE, int(n - open_rows.sum())))
    status, values = _codes(table, "status", n)
    values = values.to_pylist() if values is not None else []  # a few distinct statuses
    usable = np.isin(status, [i for i, v in enumerate(values) if v in KEPT_STATUSES])
    not_kept = np.flatnonzero(open_rows & ~usable)
    if len(not_kept):  # rare rows: their reason is the one rule's, row by row (the column read for them only)
        reason = pf.read(columns=["reason"], use_threads=False).column(0).to_pylist() \
            if "reason" in present else [None] * n
        by_row = [(int(i), drop_reason({"status": None if np.isnan(status[i]) else values[int(status[i])],
                                        "reason": reason[i]}, ())) for i in not_kept]
        first_seen += _grouped(by_row)
    open_rows &= usable
    numbers = {c: _numbers(table, c, n) for c in dict.fromkeys(columns)}
    return ShardTable(n, first_seen, open_rows, numbers)


def _grouped(by_row: List[Tuple[int, str]]) -> List[Tuple[int, str, int]]:
    counts: Dict[str, List[int]] = {}
    for i, reason in by_row:
        counts.setdefault(reason, [i, 0])[1] += 1
    return [(i, reason, n) for reason, (i, n) in counts.items()]


def _codes(table, column: str, n: int):
    """(a dictionary column's codes as float64, NaN for null; its values as an Arrow array), the
    dictionaries unified."""
    import numpy as np

    from ..runfolder.tables import float_values
    chunks = table.column(column).chunks if column in table.column_names else []
    if not chunks:  # no such column (or no rows): every row null
        return np.full(n, np.nan), None
    codes = np.concatenate([float_values(c.indices) for c in chunks])
    return codes, chunks[0].dictionary


def _numbers(table, column: str, n: int):
    """The column as float64, a missing value (null, NaN, no such column) as NaN."""
    import numpy as np

    from ..runfolder.tables import float_values
    if column not in table.column_names:
        return np.full(n, np.nan)
    return float_values(table.column(column))  # as the quantile reads them (read_numbers)
