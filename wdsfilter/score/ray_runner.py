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
                 shard are in, a finish_shard task writes scores/<shard>.parquet, the filtered
                 shard and the done marker: a run killed half-way leaves its finished shards done.

Rows, shard completion and the run state are the local engine's own (rows.py, run.Run), so `--resume`,
`wdsfilter.loader(scores=...)` and the summary work on it unchanged. The shards and the output
folder must be reachable from every node (a shared filesystem); Ray moves only the rows.

    from wdsfilter.score.ray_runner import score_on_ray
    summary = score_on_ray("s3-mounted/shards/", out="/shared/scores", scorers=["clip"],
                           min_clip=0.28, actors=8, gpus_per_actor=1, address="auto")
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import pickle
import time
from collections import Counter
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from .embeddings import FIELD as EMBEDDINGS
from .faults import disk_full, is_disk_full, read_failed_reason
from .outputs import RunSummary
from .rows import BASE_FIELDS, complete_row, item_row, new_row, write_shard

PENDING = "__pending__"  # a row whose inputs still need the model
SHARD_END_ROW = "__shard_end__"  # one per shard: carries the reader's error and member count


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data is the part we use
    except ImportError as e:
        raise ConfigError("the Ray engine needs Ray Data: pip install 'wdsfilter[ray]'") from e
    return ray


# -- prepared inputs as columns -------------------------------------------------------------------
# A row's prepared inputs cross from its read task to a model actor as two columns: PAYLOAD, every
# array of the row (numpy arrays, CPU tensors: pixels, tokens, OCR frames) copied once into one
# uint8 vector, which Ray stores as an Arrow tensor column (no pickling of the pixels; in the
# actor the arrays are views of one writable copy of the vector); and PAYLOAD_META, the small
# rest pickled: the structure with a Slot in each array's place, and the prepare() errors.
PAYLOAD, PAYLOAD_META = "payload", "payload_meta"
_ALIGN = 16  # every array starts on a 16-byte boundary of its row's vector (rows are padded to it)


class Slot(NamedTuple):
    offset: int
    dtype: str  # numpy dtype string
    shape: Tuple[int, ...]
    torch: bool  # give it back as a torch tensor


def _walk(obj, fn):
    """fn on every leaf inside dicts, lists, tuples (named too) and dataclass instances (an OcrInput)."""
    if isinstance(obj, Slot):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    if isinstance(obj, tuple):
        values = [_walk(v, fn) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(new, f.name, _walk(getattr(obj, f.name), fn))
        return new
    return fn(obj)


def pack_payload(obj) -> Tuple[np.ndarray, bytes]:
    """(uint8 vector of every array in obj, pickled structure with Slots); arrays Ray or numpy
    cannot view as bytes (object arrays, bfloat16 tensors) stay in the pickled part."""
    arrays: List[Tuple[int, np.ndarray]] = []
    total = 0

    def take(x):
        nonlocal total
        is_torch = type(x).__module__.startswith("torch") and hasattr(x, "numpy")
        try:
            if is_torch:
                a = np.ascontiguousarray(x.detach().cpu().numpy())
            elif isinstance(x, np.ndarray) and x.dtype != object:
                a = np.ascontiguousarray(x)
            else:
                return x
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): pickled with the rest
            return x
        slot = Slot(total, a.dtype.str, tuple(a.shape), is_torch)
        arrays.append((total, a))
        total += -(-a.nbytes // _ALIGN) * _ALIGN
        return slot

    skeleton = _walk(obj, take)
    data = np.empty(total, np.uint8)
    for offset, a in arrays:
        data[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
    return data, pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_payload(data, meta: bytes):
    """What pack_payload was given; its arrays are views of one writable copy of `data`."""
    skeleton = pickle.loads(meta)
    buf = np.array(data, dtype=np.uint8, copy=True) if data is not None else np.zeros(0, np.uint8)

    def put(x):
        if not isinstance(x, Slot):
            return x
        dtype = np.dtype(x.dtype)
        n = int(np.prod(x.shape, dtype=np.int64)) * dtype.itemsize
        a = buf[x.offset:x.offset + n].view(dtype).reshape(x.shape)
        if x.torch:
            import torch
            return torch.from_numpy(a)
        return a

    return _walk(skeleton, put)


# -- decode side: one task per shard --------------------------------------------------------------
def read_shard(batch, cfg, scorers, rows_per_block: int = 64) -> Iterator[Dict[str, list]]:
    """Ray map_batches generator over shard URLs: every sample's row, with its prepared inputs in
    the PAYLOAD columns (pack_payload) where a model still has to score it, then one SHARD_END_ROW row whose
    message tells the driver how many rows the shard has, how the reader ended and the shard's
    stage counts. Yields column batches of up to rows_per_block rows, so a big shard never sits
    in memory whole."""
    from ..markers import MARKER, SHARD_END
    from ..pipeline import sample_pipeline
    from ..tally import Tally
    from .prepare import Prepare

    stage = cfg.scoring_stage_config(scorers)
    paths = batch["path"] if "path" in batch else batch["shard"]
    for url, path in zip(list(batch["shard"]), list(paths)):  # rows carry the URL; the worker opens `path`
        tally = Tally(0, 0, name="wdsfilter score (ray)")
        pipeline = sample_pipeline([path], stage, tally, extra=[Prepare(scorers)])
        rows: List[dict] = []
        index = 0
        end = None
        for item in pipeline:
            if item.get(MARKER) == SHARD_END:
                end = {"error": item.get("error"), "members": item.get("members", 0), "failed": item.get("failed")}
                continue
            row = item_row(item, index, scorers, cfg.bounds)
            row["shard"] = url  # the URL as the driver knows it (the worker opened `path`)
            row[PAYLOAD], row[PAYLOAD_META] = _EMPTY, b""
            if row["status"] is None:
                row["status"] = PENDING
                row[PAYLOAD], row[PAYLOAD_META] = pack_payload((item["inputs"], item["errors"]))
            rows.append(row)
            index += 1
            if len(rows) >= rows_per_block:
                yield _columns(rows)
                rows = []
        if end is None:  # no end marker: the shard could not be opened (counted as unreadable_shard)
            examples = tally.examples.get("unreadable_shard", [])
            end = {"error": examples[0].message if examples else "could not be opened", "members": 0,
                   "unopened": True}
        end.update(rows=index, dropped=dict(tally.dropped), notes=dict(tally.notes))
        rows.append(dict(new_row("", url, -1, SHARD_END_ROW, message=json.dumps(end)),
                         **{PAYLOAD: _EMPTY, PAYLOAD_META: b""}))
        yield _columns(rows)


_EMPTY = np.zeros(0, np.uint8)  # PAYLOAD of a row with nothing to score: same dtype and ndim, so one tensor column


def _columns(rows: List[dict]) -> Dict[str, list]:
    names = list(rows[0])
    for r in rows[1:]:
        names += [n for n in r if n not in names]
    return {n: [r.get(n) for r in rows] for n in names}


# -- model side: one actor per GPU or CPU slot -----------------------------------------------------
class ScoreActor:
    """The engine's ModelRunner in a Ray actor: loads the scorers once on its device, scores the
    pending rows of each batch with the engine's back-off (halve and retry on out-of-memory; no
    row lost or scored twice) and returns the rows complete, without their payload."""

    def __init__(self, cfg, scorers, columns: Sequence[str], batch_size: int, device: str,
                 scorer_batch: Optional[Dict[str, int]] = None, min_free_host: Optional[int] = None):
        from .memory import host_status
        from .modelworker import ModelRunner
        from .planner import default_min_free_host
        self.cfg, self.columns, self.scorers = cfg, list(columns), scorers
        self.runner = ModelRunner(scorers, device)
        self.runner.load()
        self.runner.configure(batch_size, scorer_batch=scorer_batch,
                              min_free_host=min_free_host or default_min_free_host(cfg, host_status()["total"]))

    def __call__(self, batch):
        n = len(batch["key"])
        rows = [{f: _plain(batch[f][i]) for f in BASE_FIELDS} for i in range(n)]
        pending = [i for i in range(n) if rows[i]["status"] == PENDING]
        # (inputs, prepare errors), arrays as views of one copy of the row's tensor column
        loaded = {i: unpack_payload(batch[PAYLOAD][i], batch[PAYLOAD_META][i]) for i in pending}
        for i, scores, errors in self.runner.score([(i, loaded[i][0]) for i in pending]):
            rows[i]["status"] = None
            complete_row(rows[i], self.scorers, scores, {**loaded[i][1], **errors}, self.cfg.bounds)
        out = {f: [r[f] for r in rows] for f in BASE_FIELDS}
        out[EMBEDDINGS] = [pickle.dumps(r.get(EMBEDDINGS)) for r in rows]  # --save-embeddings (else None)
        for c in self.columns:  # every batch has every column, so Ray's blocks share one schema
            out[c] = [json.dumps(r.get(c)) for r in rows]
        return out


def _plain(v):
    """numpy scalars from Ray's batches -> Python values; the NaN that a missing text becomes
    on its way through Arrow and numpy -> None."""
    v = v.item() if hasattr(v, "item") and not isinstance(v, (bytes, str)) else v
    return None if isinstance(v, float) and v != v else v


# -- the plan: the local engine's planner on numbers measured in one Ray task ---------------------
def measure(cfg, scorers, model_scorers, urls: Sequence[str], device: str) -> dict:
    """A Ray task (on one GPU, or a CPU slot): what the local engine measures before planning:
    the scorers loaded on `device` (free memory, footprints) and the probe of a few prepared
    samples (activation memory per frame and scorer, speeds), and the node's host numbers."""
    from .memory import host_status
    from .modelworker import ModelRunner
    from .planner import ProbeReport
    from .prepare import collect_probe

    inputs, prep_seconds, scanned = collect_probe(list(urls), cfg.scoring_stage_config(scorers), scorers,
                                                  cfg.probe_samples, cfg.probe_scan, cfg.probe_seconds)
    runner = ModelRunner(model_scorers, device)
    report = runner.load()
    try:
        probe = ProbeReport.measured(inputs, scanned, prep_seconds, runner.probe)
    finally:
        runner.unload()
    report["worker"] = 0
    return {"report": report, "probe": probe, "host": host_status()}


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


def plan_on_ray(ray, run, cfg, urls: Sequence[str], cluster: dict):
    """make_plan (planner.py) on numbers measured on the cluster: one GPU's free memory and the
    scorers' footprints and per-frame activations there (or a CPU slot's), with the cores of the
    cluster per GPU as the host's. Returns the Plan; its first DevicePlan holds the batch sizes and
    the model processes per GPU (replicas: actors per GPU)."""
    from .planner import make_plan
    gpus = int(cluster.get("GPU", 0))
    task = ray.remote(num_cpus=1, num_gpus=1 if gpus else 0, max_retries=0)(measure)
    m = ray.get(task.remote(cfg, run.scorers, run.model_scorers, [absolute_url(u) for u in urls],
                            "cuda:0" if gpus else "cpu"))
    host = dict(m["host"])
    if gpus:  # the cores beside each GPU bound its model processes (planner.CORES_PER_GPU_PROCESS)
        host["cpus"] = max(1, int(cluster.get("CPU", host["cpus"]) // gpus))
    return make_plan(cfg, [m["report"]], m["probe"], host, len(urls))


# -- per shard: score file, filtered shard, marker --------------------------------------------------
def finish_shard(url: str, rows: List[dict], end: dict, cfg, state, columns: Sequence[str],
                 path: Optional[str] = None) -> dict:
    """A Ray task: the score values back from JSON, rows in shard order, then rows.write_shard
    (score file, embeddings, filtered shard from `path`, completion marker) as the local engine does."""
    for row in rows:
        for c in columns:
            row[c] = json.loads(row[c])
    rows.sort(key=lambda r: r["index"])
    failed = write_shard(url, rows, end, cfg, state, columns, source=path, engine="ray")
    return {"shard": url, "rows": len(rows), **({"failed": failed} if failed else {})}


class _Collector:
    """Driver side: rows arrive from the actors in any order; a shard is complete when its
    SHARD_END_ROW row has come and every row index it announced. Rows are kept by index, so a row
    that a retried Ray task sends twice is counted once."""

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self.rows: Dict[str, Dict[int, dict]] = {}
        self.ends: Dict[str, dict] = {}

    def add(self, batch) -> List[tuple]:
        """Rows of one batch in; (url, rows, end) of every shard this batch completed out."""
        complete = []
        for i in range(len(batch["key"])):
            row = {f: _plain(batch[f][i]) for f in BASE_FIELDS}
            url = row["shard"]
            if row["status"] == SHARD_END_ROW:
                self.ends[url] = json.loads(row["message"])
            else:
                row.update({c: _plain(batch[c][i]) for c in self.columns})
                row[EMBEDDINGS] = pickle.loads(batch[EMBEDDINGS][i])
                self.rows.setdefault(url, {})[row["index"]] = row
            end = self.ends.get(url)
            if end is not None and len(self.rows.get(url, ())) == end["rows"]:
                complete.append((url, list(self.rows.pop(url, {}).values()), self.ends.pop(url)))
        return complete


# -- the run ---------------------------------------------------------------------------------------
# Ray Data restarts a dead actor and retries its tasks forever by default: a batch that kills its
# actor (a host OOM kill) loops. A task (a batch, or a shard's read) is retried once; a batch that
# fails again is lost and its shard is failed (no marker), so --resume scores it again. Actor
# restarts stay unbounded on purpose: an actor whose restarts ran out is dropped from Ray Data's
# pool without a replacement, which would stall the run, and the bounded retries already end
# every batch after two attempts. Batches in flight on an actor when it dies use up a retry too.
RETRIES = 1


def _settle(ray, refs: list) -> List[dict]:
    """The results of finish_shard tasks once every one has ended. ray.get raises at the first
    failed task (a full disk) while the others may still be writing; the run must not return
    (and its caller clean up or retry) with outputs still being written behind it."""
    if refs:
        ray.wait(refs, num_returns=len(refs))
    results, error = [], None
    for ref in refs:
        try:
            results.append(ray.get(ref))
        except Exception as e:  # noqa: BLE001 - raised below, after every task has ended
            error = error or e
    if error is not None:
        raise error
    return results


def absolute_url(url: str) -> str:
    """A local shard as an absolute path (what a Ray worker elsewhere can open); URLs unchanged."""
    from ..shards import is_pipe, is_remote
    if is_pipe(url) or is_remote(url):
        return url
    return os.path.abspath(url[len("file:"):] if url.startswith("file:") else url)


def _unfinished(url: str, collector: "_Collector") -> str:
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
    from . import build_config
    cfg = build_config(out, scorers, **options)
    return run_on_ray(shards, cfg, actors=actors, gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor,
                      batch_size=batch_size, address=address, ray_init=ray_init, echo=echo)


def run_on_ray(shards, cfg, *, actors: Optional[int] = None, gpus_per_actor: Optional[float] = None,
               cpus_per_actor: float = 1.0, batch_size: Optional[int] = None, address: Optional[str] = None,
               ray_init: Optional[dict] = None, echo: Optional[Callable[[str], None]] = None) -> RunSummary:
    """score_on_ray with a ScoreConfig (what `wdsfilter score --engine ray` builds)."""
    from .run import Run

    if cfg.dry_run:
        raise ConfigError("dry_run plans the single-machine engine; Ray plans its own cluster (ray status)")
    # Ray workers may run in another folder (or on another node of the shared filesystem).
    cfg = dataclasses.replace(cfg, out=os.path.abspath(cfg.out),
                              write_shards=os.path.abspath(cfg.write_shards) if cfg.write_shards else None)
    # The local engine's URLs, scorers, columns, run state, summary and lock; the keys on the first
    # shard to score are checked there, so configuration errors come before Ray starts.
    run = Run(shards, cfg, echo)
    try:
        return _run_on_ray(run, cfg, actors, gpus_per_actor, cpus_per_actor, batch_size, address, ray_init)
    except Exception as e:
        cause = getattr(e, "cause", e)  # a Ray task's error carries the original as .cause
        if is_disk_full(cause):
            raise disk_full(cause, "the run's outputs") from None
        raise
    finally:
        run.release_lock()


def _run_on_ray(run, cfg, actors, gpus_per_actor, cpus_per_actor, batch_size, address, ray_init) -> RunSummary:
    echo = run.echo
    todo = run.pending()
    if todo:  # the keys were checked by Run
        for scorer in run.scorers:  # downloads once, on the driver (a shared filesystem), not per actor
            getattr(scorer, "fetch", lambda: None)()
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        if not cfg.progress:  # Ray Data logs its own progress on the driver
            import logging
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        ray.init(address=address, **dict({"include_dashboard": False, "log_to_driver": False}, **(ray_init or {})))
    try:
        cluster = ray.cluster_resources()
        cluster_gpus = int(cluster.get("GPU", 0))
        if gpus_per_actor and not cluster_gpus:
            raise ConfigError(f"gpus_per_actor={gpus_per_actor} but the Ray cluster has no GPU")
        if batch_size is None and isinstance(cfg.batch_size, int):
            batch_size = cfg.batch_size
        start = time.perf_counter()
        run.summary.scorers = [s.describe() for s in run.scorers]
        scorer_batch, min_free_host = None, None
        wants_plan = batch_size is None or (cluster_gpus and gpus_per_actor is None and actors is None)
        if todo and wants_plan:  # the local engine's planner, on one GPU's (or CPU slot's) measurements
            if batch_size is not None:
                cfg = dataclasses.replace(cfg, batch_size=int(batch_size))
            plan = plan_on_ray(ray, run, cfg, todo, cluster)
            run.summary.plan, run.summary.plan_text = plan.to_dict(), plan.describe()
            echo(run.summary.plan_text)
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
        done: List[dict] = []
        failed: List[dict] = []
        collector = _Collector(run.columns)
        dropped, notes = Counter(), Counter()
        if todo:
            # Workers open absolute paths: their working folder is not the driver's.
            ds = ray.data.from_items([{"shard": u, "path": absolute_url(u)} for u in todo],
                                     override_num_blocks=len(todo))
            ds = ds.map_batches(functools.partial(read_shard, cfg=cfg, scorers=run.scorers),
                                batch_size=1, batch_format="numpy", max_retries=RETRIES)
            ds = ds.map_batches(ScoreActor, batch_size=batch_size, batch_format="numpy", concurrency=actors,
                                num_gpus=gpus_per_actor, num_cpus=cpus_per_actor,
                                max_restarts=-1, max_task_retries=RETRIES,
                                fn_constructor_kwargs={"cfg": cfg, "scorers": run.model_scorers,
                                                       "columns": run.columns, "batch_size": batch_size,
                                                       "device": device, "scorer_batch": scorer_batch,
                                                       "min_free_host": min_free_host})
            # A batch that failed after its retries (its actor died twice, or it raised) is dropped
            # by Ray Data instead of ending the run: its shard never completes, so it gets no marker.
            ds.context.max_errored_blocks = -1
            finish = ray.remote(num_cpus=1)(finish_shard)
            writing = []
            try:
                for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                    for url, rows, end in collector.add(batch):
                        dropped.update(end.get("dropped", {}))
                        notes.update(end.get("notes", {}))
                        if end.get("unopened"):  # no outputs and no marker: --resume tries it again
                            failed.append({"url": url, "reason": f"unreadable: {end['error']}"})
                        elif end.get("failed"):  # not read to its end: no outputs, no marker either
                            failed.append({"url": url, "reason": read_failed_reason(end["failed"])})
                        else:
                            writing.append(finish.remote(url, rows, end, cfg, run.state, run.columns,
                                                         absolute_url(url)))
                    ready, writing = ray.wait(writing, num_returns=len(writing), timeout=0) if writing else ([], [])
                    done += ray.get(ready)
            finally:
                # Shards whose rows all arrived are written even when the stream fails: --resume keeps them.
                done += _settle(ray, writing)
            failed += [{"url": r["shard"], "reason": r["failed"]} for r in done if r.get("failed")]
            done = [r for r in done if not r.get("failed")]
        run.summary.shards_scored = len(done)
        run.summary.samples_this_run = sum(int(r["rows"]) for r in done)
        run.summary.seconds = run.summary.scoring_seconds = time.perf_counter() - start
        finished = {r["shard"] for r in done} | {f["url"] for f in failed}
        run.summary.shards_failed = failed + [{"url": u, "reason": _unfinished(u, collector)}
                                                 for u in todo if u not in finished]
        run.summary.stage_counts = {"dropped": dict(dropped), "notes": dict(notes)}
        return run.finish()  # the local engine's summary, histograms and nothing-scored check
    finally:
        if started_here:
            ray.shutdown()
