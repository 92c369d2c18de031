"""The local scoring engine: shards -> decode workers -> model workers -> per-shard score files.

    DataLoader workers   sample_pipeline(emit_rejects=True) + Prepare(scorers) + Chunk   (transport.py)
    main process         Dispatcher: rows, batches, shard completion                     (dispatch.py)
    model workers        ModelRunner: score_batch through the OOM back-off                (modelworker.py)

A run: check the keys on the first shard (before any model loads), start the model workers,
probe memory and speed on a few prepared samples, plan (planner.py), score, summarise (runner.py).
Memory is bounded by construction: the DataLoader holds workers x prefetch chunks, the
dispatcher at most two batches of pending samples, each model worker its planned queue depth.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, List, Optional

from ...core.errors import ConfigError
from ..config import ScoreConfig
from ..devices import make_pool, resolve_devices
from ..dispatch import Dispatcher, open_progress
from ..faults import RunFailedError, decode_worker_died, disk_full, is_disk_full
from ..memory import host_status
from ..modelworker import WorkerError
from ...runfolder.tables import preload_writer
from ..summary import RunSummary
from ..plan import Plan
from ..planner import make_plan
from ...storage.shardstats import sizes_samples
from ..probe import ProbeReport, collect_probe
from ..outcome import Outcome, unopened_reason
from ..runner import Run
from ..transport import Chunk, Prepare, keep_as_is
from ...core.tally import Tally, StatsSink
from ..join import run_joined

log = logging.getLogger("wdsfilter")


class LocalEngine:
    """A run scored on this machine's devices. It holds the run (runner.Run: shards, scorers,
    lease, state, summary) and does the scoring: plan, decode workers, model workers."""

    def __init__(self, shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None):
        self.run = Run(shards, cfg, echo, engine="local", check_devices=check_devices)

    # -- planning ---------------------------------------------------------------------------
    def _place_decoding(self, devices: List[str]) -> None:
        """--decode-device, resolved on the run's devices, before the scorers reach any worker."""
        on_device = decode_on_device(self.run.cfg.decode_device, devices)
        for scorer in list(self.run.scorers) + list(self.run.model_scorers):
            if hasattr(scorer, "decode_on_device"):
                scorer.decode_on_device = on_device

    def _probe(self, pool, todo: List[str]) -> ProbeReport:
        cfg, scorers = self.run.cfg, self.run.scorers
        inputs, prep_seconds, scanned = collect_probe(todo, cfg.scoring_stage_config(scorers), scorers,
                                                      cfg.probe_samples, cfg.probe_scan, cfg.probe_seconds,
                                                      self.run.only_retried(), self.run.before)
        # The job's size, where it is known, bounds the probe's share of it (ModelRunner.probe):
        # sizes.json, or the probe itself read every sample before it had what it wanted.
        job = sizes_samples(todo)
        if (job is None and len(inputs) < cfg.probe_samples and scanned < cfg.probe_scan
                and prep_seconds * scanned <= cfg.probe_seconds):  # not stopped by its time limit
            job = scanned
        return ProbeReport.measured(inputs, scanned, prep_seconds,
                                    lambda probe_inputs: pool.probe(probe_inputs, job_samples=job))

    def _apply(self, pool, plan: Plan) -> dict:
        """Start the planned replicas and configure every model worker; returns worker -> batch size."""
        pool.set_queue_depth(plan.queue_depth)
        for dp in plan.devices:
            for _ in range(dp.replicas - 1):
                pool.add_replica(dp.device)
        batch_of = {dp.device: dp for dp in plan.devices}
        batch_size_of = {}
        # --retry-failed reads only samples that failed: the run's earlier successes say the scorers work
        scored_before = self.run.state.scored_rows() if self.run.retry else 0
        for w in pool.workers:
            dp = batch_of[pool.device_of(w)]
            pool.configure(w, batch_size=dp.batch_size, threads=dp.threads, min_free_host=plan.min_free_host,
                           scorer_batch=dp.scorer_batch, scored_before=scored_before)
            batch_size_of[w] = dp.batch_size
        return batch_size_of

    # -- scoring ----------------------------------------------------------------------------------
    def _loader(self, plan: Plan, todo: List[str], sink, source=None):
        """The DataLoader over `todo`, or over the shards `source` yields (a joined run's worker:
        shards claimed as its readers ask, join.FedShards)."""
        import torch.utils.data
        from ...stream.pipeline import sample_pipeline
        cfg = self.run.cfg
        tally = Tally(0, 0, name="wdsfilter score")
        stage = cfg.scoring_stage_config(self.run.scorers)
        pipeline = sample_pipeline(todo, stage, tally, extra=[Prepare(self.run.scorers, stage)],
                                   sink=sink, before_decode=self.run.only_retried(),
                                   shard_stages=[s.reader() for s in self.run.only_retried()], source=source)
        pipeline.append(Chunk(plan.chunk))
        return torch.utils.data.DataLoader(
            pipeline, batch_size=None, shuffle=False, num_workers=plan.workers, collate_fn=keep_as_is,
            prefetch_factor=plan.prefetch if plan.workers else None,
            multiprocessing_context=cfg.worker_start if plan.workers else None)

    def _score(self, pool, plan: Plan, todo: List[str], batch_size_of: dict, source=None, progress=None):
        """Score `todo` (or what `source` yields); returns (the dispatcher, the stage counts of the
        decode workers). progress: a progress line the caller keeps (else one for `todo`)."""
        sink = StatsSink()  # a working folder in $TMPDIR, removed here (or swept once this process is gone)
        own = progress is None
        if own:
            progress = open_progress(self.run.cfg.progress and self.run.cfg.verbosity > 0, todo)
        try:
            dispatcher = Dispatcher(self.run, pool, batch_size_of, len(todo), progress)
            try:
                dispatcher.run_loader(self._loader(plan, todo, sink, source),
                                      then=lambda: preload_writer(self.run.cfg.format))
            finally:
                if own and progress is not None:
                    progress.close()
            return dispatcher, sink.read()
        finally:
            sink.remove()

    # -- the whole run ---------------------------------------------------------------------------
    def execute(self) -> RunSummary:
        try:
            try:
                return self._run()
            except OSError as e:
                if is_disk_full(e):  # stop at once, with one clear line (faults.py)
                    raise disk_full(e, "the run's outputs") from None
                raise
            except RuntimeError as e:
                died = decode_worker_died(e)
                if died is not None:
                    raise died from e
                raise
        except (RunFailedError, WorkerError) as e:  # a dead worker or device: the ledger names what it left
            if self.run.joined is None:  # a joined run's worker leaves its shards to the others (its claims go with it)
                self.run.record_run_failure(self.run.todo, e)
            raise
        finally:
            self.run.release_lock()

    def _pool(self):
        """The model workers' pool, not started; models fetched once, here."""
        devices = resolve_devices(self.run.cfg)
        self._place_decoding(devices)
        for scorer in self.run.scorers:  # downloads once, here, not in every model worker at once
            getattr(scorer, "fetch", lambda: None)()
        return make_pool(devices, self.run.model_scorers, replicas=self.run.cfg.replicas)

    def _plan(self, pool, todo: List[str], n_shards: int) -> Plan:
        """Start the model workers, probe on `todo`'s samples, plan (said as the plan is shown)."""
        cfg, summary = self.run.cfg, self.run.summary
        reports = pool.start()
        summary.scorers = list(dict.fromkeys(d for r in reports for d in r.descriptions))
        for d in summary.scorers if cfg.verbosity else ():
            self.run.echo(f"scorer: {d}")
        probe = self._probe(pool, todo)
        for r in reports:  # a model in this process (one CPU or simulated device) cannot get replicas
            r.in_process = bool(pool.in_process)
        plan = make_plan(cfg, reports, probe, host_status(), n_shards)
        summary.plan, summary.plan_text = plan.to_dict(), plan.describe()
        shown = cfg.plan_text(plan)
        if shown:
            self.run.echo(shown)
        for w in plan.warnings:
            log.warning(w)
        return plan

    def _run(self) -> RunSummary:
        if self.run.joined is not None:
            return run_joined(self)
        cfg, state, summary = self.run.cfg, self.run.state, self.run.summary
        start = time.perf_counter()
        todo = self.run.pending()  # keys on the first of them were checked when the run was set up
        if state.resumed_from_markers:
            self.run.echo(f"resume: {state.resumed_from_markers} of {len(self.run.urls)} shard(s) already done, "
                      f"{len(todo)} to score")
        dispatcher = stage_tally = None
        if todo or cfg.dry_run:
            pool = self._pool()
            try:
                plan = self._plan(pool, todo or self.run.urls, len(todo or self.run.urls))
                if cfg.dry_run:
                    return summary
                dispatcher, stage_tally = self._score(pool, plan, todo, self._apply(pool, plan))
            finally:
                summary.workers = pool.close()
        else:
            summary.scorers = [s.describe() for s in self.run.scorers]
            for d in summary.scorers if cfg.verbosity else ():
                self.run.echo(f"scorer: {d}")
            self.run.echo(f"all {len(self.run.urls)} shard(s) are already scored; summarising")
        outcome = Outcome()
        if dispatcher is not None:
            outcome.failed = dispatcher.failed + dispatcher.unfinished()
            outcome.shards_scored = dispatcher.completed
            outcome.samples = dispatcher.rows_done
            outcome.scoring_seconds = dispatcher.seconds
        ended = {f["url"] for f in outcome.failed}
        for url in todo:
            if not state.is_done(url) and url not in ended:
                outcome.failed.append({"url": url, "reason": unopened_reason(url, stage_tally)})
        outcome.seconds = time.perf_counter() - start
        if stage_tally is not None:
            outcome.stage_counts = {"dropped": dict(stage_tally.dropped), "notes": dict(stage_tally.notes)}
        return self.run.finish(outcome)


def check_devices(cfg: ScoreConfig) -> None:
    """--device/--gpus and --decode-device against the devices at hand, as _pool resolves them
    (ConfigError): asked by the run once torch is imported, before the scorers import open_clip."""
    decode_on_device(cfg.decode_device, resolve_devices(cfg))


def decode_on_device(setting: str, devices: List[str]) -> bool:
    """--decode-device: whether the CLIP scorer's JPEGs are decoded on the model workers' device."""
    on_gpus = bool(devices) and all(d.startswith("cuda") for d in devices)
    if setting == "cuda" and not on_gpus:
        raise ConfigError(f"--decode-device cuda decodes on the model's GPU; the model workers are on "
                          f"{', '.join(devices)}. Use --decode-device auto or cpu")
    return setting == "cuda" or (setting == "auto" and on_gpus)


def run_scoring(shards, cfg: ScoreConfig, echo: Optional[Callable[[str], None]] = None) -> RunSummary:
    """The local engine's run() (ENGINES["local"]): score `shards` on this machine."""
    return LocalEngine(shards, cfg, echo).execute()
