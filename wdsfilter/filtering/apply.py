"""`wdsfilter filter`: judge every score row against thresholds chosen after scoring, count,
and optionally write the kept samples into new shards (reshard.py) and a report (report_html.py).

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
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from ..runfolder import ScoredShard, ScoreRun
from ..runfolder.tables import in_threads, read_batches
from .judge import count_rows, count_table
from ..config import StageConfig
from ..thresholds import Thresholds
from .rules import FilterSpec, Threshold, bounds, drop_reason, resolve, write_thresholds

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
        for name, path in self.files.items():
            lines.append(f"  {name}: {path}")
        mins, maxes = bounds(self.thresholds)
        if self.thresholds:
            lines.append(f"  in training: wdsfilter.loader(shards, scores={self.scores_dir!r}, "
                         f"min_scores={mins!r}, max_scores={maxes!r})")
        return "\n".join(lines)


def check_sources(urls: Sequence[str], allow_pipe: bool, allow_remote: bool, scores_dir: str) -> None:
    """Permissions come from this command line, never from the folder (a folder is input, handed
    over or edited like a shard): a source shard that is a `pipe:` command or a remote URL is read
    again only when this very call allows it (--allow-pipe, --allow-remote: a folder could
    otherwise make filter run any command or fetch any URL it names). Raises UnsafeInputError
    (exit 2) naming the first refused source, before anything is read."""
    from ..errors import UnsafeInputError
    from ..remote import redact_url
    from ..shards import is_pipe, is_remote
    refused = [u for u in urls if (is_pipe(u) and not allow_pipe) or (is_remote(u) and not allow_remote)]
    if refused:
        first = refused[0]
        flag = ("--allow-pipe (allow_pipe=True: it runs that command)" if is_pipe(first)
                else "--allow-remote (allow_remote=True)")
        raise UnsafeInputError(f"the score folder {scores_dir} names {len(refused)} source shard(s) that would be "
                               f"read again for --write-shards or the report, such as {redact_url(first)!r}; a "
                               f"folder never grants that: pass {flag} if you trust it, or --no-report and no "
                               f"--write-shards to count only")


def _file_state(path: str) -> list:
    # what the file holds, not when it was written: a bucket's score folder is read through a local
    # copy whose times are the copy's (another machine, a fresh cache); the dedup's rule for a copy
    from ..runfolder.dedup import score_file_state
    state = score_file_state(path)
    return [os.path.basename(path), state["bytes"], state["sha256"]]


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


def _observed(judged: Iterator[tuple], collector, shard, dropped: Optional[Dict[int, tuple]] = None,
              dedup_counts: Optional[dict] = None) -> Iterator[tuple]:
    for row, reason in judged:
        if dropped is not None:  # --dedup: each row's verdict counted (kept, not a survivor, eval match)
            verdict = dropped.get(row["index"])
            dedup_counts[verdict[1] if verdict else "kept"] += 1
        if collector is not None:
            collector.observe(shard, row, reason)
        yield row, reason


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
    from .reshard import Resharder, Source
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
    thresholds = resolve(spec, run)  # from here: every bound resolved (rules.Threshold), shares included
    result = FilterResult(scores_dir=scores_dir, thresholds=thresholds, shards=len(run.shards),
                          unfinished=run.unfinished, dry_run=dry_run)
    result.counts = [{"kept": 0, "dropped": 0, "no_score": 0} for _ in thresholds]
    collector = None
    if report is not None and not dry_run:
        from .report_data import ReportCollector
        collector = ReportCollector(run, thresholds, allow_pipe, allow_remote, stream_idle_seconds)
    _count(run, thresholds, collector, marks, result)
    if dry_run:
        return result
    if thresholds and save_thresholds:
        result.files["thresholds (loader keyword arguments)"] = write_thresholds(
            os.path.join(scores_dir, "thresholds.json"), thresholds)
    if write_shards is not None:
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
        from .report_html import write_report
        result.files["report"] = write_report(collector.finish(result), report)
    return result


def _same_path(a: str, b: str) -> bool:
    from ..remote import is_fsspec_url
    return a.rstrip("/") == b.rstrip("/") if is_fsspec_url(a) or is_fsspec_url(b) else \
        os.path.abspath(a) == os.path.abspath(b)


def default_report(scores_dir: str, write_shards: Optional[str]) -> str:
    """Where filter's report goes unless --report says: beside what it wrote (the new shards),
    else filter_report.html in the score folder; never over the score run's own report.html."""
    from .reshard import REPORT  # one of the files filter owns in OUT: never one of the user's replaced
    return os.path.join(write_shards, REPORT) if write_shards is not None else \
        os.path.join(scores_dir, "filter_report.html")


def _count(run: ScoreRun, thresholds: Sequence[Threshold], collector, marks, result: FilterResult) -> None:
    """Every finished shard's rows judged and counted into `result` (rows, kept, per threshold,
    reasons; --dedup's verdicts)."""
    reasons: Counter = Counter()
    if marks is not None:
        result.dedup = {"kept": 0, "duplicate": 0, "eval_match": 0}
    # Without a report or --dedup nothing looks at single rows: a Parquet table is counted
    # column-wise, a few files at a time (pyarrow reads without the GIL); the counts add up in order.
    tabled = [None] * len(run.shards)
    if collector is None and marks is None:
        tabled = in_threads(lambda s: count_table(s.score_file, thresholds) if s.score_file.endswith(".parquet")
                            else None, run.shards)
    for shard, counts in zip(run.shards, tabled):
        dropped = marks.dropped(shard.name) if marks is not None else None
        if counts is None:
            judged = judge_shard(shard, thresholds, collector.columns if collector else (), dropped)
            counts = count_rows(_observed(judged, collector, shard, dropped, result.dedup), thresholds)
        counts.add_to(result, reasons)
    result.reasons = dict(reasons.most_common())


def score_report(scores_dir: str, thresholds: Dict[str, float], max_thresholds: Dict[str, float],
                 allow_pipe: bool = False, allow_remote: bool = False) -> Optional[str]:
    """report.html for a finished `wdsfilter score` run, with the run's own thresholds (and the
    permissions its own command line gave); None (and a warning) when it cannot be written: the
    scores are what matters."""
    import logging
    try:
        result = filter_scores(scores_dir, thresholds=Thresholds.build(thresholds, max_thresholds),
                               save_thresholds=False, report=os.path.join(scores_dir, "report.html"),
                               allow_pipe=allow_pipe, allow_remote=allow_remote)
        return result.files.get("report")
    except Exception as e:  # noqa: BLE001 - never fail a scoring run for its report
        logging.getLogger("wdsfilter").warning(f"report.html not written: {type(e).__name__}: {e}")
        return None
