"""Scoring on a Ray cluster with Ray Data: the same stages, scorers, rows and output folder as the
single-machine engine; Ray schedules the work across nodes and GPUs, streams it with bounded
memory (its backpressure) and retries failed tasks.

    measure    ─ one Ray task on a GPU (or CPU slot): loads the scorers, probes a few samples;
                 planner.make_plan turns that into batch sizes and model actors per GPU, as the
                 local engine does (skipped where the user set them)
    shard URLs ─ read_shard: a Ray task per shard, sample_pipeline + Prepare (the decode side);
                 a row's prepared arrays travel as one uint8 tensor column (Arrow), not pickled
               ─ ScoreActor: map_batches, replicas actors per GPU (or one per CPU slot), each
                 scorer at its planned batch through its own OOM back-off
               ─ the driver streams the scored rows (iter_batches) and, as soon as all rows of a
                 shard are in, writes scores/<shard>.parquet, the filtered shard and the done
                 marker itself (write_finished): a run killed half-way leaves its finished shards done.

This module is the driver; what runs on Ray's workers is engine-neutral, in score/batches.py
(read_shard, BatchScorer, measure; the payload columns in score/payload.py), with Ray's own
actor and roster in ray_workers.py; what the nodes see of the driver's disk is in ray_files.py.
Rows, shard completion and the run state (a runner.Run, which this engine holds, not extends)
are the local engine's own (rows.py), so `--resume`, `wdsfilter.loader(scores=...)` and the
summary work on it unchanged.
No shared filesystem is needed: the run folder has one writer, the driver; shards in object
storage are read by every node, local ones where they are (ray_files.survey).

    from wdsfilter.score.ray_runner import score_on_ray   # the documented path (engines/ray.py)
    summary = score_on_ray("s3-mounted/shards/", out="/shared/scores", scorers=["clip"],
                           min_clip=0.28, actors=8, gpus_per_actor=1, address="auto")
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...core.errors import ConfigError, require
from ...storage.remote import is_fsspec_url
from ...storage.shards import absolute_url
from ..faults import disk_full, is_disk_full, read_failed_reason
from ..ledger import OnlyKeys
from ..summary import RunSummary
from .ray_files import NodeInputs, survey
from .ray_workers import ActorRoster, ScoreActor, node_id
from ..batches import ShardCollector, measure, read_shard, write_finished
from ..planner import make_plan
from ..probe import collect_probe
from ..outcome import Outcome
from ..runner import Run
from .. import build_config  # the package's: score() and score_on_ray() build one config


def _ray():
    require("ray.data", "the Ray engine", "pip install 'wdsfilter[ray]'")  # Ray Data is the part we use
    return require("ray", "the Ray engine", "pip install 'wdsfilter[ray]'")


# -- the plan: the local engine's planner on numbers measured in one Ray task ---------------------
def actor_pool(cluster_gpus: int, replicas: int, actors: Optional[int] = None,
               gpus_per_actor: Optional[float] = None) -> Tuple[int, float]:
    """(model actors, GPU share of each): the user's where set; else the plan's model processes
    per GPU (replicas) on every GPU of the cluster, each actor 1/replicas of a GPU; one CPU actor
    on a cluster without GPUs."""
    if gpus_per_actor is None:
        gpus_per_actor = 1.0 / max(1, replicas) if cluster_gpus else 0.0
    if actors is None:
        actors = max(1, int(round(cluster_gpus / gpus_per_actor))) if gpus_per_actor else 1
    return actors, gpus_per_actor


def plan_on_ray(ray, run, cfg, urls: Sequence[str], cluster: dict, inputs: Optional[NodeInputs] = None):
    """make_plan (planner.py) on numbers measured on the cluster: one GPU's free memory and the
    scorers' footprints and per-frame activations there (or a CPU slot's), with the cores of the
    cluster per GPU as the host's. Returns the Plan; its first DevicePlan holds the batch sizes and
    the model processes per GPU (replicas: actors per GPU). Where only the driver's node reads
    the shards (inputs.pin_reads), the driver reads the probe's samples and the task gets them."""
    gpus = int(cluster.get("GPU", 0))
    task = ray.remote(num_cpus=1, num_gpus=1 if gpus else 0, max_retries=0)(measure)
    # --retry-failed: the probe reads only the samples to retry, by the paths the task opens
    only = [OnlyKeys({absolute_url(u): keys for u, keys in s.keys.items()}) for s in run.only_retried()]
    paths = [absolute_url(u) for u in urls]
    collected = None
    if inputs is not None and inputs.pin_reads:
        collected = collect_probe(paths, cfg.scoring_stage_config(run.scorers), run.scorers, cfg.probe_samples,
                                  cfg.probe_scan, cfg.probe_seconds, only, run.before)
    m = ray.get(task.remote(cfg, run.scorers, run.model_scorers, paths, "cuda:0" if gpus else "cpu", only,
                            inputs, collected))
    run.before.notes["remote_retries"] += m.get("remote_retries", 0)
    host = dict(m["host"])
    if gpus:  # the cores beside each GPU bound its model processes (planner.CORES_PER_GPU_PROCESS)
        host["cpus"] = max(1, int(cluster.get("CPU", host["cpus"]) // gpus))
    return make_plan(cfg, [m["report"]], m["probe"], host, len(urls))


# -- the run ---------------------------------------------------------------------------------------
# Ray Data restarts a dead actor and retries its tasks forever by default: a batch that kills its
# actor (a host OOM kill) loops. A task (a batch, or a shard's read) is retried once; a batch that
# fails again is lost and its shard is failed (no marker), so --resume scores it again. Actor
# restarts stay unbounded on purpose: an actor whose restarts ran out is dropped from Ray Data's
# pool without a replacement, which would stall the run, and the bounded retries already end
# every batch after two attempts. Batches in flight on an actor when it dies use up a retry too.
RETRIES = 1


def end_actors(ray, roster) -> None:
    """Kill every ScoreActor of the run (on its roster), then the roster. Nothing is lost: the
    stream has ended and the rows are in the driver."""
    try:
        actors = ray.get(roster.all.remote(), timeout=60)
    except Exception:  # noqa: BLE001 - best effort: Ray Data still drops them by reference
        actors = []
    for actor in actors + [roster]:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead
            pass


def _unfinished(url: str, collector: "ShardCollector") -> str:
    end, rows = collector.ends.get(url), collector.rows.get(url, {})
    if end is not None:
        return (f"{end['rows'] - len(rows)} of {end['rows']} row(s) lost: a batch failed twice (its model actor "
                f"died, e.g. killed for host memory, or raised); no marker: --resume scores it again")
    return ("its rows did not all come back: a batch failed twice (its model actor died, e.g. killed for host "
            "memory, or raised), or the run stopped; no marker: --resume scores it again")


def score_on_ray(shards, out: Optional[str] = None, scorers: Sequence = ("clip",), *, actors: Optional[int] = None,
                 gpus_per_actor: Optional[float] = None, cpus_per_actor: float = 1.0, batch_size: Optional[int] = None,
                 address: Optional[str] = None, ray_init: Optional[dict] = None,
                 echo: Optional[Callable[[str], None]] = None, **options) -> RunSummary:
    """Score `shards` on Ray; the options are those of wdsfilter.score.score (thresholds, model,
    caption_key, write_shards, resume, ...). Unless set, the planner (planner.make_plan, on numbers
    measured in one Ray task on a GPU or CPU slot) chooses batch_size (each scorer its own, in
    frames; halved on out-of-memory) and the model actors per GPU (actors: that times the
    cluster's GPUs, else 1; gpus_per_actor: 1 / actors per GPU, 0 on a cluster without GPUs).
    address: a running cluster ("auto"), else Ray starts a local one (ray_init: its options)."""
    cfg = build_config(out, scorers, **options)
    return run_on_ray(shards, cfg, actors=actors, gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor,
                      batch_size=batch_size, address=address, ray_init=ray_init, echo=echo)


def run_on_ray(shards, cfg, *, actors: Optional[int] = None, gpus_per_actor: Optional[float] = None,
               cpus_per_actor: float = 1.0, batch_size: Optional[int] = None, address: Optional[str] = None,
               ray_init: Optional[dict] = None, echo: Optional[Callable[[str], None]] = None) -> RunSummary:
    """score_on_ray with a ScoreConfig (what `wdsfilter score --engine ray` builds)."""

    if cfg.dry_run:
        raise ConfigError("dry_run plans the single-machine engine; Ray plans its own cluster (ray status)")
    # Absolute paths: the driver's working folder may change; a node's is not the driver's.
    cfg = dataclasses.replace(cfg, out=cfg.out if is_fsspec_url(cfg.out) else os.path.abspath(cfg.out),
                              write_shards=cfg.write_shards if not cfg.write_shards or is_fsspec_url(cfg.write_shards)
                              else os.path.abspath(cfg.write_shards))
    # The local engine's URLs, scorers, columns, run state, summary and lock; the keys on the first
    # shard to score are checked there, so configuration errors come before Ray starts.
    run = Run(shards, cfg, echo, engine="ray")
    try:
        return _run_on_ray(run, run.cfg, actors, gpus_per_actor, cpus_per_actor, batch_size, address, ray_init)
    except Exception as e:
        cause = getattr(e, "cause", e)  # a Ray task's error carries the original as .cause
        if is_disk_full(cause):
            error = disk_full(cause, "the run's outputs")
            run.record_run_failure(run.todo, error)  # the ledger names what it left, where space allows
            raise error from None
        raise
    finally:
        run.release_lock()


@dataclasses.dataclass
class RayPlan:
    """How the stream runs: the model actors, their device share and batches (plan -> dataset)."""
    cfg: object  # the run's ScoreConfig, with the plan's batch size where it was planned
    actors: int
    gpus_per_actor: float
    device: str
    batch_size: int
    scorer_batch: Optional[Dict[str, int]] = None
    min_free_host: Optional[int] = None


@dataclasses.dataclass
class Streamed:
    """What the stream did (stream -> outcome): shards written, shards failed, the stages' counts;
    the run's Outcome is made from it."""
    done: List[dict] = dataclasses.field(default_factory=list)
    failed: List[dict] = dataclasses.field(default_factory=list)
    dropped: Counter = dataclasses.field(default_factory=Counter)
    notes: Counter = dataclasses.field(default_factory=Counter)


def _run_on_ray(run, cfg, actors, gpus_per_actor, cpus_per_actor, batch_size, address, ray_init) -> RunSummary:
    """plan -> dataset -> stream -> outcome."""
    todo = run.pending()
    if todo:  # the keys were checked by Run
        for scorer in run.scorers:  # downloads once, on the driver, not per actor (ray_files sends them on)
            getattr(scorer, "fetch", lambda: None)()
    ray = _ray()
    started_here = _connect(ray, cfg, address, ray_init)
    try:
        start = time.perf_counter()
        run.summary.scorers = [s.describe() for s in run.scorers]
        for d in run.summary.scorers if cfg.verbosity else ():
            run.echo(f"scorer: {d}")
        # what the nodes see of the driver's disk: the local shards, the scorers' model files
        inputs = survey(ray, run.scorers, todo, run.echo) if todo else None
        plan = _plan(ray, run, cfg, todo, actors, gpus_per_actor, batch_size, inputs)
        collector = ShardCollector(run.columns)
        streamed = Streamed()
        if todo:
            roster = ray.remote(num_cpus=0)(ActorRoster).remote()
            ds = _dataset(ray, run, plan, todo, cpus_per_actor, roster, inputs)
            _stream(ray, ds, run, plan.cfg, collector, roster, streamed)
        return _outcome(run, todo, start, collector, streamed)
    finally:
        if started_here:
            ray.shutdown()


def _connect(ray, cfg, address, ray_init) -> bool:
    """Starts Ray (or joins the cluster at address) unless it runs already; True if started here."""
    started_here = not ray.is_initialized()
    if started_here:
        import logging
        if not cfg.progress or not cfg.verbosity:  # Ray Data logs its own progress on the driver
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        if cfg.verbosity < 2:  # and its warnings about its own arguments (deprecations)
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        quiet = {} if cfg.verbosity >= 2 else {"logging_level": logging.WARNING}  # "Connecting to ..." lines
        try:
            ray.init(address=address, **dict({"include_dashboard": False, "log_to_driver": False}, **quiet,
                                             **(ray_init or {})))
        except ConnectionError as e:  # no cluster there: a setting to change, not a failed run
            said = str(e).split(". ")[0].rstrip(".")  # Ray's advice names its own flags, not ours
            raise ConfigError(f"no Ray cluster at address {address!r} (--ray-address: {said}). Start one with "
                              f"`ray start --head`, or leave the address out to start a local Ray") from None
    if cfg.verbosity < 2:
        _one_line_errors()
    return started_here


class _OneLineFormatter:
    """Formats a Ray record with a traceback (Ray Data logs a batch lost with its node, which the
    run's summary names with its shard) as its first line; -v shows it whole. A formatter, not a
    filter: a filter that rewrote the record would shorten it for every later handler too (a
    handler shared with the root logger gave wdsfilter's own summaries the one line)."""

    def __init__(self, inner):
        import logging
        self.inner = inner or logging.Formatter()

    def format(self, record) -> str:
        text = self.inner.format(record)
        if record.name.startswith("ray") and "\n" in text:
            return text.splitlines()[0] + " (the whole message: -v)"
        return text


def _one_line_errors() -> None:
    """Ray Data's console handler (its log file keeps every traceback) gets _OneLineFormatter, once."""
    import logging

    import ray.data  # noqa: F401 - configures the "ray.data" logger and its handlers
    for handler in logging.getLogger("ray.data").handlers:
        if "File" not in type(handler).__name__ and not isinstance(handler.formatter, _OneLineFormatter):
            handler.setFormatter(_OneLineFormatter(handler.formatter))


def _plan(ray, run, cfg, todo, actors, gpus_per_actor, batch_size, inputs=None) -> RayPlan:
    """The actors and batches: the user's where set, else the local engine's planner."""
    echo = run.echo
    cluster = ray.cluster_resources()
    cluster_gpus = int(cluster.get("GPU", 0))
    if gpus_per_actor and not cluster_gpus:
        raise ConfigError(f"gpus_per_actor={gpus_per_actor} but the Ray cluster has no GPU")
    if batch_size is None and isinstance(cfg.batch_size, int):
        batch_size = cfg.batch_size
    scorer_batch, min_free_host = None, None
    wants_plan = batch_size is None or (cluster_gpus and gpus_per_actor is None and actors is None)
    if todo and wants_plan:  # the local engine's planner, on one GPU's (or CPU slot's) measurements
        if batch_size is not None:
            cfg = dataclasses.replace(cfg, batch_size=int(batch_size))
        plan = plan_on_ray(ray, run, cfg, todo, cluster, inputs)
        run.summary.plan, run.summary.plan_text = plan.to_dict(), plan.describe()
        shown = cfg.plan_text(plan)
        if shown:
            echo(shown)
        if cfg.verbosity >= 2:
            echo("ray: the plan's decode workers and prefetch are the local engine's; Ray schedules the read tasks")
        dp = plan.devices[0]
        batch_size, scorer_batch, min_free_host = dp.batch_size, dp.scorer_batch, plan.min_free_host
        replicas = dp.replicas
    else:
        replicas = 1
    actors, gpus_per_actor = actor_pool(cluster_gpus, replicas, actors, gpus_per_actor)
    device = "cuda:0" if gpus_per_actor else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES per actor
    batch_size = int(batch_size or (64 if gpus_per_actor else 32))
    per_scorer = (" (" + ", ".join(f"{n} {b}" for n, b in scorer_batch.items()) + " per scorer call)"
                  if scorer_batch and len(scorer_batch) > 1 else "")
    echo(f"ray: {len(todo)} of {len(run.urls)} shard(s) to score with {actors} model actor(s) on {device} "
         f"({gpus_per_actor:g} GPU each), batch {batch_size}{per_scorer}")
    return RayPlan(cfg, actors, gpus_per_actor, device, batch_size, scorer_batch, min_free_host)


def _dataset(ray, run, plan: RayPlan, todo, cpus_per_actor, roster, inputs: Optional[NodeInputs] = None):
    """The shards to score as a Ray dataset: read_shard tasks (on the driver's node where only it
    reads the local shards), then the ScoreActor pool."""
    cfg = plan.cfg
    # Workers open absolute paths: their working folder is not the driver's.
    ds = ray.data.from_items([{"shard": u, "path": absolute_url(u)} for u in todo],
                             override_num_blocks=len(todo))
    only = (run.only_retried() or [None])[0]  # --retry-failed: only its samples are read on
    # Ray 2.5x deprecates passing remote options by keyword (removed in 2.64, which setup.cfg
    # excludes): a warning for us, not for the user; silenced for these calls only (a
    # process-wide filter would outlive the run and pile up, one per run).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=__name__)
        ds = ds.map_batches(functools.partial(read_shard, cfg=cfg, scorers=run.scorers, only=only,
                                              node_inputs=inputs, node=node_id),
                            batch_size=1, batch_format="numpy", max_retries=RETRIES,
                            **(inputs.read_options() if inputs else {}))
        ds = ds.map_batches(ScoreActor, batch_size=plan.batch_size, batch_format="numpy", concurrency=plan.actors,
                            num_gpus=plan.gpus_per_actor, num_cpus=cpus_per_actor,
                            max_restarts=-1, max_task_retries=RETRIES,
                            fn_constructor_kwargs={"cfg": cfg, "scorers": run.model_scorers,
                                                   "columns": run.columns, "batch_size": plan.batch_size,
                                                   "device": plan.device, "scorer_batch": plan.scorer_batch,
                                                   "min_free_host": plan.min_free_host, "roster": roster,
                                                   "node_inputs": inputs,
                                                   # --retry-failed reads only samples that failed: the
                                                   # run's earlier successes say the scorers work
                                                   "scored_before": run.state.scored_rows() if run.retry else 0})
    # A batch that failed after its retries (its actor died twice, or it raised) is dropped
    # by Ray Data instead of ending the run: its shard never completes, so it gets no marker.
    ds.context.max_errored_blocks = -1
    if inputs is not None and inputs.pin_reads and inputs.driver_store:
        # Every block is made on the driver's node (ray_files.NodeInputs.read_options, which
        # also runs no more read tasks than its CPUs): Ray Data's limit, half of the cluster's
        # object store, would let them fill that node's store past the 80% where Ray spills to
        # disk. Measured on three nodes of 80 MB, 289 MB of prepared inputs: 138 MB spilled with
        # Ray Data's defaults, none with these two bounds (tests/test_ray_nodes.py).
        options = ds.context.execution_options
        options.resource_limits = options.resource_limits.copy(object_store_memory=inputs.driver_store / 2)
    return ds


def _stream(ray, ds, run, cfg, collector: "ShardCollector", roster, streamed: Streamed) -> None:
    """The scored rows, shard by shard: the driver writes each shard whose rows are all in, as the
    local engine's main process does (write_finished: the run folder has one writer, and no node
    needs to reach it); a shard whose stream failed is listed failed."""
    done, failed, dropped, notes = streamed.done, streamed.failed, streamed.dropped, streamed.notes
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for url, rows, end in collector.add(batch):
                dropped.update(end.get("dropped", {}))
                notes.update(end.get("notes", {}))
                if end.get("unopened"):  # no outputs and no marker: --resume tries it again
                    failed.append({"url": url, "reason": f"unreadable: {end['error']}"})
                elif end.get("failed"):  # not read to its end: no outputs, no marker either
                    failed.append({"url": url, "reason": read_failed_reason(end["failed"])})
                else:  # a tar cut short is listed from its marker (Run.finish)
                    done.append(write_finished(url, rows, end, cfg, run.state, run.columns,
                                               absolute_url(url), run.retry.get(url), engine="ray"))
    finally:
        # The stream has ended: end its actors (see ActorRoster) so that their CPUs and
        # GPUs are free for the next run in this cluster.
        end_actors(ray, roster)
    failed += [{"url": r["shard"], "reason": r["failed"]} for r in done if r.get("failed")]
    done[:] = [r for r in done if not r.get("failed")]


def _outcome(run, todo, start: float, collector: "ShardCollector", streamed: Streamed) -> RunSummary:
    """The run's Outcome, from which Run.finish builds the summary as it does for the local engine."""
    done, failed = streamed.done, streamed.failed
    seconds = time.perf_counter() - start
    finished = {r["shard"] for r in done} | {f["url"] for f in failed}
    return run.finish(Outcome(  # the local engine's summary, histograms and nothing-scored check
        shards_scored=len(done), samples=sum(int(r["rows"]) for r in done),
        failed=failed + [{"url": u, "reason": _unfinished(u, collector)} for u in todo if u not in finished],
        stage_counts={"dropped": dict(streamed.dropped), "notes": dict(streamed.notes)},
        seconds=seconds, scoring_seconds=seconds))
