"""`wdsfilter filter`: judge every score row against thresholds chosen after scoring, count,
and optionally write the kept samples into new shards (runfolder/reshard.py) and a report
(wdsfilter/report/): write.py, imported only when something may be written.

    from wdsfilter.filtering import filter_scores
    result = filter_scores("scores/", top_shares={"clip_score": 30}, max_scores={"ocr_area": 0.2},
                           write_shards="train/", samples_per_shard=1000)
    print(result.format_text())

No model is loaded and torch is never imported: only the score files (and, to copy samples or
draw thumbnails, the source shards) are read, shard by shard, so memory does not grow with the
number of rows.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from ..runfolder import ScoredShard, ScoreRun, quantile  # its IN_MEMORY_ROWS read at each call (tests lower it)
from ..runfolder.names import FILTER_REPORT, REPORT
from ..runfolder.judge import FilterResult, count_run, read_shard_table
from ..runfolder.shares import check_present
from ..core.progress import Passes
from ..core.selection import Selection, selection_of, warn_renamed
from .rules import resolve_selection
from ..core.errors import ConfigError
from ..storage.remote import is_fsspec_url  # a bucket's folder by its URL (not abspath's)
from ..runfolder.tables import format_for, in_threads


# The old keywords of filter_scores (the flags' texts, and thresholds= a Thresholds), taken with a
# DeprecationWarning: name -> its Selection.parse keyword
OLD_KEYWORDS = {"mins": "mins", "maxes": "maxes", "tops": "tops", "bottoms": "bottoms"}


@dataclass(frozen=True)
class FilterOptions:
    """What filter_scores writes and how it reads the sources again (its keyword arguments but the
    rules, which are a Selection): checked once, then handed through plan -> count -> write."""
    write_shards: Optional[str] = None
    samples_per_shard: int = 1000
    prefix: str = "shard"
    dry_run: bool = False
    report: Optional[str] = ""
    save: bool = False
    overwrite: bool = False
    save_thresholds: bool = True
    source_root: Optional[str] = None
    allow_pipe: bool = False
    allow_remote: bool = False
    stream_idle_seconds: Optional[float] = None  # None: StageConfig's (write.idle_seconds)
    unique_keys: bool = False
    interleave: int = 0
    export_uids: Optional[str] = None
    progress: bool = False

    def __post_init__(self):
        if self.write_shards is not None and self.samples_per_shard < 1:
            raise ConfigError(f"--samples-per-shard must be >= 1, got {self.samples_per_shard}")
        if self.dry_run and self.export_uids is not None:
            raise ConfigError("--dry-run writes nothing, --export-uids a file: drop one of them")

    def report_path(self, scores_dir: str) -> Optional[str]:
        """The report's path: as given, the default for "" (default_report), None for none."""
        return default_report(scores_dir, self.write_shards, self.save) if self.report == "" else self.report

    def writes_into(self, scores_dir: str, report: Optional[str]) -> bool:
        """Whether this filter writes into the score folder (its lease is then held)."""
        return not self.dry_run and ((self.save_thresholds and (self.save or self.write_shards is not None))
                                     or _inside(report, scores_dir))


def given_selection(selection, rules: dict, old: dict) -> Selection:
    """The selection of filter_scores: selection=, or the keywords every API takes (min_scores=,
    top_shares=, ...; selection.selection_of), or the old ones (mins=["clip_score=0.3"], tops=,
    thresholds=Thresholds), with a DeprecationWarning."""
    unknown = sorted(set(old) - set(OLD_KEYWORDS) - {"thresholds"})
    if unknown:
        raise TypeError(f"filter_scores() got an unexpected keyword argument {unknown[0]!r}")
    texts = {k: tuple(v or ()) for k, v in old.items() if k in OLD_KEYWORDS and v}
    typed = old.get("thresholds")
    for name in [*texts, *(["thresholds"] if typed else [])]:
        new = {"mins": "min_scores", "maxes": "max_scores", "tops": "top_shares", "bottoms": "bottom_shares",
               "thresholds": "min_scores and max_scores"}[name]
        warn_renamed(name, new, "filter_scores")
    out = selection_of(selection, rules, "filter_scores")
    if texts or typed:
        previous = Selection(minima=dict(typed.minima), maxima=dict(typed.maxima)) if typed else Selection()
        out = out.merged(previous).merged(Selection.parse(**texts))
    return out


def filter_scores(scores_dir: str, selection: Optional[Selection] = None, *, write_shards: Optional[str] = None,
                  samples_per_shard: int = 1000, prefix: str = "shard", dry_run: bool = False,
                  report: Optional[str] = "", save: bool = False, overwrite: bool = False,
                  echo: Optional[Callable[[str], None]] = None, save_thresholds: bool = True,
                  source_root: Optional[str] = None, allow_pipe: bool = False, allow_remote: bool = False,
                  stream_idle_seconds: Optional[float] = None, shard_echo: Optional[Callable] = None,
                  unique_keys: bool = False, interleave: int = 0, export_uids: Optional[str] = None,
                  min_scores: Optional[dict] = None, max_scores: Optional[dict] = None,
                  top_shares: Optional[dict] = None, bottom_shares: Optional[dict] = None,
                  equal: Optional[dict] = None, dedup: bool = False, recipe=None, min_clip: Optional[float] = None,
                  max_ocr_area: Optional[float] = None, progress: bool = False, **old) -> FilterResult:
    """Judge, count and write (see the module docstring). The rules: selection= (a
    wdsfilter.Selection) or its keywords (min_scores=, max_scores=, top_shares=, bottom_shares=,
    equal=, dedup=, recipe=, min_clip=, max_ocr_area=: as wdsfilter.loader takes them).

    write_shards: new shards of the kept samples there, with the rules (thresholds.json, the
    loader's keyword arguments) beside them and in SCORES_DIR. Without it nothing is written
    unless asked: save=True writes SCORES_DIR/thresholds.json and SCORES_DIR/filter_report.html,
    report=PATH a report there, export_uids=PATH the kept samples' uids (DataComp's .npy).
    report: a path, "" for the default (beside the shards, or with save), None for none.
    unique_keys, interleave, shard_echo: reshard.Resharder's. save_thresholds=False: no
    thresholds.json at all. source_root: the folder holding the source shards now (moved since
    scoring, or a folder received from someone else): each is read there by its file name, never
    where the folder says. allow_pipe, allow_remote: read source shards that are `pipe:` commands
    or remote URLs again (for write_shards and the report's thumbnails); what the score folder says
    (run.json) never allows them. stream_idle_seconds: such a source that sends nothing this long
    is killed (0: never; None: StageConfig's default), as in every other read of a shard
    (shards.IdleGuard). progress: a
    progress line on stderr (wdsfilter/progress.py) while the score files are counted and while
    the shards are written (the CLI's default; off here)."""
    echo = echo or (lambda line: None)
    rules = dict(min_scores=min_scores, max_scores=max_scores, top_shares=top_shares, bottom_shares=bottom_shares,
                 equal=equal, dedup=dedup, recipe=recipe, min_clip=min_clip, max_ocr_area=max_ocr_area)
    selection = given_selection(selection, rules, old)  # usage errors before any file is read
    opts = FilterOptions(write_shards=write_shards, samples_per_shard=samples_per_shard, prefix=prefix,
                         dry_run=dry_run, report=report, save=save, overwrite=overwrite,
                         save_thresholds=save_thresholds, source_root=source_root, allow_pipe=allow_pipe,
                         allow_remote=allow_remote, stream_idle_seconds=stream_idle_seconds,
                         unique_keys=unique_keys, interleave=interleave, export_uids=export_uids, progress=progress)
    run = ScoreRun.open(scores_dir, source_root)  # not a score folder: say so, before its report path is judged
    report = opts.report_path(scores_dir)
    if dry_run:  # a count: the write side (report, resharder, lease) is not even imported (tools/bench_filter.py)
        with Passes(progress) as passes:
            return _filter_run(run, scores_dir, selection, report, opts, passes)
    from . import write
    write.check_outputs(run, scores_dir, report, opts)  # an output that cannot be written: before any work
    with write.score_folder_lease(scores_dir, writes_there=opts.writes_into(scores_dir, report)), \
            Passes(progress) as passes:
        return _filter_run(run, scores_dir, selection, report, opts, passes, write.Writes(echo, shard_echo))


def _inside(path: Optional[str], folder: str) -> bool:
    if not path or is_fsspec_url(path) or is_fsspec_url(folder):
        return False
    return os.path.dirname(os.path.abspath(path)) == os.path.abspath(folder)


def _filter_run(run: ScoreRun, scores_dir: str, selection: Selection, report: Optional[str], opts: FilterOptions,
                passes: Passes, writes=None) -> FilterResult:
    """filter_scores once its options are checked (under the score folder's lease when it writes
    there): plan (the rules resolved), count, then, unless a dry run, what `writes`
    (write.Writes) writes; each pass on its progress line (`passes`)."""
    counting = passes.start("counting", "score files", total=len(run.shards))
    # Counted column-wise (no report, no --dedup): each score file read once, its threshold columns
    # held for the shares too (judge.ShardTable), instead of a read to resolve and one to count.
    tables = _read_tables(run, selection, counting) if not selection.dedup and (report is None or writes is None) \
        else None
    held = ({c: [t.numbers[c] for t in tables] for c in selection.numeric_columns()}
            if tables is not None and all(t is not None for t in tables) else None)
    resolved = resolve_selection(selection, run, held=held)  # every rule resolved, shares included; dedup's marks
    thresholds, marks = resolved.thresholds, resolved.marks
    result = FilterResult(scores_dir=scores_dir, thresholds=thresholds, shards=len(run.shards),
                          unfinished=run.unfinished, dry_run=writes is None, selection=resolved.selection)
    result.counts = [{"kept": 0, "dropped": 0, "no_score": 0} for _ in thresholds]
    collector = writes.collector(run, thresholds, report, opts) if writes is not None else None
    count_run(run, thresholds, collector, marks, result, tables, counting if tables is None else None)  # else counted there
    passes.end(counting)
    if writes is not None:
        writes.write(run, resolved, result, opts, report, collector, passes)
    return result


def default_report(scores_dir: str, write_shards: Optional[str], save: bool = True) -> Optional[str]:
    """Where filter's report goes unless --report says: beside what it wrote (the new shards),
    else, with --save, filter_report.html in the score folder (never over the score run's own
    report.html); None: exploring without --write-shards or --save writes no report."""
    if write_shards is None:
        return os.path.join(scores_dir, FILTER_REPORT) if save else None
    return os.path.join(write_shards, REPORT)


def _read_tables(run: ScoreRun, spec: Selection, progress=None) -> Optional[list]:
    """A judge.ShardTable per finished shard (None for a file the column-wise path cannot count),
    read a few at a time in threads, each file opened once (its footer with its columns); None for
    a run with a JSON Lines file or of more rows than quantile.IN_MEMORY_ROWS (as its markers
    count them, or as the reads find): its shares stream and its files are counted one by one."""
    import threading

    if not all(format_for(s.score_file).columnar for s in run.shards) or spec.equal:
        return None  # (a text column's rule is judged row by row)
    check_present(spec, run)  # a column the files lack: said before the reads
    if sum(s.rows for s in run.shards) > quantile.IN_MEMORY_ROWS:
        return None
    left, lock = [quantile.IN_MEMORY_ROWS], threading.Lock()  # rows that may still be held: memory bounded by the reads

    def read(shard: ScoredShard):
        if left[0] < 0:
            return None
        table = read_shard_table(shard.score_file, columns)
        with lock:
            left[0] -= table.rows if table is not None else 0
        if progress is not None:
            progress.update()
        return table
    columns = spec.numeric_columns()
    tables = in_threads(read, run.shards, threads=0 if _large_files(run) else 1)
    # resolve() checks every file's column types (check_selection; the footers read by now): a column
    # that does not hold numbers in one file made its table None, and is named there
    if left[0] < 0 and progress is not None:
        progress.n = 0  # counted again, one by one (count_run)
    return None if left[0] < 0 else tables


# Reading in threads pays where pyarrow's decoding (which releases the GIL) outweighs each file's
# Python (the open, the footer, the float64 copies), which holds it. Measured with a free core
# (tools/bench_filter.py, load ~2): 400 files of 10 k rows (~250 KB) in two threads took the same
# wall time as in one and 60% more CPU; 400 files of 100 k rows (~2.3 MB), two threads cut the
# reads' wall time by a third for 5% more CPU.
THREADED_FILE_BYTES = 1 << 20


def _large_files(run: ScoreRun) -> bool:
    """The run's score files average THREADED_FILE_BYTES or more (their sizes on disk)."""
    total = 0
    for s in run.shards:
        try:
            total += os.path.getsize(s.score_file)
        except OSError:
            pass  # its read names the problem
    return total >= THREADED_FILE_BYTES * len(run.shards)
