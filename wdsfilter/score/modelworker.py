"""Model workers: the process side of scoring.

A ModelRunner (modelrunner.py) loads the scorers on one device and scores batches through the
back-off. It runs in the main process (LocalPool: one CPU device) or in one spawned process per device
replica (ProcessPool: GPUs, or several CPU/simulated devices so the path is testable without a
GPU). Work flows through per-worker queues holding at most `depth` batches each, so memory stays
bounded whatever the dataset size.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.errors import ConfigError, RunError
from .faults import DeviceFailedError
from .memory import registered_device, prefer_expandable_segments
from .modelrunner import LoadReport, ModelRunner
from .transport import open_items, pack, unpack


class WorkerError(RunError):
    """A model worker process failed or died."""


class RemoteTraceback(Exception):
    """A model worker process's traceback: the cause of its WorkerError, printed with --debug only
    (the error itself is one line)."""

    def __str__(self):
        return "the model worker's traceback:\n" + self.args[0]


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


class LocalPool:
    """The model in the main process: one CPU device, no extra process to start."""

    in_process = True

    def __init__(self, device: str, scorers: Sequence):
        self.devices = [device]
        self.runner = ModelRunner(scorers, device)
        self.done: List[tuple] = []
        self.busy = False

    def start(self) -> List[LoadReport]:
        try:
            report = self.runner.load()
        except Exception as e:  # the scorer's own failure (weights, a library), not wdsfilter's bug
            if isinstance(e, (ConfigError, RunError)):
                raise
            raise WorkerError(f"the scorers failed to load on {self.devices[0]}: {type(e).__name__}: "
                              f"{_first_line(str(e))}") from e
        report.worker = 0
        return [report]

    def probe(self, inputs, job_samples=None) -> dict:
        return self.runner.probe(inputs, job_samples=job_samples)

    def add_replica(self, device: str) -> LoadReport:
        raise ConfigError("the in-process model runs one replica; use devices=['cpu', 'cpu'] for more")

    def set_queue_depth(self, depth: int) -> None:
        """In-process: one batch at a time, nothing queues."""

    def configure(self, worker: int, **settings) -> None:
        self.runner.configure(**settings)

    @property
    def workers(self) -> List[int]:
        return [0]

    def device_of(self, worker: int) -> str:
        return self.devices[0]

    def idle_worker(self) -> Optional[int]:
        return 0

    def in_flight(self) -> int:
        return 0

    def submit(self, worker: int, batch_id: int, batch) -> None:
        """batch: a transport.Batch (or a list of (ref, inputs) items)."""
        self.done.append((batch_id, 0, self.runner.score(open_items(batch))))

    def poll(self, timeout: float = 0.0) -> List[tuple]:
        done, self.done = self.done, []
        return done

    def close(self) -> List[dict]:
        stats = self.runner.stats()
        stats["worker"] = 0
        self.runner.unload()
        return [stats]


def _worker_main(worker: int, device: str, scorers, inbox, outbox, threads: Optional[int], sim=None) -> None:
    """A model worker process: load, then serve probe/configure/batch messages until stop.
    `sim`: the DeviceMemory of a registered device kind (memory.DEVICE_KINDS: the tests' simulated
    GPU), else None; unpickling it registers it in this process."""
    try:
        prefer_expandable_segments()
        import torch
        if threads:
            torch.set_num_threads(threads)
        if device.startswith("cuda"):
            # This worker's GPU becomes the current one: libraries that allocate on "cuda" (the
            # current device) and current-device checks then see it, not GPU 0.
            torch.cuda.set_device(torch.device(device))
        runner = ModelRunner(scorers, device)
        outbox.put(("loaded", worker, runner.load()))
        while True:
            msg = _next_message(inbox)
            if msg[0] == "batch":
                # The batch's buffers are the decode workers' chunk buffers, mapped here by handle.
                outbox.put(("result", worker, (msg[1], runner.score(open_items(msg[2])))))
                del msg  # unmap the chunk buffers before waiting for the next batch
            elif msg[0] == "probe":
                outbox.put(("probe", worker, runner.probe(unpack(msg[1]), job_samples=msg[2])))
            elif msg[0] == "configure":
                runner.configure(**msg[1])
                outbox.put(("configured", worker, None))
            elif msg[0] == "stop":
                stats = runner.stats()
                runner.unload()
                outbox.put(("stopped", worker, stats))
                return
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        outbox.put(("error", worker, {"type": type(e).__name__, "message": str(e),
                                      "config": isinstance(e, ConfigError), "traceback": traceback.format_exc(),
                                      "device_failed": isinstance(e, DeviceFailedError)}))


def _next_message(inbox, every: float = 1.0):
    """The next message from the main process. A worker whose main process is gone (killed with
    SIGKILL, or by a signal it could not clean up after) exits: it would otherwise wait here for
    ever, holding its device and its memory."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            return inbox.get(timeout=every)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                os._exit(1)


class ProcessPool:
    """One spawned process per model replica (spawn: CUDA cannot live in forked children)."""

    in_process = False

    def __init__(self, devices: Sequence[str], scorers: Sequence, depth: int = 2, threads: Optional[int] = None):
        import torch.multiprocessing as tmp
        self.ctx = tmp.get_context("spawn")
        self.scorers = list(scorers)
        self.depth = depth
        self.threads = threads
        self.outbox = self.ctx.Queue()
        self.procs: Dict[int, Any] = {}
        self.inboxes: Dict[int, Any] = {}
        self.device_by_worker: Dict[int, str] = {}
        self.inflight: Dict[int, int] = {}
        self.first_devices = list(devices)
        self.waiting: Dict[Tuple[str, int], Any] = {}
        self.results: List[tuple] = []
        self.final_stats: Dict[int, dict] = {}
        self.reported: set = set()  # workers that loaded their scorers

    @property
    def devices(self) -> List[str]:
        return list(self.first_devices)

    @property
    def workers(self) -> List[int]:
        return sorted(self.procs)

    def device_of(self, worker: int) -> str:
        return self.device_by_worker[worker]

    def _spawn(self, device: str) -> int:
        worker = len(self.procs)
        inbox = self.ctx.Queue()
        sim = registered_device(device)  # a test's simulated GPU: it registers again in the worker
        proc = self.ctx.Process(target=_worker_main, name=f"wdsfilter-model-{worker}",
                                args=(worker, device, self.scorers, inbox, self.outbox, self.threads, sim), daemon=True)
        proc.start()
        self.procs[worker], self.inboxes[worker] = proc, inbox
        self.device_by_worker[worker] = device
        self.inflight[worker] = 0
        return worker

    def _receive(self, timeout: float) -> bool:
        """Take one message off the shared outbox; False when none came in `timeout` seconds."""
        try:
            kind, worker, payload = self.outbox.get(timeout=timeout)
        except queue.Empty:
            self._check_alive()
            return False
        if kind == "error":
            self.terminate()
            device = self.device_by_worker.get(worker, "?")
            if payload["config"]:
                raise ConfigError(payload["message"])
            if payload.get("device_failed"):  # a clear line, no traceback: the message says it all
                raise DeviceFailedError(payload["message"])
            raise WorkerError(f"model worker {worker} on {device} failed: {payload['type']}: "
                              f"{_first_line(payload['message'])} (--debug shows its traceback)") \
                from RemoteTraceback(payload["traceback"])
        if kind == "result":
            batch_id, results = payload
            self.inflight[worker] -= 1
            self.results.append((batch_id, worker, results))
        elif kind == "stopped":
            self.final_stats[worker] = payload
        else:
            self.waiting[(kind, worker)] = payload
        return True

    def _check_alive(self) -> None:
        for worker, proc in self.procs.items():
            if worker in self.final_stats:
                continue
            if not proc.is_alive():
                code = proc.exitcode
                loading = ("loaded", worker) not in self.waiting and worker not in self.reported
                self.terminate()
                hint = " (killed by a signal: out of host memory?)" if code and code < 0 else ""
                if loading and code and code > 0:
                    # The usual cause: a script that starts scoring at import time, without the main
                    # guard; the spawned worker imports it again (its own error is printed above).
                    hint += (". It died while starting: if your script calls wdsfilter at import time, put the "
                             "call under `if __name__ == \"__main__\":` (model workers import the script again)")
                raise WorkerError(f"model worker {worker} on {self.device_by_worker[worker]} died with exit code "
                                  f"{code}{hint}")

    def _await(self, kind: str, worker: int, timeout: float = 3600.0) -> Any:
        deadline = time.monotonic() + timeout
        while (kind, worker) not in self.waiting:
            if time.monotonic() > deadline:
                self.terminate()
                raise WorkerError(f"model worker {worker} sent no {kind!r} in {timeout:.0f}s")
            self._receive(0.5)
        return self.waiting.pop((kind, worker))

    def start(self) -> List[LoadReport]:
        workers = [self._spawn(d) for d in self.first_devices]
        reports = []
        for w in workers:
            report = self._await("loaded", w)
            self.reported.add(w)
            report.worker = w
            reports.append(report)
        return reports

    def set_queue_depth(self, depth: int) -> None:
        """Batches each model worker may hold (the plan's queue depth): one scored, others waiting."""
        self.depth = max(1, int(depth))

    def add_replica(self, device: str) -> LoadReport:
        w = self._spawn(device)
        report = self._await("loaded", w)
        self.reported.add(w)
        report.worker = w
        return report

    def probe(self, inputs, job_samples=None) -> dict:
        self.inboxes[0].put(("probe", pack(inputs), job_samples))
        return self._await("probe", 0)

    def configure(self, worker: int, **settings) -> None:
        self.inboxes[worker].put(("configure", settings))
        self._await("configured", worker)

    def idle_worker(self) -> Optional[int]:
        """The worker with the fewest batches in flight, if it has room for one more."""
        worker = min(self.inflight, key=lambda w: (self.inflight[w], w))
        return worker if self.inflight[worker] < self.depth else None

    def in_flight(self) -> int:
        return sum(self.inflight.values())

    def submit(self, worker: int, batch_id: int, batch) -> None:
        """batch: a transport.Batch: slots into shared chunk buffers, sent by handle (no pixel is
        copied here); a plain list of (ref, inputs) items is pickled as it is."""
        self.inflight[worker] += 1
        self.inboxes[worker].put(("batch", batch_id, batch))

    def poll(self, timeout: float = 0.0) -> List[tuple]:
        """Results that arrived; waits up to `timeout` for the first one."""
        if not self.results and timeout > 0:
            self._receive(timeout)
        while self._receive(0.0):
            pass
        results, self.results = self.results, []
        return results

    def close(self) -> List[dict]:
        for w, inbox in self.inboxes.items():
            if self.procs[w].is_alive():
                inbox.put(("stop",))
        deadline = time.monotonic() + 60
        while len(self.final_stats) < len(self.procs) and time.monotonic() < deadline:
            try:
                self._receive(0.5)
            except WorkerError:
                break
        self.terminate()
        stats = []
        for w in self.workers:
            s = dict(self.final_stats.get(w, {"device": self.device_by_worker[w]}))
            s["worker"] = w
            stats.append(s)
        return stats

    def terminate(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.join(timeout=0.05)
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs.values():
            proc.join(timeout=5)
