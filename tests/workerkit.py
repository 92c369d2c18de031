"""Many `wdsfilter score --join` workers on one run folder, killed (SIGKILL) and stopped (SIGSTOP)
at random moments while others are started, until the run is done (no tests in this module:
tests/test_score_join_faults.py runs a trial, tools/fuzz_workers.py many).

A trial (`play`) runs the same shards into several run folders at once (a local one, one in moto's
S3 server), each with its own fleet of workers. It waits for events, never for time: each time a
folder's claims or markers change, a seeded draw decides whether to kill or stop one of that
folder's running workers, or to start one; a stopped worker is continued once its lease was
fenced by the worker that took its shards over (or once the run is done). `violations` then checks
the promise of a joined run against a one-process run of the same shards and settings:

* every sample of every input shard is in exactly one row of its shard's score file (or in the
  failure ledger), in the one-process run's order, with the same status, reason, kept and scores;
* every marker's files are there with the sizes it recorded;
* one worker's results per shard: the score file's writer (Parquet metadata) is the marker's;
* the run ended once: summary.json names every shard, the end claim records them all;
* no worker ended with a traceback; a worker continued after its lease was taken exits 3 naming
  the worker that took over.

Workers are children of a fork server that imported torch and wdsfilter once (a process starts in
milliseconds, not seconds), each in a session of its own (killpg ends it and its decode workers).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

SCORER = "scorekit:BrightnessScorer"
LEASE_SECONDS = 3.0  # the workers' leases: a stopped worker's shards are taken over after this


def worker_args(shards: List[str], out: str, *extra: str) -> List[str]:
    return ["score", *shards, "--out", out, "--scorer", SCORER, "--scorer-opt", "bright.delay=0.05",
            "--device", "cpu", "--batch-size", "4", "--workers", "0", "--no-progress", "--format", "parquet", *extra]


# -- worker processes ---------------------------------------------------------------------------------
_CONTEXT = None


def _forkserver():
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "scorekit", "wdsfilter.score", "wdsfilter.cli"])
    return _CONTEXT


def _child(args: List[str], env: Dict[str, str], log: str) -> None:
    os.setsid()  # a session of its own: killpg ends its decode workers with it
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from wdsfilter.cli import main
    main(args, prog_name="wdsfilter")


@dataclass
class Worker:
    proc: object
    log: str
    stopped: bool = False
    killed: bool = False
    fenced_stop: bool = False  # stopped, then continued once its lease was taken over
    token: Optional[str] = None  # its lease's token, once its record was seen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.exitcode is None and not self.stopped

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()


class Fleet:
    """The workers of one run folder."""

    def __init__(self, args: List[str], env: Dict[str, str], logs: str):
        self.args, self.env, self.logs = args, env, logs
        self.slices = 0  # > 0: each worker started takes the next of that many slices first
        os.makedirs(logs, exist_ok=True)
        self.workers: List[Worker] = []

    def start(self) -> Worker:
        log = os.path.join(self.logs, f"worker-{len(self.workers)}.log")
        args = self.args + (["--task-index", str(len(self.workers) % self.slices), "--task-count", str(self.slices)]
                            if self.slices else [])
        proc = _forkserver().Process(target=_child, args=(args, self.env, log), daemon=False)
        proc.start()
        worker = Worker(proc, log)
        self.workers.append(worker)
        return worker

    def kill(self, w: Worker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGKILL)
        w.killed = True
        w.proc.join(30)

    def stop(self, w: Worker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGSTOP)
        w.stopped = True

    def cont(self, w: Worker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGCONT)
        w.stopped = False

    def running(self) -> List[Worker]:
        return [w for w in self.workers if w.running()]

    def end(self, timeout: float = 120.0) -> None:
        """Every stopped worker continued, every worker waited for (killed past `timeout`)."""
        for w in self.workers:
            if w.stopped:
                self.cont(w)
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.exitcode is None:
                self.kill(w)


# -- the run folders, as the trial watches them ---------------------------------------------------------
class Folder:
    """A run folder's files as `path -> bytes` (relative), its records read as JSON."""

    def names(self, sub: str) -> List[str]:
        raise NotImplementedError

    def read(self, rel: str) -> Optional[bytes]:
        raise NotImplementedError

    def sizes(self) -> Dict[str, int]:
        raise NotImplementedError

    def record(self, rel: str) -> Optional[dict]:
        data = self.read(rel)
        try:
            return json.loads(data) if data is not None else None
        except ValueError:
            return None

    def size_of(self, rel: str, sizes: Dict[str, int]) -> Optional[int]:
        return sizes.get(rel)

    def progress(self) -> int:
        """Claims and markers: each new one is an event of the trial."""
        return len(self.names("claims")) + len(self.names("done"))

    def finished(self, shards: int) -> bool:
        end = self.record(".finish.json") or {}
        return bool(end.get("finished")) and end.get("done", 0) + end.get("failed", 0) == shards


class LocalFolder(Folder):
    def __init__(self, path: str):
        self.path = self.out = path

    def names(self, sub: str) -> List[str]:
        try:
            return sorted(n for n in os.listdir(os.path.join(self.path, sub)) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def read(self, rel: str) -> Optional[bytes]:
        try:
            with open(os.path.join(self.path, rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def sizes(self) -> Dict[str, int]:
        out = {}
        for root, _, files in os.walk(self.path):
            for name in files:
                path = os.path.join(root, name)
                out[os.path.relpath(path, self.path)] = os.path.getsize(path)
        return out

    def size_of(self, rel: str, sizes: Dict[str, int]) -> Optional[int]:
        path = os.path.join(self.path, rel)  # a --write-shards folder beside it too (../kept/...)
        return os.path.getsize(path) if os.path.exists(path) else None


class S3Folder(Folder):
    def __init__(self, client, bucket: str, prefix: str):
        self.client, self.bucket, self.prefix = client, bucket, prefix.strip("/")
        self.out = f"s3://{bucket}/{self.prefix}"

    def _list(self, prefix: str) -> List[dict]:
        found, token = [], None
        while True:
            kw = {"ContinuationToken": token} if token else {}
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, **kw)
            found += page.get("Contents", [])
            token = page.get("NextContinuationToken")
            if not token:
                return found

    def names(self, sub: str) -> List[str]:
        return sorted(o["Key"].rsplit("/", 1)[1] for o in self._list(f"{self.prefix}/{sub}/"))

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{rel}")["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def sizes(self) -> Dict[str, int]:
        return {o["Key"][len(self.prefix) + 1:]: o["Size"] for o in self._list(self.prefix + "/")}


class GcsFolder(Folder):
    def __init__(self, fs, bucket: str, prefix: str):
        self.fs, self.root = fs, f"{bucket}/{prefix.strip('/')}"
        self.out = f"gs://{self.root}"

    def names(self, sub: str) -> List[str]:
        self.fs.invalidate_cache()
        try:
            return sorted(p.rsplit("/", 1)[1] for p in self.fs.ls(f"{self.root}/{sub}", detail=False))
        except FileNotFoundError:
            return []

    def read(self, rel: str) -> Optional[bytes]:
        self.fs.invalidate_cache()
        try:
            return self.fs.cat_file(f"{self.root}/{rel}")
        except FileNotFoundError:
            return None

    def sizes(self) -> Dict[str, int]:
        self.fs.invalidate_cache()
        return {k[len(self.root) + 1:]: int(v["size"]) for k, v in self.fs.find(self.root + "/", detail=True).items()}


# -- one trial ----------------------------------------------------------------------------------------
@dataclass
class Trial:
    seed: int
    kills: Dict[str, List[str]] = field(default_factory=dict)  # folder -> what was done, in order
    seconds: float = 0.0
    fleets: Dict[str, Fleet] = field(default_factory=dict)


def play(seed: int, shards: List[str], folders: Dict[str, Folder], env: Dict[str, str], logs: str,
         workers: int = 4, faults: int = 3, timeout: float = 240.0, slices: bool = False) -> Trial:
    """Start `workers` workers on each folder, then on each event (a folder's claims or markers
    changed) draw whether to kill or stop a running worker of that folder (at most `faults` per
    folder) or start one (while fewer than `workers` run); continue a stopped worker once its
    lease was fenced. Until every folder's run is finished, or `timeout`. slices: the k-th worker
    started takes slice k mod `workers` first (--task-index), stealing the others' after."""
    rng = random.Random(seed)
    trial = Trial(seed)
    started = time.monotonic()
    env = dict(env, WDSFILTER_LEASE_SECONDS=str(LEASE_SECONDS), WDSFILTER_SYNC_SECONDS="0.2", OMP_NUM_THREADS="1")
    for name, folder in folders.items():
        fleet = trial.fleets[name] = Fleet(worker_args(shards, folder.out, "--join"), env, os.path.join(logs, name))
        fleet.slices = workers if slices else 0
        trial.kills[name] = []
        for _ in range(workers):
            fleet.start()
    seen = {name: -1 for name in folders}
    try:
        while not all(f.finished(len(shards)) for f in folders.values()):
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"seed {seed}: the runs did not finish in {timeout:.0f}s "
                                   f"({', '.join(trial.kills)}; logs in {logs})")
            for name, folder in folders.items():
                _step(rng, name, folder, trial, seen, len(shards), workers, faults)
            time.sleep(0.05)  # the folders are polled for their next event
    finally:
        for fleet in trial.fleets.values():
            fleet.end()
    trial.seconds = time.monotonic() - started
    return trial


def _step(rng, name: str, folder: Folder, trial: Trial, seen: Dict[str, int], shards: int, workers: int,
          faults: int) -> None:
    fleet, done = trial.fleets[name], trial.kills[name]
    for w in fleet.workers:  # a stopped worker whose lease another worker fenced: continued (it must stop)
        if w.stopped:
            w.token = w.token or _token(w, folder)
            record = folder.record(f"workers/{w.token}.json") if w.token else None
            if (record or {}).get("fenced") or folder.finished(shards):
                fleet.cont(w)
                w.fenced_stop = bool((record or {}).get("fenced"))
                done.append(f"continued {w.pid}")
    progress = folder.progress()
    if progress == seen[name] or folder.finished(shards):
        if not fleet.running() and not folder.finished(shards):
            fleet.start()  # none left running: a new one (the others are stopped or dead)
            done.append("started")
        return
    seen[name] = progress
    running = fleet.running()
    hit = [d for d in done if d.startswith(("kill", "stop"))]
    victim = _holder(rng, folder, running) if len(hit) < faults else None
    # the first two faults of each folder: a stop, then a kill (each kind once at least); then drawn
    if victim is not None and (len(hit) < 2 or rng.random() < 0.3):
        if (len(hit) == 1 or len(hit) >= 2 and rng.random() < 0.5) and hit[0].startswith("stop"):
            fleet.kill(victim)
            done.append(f"kill {victim.pid} at {progress}")
        else:
            fleet.stop(victim)
            done.append(f"stop {victim.pid} at {progress}")
    elif len(running) < workers and rng.random() < 0.5:
        fleet.start()
        done.append(f"started at {progress}")


def _holder(rng, folder: Folder, running: List[Worker]) -> Optional[Worker]:
    """A running worker that holds a claim on a shard not done yet (drawn among them), or None."""
    done = set(folder.names("done"))
    pids = {w.pid: w for w in running}
    claims = [n for n in folder.names("claims") if n not in done]
    rng.shuffle(claims)
    for name in claims[:4]:
        claim = folder.record(f"claims/{name}") or {}
        if claim.get("pid") in pids and not claim.get("failed"):
            return pids[claim["pid"]]
    return None


def _token(w: Worker, folder: Folder) -> Optional[str]:
    """The token of the worker process `w`, from the records of the folder (by pid)."""
    for name in folder.names("workers"):
        record = folder.record(f"workers/{name}") or {}
        if record.get("pid") == w.pid and not record.get("fenced"):
            return name[:-5]
        if (record.get("fenced_holder") or {}).get("pid") == w.pid:
            return name[:-5]
    return None


# -- the check ------------------------------------------------------------------------------------------
def rows_of(data: bytes) -> List[dict]:
    import io
    import pyarrow.parquet as pq
    return pq.read_table(io.BytesIO(data)).to_pylist()


def writer_of(data: bytes) -> Optional[str]:
    import io
    import pyarrow.parquet as pq
    meta = pq.read_schema(io.BytesIO(data)).metadata or {}
    value = meta.get(b"wdsfilter.writer")
    return value.decode() if value else None


def violations(trial: Trial, reference: str, names: List[str], folders: Dict[str, Folder]) -> List[str]:
    """What broke the promise, per folder (see the module docstring); [] when nothing did."""
    found = []
    for name, folder in folders.items():
        found += [f"{name}: {v}" for v in _folder_violations(reference, names, folder)]
        for w in trial.fleets[name].workers:
            text = w.output()
            if "Traceback" in text:
                found.append(f"{name}: worker {w.pid} ended with a traceback: {text[-2000:]}")
            code = w.proc.exitcode
            if w.killed:
                continue
            if code not in (0, 3):
                found.append(f"{name}: worker {w.pid} exited {code}: {text[-1500:]}")
            if code == 3 and "took it over" not in text and "was deleted" not in text:
                found.append(f"{name}: worker {w.pid} failed: {text[-1500:]}")
    return found


def _folder_violations(reference: str, names: List[str], folder: Folder, ignored=()) -> List[str]:
    """The checks of `violations` on one folder; `ignored`: columns not compared (the shard's
    URL, when the one-process run read the same shards elsewhere)."""
    found = []
    sizes = folder.sizes()
    summary = folder.record("summary.json") or {}
    if summary.get("shards") != len(names) or summary.get("shards_failed"):
        found.append(f"summary.json: {summary.get('shards')} shards, failed {summary.get('shards_failed')}")
    for shard in names:
        marker = folder.record(f"done/{shard}.json")
        if marker is None:
            found.append(f"{shard}: no marker")
            continue
        for rel, size in (marker.get("sizes") or {}).items():
            if folder.size_of(rel, sizes) != size:
                found.append(f"{shard}: marker records {rel} of {size} bytes, the folder holds "
                             f"{folder.size_of(rel, sizes)}")
        data = folder.read(f"scores/{shard}.parquet")
        if data is None:
            continue
        if writer_of(data) != marker.get("writer"):
            found.append(f"{shard}: score file written by {writer_of(data)}, marker by {marker.get('writer')}")
        with open(os.path.join(reference, "scores", f"{shard}.parquet"), "rb") as f:
            expected = [{k: v for k, v in r.items() if k not in ignored} for r in rows_of(f.read())]
        got = [{k: v for k, v in r.items() if k not in ignored} for r in rows_of(data)]
        if got != expected:
            keys = [r["key"] for r in got]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            found.append(f"{shard}: rows differ from the one-process run ({len(got)} vs {len(expected)} rows"
                         f"{', keys twice: ' + str(twice[:5]) if twice else ''})")
        ledger = folder.read(f"failures/{shard}.parquet")
        strip = (lambda rows: [{k: v for k, v in r.items() if k not in ignored} for r in rows])  # noqa: E731
        if ledger is not None and strip(rows_of(ledger)) != strip(_entries(reference, shard)):
            found.append(f"{shard}: failure ledger differs from the one-process run's")
    return found


def _entries(reference: str, shard: str) -> List[dict]:
    path = os.path.join(reference, "failures", f"{shard}.parquet")
    with open(path, "rb") as f:
        return rows_of(f.read())


def run_all(arg_lists: List[List[str]], env: Dict[str, str], logs: str, timeout: float = 240.0) -> List[Worker]:
    """Workers started at once (one per argument list), each waited for; their exit codes in
    `.proc.exitcode`, their output in `.output()`."""
    fleet = Fleet([], env, logs)
    started = []
    for args in arg_lists:
        fleet.args = args
        started.append(fleet.start())
    deadline = time.monotonic() + timeout
    for w in started:
        w.proc.join(max(0.0, deadline - time.monotonic()))
    hung = [w for w in started if w.proc.exitcode is None]
    for w in hung:
        fleet.kill(w)
    assert not hung, f"workers did not end in {timeout:.0f}s: {[w.output()[-500:] for w in hung]}"
    return started
