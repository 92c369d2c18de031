"""What `wdsfilter filter` writes, once the rules are resolved and the rows counted (apply.py):
the outputs checked before any work, the score folder's lease, the report's collector, the
kept samples as new shards (runfolder/reshard.py), thresholds.json, the report and the uids.

A count (`--dry-run`) writes nothing and never imports this module, nor the report and the
resharder it imports: their imports were a tenth of a dry run over 4 M rows (tools/bench_filter.py).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

from ..runfolder import ScoreRun
from ..runfolder.names import REPORT, THRESHOLDS
from ..runfolder.lease import Lease
from ..runfolder.judge import FilterResult
from ..runfolder.reader import check_sources
from ..core.progress import Passes
from .rules import write_thresholds
from ..storage.writing import check_output_dir, check_output_file, refuse_writing_into_inputs
from .uids import check_export, export_kept_uids
from ..report.collect import ReportCollector
from ..report.page import write_report
from ..storage.remote import is_fsspec_url
from ..runfolder.reshard import Resharder, reshard_run
from ..stream.config import StageConfig


def idle_seconds(opts) -> float:
    """How long a source shard read again may send nothing before it is killed: the option, or
    StageConfig's default (apply.py leaves it None: a count never imports the stage options)."""
    return StageConfig.stream_idle_seconds if opts.stream_idle_seconds is None else opts.stream_idle_seconds


def check_outputs(run: ScoreRun, scores_dir: str, report: Optional[str], opts) -> None:
    """What filter writes can be written, and the sources it reads again may be: before any work.
    opts: apply.FilterOptions."""
    write_shards = opts.write_shards
    if write_shards is not None or report is not None:
        run.require_sources()  # sources only where the run's own record names them
    if opts.export_uids is not None:
        check_export(opts.export_uids, run)
    if write_shards is not None:  # a bucket's folder too (reshard.Resharder.lock)
        check_output_dir(write_shards, "--write-shards")
        refuse_writing_into_inputs(write_shards, [s.url for s in run.shards])
    if report is not None:
        check_output_file(report, "--report")
    if write_shards is not None or report is not None:  # the sources are read again: refused before any work
        check_sources([s.url for s in run.shards], opts.allow_pipe, opts.allow_remote, scores_dir)


def score_folder_lease(scores_dir: str, writes_there: bool):
    """The score folder's lease while filter writes into it (thresholds.json, filter_report.html):
    refused while a score run (or a worker of a joined run) holds the folder, and every write
    fenced on a local disk, as score's and dedup's are (runfolder/lease.py). In a bucket the lease
    excludes a score run as well; the one-object writes there are not conditional on it."""
    if not writes_there:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def held():
        with Lease(scores_dir, command="filter", option="RUN") as lease:
            if not is_fsspec_url(scores_dir):
                lease.guard([scores_dir])
            yield
    return held()


class Writes:
    """The write side of one filter_scores call (not a dry run): the report's collector, then
    every output, in order. echo: the summary's lines; shard_echo: a line per shard written."""

    def __init__(self, echo: Callable[[str], None], shard_echo: Optional[Callable] = None):
        self.echo, self.shard_echo = echo, shard_echo

    @staticmethod
    def collector(run: ScoreRun, thresholds, report: Optional[str], opts) -> Optional[ReportCollector]:
        """What the report shows, gathered while the rows are judged (None: no report)."""
        if report is None:
            return None
        return ReportCollector(run, thresholds, opts.allow_pipe, opts.allow_remote, idle_seconds(opts))

    def write(self, run: ScoreRun, resolved, result: FilterResult, opts, report: Optional[str], collector,
              passes: Passes) -> None:
        """The uids, thresholds.json, the new shards and the report, as opts (apply.FilterOptions) ask."""
        scores_dir = result.scores_dir
        if opts.export_uids is not None:
            result.uids = export_kept_uids(opts.export_uids, run, resolved.thresholds, resolved.marks)
        if opts.save_thresholds and (opts.save or opts.write_shards is not None):
            result.files["thresholds (loader keyword arguments)"] = write_thresholds(
                os.path.join(scores_dir, THRESHOLDS), resolved.selection)
        if opts.write_shards is not None:
            self._write_shards(run, resolved, result, opts, report, passes)
        if collector is not None:
            result.files["report"] = write_report(collector.finish(result), report)

    def _write_shards(self, run: ScoreRun, resolved, result: FilterResult, opts, report: Optional[str],
                      passes: Passes) -> None:
        """The kept samples into new shards of N (runfolder/reshard.py), the rules beside them (thresholds.json)."""
        scores_dir, write_shards, samples_per_shard = result.scores_dir, opts.write_shards, opts.samples_per_shard
        writer = Resharder(write_shards, samples_per_shard, opts.prefix, run.stage.get("rekey", "first-dot"),
                           opts.allow_pipe, opts.allow_remote, idle_seconds(opts), self.shard_echo,
                           opts.unique_keys, opts.interleave,
                           writes_report=report is not None and _same_path(report, os.path.join(write_shards, REPORT)))
        with writer.lock():
            def progress(kept: int):
                return passes.start("writing shards", "samples", total=kept, parts=-(-kept // samples_per_shard))
            result.sizes = reshard_run(run, scores_dir, resolved.thresholds, resolved.marks, writer,
                                       overwrite=opts.overwrite, kept=result.kept, echo=self.echo, shown=write_shards,
                                       progress=progress)
            passes.end(writer.progress)
            if opts.save_thresholds:  # beside the shards: the loader call that keeps what they hold
                write_thresholds(os.path.join(writer.out, THRESHOLDS), resolved.selection)
        result.files["shards"] = write_shards


def _same_path(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/") if is_fsspec_url(a) or is_fsspec_url(b) else \
        os.path.abspath(a) == os.path.abspath(b)
