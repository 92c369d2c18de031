"""Many `wdsfilter score --join` workers on one run folder (docs/scale.md): the scoring side of the
per-shard claims of runfolder/claims.py.

    worker start    its lease (workers/<token>.json), refused while a single run holds the folder
                    (.lock.json); run.json created, or joined with the same settings and shards
    each round      decode workers ask for shards (ShardFeed); the main process claims one per
                    ask (claims.Claims.next: afresh, or taken over from a stale worker) and the
                    local engine scores them as it scores any shard; a shard that failed is
                    marked so in its claim, with its entry in the failure ledger
    between rounds  a survey: shards to take over start another round; shards others hold live
                    are waited for (their claims may go stale); none left: the worker stops
    the end         the worker that finds every shard ended does the end-of-run work under the
                    claim `.finish.json` (Run.finish: summary, statistics, shares, report, the
                    failure ledger merged, sizes.json of --write-shards)

Every write of a worker is fenced by its own lease, and so by every claim it holds (lease.py,
claims.py); a worker that lost its lease (stopped past it, taken over) writes nothing more and
exits 3 naming the worker that took over.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..core.errors import ConfigError
from ..runfolder import layout
from ..runfolder.claims import Claims, claim_order, run_status, worker_token
from .outcome import Outcome, unopened_reason
from ..runfolder.lease import (LEASE_NAME, WORKERS, Lease, LeaseHeldError, describe_holder, record_at, stale_reason,
                               stale_seconds, live_records, record_names)
from ..storage.remote import is_fsspec_url, redact_url
from ..core.tally import Tally
from ..core.progress import Progress
from ..storage.shards import is_local
from .ledger import shard_entry, write_shard_failures, folder as ledger_folder
from .rows import NothingScoredError
from ..storage.shardstats import update_sizes
from ..storage.atomic import is_temporary
from ..runfolder.embeddings import folders as embedding_folders

log = logging.getLogger("wdsfilter")

SLURM_TASK, SLURM_MIN, SLURM_COUNT = "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT"
K8S_INDEX = "JOB_COMPLETION_INDEX"
SHOWN_WORKERS = 40  # --status: the workers listed one by one


def task_slice(index: Optional[int], count: Optional[int], environ=None) -> Tuple[Optional[int], Optional[int]]:
    """(index, count) of this worker's slice: the flags, else a Slurm array task's
    (SLURM_ARRAY_TASK_ID less SLURM_ARRAY_TASK_MIN, of SLURM_ARRAY_TASK_COUNT), else a Kubernetes
    indexed Job's (JOB_COMPLETION_INDEX, of the --task-count given); (None, None): no slice."""
    env = os.environ if environ is None else environ
    source = "--task-index"
    if index is None and env.get(SLURM_TASK):
        index = _number(env[SLURM_TASK], SLURM_TASK) - _number(env.get(SLURM_MIN) or "0", SLURM_MIN)
        count = count if count is not None else _number(env.get(SLURM_COUNT) or "", SLURM_COUNT)
        source = SLURM_TASK
    elif index is None and env.get(K8S_INDEX):
        index, source = _number(env[K8S_INDEX], K8S_INDEX), K8S_INDEX
        if count is None:
            raise ConfigError(f"{K8S_INDEX}={env[K8S_INDEX]} gives this worker's index; give the number of tasks "
                              f"too (--task-count N: the Job's completions)")
    if index is None:
        if count is not None:
            raise ConfigError(f"--task-count {count} without --task-index (nor {SLURM_TASK} or {K8S_INDEX} set): "
                              f"give this worker's index")
        return None, None
    if count is None or count < 1:
        raise ConfigError(f"{source}: give the number of tasks (--task-count N)")
    if not 0 <= index < count:
        raise ConfigError(f"{source}: task index {index} is not in 0..{count - 1} (--task-count {count})")
    return index, count


def _number(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a whole number") from None


# -- the shards a round reads ---------------------------------------------------------------------------
class FedShards:
    """The shard source of a round's pipeline (it replaces the fixed shard list): each reader, a
    decode worker or the main process, asks for a shard when it needs one and reads it; None ends
    it. Picklable: decode workers get the two queues when they start."""

    def __init__(self, asks, answers):
        self.asks, self.answers = asks, answers

    def __iter__(self):
        while True:
            self.asks.put(True)
            url = self.answers.get()
            if url is None:
                return
            yield {"url": url}


class ShardFeed:
    """A thread of the main process that answers each ask with a shard claimed then (claims.next),
    so no worker holds a claim on a shard none of its readers is ready for. `first`: claimed
    already. Records the shards handed out and an error that stopped the claiming."""

    def __init__(self, claims: Claims, first: str, start_method: Optional[str] = None):
        ctx = multiprocessing.get_context(start_method)
        self.claims, self.first = claims, first
        self.asks, self.answers = ctx.SimpleQueue(), ctx.SimpleQueue()
        self.handed: List[str] = []
        self.error: Optional[BaseException] = None
        self._dry = False
        self._thread = threading.Thread(target=self._serve, name="wdsfilter-claims", daemon=True)
        self._thread.start()

    def source(self) -> FedShards:
        return FedShards(self.asks, self.answers)

    def _serve(self) -> None:
        while self.asks.get() is not None:
            url = None
            if self.first is not None:
                url, self.first = self.first, None
            elif not self._dry:
                try:
                    url = self.claims.next()
                except BaseException as e:  # noqa: BLE001 - said by the run once the round ends
                    self.error = e
            if url is None:
                self._dry = True
            else:
                self.handed.append(url)
            self.answers.put(url)

    def stop(self) -> None:
        self.asks.put(None)
        self._thread.join(timeout=60)


# -- one worker ----------------------------------------------------------------------------------------
@dataclass
class Counts:
    """What this worker did, as its lease's record reports it (`--status`, the finisher's summary)."""
    shards: int = 0
    rows: int = 0
    failed_shards: int = 0
    seconds: float = 0.0

    def record(self, idle: bool, stage_counts: Optional[dict] = None) -> dict:
        return {"shards_done": self.shards, "rows": self.rows, "shards_failed": self.failed_shards,
                "seconds": round(self.seconds, 1), "idle": idle, **({"stage_counts": stage_counts} if stage_counts else {})}


class Worker:
    """This process as one worker of a joined run: its token, slice, lease and claims."""

    def __init__(self, cfg, url: str):
        self.cfg, self.url = cfg, url  # url: the run folder as given (a bucket's, not the staging copy)
        self.token = worker_token()
        self.index, self.count = task_slice(cfg.task_index, cfg.task_count)
        self.lease = Lease(url, cfg.stage.storage_options, name=f"{WORKERS}/{self.token}.json", token=self.token)
        self.lease.info["task"] = None if self.index is None else f"{self.index}/{self.count}"
        self.lease.report = Counts().record(idle=True)
        self.claims: Optional[Claims] = None
        self.last_survey = None  # the survey after the last round (claims.Survey)
        self.counts = Counts()

    def refuse_single_run(self) -> None:
        """A run without --join that holds the folder (its `.lock.json` live): refused, as that run
        refuses the workers (lease.Lease.acquire)."""
        holder = record_at(self.url, LEASE_NAME, self.cfg.stage.storage_options).read_data()
        if holder is not None and stale_reason(holder, self.lease.stale) is None:
            raise LeaseHeldError(f"--out {self.lease.shown} is in use by a run without --join{describe_holder(holder)};"
                                 f" wait for it to finish, or use another --out")

    def run_record(self):
        return record_at(self.url, layout.RUN_JSON, self.cfg.stage.storage_options)

    def start(self, state, urls: List[str]) -> List[str]:
        """The claims, once run.json names the run; the shards not done (by the markers listed)."""
        own, others = claim_order(urls, self.token, self.index, self.count, self.cfg.steal)
        self.claims = Claims(self.url, state.names, self.lease, state.run_id, own, others,
                             self.cfg.stage.storage_options)
        self.claims.start()
        state.writer = self.token  # in each marker and score file this worker writes
        done = self.claims.done_at_start
        return [u for u in urls if state.names[u] not in done]

    @property
    def scope(self) -> List[str]:
        """The shards this worker waits for and takes over: its slice with --no-steal, else all."""
        if self.cfg.steal or self.index is None:
            return list(self.claims.names.values())
        return [self.claims.names[u] for u in self.claims.own]

    def report(self, idle: bool, stage_counts: Optional[dict] = None, now: bool = False) -> None:
        self.lease.report = self.counts.record(idle, stage_counts)
        if now:
            self.lease.renew()


def status_text(folder: str, storage_options=None) -> str:
    """`wdsfilter score --status RUN`: the whole run's shards, samples, failures and workers."""
    names = _run_shard_names(folder, storage_options)
    s = run_status(folder, names, stale_seconds(), storage_options)
    rows = sum(int(w.get("rows") or 0) for w in s.workers)
    lines = [f"run {redact_url(folder) if is_fsspec_url(folder) else folder}: {s.shards} shard(s): {s.done} done, "
             f"{len(s.claimed)} claimed by live workers, {len(s.stale)} claimed by workers that are gone (taken over "
             f"by the next worker), {len(s.failed)} failed, {s.free} free",
             f"  samples scored (as the workers report them): {rows}"]
    for name, reason in sorted(s.failed.items())[:20]:
        lines.append(f"  shard {name} FAILED: {reason}")
    alive = [w for w in s.workers if w["state"] == "alive"]
    lines.append(f"  workers: {len(alive)} alive, {len(s.workers) - len(alive)} ended or gone")
    now = time.time()
    for w in s.workers[:SHOWN_WORKERS]:  # the latest heartbeats first
        beat = now - float(w.get("heartbeat") or now)
        task = f", task {w['task']}" if w.get("task") else ""
        lines.append(f"    {w['token']} {w['state']:>6}: pid {w.get('pid')} on {w.get('host')}{task}, "
                     f"{w.get('shards_done', 0)} shard(s), {w.get('rows', 0)} samples, "
                     f"{w.get('shards_failed', 0)} failed; last heartbeat {beat:.0f}s ago")
    if len(s.workers) > SHOWN_WORKERS:
        lines.append(f"    ... and {len(s.workers) - SHOWN_WORKERS} more (workers/ in the run folder)")
    finish = s.finish or {}
    if finish.get("finished"):
        lines.append(f"  the run's end (summary, report) was written by worker {finish.get('worker')} for "
                     f"{finish.get('done')} done and {finish.get('failed')} failed shard(s)")
    elif finish:
        lines.append(f"  the run's end is being written by worker {finish.get('worker')}")
    return "\n".join(lines)


def _run_shard_names(folder: str, storage_options=None) -> List[str]:
    """The run's shard names, from shards.json (read where it lies)."""
    import json
    record = record_at(folder, layout.SHARDS_FILE, storage_options)
    if record.remote:
        try:
            data = json.loads(record.fs.cat_file(record.path))
        except FileNotFoundError:
            data = None
    else:
        data = layout.read_json(folder, record.path)
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise ConfigError(f"{folder} holds no scoring run (no shards.json); pass the --out folder of a `wdsfilter "
                          f"score` run")
    return [str(e.get("name")) for e in data["shards"] if isinstance(e, dict)]


# -- the run loop of a worker ------------------------------------------------------------------------------
def run_joined(engine):
    """The local engine's run as one worker of a joined run (engines/local.LocalEngine._run): rounds of claimed
    shards until none is left to claim or wait for, then the end of the run if it is this
    worker's to do. Returns the summary (the run's, or this worker's share)."""
    cfg, worker, summary = engine.run.cfg, engine.run.joined, engine.run.summary
    started = time.perf_counter()
    outcome, tally = Outcome(), Tally(0, 0, name="wdsfilter score")
    pool = plan = sizes = progress = None
    if worker.claims.done_at_start:
        engine.run.echo(f"join: {len(worker.claims.done_at_start)} of {len(engine.run.urls)} shard(s) already done")
    try:
        while True:
            first = worker.claims.next()
            if first is None:
                if _wait(engine):
                    continue
                break
            if pool is None:  # the models, the probe and the plan once the worker has a shard
                pool = engine._pool()
                probe_on = [first] + [u for u in engine.run.todo if u != first][:2]
                plan = engine._plan(pool, probe_on, len(engine.run.todo) or 1)
                sizes = engine._apply(pool, plan)
                progress = _progress(cfg, worker)
            worker.report(idle=False, now=True)
            feed = ShardFeed(worker.claims, first, cfg.worker_start)
            try:
                dispatcher, round_tally = engine._score(pool, plan, [first], sizes, feed.source(), progress)
            finally:
                feed.stop()
            _settle(engine, feed.handed, dispatcher, round_tally, outcome, tally)
            if feed.error is not None:
                raise feed.error
    finally:
        if progress is not None:
            progress.close()
        if pool is not None:
            summary.workers = pool.close()
    outcome.seconds = time.perf_counter() - started
    outcome.stage_counts = {"dropped": dict(tally.dropped), "notes": dict(tally.notes)}
    return _end(engine, outcome)


def _progress(cfg, worker: Worker):
    if not (cfg.progress and cfg.verbosity > 0):
        return None
    box: list = []  # the line counts the shards this worker finished, as it draws itself
    progress = Progress(f"scoring (worker {worker.token})", "samples",
                        extra=lambda: f"{box[0].parts_done if box else 0} shard(s) done by this worker")
    box.append(progress)
    return progress


def _settle(engine, handed: List[str], dispatcher, round_tally, outcome, tally) -> None:
    """After a round: the shards handed out are done or failed (each failure's entry in the
    ledger, then its claim says so), the counts go into the worker's record."""
    worker, state = engine.run.joined, engine.run.state
    ended = {f["url"]: f["reason"] for f in dispatcher.failed + dispatcher.unfinished()}
    outcome.shards_scored += dispatcher.completed
    outcome.samples += dispatcher.rows_done
    outcome.scoring_seconds += dispatcher.seconds
    tally.merge_dict(round_tally.to_dict())
    failed = []
    for url in handed:
        if url not in ended and state.is_done(url):
            worker.claims.finished(url)
            continue
        reason = ended.get(url) or unopened_reason(url, round_tally)
        write_shard_failures(state.out, state.names[url], [shard_entry(url, reason, not is_local(url))])
        failed.append({"url": url, "reason": reason})
    if engine.run.remote is not None:  # the markers and ledger files in the bucket before the claims say so
        engine.run.remote.sync()
    for f in failed:
        worker.claims.fail(f["url"], f["reason"])
    outcome.failed += failed
    worker.counts.shards, worker.counts.rows = outcome.shards_scored, outcome.samples
    worker.counts.failed_shards = len(outcome.failed)
    worker.counts.seconds = outcome.scoring_seconds
    worker.report(idle=True, stage_counts={"dropped": dict(tally.dropped), "notes": dict(tally.notes)}, now=True)


def _wait(engine) -> bool:
    """Between rounds: True as soon as something can be claimed (a stale worker's shards, a
    failure this worker may try again); False once every shard this worker answers for has ended.
    Shards live workers hold are waited for: their claims may go stale (a node that dies)."""
    worker = engine.run.joined
    interval = min(worker.lease.stale / 4, 5.0)
    if engine.run.remote is not None:  # this worker's markers in the bucket before it looks at the others'
        engine.run.remote.sync()
    survey = worker.claims.survey(worker.scope)
    said = False
    while True:
        worker.last_survey = survey
        if survey.takeable or survey.free:
            return True
        if not survey.live:
            return False
        if not said:
            engine.run.echo(f"join: {len(survey.live)} shard(s) left, claimed by {len(set(survey.live.values()))} other "
                        f"live worker(s); waiting for them (a worker that stops is taken over)")
            said = True
        time.sleep(interval)
        engine.run.check_lease()
        survey = worker.claims.poll(survey, worker.scope)


def _end(engine, outcome):
    """The end of this worker: the run's end-of-run work when every shard has ended and no other
    worker does it (the claim .finish.json), else this worker's share of the summary."""
    worker, summary = engine.run.joined, engine.run.summary
    claims = worker.claims
    names = list(claims.names.values())
    survey = worker.last_survey  # the one that ended the rounds, where it looked at every shard
    if survey is None or worker.scope != names:
        if engine.run.remote is not None:
            engine.run.remote.sync()
        survey = claims.survey()
    ended = survey.ended(names)
    done, failed = len(survey.done), len(survey.failed)
    summary.joined = {"worker": worker.token, "task": worker.lease.info.get("task"),
                      "run": {"shards": len(names), "done": done, "failed": failed, "live": len(survey.live)},
                      "finished": False, "shards_scored": outcome.shards_scored}
    version = claims.take_finish(done, failed) if ended else None
    if version is None:  # this worker's share only: the summary is the finisher's to write
        summary.shards_scored, summary.samples_this_run = outcome.shards_scored, outcome.samples
        summary.seconds, summary.scoring_seconds = outcome.seconds, outcome.scoring_seconds
        summary.shards_failed = list(outcome.failed)
        summary.joined["by"] = "another worker" if ended else None
        return summary
    written = False
    try:
        _wait_for_reports(worker)
        if engine.run.remote is not None:  # every worker's markers, ledger files and sizes, from the bucket
            engine.run.remote.refresh()
            engine.run.state.size_of = engine.run.remote.sizes()
        outcome.failed = [{"url": claims.urls[n], "reason": r} for n, r in survey.failed.items()]
        records = _records(worker)
        outcome.stage_counts = _stage_counts(records)
        summary.shards_resumed = max(0, done - outcome.shards_scored)
        summary.joined.update(finished=True, workers=[
            {k: r.get(k) for k in ("token", "host", "pid", "task", "shards_done", "rows", "shards_failed", "seconds")}
            for r in records])
        _write_sizes(engine)
        _sweep_temporaries(engine)
        try:
            result = engine.run.finish(outcome)
        except NothingScoredError:
            written = True  # summary.json says so: done, for these shards
            raise
        written = True
        return result
    finally:
        if written:
            claims.release_finish(version, done, failed)


def _wait_for_reports(worker: Worker) -> None:
    """The other live workers' counts in their records: each says `idle` once its last round
    ended (a shard's marker can be seen a moment before). Waited for at most one lease."""
    deadline = time.monotonic() + worker.lease.stale
    while time.monotonic() < deadline:
        busy = [t for t, r in live_records(worker.url, WORKERS, worker.lease.stale,
                                           worker.cfg.stage.storage_options).items()
                if t != worker.token and not r.get("idle")]
        if not busy:
            return
        time.sleep(0.2)


def _records(worker: Worker) -> List[dict]:
    so = worker.cfg.stage.storage_options
    out = []
    for token in record_names(worker.url, WORKERS, so):
        holder = record_at(worker.url, f"{WORKERS}/{token}.json", so).read_data()
        if holder and not holder.get("fenced"):
            out.append(holder)
    return out


def _stage_counts(records: List[dict]) -> dict:
    """The stage counts every worker reported (its record), summed."""
    total: dict = {"dropped": {}, "notes": {}}
    for record in records:
        for kind in ("dropped", "notes"):
            for reason, n in ((record.get("stage_counts") or {}).get(kind) or {}).items():
                total[kind][reason] = total[kind].get(reason, 0) + int(n)
    return total


def _write_sizes(engine) -> None:
    """sizes.json of --write-shards, once, from the markers (a worker writes only its shards'
    _stats.json)."""
    cfg, state = engine.run.cfg, engine.run.state
    if not cfg.copies_shards:  # resharded shards: their sizes.json is the reshard's (Run.finish)
        return
    entries = {}
    for url in engine.run.urls:
        marker = state._marker(url) if state.is_done(url) else None
        if marker is not None and marker.filtered:
            entries[os.path.basename(state.filtered_path(url))] = int(marker.filtered.get("samples", 0))
    update_sizes(cfg.write_shards, entries)


def _sweep_temporaries(engine) -> None:
    """Temporaries left by killed workers (their pids mean nothing on another host): those older
    than two leases, when no live worker can still be writing them."""
    cfg = engine.run.cfg
    limit = time.time() - 2 * engine.run.joined.lease.stale
    for folder in (cfg.out, engine.run.state.scores_dir, engine.run.state.done_dir, cfg.write_shards,
                   *embedding_folders(cfg.out), ledger_folder(cfg.out)):
        if not folder or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            try:
                if is_temporary(name) and os.path.getmtime(path) < limit:
                    os.remove(path)
            except OSError:
                pass
