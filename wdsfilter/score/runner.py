"""What every engine (engines/: local, ray) shares about one scoring run, held by the engine (not
extended): the shard URLs, the scorers and their columns, the run state on disk (resume.RunState),
the summary, and how a run ends (the summary read back from the score files, histograms,
summary.json, and the "nothing was scored" check).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
from typing import Callable, List, Optional, Sequence

from ..core.errors import ConfigError, require
from ..stream.keycheck import check_keys
from ..core.publish import published
from ..storage.shards import expand_urls, is_local, refuse_unreachable, unique_urls, shown_url
from ..core.specs import utf8_text
from ..core.tally import Tally
from .config import ScoreConfig
from .faults import disk_full, is_disk_full
from .ledger import (MERGED as LEDGER_FILE, merge as merge_ledger, shard_entry, summarize as summarize_ledger,
                     OnlyKeys, retry_plan, write_shard_failures)
from ..runfolder.names import HISTOGRAMS, RUN_JSON, STATE_FILES, SUMMARY, THRESHOLDS
from ..runfolder.lease import Lease, LeaseLostError
from .recipe import write_recipe
from ..report import run_report
from ..report.statistics import plot_histograms, summarize_files
from .outcome import Outcome
from .kept_shards import check_folder, reshard_kept
from .summary import RunSummary, write_summary
from .resume import RunState
from .rows import NothingScoredError
from ..storage.writing import refuse_writing_into_inputs
from .scorerset import check_before_torch, check_scorer_names, resolve_scorers, run_identity, score_columns
from .join import Worker
from ..storage.remote import is_fsspec_url
from ..runfolder.bucket import RemoteRunFolder
from ..runfolder.shares import resolve_over_run, write_thresholds

log = logging.getLogger("wdsfilter")


class Run:
    """One scoring run's shards, scorers, state and summary; no model is loaded here."""

    def __init__(self, shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None, engine: str = "local",
                 check_devices: Optional[Callable[[ScoreConfig], None]] = None):
        """The run set up, in order: its shards; the checks that need no model; the run folder
        taken (its lease); the run state read (what is left to score, the first shard's keys);
        the scorers resolved; the run recorded on disk (run.json, run.yaml). `engine`: the name
        (engines.ENGINES) run.yaml gives, so a replay runs on the same engine. `check_devices`: the
        engine's check of the devices it will score on (ConfigError), run once torch is imported
        and before the scorers are (a CUDA device asked for and absent answers without importing
        open_clip)."""
        refuse_in_spawned_worker()
        self.cfg = cfg
        self.check_devices = check_devices
        self.echo = echo or (lambda text: None)
        self.urls = self._shard_urls(shards, cfg)
        # The checks that need no model come first: a wrong scorer name, output folder or caption
        # key answers before torch is imported (resolving a CLIP scorer imports open_clip).
        check_scorer_names(cfg)
        check_before_torch(cfg)
        # A joined run's worker (--join, join.py) holds its own lease, not the folder's, and claims
        # the shards one by one (runfolder/claims.py); a dry run plans only, as any.
        self.joined = self._worker(cfg)
        # The reads before scoring (the key check, the probe): their remote retries, for the summary
        self.before = Tally(0, 0, name="wdsfilter score (before scoring)")
        fence = self._take_folder()
        try:
            self._read_state(fence)
            self._resolve_scorers()
            self._record(engine)
        except BaseException as e:
            self.release_lock()
            if self.remote and isinstance(e, ConfigError):  # "OUT already holds a run": the bucket's name
                raise type(e)(self.remote.public(str(e))) from None
            if is_disk_full(e):
                raise disk_full(e, "the run state") from None
            raise
        self.summary = RunSummary(out=self.remote.url if self.remote else self.cfg.out, shards=len(self.urls),
                                  dry_run=self.cfg.dry_run, shards_resumed=self.state.resumed_from_markers)

    def _take_folder(self):
        """One run per --out, by a lease (runfolder/lease.py), taken before the run state, which
        deletes temporaries; every write into the folder is fenced by it. A remote --out: the
        lease in the bucket, then the run writes a local staging copy mirrored to the bucket (and
        self.cfg names the copy). Returns the fence."""
        cfg = self.cfg
        self.remote = self._remote_out(cfg, self.joined)
        if self.remote:
            cfg = self.cfg = dataclasses.replace(cfg, out=self.remote.local, write_shards=(
                self.remote.shards.local if self.remote.shards else cfg.write_shards))
        try:
            self.lock = None if cfg.dry_run or self.remote else (
                self.joined.lease if self.joined else Lease(cfg.out)).acquire()
            return self.remote.fence if self.remote else self.lock and self.lock.guard([cfg.out, cfg.write_shards])
        except BaseException:
            if self.remote:  # its lock object is not left to go stale
                self.remote.release()
            raise

    def _read_state(self, fence) -> None:
        """The run state (resume.RunState) and the shards to score: those without a marker, and
        with --retry-failed those with samples to score again; the first one's keys checked."""
        cfg = self.cfg
        if self.joined:  # a run without --join in the folder excludes its workers
            self.joined.refuse_single_run()
        if cfg.reshards and not cfg.dry_run:  # another folder's reshard in DIR: said before any scoring
            check_folder(cfg.write_shards, self.remote.url if self.remote else cfg.out, cfg.overwrite)
        if cfg.retry_failed and not os.path.exists(os.path.join(cfg.out, RUN_JSON)):
            raise ConfigError(f"--retry-failed: {cfg.out} holds no scoring run; score the shards there first")
        self.state = RunState(cfg, self.urls, size_of=self.remote.sizes() if self.remote else os.path.getsize,
                              run_record=self.joined and self.joined.run_record())
        self.state.fence = fence  # installed by rows.write_shard where a Ray worker writes
        self.todo = self.state.pending()
        # --retry-failed: url -> {index: ledger entry} of the samples of finished shards to score
        # again (only those are read on, OnlyKeys); shards without a marker are in todo whole
        self.retry = retry_plan(self.state, cfg.retry_failed) if cfg.retry_failed else {}
        self.todo += [u for u in self.urls if u in self.retry and u not in self.todo]
        if self.todo:  # no shard can be opened, for one reason (one line); a caption/image key no sample has
            refuse_unreachable(self.todo, cfg.stage)
            check_keys(self.todo[0], cfg.scoring_stage_config(), self.before)

    def _resolve_scorers(self) -> None:
        """The scorers (a CLIP scorer resolves its model: torch, open_clip), their columns, and the
        model side's own copies."""
        cfg = self.cfg
        if cfg.verbosity and (self.todo or cfg.dry_run):  # at once, before the imports and the models
            names = [s if isinstance(s, str) else getattr(s, "name", type(s).__name__) for s in cfg.scorers]
            self.echo(f"{len(self.todo)} shard(s) to score; loading {', '.join(names)} and measuring a probe batch")
        require("torch", "scoring")  # before a scorer's own import asks for it less plainly
        if self.check_devices is not None and (self.todo or cfg.dry_run):  # as the engine will use them
            self.check_devices(cfg)
        self.scorers = resolve_scorers(cfg)
        self.columns = score_columns(self.scorers)
        # The model side gets its own copies: a loaded model must never be pickled into a
        # decode worker (spawn would copy the weights into every one of them).
        self.model_scorers = [copy.deepcopy(s) for s in self.scorers]

    def _record(self, engine: str) -> None:
        """The run on disk: run.json (created, or checked against this run's settings), a joined
        run's claims, run.yaml (the resolved recipe), then the bucket's mirror started."""
        cfg = self.cfg
        if self.remote and self.remote.shards:  # what the bucket's markers name, not the staging folder
            self.state.shown_write_shards = (self.remote.shards.local, self.remote.shards.url)
        self.state.open(self._identity())
        if self.joined:  # the run's shards now claimed one by one; those with a marker are done
            self.todo = self._join_run()
        if not cfg.dry_run and (self.joined is None or self.state.created):
            # the resolved recipe: `wdsfilter score --config OUT/run.yaml` runs it again
            write_recipe(cfg, self.urls, engine, self.remote and {
                "out": self.remote.url, "write_shards": self.remote.shards and self.remote.shards.url})
        if self.remote:
            self.remote.start()

    @staticmethod
    def _worker(cfg: ScoreConfig):
        """This process as a worker of a joined run (--join), or None; a dry run plans only, as any."""
        if not cfg.join or cfg.dry_run:
            return None
        return Worker(cfg, cfg.out)

    def _join_run(self) -> List[str]:
        """A joined run's worker, once run.json names the run: its claims, the shards not done."""
        todo = self.joined.start(self.state, self.urls)
        if self.remote and self.state.created:  # run.json was created in the bucket, in place
            self.remote.folder.adopt(RUN_JSON, self.state.run_json_version)
        elif self.remote:  # the run's files as its creator wrote them (after this worker's pull, perhaps)
            self.remote.folder.refresh(fetch=STATE_FILES)
        return todo

    @staticmethod
    def _shard_urls(shards, cfg: ScoreConfig) -> List[str]:
        """The run's shards, each once, named in UTF-8, none of them where --write-shards writes."""
        urls, repeats = unique_urls(expand_urls(shards, cfg.stage.allow_pipe, cfg.stage.allow_remote,
                                                cfg.stage.storage_options))
        unnamed = [u for u in urls if utf8_text(u) != u]
        if unnamed:  # its path goes into score files, markers and stats, all UTF-8
            raise ConfigError(f"shard path '{utf8_text(unnamed[0])}' is not UTF-8 ({len(unnamed)} such shard(s)): "
                              f"rename it (e.g. `convmv -f latin1 -t utf8`) before scoring; member names "
                              f"inside shards may be any bytes")
        refuse_writing_into_inputs(cfg.write_shards, urls)
        if repeats:
            log.warning(f"{len(repeats)} shard(s) given more than once are scored once: "
                        f"{', '.join(repeats[:3])}{' ...' if len(repeats) > 3 else ''}")
        return urls

    def only_retried(self) -> list:
        """The stage that lets only the samples to retry through in their shards (before
        decoding; ledger.OnlyKeys), or none outside --retry-failed."""
        if not self.retry:
            return []
        return [OnlyKeys({u: [e["key"] for e in plan.values()] for u, plan in self.retry.items()})]

    @staticmethod
    def _remote_out(cfg: ScoreConfig, joined=None):
        if not is_fsspec_url(cfg.out):
            if cfg.write_shards and is_fsspec_url(cfg.write_shards):
                raise ConfigError("--write-shards in a bucket needs --out in a bucket too (a shard's completion marker "
                                  "is written after its filtered shard is uploaded); or write both locally")
            return None
        remote_shards = cfg.write_shards if cfg.write_shards and is_fsspec_url(cfg.write_shards) else None
        if cfg.write_shards and not remote_shards:
            raise ConfigError("--out in a bucket takes --write-shards in a bucket too (s3://...), or no --write-shards")
        # --resume pulls only the folder's state (lazy): finished shards' files stay in the bucket.
        # --retry-failed rewrites finished shards' score files, so it pulls them all.
        return RemoteRunFolder(cfg.out, cfg.stage.storage_options, lock=not cfg.dry_run, write_shards=remote_shards,
                               pull_shards=cfg.resume or bool(cfg.retry_failed),
                               lazy=cfg.resume and not cfg.retry_failed, lease=joined and joined.lease)

    def _identity(self) -> dict:
        identity = run_identity(self.cfg, self.scorers)
        if self.remote and self.remote.shards:
            identity["write_shards"] = self.remote.shards.url
        return identity

    def check_lease(self) -> None:
        """LeaseLostError as soon as the lease's heartbeat found the folder taken over (or its
        lock deleted): scoring on would be for nothing, as nothing more may be written."""
        lease = self.lock or (self.remote.lock if self.remote else None)
        if lease is not None and lease.lost:
            raise LeaseLostError(lease.lost)

    def shard_written(self, url: str) -> None:
        """A shard's outputs and marker are written: a joined run's worker sends them to the
        bucket now (the other workers see the shard done only then), not at the mirror's interval."""
        if self.joined is not None and self.remote is not None and self.remote.mirror is not None:
            self.remote.mirror.wake()

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.remote is not None:  # the last upload, then the lock object
            self.remote.release()

    def pending(self) -> List[str]:
        """The shards to score (all, or those without a completion marker with --resume)."""
        return self.todo

    def finish(self, outcome: Optional[Outcome] = None) -> RunSummary:
        """The summary: what the engine did (its Outcome) and every finished shard (read back from
        the score files, so a resumed run reports the whole dataset), written to summary.json with
        the histograms and report.html. Raises NothingScoredError with the counts when no sample
        got a score."""
        cfg, summary = self.cfg, self.summary
        if outcome is not None:
            summary.shards_scored, summary.samples_this_run = outcome.shards_scored, outcome.samples
            summary.shards_failed += outcome.failed
            summary.seconds, summary.scoring_seconds = outcome.seconds, outcome.scoring_seconds
            if outcome.stage_counts is not None:
                summary.stage_counts = outcome.stage_counts
        self._count_early_retries(summary)
        files = self.state.done_score_files()
        if self.remote:  # finished shards' score files left in the bucket by --resume: read now
            self.remote.fetch(files)
        summary.shards_cut = self.state.cut_shards()
        rules = self.resolved_rules(bool(files))
        bounds = rules.bounds
        for k, v in summarize_files(files, self.columns, rules, cfg.histogram_bins).items():
            setattr(summary, k, v)
        summary.files = {"scores": self.state.scores_dir, "summary": os.path.join(cfg.out, SUMMARY),
                         "histograms": plot_histograms(summary.columns, bounds,
                                                       os.path.join(cfg.out, HISTOGRAMS)),
                         "filtered shards": cfg.write_shards}
        summary.files["failures"] = self.record_failures()
        if cfg.selection.shares and files:
            summary.files["thresholds"] = os.path.join(cfg.out, THRESHOLDS)
        summary.files["report"] = run_report(cfg.out, rules, cfg.stage.allow_pipe, cfg.stage.allow_remote)
        if cfg.reshards and not cfg.dry_run and summary.scored:  # once, over every shard's rows (kept_shards.py)
            reshard_kept(cfg, rules, self.remote.url if self.remote else cfg.out, len(files) == len(self.urls),
                         self.echo, self.remote.shards.url if self.remote and self.remote.shards else None)
        if self.remote:  # the summary and report name the bucket's objects, not the staging copy
            self.remote.publish_text(summary.files["report"])
            summary.files = {k: self.remote.public(v) for k, v in summary.files.items()}
            write_summary(summary, os.path.join(cfg.out, SUMMARY))
            self.remote.sync()  # every object in the bucket before the run reports success
        else:
            write_summary(summary, summary.files["summary"])
        if summary.scored == 0:
            raise NothingScoredError(nothing_scored_text(summary, len(files), self.state.scores_dir))
        return summary

    def resolved_rules(self, any_files: bool):
        """The run's rules (a wdsfilter.Selection) with its shares (--top/--bottom) resolved over
        every finished row, as `wdsfilter filter` resolves them (runfolder/shares.py), written to
        OUT/thresholds.json (the loader's keyword arguments); cfg.selection when the run has no
        share (or no row yet)."""
        cfg = self.cfg
        if not cfg.selection.shares or not any_files:
            return cfg.selection
        resolved = resolve_over_run(cfg.out, cfg.selection)
        for t in resolved.thresholds:
            if t.share is not None and cfg.verbosity:  # -q: the one-line result only
                self.echo(f"{t.given}: {t.rank} of the {t.scored} rows with a {t.column} -> {t.describe()}")
        write_thresholds(os.path.join(cfg.out, THRESHOLDS), resolved.selection)
        return resolved.selection

    def _count_early_retries(self, summary: RunSummary) -> None:
        """The remote retries of the reads before scoring (the key check, the probe) join the
        scoring's in the summary: one tally of a run's retries. Only retries: the samples those
        reads saw are read again by the scoring, which counts their drops."""
        early = self.before.notes.get("remote_retries", 0)
        if early:
            counts = summary.stage_counts or {"dropped": {}, "notes": {}}
            notes = counts.setdefault("notes", {})
            notes["remote_retries"] = notes.get("remote_retries", 0) + early
            summary.stage_counts = counts
            self.before.notes["remote_retries"] = 0  # counted once, if finish runs again

    def record_failures(self, unfinished: Sequence[dict] = ()) -> Optional[str]:
        """The failure ledger at the end of a run (ledger.py): an entry for each shard that failed
        (it has no marker, so no file of its own rows), then every shard's file merged into
        failures.parquet, summarised by reason. unfinished: shards a failed run left (url, reason)."""
        if self.cfg.dry_run:
            return None
        for f in [*self.summary.shards_failed, *unfinished]:
            if f["url"] in self.state.names and not self.state.is_done(f["url"]):
                write_shard_failures(self.cfg.out, self.state.names[f["url"]],
                                     [shard_entry(f["url"], f["reason"], not is_local(f["url"]))])
        entries = merge_ledger(self.cfg.out, [self.state.names[u] for u in self.urls])
        self.summary.failures = summarize_ledger(entries)
        if self.retry:
            listed = {(e["shard"], e["index"]) for e in entries}  # the ledger names shards published
            self.summary.retried = {"samples": sum(len(p) for p in self.retry.values()),
                                    "scored": sum((published(u), i) not in listed for u, p in self.retry.items()
                                                  for i in p)}
        return os.path.join(self.cfg.out, LEDGER_FILE)

    def record_run_failure(self, todo: Sequence[str], error: BaseException) -> None:
        """A run that stopped (a dead worker or device): its unfinished shards go into the ledger,
        as far as the disk allows (a full disk stopped it, perhaps)."""
        try:
            self.record_failures([{"url": u, "reason": str(error)} for u in todo])
        except OSError:
            pass


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
    lines += [f"  shard {shown_url(f['url'])}: {f['reason']}" for f in summary.shards_failed]
    lines.append(f"  details: {summary.files['summary']} and the score files in {scores_dir}")
    return "\n".join(lines)
