"""Scoring on a Ray cluster with Ray Data: the same stages, scorers, rows and output folder as the
single-machine engine; Ray schedules the work across nodes and GPUs, streams it with bounded
memory (its backpressure) and retries failed tasks.

    shard URLs ─ read_shard: a Ray task per shard, sample_pipeline + Prepare (the decode side)
               ─ ScoreActor: map_batches, one actor per GPU (or CPU slot), OOM back-off
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

import dataclasses
import functools
import json
import os
from collections import Counter
import pickle
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

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


# -- decode side: one task per shard --------------------------------------------------------------
def read_shard(batch, cfg, scorers, rows_per_block: int = 64) -> Iterator[Dict[str, list]]:
    """Ray map_batches generator over shard URLs: every sample's row, with its prepared inputs
    pickled into `payload` where a model still has to score it, then one SHARD_END_ROW row whose
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
            row["payload"] = b""
            if row["status"] is None:
                row["status"] = PENDING
                row["payload"] = pickle.dumps((item["inputs"], item["errors"]), protocol=pickle.HIGHEST_PROTOCOL)
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
        rows.append(dict(new_row("", url, -1, SHARD_END_ROW, message=json.dumps(end)), payload=b""))
        yield _columns(rows)


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

    def __init__(self, cfg, scorers, columns: Sequence[str], batch_size: int, device: str):
        from .memory import host_status
        from .modelworker import ModelRunner
        from .planner import default_min_free_host
        self.cfg, self.columns, self.scorers = cfg, list(columns), scorers
        self.runner = ModelRunner(scorers, device)
        self.runner.load()
        self.runner.configure(batch_size, min_free_host=default_min_free_host(cfg, host_status()["total"]))

    def __call__(self, batch):
        n = len(batch["key"])
        rows = [{f: _plain(batch[f][i]) for f in BASE_FIELDS} for i in range(n)]
        pending = [i for i in range(n) if rows[i]["status"] == PENDING]
        loaded = {i: pickle.loads(batch["payload"][i]) for i in pending}  # (inputs, prepare errors)
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
    caption_key, write_shards, resume, ...). actors: model actors (default: one per GPU of the
    cluster, else 1); gpus_per_actor: default 1 when the cluster has GPUs, else 0 (CPU);
    batch_size: rows per model call (default 64 on GPU, 32 on CPU; halved on out-of-memory).
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
        cluster_gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus_per_actor is None:
            gpus_per_actor = 1.0 if cluster_gpus else 0.0
        if gpus_per_actor and not cluster_gpus:
            raise ConfigError(f"gpus_per_actor={gpus_per_actor} but the Ray cluster has no GPU")
        if actors is None:
            actors = max(1, int(cluster_gpus / gpus_per_actor)) if gpus_per_actor else 1
        device = "cuda:0" if gpus_per_actor else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES per actor
        if batch_size is None and isinstance(cfg.batch_size, int):
            batch_size = cfg.batch_size
        batch_size = int(batch_size or (64 if gpus_per_actor else 32))
        start = time.perf_counter()
        run.summary.scorers = [s.describe() for s in run.scorers]
        echo(f"ray: {len(todo)} of {len(run.urls)} shard(s) to score with {actors} model actor(s) on {device} "
             f"({gpus_per_actor:g} GPU each), batch {batch_size}")
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
                                                       "device": device})
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
