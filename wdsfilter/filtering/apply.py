"""`wdsfilter filter`: judge every score row against thresholds chosen after scoring, count,
and optionally write the kept samples into new shards (reshard.py) and a report (wdsfilter/report/).

    from wdsfilter.filtering import filter_scores
    result = filter_scores("scores/", tops=["clip_score=30%"], maxes=["ocr_area=0.2"],
                           write_shards="train/", samples_per_shard=1000)
    print(result.format_text())

No model is loaded and torch is never imported: only the score files (and, to copy samples or
draw thumbnails, the source shards) are read, shard by shard, so memory does not grow with the
number of rows.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence

from ..runfolder import ScoredShard, ScoreRun
from ..runfolder.judge import FilterResult, Threshold, count_run, judge_shard
from ..runfolder.reader import check_sources
from ..config import StageConfig
from ..thresholds import Thresholds
from .rules import FilterSpec, resolve, write_thresholds

def _file_state(path: str) -> list:
    # what the file holds, not when it was written: a bucket's score folder is read through a local
    # copy whose times are the copy's (another machine, a fresh cache); the dedup's rule for a copy
    from ..runfolder.dedup import score_file_state
    state = score_file_state(path)
    return [os.path.basename(path), state["bytes"], state["sha256"]]


def kept_keys(shard: ScoredShard, thresholds: Sequence[Threshold], marks=None) -> List[str]:
    dropped = marks.dropped(shard.name) if marks is not None else None
    return [row["key"] for row, reason in judge_shard(shard, thresholds, dropped=dropped) if reason is None]


def _check_outputs(run: ScoreRun, scores_dir: str, write_shards: Optional[str], report: Optional[str],
                   allow_pipe: bool, allow_remote: bool) -> None:
    """What filter writes can be written, and the sources it reads again may be: before any work."""
    from ..writing import check_output_dir, check_output_file, refuse_writing_into_inputs
    if write_shards is not None:  # a bucket's folder too (reshard.Resharder.lock)
        check_output_dir(write_shards, "--write-shards")
        refuse_writing_into_inputs(write_shards, [s.url for s in run.shards])
    if report is not None:
        check_output_file(report, "--report")
    if write_shards is not None or report is not None:  # the sources are read again: refused before any work
        check_sources([s.url for s in run.shards], allow_pipe, allow_remote, scores_dir)


def filter_scores(scores_dir: str, mins: Sequence[str] = (), maxes: Sequence[str] = (), tops: Sequence[str] = (),
                  bottoms: Sequence[str] = (), write_shards: Optional[str] = None, samples_per_shard: int = 1000,
                  prefix: str = "shard", dry_run: bool = False, report: Optional[str] = "",
                  overwrite: bool = False, echo: Optional[Callable[[str], None]] = None,
                  save_thresholds: bool = True, source_root: Optional[str] = None, allow_pipe: bool = False,
                  allow_remote: bool = False,
                  stream_idle_seconds: float = StageConfig.stream_idle_seconds, dedup: bool = False,
                  shard_echo: Optional[Callable] = None, unique_keys: bool = False, interleave: int = 0,
                  thresholds: Optional[Thresholds] = None) -> FilterResult:
    """Judge, count and write (see the module docstring). report: a path, "" for default_report's,
    None for no report. unique_keys, interleave, shard_echo: reshard.Resharder's. save_thresholds: write SCORES_DIR/thresholds.json (the
    resolved thresholds as wdsfilter.loader's keyword arguments). source_root: the folder holding
    the source shards now (moved since scoring, or a folder received from someone else): each is
    read there by its file name, never where the folder says. allow_pipe, allow_remote: read
    source shards that are `pipe:` commands or remote URLs again (for --write-shards and the
    report's thumbnails); what the score folder says (run.json) never allows them.
    stream_idle_seconds: such a source that sends nothing this long is killed (0: never), as in
    every other read of a shard (shards.IdleGuard). thresholds: minima and maxima as a
    thresholds.Thresholds (the scoring run's own), with those of mins/maxes."""
    echo = echo or (lambda line: None)
    spec = FilterSpec.parse(mins, maxes, tops, bottoms, thresholds)  # usage errors before any file is read
    if write_shards is not None and samples_per_shard < 1:
        from ..errors import ConfigError
        raise ConfigError(f"--samples-per-shard must be >= 1, got {samples_per_shard}")
    run = ScoreRun.open(scores_dir, source_root)  # not a score folder: say so, before its report path is judged
    if not dry_run and (write_shards is not None or report is not None):
        run.require_sources()  # sources only where the run's own record names them
    report = default_report(scores_dir, write_shards) if report == "" else report
    if not dry_run:  # an output that cannot be written is a usage error, found before any work
        _check_outputs(run, scores_dir, write_shards, report, allow_pipe, allow_remote)
    marks = None
    if dedup:  # `wdsfilter dedup`'s verdicts: survivors only, no eval match
        from ..runfolder.dedup import DedupMarks
        marks = DedupMarks(run.folder, [(s.name, s.score_file) for s in run.shards])
    # Counted column-wise (no report, no --dedup): each score file read once, its threshold columns
    # held for the shares too (judge.ShardTable), instead of a read to resolve and one to count.
    tables = _read_tables(run, spec) if marks is None and (report is None or dry_run) else None
    held = ({c: [t.numbers[c] for t in tables] for c in spec.columns()}
            if tables is not None and all(t is not None for t in tables) else None)
    thresholds = resolve(spec, run, held=held)  # from here: every bound resolved (rules.Threshold), shares included
    result = FilterResult(scores_dir=scores_dir, thresholds=thresholds, shards=len(run.shards),
                          unfinished=run.unfinished, dry_run=dry_run)
    result.counts = [{"kept": 0, "dropped": 0, "no_score": 0} for _ in thresholds]
    collector = None
    if report is not None and not dry_run:
        from ..report.collect import ReportCollector
        collector = ReportCollector(run, thresholds, allow_pipe, allow_remote, stream_idle_seconds)
    count_run(run, thresholds, collector, marks, result, tables)
    if dry_run:
        return result
    if thresholds and save_thresholds:
        result.files["thresholds (loader keyword arguments)"] = write_thresholds(
            os.path.join(scores_dir, "thresholds.json"), thresholds)
    if write_shards is not None:
        from .reshard import Resharder, Source  # imports the score package's shard writer: only to write
        stage = run.stage
        writer = Resharder(write_shards, samples_per_shard, prefix, stage.get("rekey", "first-dot"), allow_pipe,
                           allow_remote, stream_idle_seconds, shard_echo, unique_keys, interleave,
                           writes_report=report is not None and _same_path(report, default_report(scores_dir, write_shards)))
        from ..remote import is_fsspec_url, redact_url  # a bucket's folder by its URL (not abspath's)
        identity = {"scores": scores_dir if is_fsspec_url(scores_dir) else os.path.abspath(scores_dir), "thresholds": [[t.column, t.minimum, t.value] for t in thresholds],
                    **({"dedup": marks.summary.get("settings")} if marks is not None else {}),
                    "samples_per_shard": samples_per_shard, "prefix": prefix, **writer.layout(),
                    "sources": [redact_url(s.url) for s in run.shards],  # OUT is published: no password
                    # what the rows were: a shard scored again (score --resume) is other data
                    "score_files": [_file_state(s.score_file) for s in run.shards]}
        with writer.lock():
            whole = writer.prepare(identity, overwrite, result.kept)
            if whole:
                echo(f"resume: {whole} shard(s) in {write_shards} are already whole")
            sources = (Source(s.url, kept_keys(s, thresholds, marks), s.source) for s in run.shards)
            result.sizes = writer.write(sources)
        result.files["shards"] = write_shards
    if collector is not None:
        from ..report.page import write_report
        result.files["report"] = write_report(collector.finish(result), report)
    return result


def _same_path(a: str, b: str) -> bool:
    from ..remote import is_fsspec_url
    return a.rstrip("/") == b.rstrip("/") if is_fsspec_url(a) or is_fsspec_url(b) else \
        os.path.abspath(a) == os.path.abspath(b)


def default_report(scores_dir: str, write_shards: Optional[str]) -> str:
    """Where filter's report goes unless --report says: beside what it wrote (the new shards),
    else filter_report.html in the score folder; never over the score run's own report.html."""
    if write_shards is None:
        return os.path.join(scores_dir, "filter_report.html")
    from .reshard import REPORT  # one of the files filter owns in OUT: never one of the user's replaced
    return os.path.join(write_shards, REPORT)


def _read_tables(run: ScoreRun, spec: FilterSpec) -> Optional[list]:
    """A judge.ShardTable per finished shard (None for a file the column-wise path cannot count),
    read a few at a time in threads, each file opened once (its footer with its columns); None for
    a run with a JSON Lines file or of more rows than quantile.IN_MEMORY_ROWS (as its markers
    count them, or as the reads find): its shares stream and its files are counted one by one."""
    import threading

    from ..runfolder.judge import read_shard_table
    from ..runfolder.quantile import IN_MEMORY_ROWS
    from ..runfolder.tables import in_threads
    if not all(s.score_file.endswith(".parquet") for s in run.shards):
        return None
    run.check_columns(spec.columns(), "thresholds")  # a column the files lack: said before the reads
    if sum(s.rows for s in run.shards) > IN_MEMORY_ROWS:
        return None
    left, lock = [IN_MEMORY_ROWS], threading.Lock()  # rows that may still be held: memory bounded by the reads

    def read(shard: ScoredShard):
        if left[0] < 0:
            return None
        table = read_shard_table(shard.score_file, columns)
        with lock:
            left[0] -= table.rows if table is not None else 0
        return table
    columns = spec.columns()
    tables = in_threads(read, run.shards)
    # resolve() checks every file's column types (check_spec; the footers read by now): a column
    # that does not hold numbers in one file made its table None, and is named there
    return None if left[0] < 0 else tables
