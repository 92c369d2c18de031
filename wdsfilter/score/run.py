"""What both runners (the local engine and the Ray runner) share about one scoring run: the shard
URLs, the scorers and their columns, the run state on disk (resume.RunState), the summary, and
how a run ends (the summary read back from the score files, histograms, summary.json, and the
"nothing was scored" check).
"""
from __future__ import annotations

import copy
import logging
import os
from typing import Callable, List, Optional, Sequence

from ..errors import ConfigError, require
from ..keycheck import check_keys
from ..shards import expand_urls, is_local, local_path, unique_urls
from ..specs import utf8_text
from ..filtering.run import score_report
from .config import ScoreConfig
from .faults import disk_full, is_disk_full
from .outlock import OutputLock
from .outputs import RunSummary, plot_histograms, summarize_files, write_summary
from .resume import RunState
from .rows import NothingScoredError
from .scorerset import check_scorer_names, resolve_scorers, run_identity, score_columns

log = logging.getLogger("wdsfilter")


class Run:
    """One scoring run's shards, scorers, state and summary; no model is loaded here."""

    def __init__(self, shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None):
        refuse_in_spawned_worker()
        self.cfg = cfg
        self.echo = echo or (lambda text: None)
        self.urls, repeats = unique_urls(expand_urls(shards, cfg.stage.allow_pipe, cfg.stage.allow_remote,
                                                           cfg.stage.storage_options))
        unnamed = [u for u in self.urls if utf8_text(u) != u]
        if unnamed:  # its path goes into score files, markers and stats, all UTF-8
            raise ConfigError(f"shard path '{utf8_text(unnamed[0])}' is not UTF-8 ({len(unnamed)} such shard(s)): "
                              f"rename it (e.g. `convmv -f latin1 -t utf8`) before scoring; member names "
                              f"inside shards may be any bytes")
        refuse_writing_into_inputs(cfg.write_shards, self.urls)
        if repeats:
            log.warning(f"{len(repeats)} shard(s) given more than once are scored once: "
                        f"{', '.join(repeats[:3])}{' ...' if len(repeats) > 3 else ''}")
        # The checks that need no model come first: a wrong scorer name, output folder or caption
        # key answers before torch is imported (resolving a CLIP scorer imports open_clip).
        check_scorer_names(cfg)
        # One run per --out (outlock.py): taken before the run state, which deletes temporaries.
        self.lock = None if cfg.dry_run else OutputLock(cfg.out).acquire()
        try:
            self.state = RunState(cfg, self.urls)
            self.todo = self.state.pending()
            if self.todo:  # a caption/image key no sample of the first shard has
                check_keys(self.todo[0], cfg.scoring_stage_config())
            require("torch", "scoring")  # before a scorer's own import asks for it less plainly
            self.scorers = resolve_scorers(cfg)
            self.columns = score_columns(self.scorers)
            # The model side gets its own copies: a loaded model must never be pickled into a
            # decode worker (spawn would copy the weights into every one of them).
            self.model_scorers = [copy.deepcopy(s) for s in self.scorers]
            self.state.open(run_identity(cfg, self.scorers))
        except BaseException as e:
            self.release_lock()
            if is_disk_full(e):
                raise disk_full(e, "the run state") from None
            raise
        self.summary = RunSummary(out=cfg.out, shards=len(self.urls), dry_run=cfg.dry_run,
                                  shards_resumed=self.state.resumed_from_markers)

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def pending(self) -> List[str]:
        """The shards to score (all, or those without a completion marker with --resume)."""
        return self.todo

    def finish(self) -> RunSummary:
        """The summary of every finished shard (read back from the score files, so a resumed run
        reports the whole dataset), written to summary.json with the histograms. Raises
        NothingScoredError with the counts when no sample got a score."""
        cfg, summary = self.cfg, self.summary
        files = self.state.done_score_files()
        summary.shards_cut = self.state.cut_shards()
        for k, v in summarize_files(files, self.columns, cfg.bounds, cfg.histogram_bins).items():
            setattr(summary, k, v)
        summary.files = {"scores": self.state.scores_dir, "summary": os.path.join(cfg.out, "summary.json"),
                         "histograms": plot_histograms(summary.columns, cfg.bounds,
                                                       os.path.join(cfg.out, "histograms.png")),
                         "filtered shards": cfg.write_shards}
        summary.files["report"] = score_report(cfg.out, cfg.thresholds, cfg.max_thresholds)
        write_summary(summary, summary.files["summary"])
        if summary.scored == 0:
            raise NothingScoredError(nothing_scored_text(summary, len(files), self.state.scores_dir))
        return summary


def refuse_in_spawned_worker() -> None:
    """A run started while a spawned process imports the user's script (no main guard) would start
    the run again in every model worker: refuse it, saying why, instead of a worker that dies."""
    import multiprocessing
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError("wdsfilter scoring was started while a worker process was importing your script: "
                          "put the call under `if __name__ == \"__main__\":` (model workers are spawned "
                          "processes, which import the script again)")


def nothing_scored_text(summary: RunSummary, finished: int, scores_dir: str) -> str:
    lines = [f"no sample was scored: {summary.rows} row(s) in {finished} finished shard(s) of {summary.shards}"]
    lines += [f"  {n} {r}" for r, n in summary.reasons.items()]
    lines += [f"  shard {f['url']}: {f['reason']}" for f in summary.shards_failed]
    lines.append(f"  details: {summary.files['summary']} and the score files in {scores_dir}")
    return "\n".join(lines)


def refuse_writing_into_inputs(write_shards: Optional[str], urls: Sequence[str]) -> None:
    """--write-shards into a folder that holds input shards would replace each input shard by its
    filtered copy (same file name): the dropped samples gone for good, its img2dataset stats
    overwritten. Refused before anything is read or written."""
    if not write_shards:
        return
    target = os.path.realpath(write_shards)
    for url in urls:
        if is_local(url) and os.path.dirname(os.path.realpath(local_path(url))) == target:
            raise ConfigError(f"--write-shards {write_shards} is the folder of the input shard {url}: the filtered "
                              f"copies would overwrite the shards they are read from. Write them to another folder")
