"""A run's score rows judged against resolved thresholds (Threshold: a Bound and where it came
from) by the one keep rule (keep.py), and counted: rows, kept, drops per reason, and per threshold
kept/dropped/without a score (FilterResult); what `wdsfilter filter` prints and what the run's
report (wdsfilter/report/, `score` and `filter` alike) shows. Below score/ and filtering/.

Two ways to the same counts: row by row (`count_rows`, over judge_shard, which the HTML report
needs to see every row) and a whole Parquet table at once with numpy over pyarrow's columns
(`count_table`), which `filter` uses when no report looks at the rows: 4 million rows in 400 files
are counted at the speed of the file reads, not of a Python loop per row. Which row is kept, and
every reason's text, is still decided by the one rule (drop_reason and thresholds.Bound):
the table path only picks the rows each reason applies to (tests/test_filter_judge.py holds the
two paths to the same counts, reasons in the same order).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .keep import keep_reason, KEPT_STATUSES
from .reader import ScoredShard, ScoreRun
from .shares import Threshold, bounds  # noqa: F401 - judged here, resolved there
from .tables import format_for, in_threads, read_batches
from .parquet import ColumnFile, float_values, parquet_errors

DUPLICATE = "duplicate key in shard"


@dataclass
class FilterResult:
    scores_dir: str
    rows: int = 0
    kept: int = 0
    thresholds: List[Threshold] = field(default_factory=list)
    counts: List[Dict[str, int]] = field(default_factory=list)  # per threshold: kept, dropped, no_score
    reasons: Dict[str, int] = field(default_factory=dict)  # dropped rows by their first reason
    shards: int = 0  # score files read
    unfinished: List[str] = field(default_factory=list)  # shards of the scoring run left out (no usable score file)
    dedup: Optional[Dict[str, int]] = None  # --dedup: kept, duplicate, eval_match (wdsfilter/runfolder/dedup.py)
    selection: Optional[object] = None  # the resolved wdsfilter.Selection: the loader call, thresholds.json
    uids: Optional[Dict[str, object]] = None  # --export-uids: path, written, without_uid (filtering/uids.py)
    sizes: Optional[Dict[str, int]] = None  # written shards -> samples
    files: Dict[str, str] = field(default_factory=dict)
    dry_run: bool = False

    def format_text(self) -> str:
        m = self.rows
        lines = [f"{m} rows in {self.shards} finished shard(s) of {self.scores_dir}"]
        if self.unfinished:
            n = len(self.unfinished)
            lines.append(f"  INCOMPLETE: {n} shard(s) of the scoring run have no complete score file (failed, not "
                         f"scored yet, or the file is missing or damaged): their samples are not counted or written; "
                         f"finish them with `wdsfilter score ... --resume`: "
                         f"{', '.join(self.unfinished[:3])}{' ...' if n > 3 else ''}")
        for t, c in zip(self.thresholds, self.counts):
            extra = f" ({c['no_score']} of them without a {t.column})" if c["no_score"] else ""
            lines.append(f"  {t.describe()} ({t.given}): {c['kept']} of {m} kept, {m - c['kept']} dropped{extra}")
            if t.share is not None:
                ties = c["kept"] - t.rank
                share = 100.0 * c["kept"] / t.scored
                lines.append(f"    {t.share:g}% of the {t.scored} rows with a {t.column} is {t.rank} rows; "
                             + (f"{ties} more tie with the cut value {t.value:.6g} and are kept too "
                                f"(kept share {share:.2f}%)" if ties else "no ties at the cut value"))
        if self.dedup is not None:
            d = self.dedup
            lines.append(f"  dedup (one survivor per duplicate group, no eval match): {d['kept']} of {m} kept, "
                         f"{m - d['kept']} dropped ({d['duplicate']} duplicates, {d['eval_match']} eval matches)")
        lines.append(f"  all thresholds: {self.kept} of {m} kept, {m - self.kept} dropped"
                     if self.thresholds or self.dedup is not None else f"  no thresholds: {self.kept} of {m} kept (every scored row), "
                                             f"{m - self.kept} dropped")
        if self.reasons:
            lines.append("  dropped, by first reason:")
            lines += [f"    {n:>8}  {r}" for r, n in self.reasons.items()]
        if self.sizes is not None:
            lines.append(f"  wrote {sum(self.sizes.values())} samples into {len(self.sizes)} shard(s)")
        if self.dry_run:
            lines.append("  dry run: nothing written")
        elif not self.files and self.sizes is None and self.uids is None:
            lines.append("  nothing written: --save writes thresholds.json and filter_report.html into "
                         f"{self.scores_dir}, --write-shards OUT the kept samples")
        if self.uids is not None:
            u = self.uids
            lines.append(f"  uids of the {u['written']} kept samples: {u['path']} (DataComp's subset format)"
                         + (f"; {u['without_uid']} kept sample(s) without a uid left out" if u["without_uid"] else ""))
        for name, path in self.files.items():
            lines.append(f"  {name}: {path}")
        if self.selection:
            lines.append(f"  in training: {self.selection.loader_call(self.scores_dir)}")
        return "\n".join(lines)


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
    """Counts of (row, reason) pairs, reason None for a kept row (run.judge_shard)."""
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
    open_rows: object  # bool numpy array: rows still kept after status and duplicate keys; None: every row
    numbers: Dict[str, object]  # threshold column -> float64 numpy array, NaN where missing

    def count(self, thresholds: Sequence) -> ShardCounts:
        """ShardCounts of this file against resolved thresholds (rules.Threshold)."""
        import numpy as np
        n = self.rows
        open_rows, first_seen = self.open_rows, list(self.first_seen)
        out = ShardCounts(rows=n)
        for t in thresholds:
            values = self.numbers[t.column]
            missing = np.isnan(values)
            with np.errstate(invalid="ignore"):  # NaN compares False: a missing value never passes
                passes = values >= t.value if t.minimum else values <= t.value
            kept, no_score = int(np.count_nonzero(passes)), int(np.count_nonzero(missing))
            out.thresholds.append({"kept": kept, "dropped": n - kept - no_score, "no_score": no_score})
            if open_rows is None:  # every row still open: the failing rows are the missing ones and the rest
                drops = [(missing, None, no_score), (~(passes | missing), True, n - kept - no_score)]
                open_rows = passes
            else:
                failing = open_rows & ~passes
                drops = [(failing & missing, None, None), (failing & ~missing, True, None)]
                open_rows = open_rows & passes
            for rows, value, count in drops:
                count = int(np.count_nonzero(rows)) if count is None else count
                if count:
                    i = int(np.argmax(rows))
                    first_seen.append((i, t.bound.drop_reason(None if value is None else values[i].item()), count))
        out.kept = n if open_rows is None else int(np.count_nonzero(open_rows))
        out.reasons = [(reason, rows) for _, reason, rows in sorted(first_seen, key=lambda x: x[0])]
        return out


def read_shard_table(path: str, columns: Sequence[str]) -> Optional[ShardTable]:
    """A ShardTable of one Parquet score file with `columns` (the threshold columns); None where
    count_table would be None."""
    try:
        return _read_shard_table(path, columns)
    except parquet_errors():
        return None


def _read_shard_table(path: str, columns: Sequence[str]) -> Optional[ShardTable]:
    import numpy as np

    # a Parquet file of another schema is the reader's one-line error (check_schema); strings as
    # codes: no Python str per row; the footer read by this open (once)
    file = ColumnFile(path, dictionary=["key", "status", "reason"])
    # The keys are read only when the writer did not record that none repeats (most of the read),
    # the status only when the footer's statistics do not say every row has one kept status.
    read_keys = not file.unique_keys
    by_footer = _footer_all_kept(file.metadata, file.schema)
    # (with the status, its reason: what a row not kept is dropped for, in the same read)
    wanted = [*(["key"] if read_keys else []), *([] if by_footer else ["status", "reason"]), *columns]
    table = file.read(wanted or ["status"])
    n = file.metadata.num_rows
    if any(len(c) != n for c in table.values()):
        return None  # rows the footer does not count: the row by row way names the damage
    if read_keys and ("key" not in table or table["key"].null_count):
        return None  # rows without a key: judge_shard's own way (each such row a duplicate of the first)
    if "reason" in table and not _is_dictionary(table["reason"]):
        return None  # reasons that are not strings (not what `wdsfilter score` writes): row by row
    for c in ("key", "status", "reason"):
        if c in table and table[c].num_chunks > 1:
            table[c] = table[c].unify_dictionaries()  # one dictionary per column for _codes
    first_seen: List[Tuple[int, str, int]] = []  # (first row, reason, rows)
    # A key repeated in a shard is judged once, at its first row (as judge_shard does).
    open_rows = None  # every row (no array for the common case: unique keys, every status kept)
    keys, names = _codes(table, "key", n) if read_keys else (None, None)
    if read_keys and (names is None or len(names) < n):
        open_rows = np.zeros(n, dtype=bool)
        open_rows[np.unique(keys, return_index=True)[1]] = True
        first_seen.append((int(np.argmin(open_rows)), DUPLICATE, int(n - open_rows.sum())))
    if not (by_footer or _all_kept(table, n)):  # else every status this file holds keeps its row
        status, values = _codes(table, "status", n)
        values = values.to_pylist() if values is not None else []  # a few distinct statuses
        usable = np.isin(status, [i for i, v in enumerate(values) if v in KEPT_STATUSES])
        not_kept = np.flatnonzero(~usable if open_rows is None else open_rows & ~usable)
        if len(not_kept):  # rows not kept by their status: the one rule's reason, once per distinct (status, reason)
            first_seen += _status_drops(not_kept, status[not_kept], values, table, n)
        open_rows = usable if open_rows is None else open_rows & usable
    numbers = {c: _numbers(table, c, n) for c in dict.fromkeys(columns)}
    return ShardTable(n, first_seen, open_rows, numbers)


def _footer_all_kept(metadata, schema) -> bool:
    """The writer's statistics in the footer (read already) say that every row group's status
    column holds one kept status and no null: the column need not be read. Like the unique keys
    the writer records (tables.KEYS_META), what the file says of itself; a footer without them
    (another writer, no statistics) is read the ordinary way."""
    index = schema.get_field_index("status")
    if index < 0:
        return False
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if index >= group.num_columns:
            return False
        chunk = group.column(index)
        stats = chunk.statistics
        if chunk.path_in_schema != "status" or stats is None or not stats.has_min_max or not stats.has_null_count \
                or stats.null_count != 0 or stats.num_values != group.num_rows or stats.min != stats.max \
                or stats.min not in KEPT_STATUSES:
            return False
    return True


def _all_kept(table: dict, n: int) -> bool:
    """No row's status is null and every value of the status dictionaries is a kept status."""
    if "status" not in table:
        return n == 0
    import pyarrow as pa
    column = table["status"]
    return pa.types.is_dictionary(column.type) and column.null_count == 0 and all(v in KEPT_STATUSES for c in column.chunks
                                          for v in c.dictionary.to_pylist())


def _is_dictionary(column) -> bool:
    import pyarrow as pa
    return pa.types.is_dictionary(column.type)


def _status_drops(rows, status, statuses: list, table, n: int) -> List[Tuple[int, str, int]]:
    """(first row, reason, rows) of the rows not kept by their status (`rows`, their status codes
    `status`), grouped by drop_reason's text, which is asked once per distinct (status, reason)."""
    import numpy as np
    reasons, given = _codes(table, "reason", n)
    given = given.to_pylist() if given is not None else []
    s = np.where(np.isnan(status), -1, status).astype(np.int64)  # -1: no status, no reason
    r = reasons[rows]
    r = np.where(np.isnan(r), -1, r).astype(np.int64)
    _, first, counts = np.unique((s + 1) * (len(given) + 1) + (r + 1), return_index=True, return_counts=True)
    out: Dict[str, List[int]] = {}
    for f, c in zip(first.tolist(), counts.tolist()):
        text = drop_reason({"status": statuses[s[f]] if s[f] >= 0 else None,
                            "reason": given[r[f]] if r[f] >= 0 else None}, ())
        row = int(rows[f])
        seen = out.setdefault(text, [row, 0])
        seen[0], seen[1] = min(seen[0], row), seen[1] + c
    return [(row, text, c) for text, (row, c) in out.items()]


def _codes(table, column: str, n: int):
    """(a dictionary column's codes as float64, NaN for null; its values as an Arrow array), the
    dictionaries unified."""
    import numpy as np

    chunks = table[column].chunks if column in table else []
    if not chunks:  # no such column (or no rows): every row null
        return np.full(n, np.nan), None
    codes = np.concatenate([float_values(c.indices) for c in chunks])
    return codes, chunks[0].dictionary


def _numbers(table, column: str, n: int):
    """The column as float64, a missing value (null, NaN, no such column) as NaN."""
    import numpy as np

    if column not in table:
        return np.full(n, np.nan)
    return float_values(table[column])  # as the quantile reads them (read_numbers)


def drop_reason(row: dict, thresholds: Sequence[Threshold]) -> Optional[str]:
    """Why a score row is not kept (None: kept): the first reason of runfolder.keep_reason."""
    drop = keep_reason(row, [t.bound for t in thresholds])
    return None if drop is None else drop.reason


def judge_shard(shard: ScoredShard, thresholds: Sequence[Threshold], extra: Sequence[str] = (),
                dropped: Optional[Dict[int, tuple]] = None) -> Iterator[tuple]:
    """(row, reason) per row of one score file, in order; reason None means kept. A key repeated
    in a shard is judged once (its first row), as the loader does. dropped: --dedup's verdicts,
    {index: (key, reason)} (wdsfilter/runfolder/dedup.py), applied after the thresholds."""
    columns = ["key", "index", "status", "reason", "message", *[t.column for t in thresholds], *extra]
    seen = set()
    for batch in read_batches(shard.score_file, columns):
        names = list(batch)
        for i in range(len(batch["key"])):
            row = {c: batch[c][i] for c in names}
            key = row["key"]
            if key in seen:
                yield row, DUPLICATE
                continue
            seen.add(key)
            reason = drop_reason(row, thresholds)
            if reason is None and dropped and row["index"] in dropped:
                reason = dropped[row["index"]][1]
            yield row, reason


def observed(judged: Iterator[tuple], collector, shard, dropped: Optional[Dict[int, tuple]] = None,
              dedup_counts: Optional[dict] = None) -> Iterator[tuple]:
    for row, reason in judged:
        if dropped is not None:  # --dedup: each row's verdict counted (kept, not a survivor, eval match)
            verdict = dropped.get(row["index"])
            dedup_counts[verdict[1] if verdict else "kept"] += 1
        if collector is not None:
            collector.observe(shard, row, reason)
        yield row, reason


def count_run(run: ScoreRun, thresholds: Sequence[Threshold], collector, marks, result: FilterResult,
              tables: Optional[list] = None, progress=None) -> None:
    """Every finished shard's rows judged and counted into `result` (rows, kept, per threshold,
    reasons; --dedup's verdicts). tables: a ShardTable per shard (None: count that file another
    way) when the files were read already (filter's shares: filtering/apply._read_tables).
    progress: a progress.Progress told of each score file counted."""
    tick = progress.update if progress is not None else (lambda: None)
    reasons: Counter = Counter()
    if marks is not None:
        result.dedup = {"kept": 0, "duplicate": 0, "eval_match": 0}
    # Without a report or --dedup nothing looks at single rows: a Parquet table is counted
    # column-wise, a few files at a time (pyarrow reads without the GIL); the counts add up in order.
    tabled = [None] * len(run.shards)
    if not all(t.numeric for t in thresholds):  # a text column's rule (--equal): judged row by row
        pass
    elif tables is not None and collector is None and marks is None:
        tabled = [t.count(thresholds) if t is not None else None for t in tables]
    elif collector is None and marks is None:
        def counted(s: ScoredShard):
            counts = count_table(s.score_file, thresholds) if format_for(s.score_file).columnar else None
            if counts is not None:
                tick()
            return counts
        tabled = in_threads(counted, run.shards)
    for shard, counts in zip(run.shards, tabled):
        dropped = marks.dropped(shard.name) if marks is not None else None
        if counts is None:
            judged = judge_shard(shard, thresholds, collector.columns if collector else (), dropped)
            counts = count_rows(observed(judged, collector, shard, dropped, result.dedup), thresholds)
            tick()
        counts.add_to(result, reasons)
    result.reasons = dict(reasons.most_common())
