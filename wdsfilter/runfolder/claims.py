"""Per-shard claims: many `wdsfilter score --join` workers on one run folder, with no coordinator.

    FOLDER/workers/<token>.json   each worker's lease (lease.py): host, pid, its counts, and its
                                  heartbeat; released at its end with what it did
    FOLDER/claims/<name>.json     a shard's claim: the worker that holds it (its token), the run
                                  (run.json's run_id); `failed` where that worker could not finish it
    FOLDER/.finish.json           the claim of the end-of-run work (summary, statistics, report)

The rules, in this module only:

* **Created atomically.** A claim is created where none exists (S3 `If-None-Match: *`, GCS
  `ifGenerationMatch=0`, `link()` on a disk: lease.py's records): of two workers, one holds it.
* **Live while its worker is.** A claim names its worker's lease and lives as long as that lease
  does: one heartbeat per worker renews every claim it holds (no request per claim).
* **Taken over only when stale.** When a claim's worker is stale (silent past its lease, its
  process gone, its lease released or deleted), a taker first fences that worker: it replaces the
  worker's record, on the version it read, by one that names the taker, so the stalled worker's
  next renewal fails and it writes nothing more (every write of a worker is fenced by its lease);
  then it replaces the claim on the version it read: of two takers, one wins.
* **Ended** when its shard has a marker (done/) or its claim says `failed`. A failure recorded
  before a worker started is tried again by that worker (each worker tries a failed shard at most
  once); one recorded later ends the shard for it. A claim of another run (another run_id: the
  folder was started over) is free.
* **The end of the run** (summary.json, statistics, shares, report, sizes.json) is done by the
  worker that finds every shard ended, under the claim `.finish.json`; a finished claim records
  the shards it summarised, so the workers that also find the run ended leave it alone.

Which shards a worker tries first (`claim_order`): its slice (`--task-index I --task-count N`:
the I-th of N equal runs of the shard list), then the others' slices from their ends, so a thief
meets each owner last; without a slice, the shard list from a point drawn from its token.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .lease import Conflict, Lease, describe_holder, record_at, record_names, stale_reason
from .names import CLAIMS, DONE, FINISH, RUN_JSON, WORKERS


def claim_order(urls: Sequence[str], token: str, index: Optional[int] = None, count: Optional[int] = None,
                steal: bool = True) -> Tuple[List[str], List[str]]:
    """(the worker's own shards in order, the shards it may steal in order)."""
    urls = list(urls)
    if not urls:
        return [], []
    if index is None or not count:
        start = int(token[:8], 16) % len(urls)  # spread out: workers started at once meet rarely
        return urls[start:] + urls[:start], []
    bounds = [len(urls) * i // count for i in range(count + 1)]
    own = urls[bounds[index]:bounds[index + 1]]
    others = []
    if steal:
        for j in range(1, count):
            k = (index + j) % count
            others += reversed(urls[bounds[k]:bounds[k + 1]])
    return own, others


@dataclass
class Survey:
    """Where every shard of the run stands, as one worker read it."""
    done: List[str] = field(default_factory=list)  # names with a marker
    failed: Dict[str, str] = field(default_factory=dict)  # name -> reason: ended, failed
    live: Dict[str, str] = field(default_factory=dict)  # name -> token of the live worker that holds it
    takeable: Dict[str, Tuple[dict, str]] = field(default_factory=dict)  # name -> (claim, version): stale or free
    free: List[str] = field(default_factory=list)  # names without a claim (or another run's)
    workers: Dict[str, dict] = field(default_factory=dict)  # token -> its record, as read

    def ended(self, names: Sequence[str]) -> bool:
        done = set(self.done)
        return all(n in done or n in self.failed for n in names)


class Claims:
    """One worker's claims on the shards of a run folder (`folder`: a path or an s3:// / gs:// URL;
    `lease`: the worker's own lease, `workers/<token>.json`). Thread-safe: the shard feed claims
    from a thread while the run writes."""

    def __init__(self, folder: str, names: Dict[str, str], lease: Lease, run_id: Optional[str],
                 own: Sequence[str], others: Sequence[str] = (), storage_options=None):
        self.folder, self.names, self.lease, self.run_id = folder, dict(names), lease, run_id
        self.storage_options = storage_options
        self.urls = {n: u for u, n in self.names.items()}
        self.own, self.others = list(own), list(others)
        self.started = time.time()  # failures recorded before this are tried again by this worker
        self.held: Dict[str, str] = {}  # name -> the version of the claim this worker wrote
        self.known: set = set()  # names claimed (or done) as last listed: not tried afresh
        self.done_at_start: set = set()  # names with a marker when this worker started
        self._todo: List[str] = []  # names to try afresh, in order
        self._take: Dict[str, Tuple[dict, str]] = {}  # name -> (claim, version): to take over
        self._lock = threading.Lock()
        self._fenced: Dict[str, bool] = {}  # stale worker token -> fenced by this worker (or gone)

    # -- the folder's records ---------------------------------------------------------------------
    def _record(self, name: str):
        return record_at(self.folder, name, self.storage_options)

    def _claim(self, name: str):
        return self._record(f"{CLAIMS}/{name}.json")

    def _list(self, sub: str) -> List[str]:
        return record_names(self.folder, sub, self.storage_options)

    @staticmethod
    def _read(record) -> Tuple[Optional[dict], Optional[str]]:
        return record.read()

    @staticmethod
    def _read_data(record) -> Optional[dict]:
        return record.read_data()

    def _body(self, **extra) -> bytes:
        return json.dumps({"worker": self.lease.token, "run_id": self.run_id, "host": self.lease.info["host"],
                           "pid": self.lease.info["pid"], "claimed": time.time(), **extra}).encode()

    def start(self, done: Sequence[str] = ()) -> None:
        """The first listing: shards done or claimed are not tried afresh (a survey finds the
        stale ones). done: names known done (the folder's markers as the run state read them)."""
        self.done_at_start = set(done) | set(self._list(DONE))
        self.known = self.done_at_start | set(self._list(CLAIMS))
        self._todo = [self.names[u] for u in self.own + self.others if self.names[u] not in self.known]

    # -- taking shards ----------------------------------------------------------------------------
    def next(self) -> Optional[str]:
        """Claim the next shard in this worker's order (afresh, or taken over from a stale
        worker); its URL, or None when nothing is claimable now."""
        with self._lock:
            while self._take:
                name, (claim, version) = next(iter(self._take.items()))
                del self._take[name]
                if self._take_over(name, claim, version):
                    return self.urls[name]
            while self._todo:
                name = self._todo.pop(0)
                if name in self.known:
                    continue
                self.lease.check()  # a worker that lost its lease claims nothing more
                try:
                    self.held[name] = self._claim(name).create(self._body())
                    self.known.add(name)
                    return self.urls[name]
                except Conflict:  # another worker was first: what else did the others claim? (a
                    self.known |= set(self._list(CLAIMS))  # marker comes under a claim: done/ adds none)
                    if not self.others:  # no slice: go where no worker is, not behind the one met
                        self._todo = self._widest_gap()
        return None

    def _widest_gap(self) -> List[str]:
        """The names not known claimed, in this worker's order from the middle of the longest run
        of them (circularly): workers that meet spread out instead of trailing one another."""
        order = [self.names[u] for u in self.own]
        free = [n not in self.known for n in order]
        if not any(free):
            return []
        best, best_start, run, start = 0, 0, 0, 0
        for i in range(2 * len(order)):  # twice round: a run across the end counts whole
            if free[i % len(order)]:
                if run == 0:
                    start = i
                run += 1
                if run > best:
                    best, best_start = min(run, len(order)), start
            else:
                run = 0
        middle = (best_start + best // 2) % len(order)
        return [n for n in order[middle:] + order[:middle] if n not in self.known]

    def _take_over(self, name: str, claim: dict, version: str) -> bool:
        """Replace a stale, failed or foreign claim on the version read, after fencing its stale
        worker; False when another worker was first or the worker came back."""
        token = claim.get("worker")
        foreign = claim.get("run_id") != self.run_id or not claim
        if not foreign and not claim.get("failed") and isinstance(token, str) and not self._fence_worker(token):
            return False
        self.lease.check()
        try:
            self.held[name] = self._claim(name).replace(self._body(took_over=token), version)
        except Conflict:
            return False
        self.known.add(name)
        return True

    def _fence_worker(self, token: str) -> bool:
        """The stale worker `token` can write nothing more: its record replaced by one naming this
        worker (released). False when it is live after all (it renewed meanwhile)."""
        if token in self._fenced:
            return self._fenced[token]
        record = self._record(f"{WORKERS}/{token}.json")
        for _ in range(3):
            holder, version = self._read(record)
            if holder is None or holder.get("released"):  # gone, released, or fenced by another taker
                self._fenced[token] = True
                return True
            if stale_reason(holder, self.lease.stale) is None:
                return False
            body = {**self.lease.info, "heartbeat": time.time(), "released": time.time(), "fenced": token,
                    "fenced_holder": {k: holder.get(k) for k in ("host", "pid", "started")}}
            try:
                record.replace(json.dumps(body).encode(), version)
                self._fenced[token] = True
                return True
            except Conflict:
                continue  # it renewed, or another taker fenced it: read again
        return False

    def fail(self, url: str, reason: str) -> None:
        """This worker could not finish the shard: its claim says so (ended, for the workers that
        started before now)."""
        name = self.names[url]
        with self._lock:
            version = self.held.pop(name, None)
            if version is None:
                return
            try:
                self._claim(name).replace(self._body(failed=reason[:2000], failed_at=time.time()), version)
            except Conflict:
                pass  # taken over meanwhile: not this worker's to mark

    def finished(self, url: str) -> None:
        """The shard's marker is written: the claim stays (the marker says done)."""
        with self._lock:
            self.held.pop(self.names[url], None)

    # -- where the run stands ---------------------------------------------------------------------
    def survey(self, names: Optional[Sequence[str]] = None) -> Survey:
        """Every shard of `names` (default: the run's) done, failed, held live, takeable or free;
        the takeable ones are queued for next(). Reads the listings, and the claims and worker
        records of the shards that are neither done nor this worker's."""
        names = list(self.names.values()) if names is None else list(names)
        s = Survey(done=sorted(set(self._list(DONE)) & set(names)))
        claimed = set(self._list(CLAIMS))
        done = set(s.done)
        for name in names:
            if name in done:
                continue
            if name not in claimed:
                s.free.append(name)
                continue
            claim = self._read_data(self._claim(name))  # most are live: their version is not needed
            why = "free" if claim is None else self._standing(claim, s.workers)
            if why in ("takeable", "mine"):  # the version its replacement will be conditional on
                claim, version = self._read(self._claim(name))
                why = "free" if claim is None else self._standing(claim, s.workers)
            if why == "free":
                s.free.append(name)
                continue
            if why == "failed":
                s.failed[name] = str(claim.get("failed"))
            elif why == "mine":
                self.held.setdefault(name, version)
            elif why == "live":
                s.live[name] = claim["worker"]
            else:
                s.takeable[name] = (claim, version)
        with self._lock:
            self._take.update(s.takeable)
            self._todo = [n for n in s.free if n not in self._todo] + self._todo
            self.known -= set(s.free)
        return s

    def poll(self, last: Survey, names: Optional[Sequence[str]] = None) -> Survey:
        """`last` brought up to date cheaply while this worker waits for the shards others hold:
        the markers listed and the holders' records read (a request per worker, not per shard);
        a full survey when a holder is no longer live (its shards are to be taken over)."""
        done = set(self._list(DONE))
        live = {n: t for n, t in last.live.items() if n not in done}
        workers: Dict[str, dict] = {}
        for token in set(live.values()):
            self._standing({"worker": token, "run_id": self.run_id}, workers)
            if not workers[token]["alive"]:
                return self.survey(names)
        scope = set(names if names is not None else self.names.values())
        return Survey(done=sorted(done & scope), failed=dict(last.failed), live=live, workers=workers)

    def _standing(self, claim: dict, workers: Dict[str, dict]) -> str:
        """failed, mine, live, or takeable (stale, another run's, failed before this worker began)."""
        if claim.get("run_id") != self.run_id:
            return "takeable"
        if claim.get("failed"):
            at = claim.get("failed_at")
            return "takeable" if isinstance(at, (int, float)) and at < self.started else "failed"
        token = claim.get("worker")
        if token == self.lease.token:
            return "mine"
        if not isinstance(token, str):
            return "takeable"
        if token not in workers:  # read and judged once per survey: every claim of a worker stands as one
            holder = self._read_data(self._record(f"{WORKERS}/{token}.json")) or {}
            workers[token] = dict(holder, alive=bool(holder) and stale_reason(holder, self.lease.stale) is None)
        return "live" if workers[token]["alive"] else "takeable"

    # -- the end of the run -----------------------------------------------------------------------
    def take_finish(self, done: int, failed: int) -> Optional[str]:
        """Claim the end-of-run work; None when another live worker does it, or a worker did it
        for the same shards (`done` and `failed` counts); else the version held (release_finish)."""
        record = self._record(FINISH)
        self.lease.check()
        try:
            return record.create(self._body(finishing=True))
        except Conflict:
            pass
        claim, version = self._read(record)
        if claim is not None and claim.get("run_id") == self.run_id:
            if claim.get("finished") and claim.get("done") == done and claim.get("failed") == failed:
                return None  # summarised already, for these shards
            if not claim.get("finished") and self._standing(dict(claim, failed=None), {}) == "live":
                return None  # another worker is at it
            if not claim.get("finished") and not self._fence_worker(str(claim.get("worker"))):
                return None
        try:
            return record.replace(self._body(finishing=True), version)
        except Conflict:
            return None

    def release_finish(self, version: str, done: int, failed: int) -> None:
        try:
            self._record(FINISH).replace(self._body(finished=time.time(), done=done, failed=failed), version)
        except Conflict:
            pass


# -- the whole run, as read by anyone --------------------------------------------------------------------
@dataclass
class RunStatus:
    """A joined run's state as its records say (`wdsfilter score --status`): decided here,
    rendered by the caller."""
    shards: int = 0
    done: int = 0
    failed: Dict[str, str] = field(default_factory=dict)  # name -> reason
    claimed: Dict[str, str] = field(default_factory=dict)  # name -> token of the live worker
    stale: List[str] = field(default_factory=list)  # claimed by a worker that is gone: taken by the next
    free: int = 0
    workers: List[dict] = field(default_factory=list)  # each worker record, with "state": alive/ended/gone/fenced
    finish: Optional[dict] = None  # the end-of-run claim


def run_status(folder: str, names: Sequence[str], stale: float, storage_options=None) -> RunStatus:
    """Where a run folder's shards (`names`) and workers stand, from its records alone."""
    status = RunStatus(shards=len(names))
    workers: Dict[str, dict] = {}
    for token in record_names(folder, WORKERS, storage_options):
        holder = record_at(folder, f"{WORKERS}/{token}.json", storage_options).read_data() or {}
        state = ("fenced" if holder.get("fenced") else "ended" if holder.get("released")
                 else "alive" if stale_reason(holder, stale) is None else "gone")
        workers[token] = dict(holder, token=token, state=state)
    done = set(record_names(folder, DONE, storage_options))
    claimed = set(record_names(folder, CLAIMS, storage_options))
    run_id = _run_id(folder, storage_options)
    for name in names:
        if name in done:
            status.done += 1
        elif name not in claimed:
            status.free += 1
        else:
            claim = record_at(folder, f"{CLAIMS}/{name}.json", storage_options).read_data() or {}
            holder = workers.get(str(claim.get("worker")), {})
            if claim.get("run_id") != run_id:
                status.free += 1
            elif claim.get("failed"):
                status.failed[name] = str(claim["failed"])
            elif holder.get("state") == "alive":
                status.claimed[name] = holder["token"]
            else:
                status.stale.append(name)
    status.workers = sorted(workers.values(), key=lambda w: float(w.get("heartbeat") or 0), reverse=True)
    status.finish = record_at(folder, FINISH, storage_options).read_data()
    return status


def _run_id(folder: str, storage_options=None) -> Optional[str]:
    return (record_at(folder, RUN_JSON, storage_options).read_data() or {}).get("run_id")


def describe_worker(record: dict) -> str:
    """'pid N on HOST, started T' as a worker's record names it."""
    return describe_holder(record).strip(" ()")


def worker_token() -> str:
    return os.urandom(8).hex()
