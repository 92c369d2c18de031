"""The model side of scoring, shared by both engines: a ModelRunner loads the scorers on one
device, measures what they cost (memory_allocated before and after each load; peak memory of
probe batches) and scores batches through the back-off. The local engine runs it in its model
workers (modelworker.py), the Ray engine in its ScoreActor.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.errors import DataError
from .backoff import Backoff, ScorerError
from ..runfolder.embeddings import FIELD as EMBEDDINGS
from .faults import DeviceFailedError, device_failed, sticky_device_error
from .memory import HostMemory, device_memory, is_oom, prefer_expandable_segments, torch_device
from .scorerset import bind_one
from .scorers.base import Upstream, overridden
from ..storage.shards import shown_url

# One work item: (row reference, {scorer name: prepared input}).
Item = Tuple[Any, Dict[str, Any]]
# Each scorer's timed probe work stops growing past about this many seconds (OCR on the CPU: a
# few samples, not 16 twice); the warm-up and the single-sample measurement come on top.
PROBE_SECONDS = 4.0
# The probe's timed work is also at most this share of the job's own model time (its samples times
# the first timed sample), where the job's size is known: on the CPU, OCR's probe was 48% of an
# 8-clip job's wall time.
PROBE_SHARE = 0.1


@dataclass
class LoadReport:
    """What a model process measured when it loaded the scorers (ModelRunner.load): what the
    planner and the plan's lines are given, from either engine."""
    device: str
    kind: str  # the memory kind: "cuda", "host", or a registered one ("simulated")
    total: int  # the device's memory, bytes
    free_before: int  # free before loading
    footprint: int  # all scorers' models together
    footprints: Dict[str, int] = field(default_factory=dict)  # per scorer
    overhead: int = 0  # what one more model process costs the device (its CUDA context)
    overhead_estimated: bool = False  # overhead guessed, not measured
    rss: int = 0  # the process's host memory after loading
    descriptions: List[str] = field(default_factory=list)  # each scorer's describe()
    worker: int = 0  # which model process (the pool's number)
    in_process: bool = False  # loaded in the main process: no replica can be added


def probe_batch_size(one: float, size: int, passes: int, max_seconds: float, job_samples: Optional[int]) -> int:
    """The probe's second batch: `size` inputs, cut to about max_seconds of timed work (`one`:
    seconds of one input, timed `passes` times) and, where the job's size is known, to PROBE_SHARE
    of its model time; 1 for a job too small for a second probe batch."""
    budget = max_seconds if not job_samples else min(max_seconds, PROBE_SHARE * one * job_samples)
    if one * size * passes > budget:
        size = min(size, int(budget / (one * passes)))
        size = 1 if job_samples and size < 2 else max(2, size)
    return size


class ModelRunner:
    def __init__(self, scorers: Sequence, device: str):
        self.scorers = list(scorers)
        self.device = device
        self.memory = None
        self.host = None
        self.backoffs: Dict[str, Backoff] = {}
        self.batches = 0
        self.samples = 0
        self.seconds = 0.0

    # -- measuring --------------------------------------------------------------------------
    def load(self) -> LoadReport:
        """Load every scorer; report the device's free memory before and each model's footprint."""
        if self.device.startswith("cuda"):
            prefer_expandable_segments()  # a Ray actor's first CUDA use is here
        self.memory = device_memory(self.device)
        self.host = self.memory if isinstance(self.memory, HostMemory) else HostMemory()
        mem = self.memory
        mem.empty_cache()
        free_before = mem.free()
        overhead = mem.process_overhead()
        footprints = {}
        by_name = {s.name: s for s in self.scorers}
        for scorer in self.scorers:
            # the run orders required scorers first (scorerset.with_required): loaded by now
            bind_one(scorer, by_name)
            before, used_before = mem.allocated(), mem.device_used()
            scorer.load(torch_device(self.device))
            # with the device memory its scoring takes at any batch size (the JPEG decode's workspace)
            footprints[scorer.name] = _grown(mem, before, used_before) + getattr(scorer, "workspace_bytes", lambda: 0)()
        return LoadReport(device=self.device, kind=mem.kind, total=mem.total(), free_before=free_before,
                          footprint=sum(footprints.values()), footprints=footprints, overhead=overhead,
                          overhead_estimated=mem.overhead_estimated, rss=self.host.allocated(),
                          descriptions=[s.describe() for s in self.scorers])

    def probe(self, inputs: List[Dict[str, Any]], max_seconds: float = PROBE_SECONDS,
              job_samples: Optional[int] = None) -> dict:
        """Activation memory and time of each scorer at two batch sizes (1 and n), after one
        warm-up call, so the timed call is representative and lazy initialisation is not counted
        as activations. n is len(inputs), or fewer for a slow scorer: its timed work at n (the
        batch, and on the CPU the same samples one at a time) is cut to about max_seconds, so the
        probe of OCR on the CPU does not take longer than a small job itself; where `job_samples`
        (the samples of the whole job) is known, also to PROBE_SHARE of the job's model time, and a
        job too small for a second probe batch gets none (n = 1: its memory is planned as if it
        all scaled with the batch, as after an out-of-memory probe). `sizes`: each
        scorer's (1, n). What the warm-up leaves allocated (cuDNN/cuBLAS workspaces, onnxruntime's
        arena) is reported as `retained`: the planner adds it to the model.
        `frames`: each probe batch's frames (scorer.frame_count): a k-frame video costs k frames.
        A dependent scorer (Scorer.requires) is probed on its attach(probe=True) inputs."""
        import torch
        mem, passes = self.memory, (2 if self.memory.kind == "host" else 1)  # on the CPU the larger batch is timed twice
        sizes: Dict[str, List[int]] = {}
        peaks: Dict[str, List[int]] = {}
        timings: Dict[str, List[float]] = {}  # seconds per sample one at a time, then batched
        retained: Dict[str, int] = {}
        errors, frames = {}, {}  # scorer -> its probe error; scorer -> frames of its probe batches
        outputs: Dict[str, List[dict]] = {}  # each scorer's last probe batch: what a dependent's probe reads
        seconds, oom_at = 0.0, None

        def measure(scorer, batch) -> Tuple[int, float]:
            """(peak bytes above what was allocated before, seconds) of one scored batch: the
            allocator's peak, or the device-level growth where a library allocates outside
            PyTorch (an arena keeps its peak, so growth shows it)."""
            base, used_base = mem.allocated(), mem.device_used()
            mem.reset_peak()
            start = time.perf_counter()
            outputs[scorer.name] = scorer.score_batch(batch)
            elapsed = time.perf_counter() - start
            return max(0, mem.peak() - base, _grown(mem, base, used_base)), elapsed

        for scorer in self.scorers:
            batch = self._probe_batch(scorer, inputs, outputs)
            if not batch:  # a scorer it requires failed its probe: planned as unmeasured
                errors[scorer.name], peaks[scorer.name] = "not probed: a scorer it requires failed its probe", []
                continue
            count = getattr(scorer, "frame_count", lambda _: 1)
            measured: List[int] = []
            size = 1
            try:
                before, used_before = mem.allocated(), mem.device_used()
                scorer.score_batch(batch[:1])  # warm-up
                mem.empty_cache()
                retained[scorer.name] = _grown(mem, before, used_before) if mem.kind != "host" else 0
                peak, one = measure(scorer, batch[:1])
                measured.append(peak)
                size = probe_batch_size(one, len(batch), passes, max_seconds, job_samples)
                sizes[scorer.name] = [1, size]
                frames[scorer.name] = [sum(max(1, int(count(x))) for x in batch[:n]) for n in (1, size)]
                if size == 1:  # a job too small for a second probe batch: the first stands for it
                    seconds += one
                    if mem.kind == "host":
                        timings[scorer.name] = [one, one]
                else:
                    mem.empty_cache()
                    peak, elapsed = measure(scorer, batch[:size])
                    measured.append(peak)
                    seconds += elapsed / size
                    if mem.kind == "host":
                        # The same inputs one at a time: on a CPU, batching does not always pay.
                        start = time.perf_counter()
                        for one_input in batch[:size]:
                            scorer.score_batch([one_input])
                        timings[scorer.name] = [(time.perf_counter() - start) / size, elapsed / size]
            except Exception as e:  # noqa: BLE001 - the plan reports it; scoring handles it per sample
                if sticky_device_error(e):
                    raise device_failed(self.device, sticky_device_error(e)) from e
                if is_oom(e):
                    oom_at = size
                else:
                    errors[scorer.name] = f"{type(e).__name__}: {e}"[:300]
            mem.empty_cache()
            peaks[scorer.name] = measured
        return {"sizes": sizes, "peaks": peaks, "frames": frames, "retained": retained, "timings": timings,
                "seconds_per_sample": seconds,
                "threads": torch.get_num_threads(), "oom_at": oom_at, "errors": errors}

    @staticmethod
    def _probe_batch(scorer, inputs: List[Dict[str, Any]], outputs: Dict[str, List[dict]]) -> List[Any]:
        """A scorer's probe inputs; a dependent's attached to what its required scorers' largest
        probe batch gave, in the costliest form (attach(probe=True))."""
        required = getattr(scorer, "requires", ()) or ()
        if not required:
            return [inp[scorer.name] for inp in inputs]
        batch = []
        for k, inp in enumerate(inputs):
            if not all(k < len(outputs.get(r, ())) for r in required):
                break
            batch.append(scorer.attach(inp[scorer.name], {r: Upstream(inp[r], outputs[r][k]) for r in required},
                                       probe=True))
        return batch

    # -- scoring ------------------------------------------------------------------------------
    def configure(self, batch_size: int, threads: Optional[int] = None, min_free_host: Optional[int] = None,
                  scorer_batch: Optional[Dict[str, int]] = None, scored_before: int = 0) -> None:
        """batch_size: the dispatched batch (samples); scorer_batch: each scorer's own planned
        sub-batch in frames (plan.DevicePlan.scorer_batch). Each scorer runs the dispatched
        batch in sub-batches of its own size, through its own back-off, so a scorer with a small
        batch (OCR on large frames) no longer holds back one with a large one (CLIP); a scorer
        the plan does not name uses batch_size. scored_before: the run's rows scored before
        (backoff.Backoff: a --retry-failed of failing samples is not stopped as a bug)."""
        if threads:
            import torch
            torch.set_num_threads(threads)
            for scorer in self.scorers:  # libraries torch's setting does not reach (onnxruntime)
                set_threads = getattr(scorer, "set_threads", None)
                if set_threads is not None:
                    set_threads(threads)
        sizes = scorer_batch or {}
        self.backoffs = {s.name: Backoff(s, self.memory, sizes.get(s.name, batch_size), self.host, min_free_host,
                                         scored_before=scored_before)
                         for s in self.scorers}

    def score(self, items: List[Item]) -> List[Tuple[Any, dict, dict]]:
        """(ref, {column: value}, {scorer: (reason, message)}) per item, in order."""
        try:
            return self._score(items)
        except DeviceFailedError as e:  # name the device; the pool stops this worker
            raise device_failed(self.device, str(e)) from e

    def _score(self, items: List[Item]) -> List[Tuple[Any, dict, dict]]:
        start = time.perf_counter()
        scores: List[dict] = [{} for _ in items]
        errors: List[dict] = [{} for _ in items]
        # Each sample's whole output per scorer (private keys too) while the batch is scored: what
        # a dependent scorer's attach() is given. Dropped with the batch.
        outputs: List[Dict[str, dict]] = [{} for _ in items]
        for scorer in self.scorers:
            batch_key = overridden(scorer, "batch_key")  # None: all of this scorer's inputs are one group
            inputs_of = self._inputs(scorer, items, outputs, errors)
            groups: Dict[Any, List[int]] = {}
            for k, x in inputs_of.items():
                groups.setdefault(batch_key(x) if batch_key else None, []).append(k)
            columns = scorer.columns()
            for members in groups.values():
                backoff = self.backoffs[scorer.name]
                try:
                    outcomes = backoff.run([inputs_of[k] for k in members])
                except ScorerError as e:  # a broken scorer: the one line names the sample it stopped at
                    raise ScorerError(f"{e} (at {_sample(items[members[min(backoff.at, len(members) - 1)]][0])})") \
                        from e.__cause__
                for k, outcome in zip(members, outcomes):
                    if outcome[0] == "ok":
                        scores[k].update({c: outcome[1].get(c) for c in columns})
                        outputs[k][scorer.name] = outcome[1]
                        if EMBEDDINGS in outcome[1]:  # --save-embeddings: written beside the score file
                            scores[k][EMBEDDINGS] = outcome[1][EMBEDDINGS]
                    else:
                        errors[k][scorer.name] = (outcome[1], outcome[2])
        self.batches += 1
        self.samples += len(items)
        self.seconds += time.perf_counter() - start
        return [(item[0], s, e) for item, s, e in zip(items, scores, errors)]

    @staticmethod
    def _inputs(scorer, items: List[Item], outputs: List[Dict[str, dict]], errors: List[dict]) -> Dict[int, Any]:
        """{item index: this scorer's input} of the items it has an input for. A dependent scorer's
        is attached to its required scorers' inputs and outputs (Scorer.attach); an item a required
        scorer has no output for gets this scorer's error instead, with that scorer's reason."""
        required = getattr(scorer, "requires", ()) or ()
        out: Dict[int, Any] = {}
        for k, (_, inputs) in enumerate(items):
            if scorer.name not in inputs:
                continue
            if not required:
                out[k] = inputs[scorer.name]
                continue
            failed = next((r for r in required if r not in outputs[k]), None)
            if failed is not None:
                reason, message = errors[k].get(failed, ("required_scorer_failed", "it could not prepare this sample"))
                errors[k][scorer.name] = (reason, f"needs the {failed} scorer's output: {message}")
                continue
            try:
                out[k] = scorer.attach(inputs[scorer.name], {r: Upstream(inputs.get(r), outputs[k][r])
                                                             for r in required})
            except DataError as e:
                errors[k][scorer.name] = (e.reason, str(e))
        return out

    def stats(self) -> dict:
        return {"device": self.device, "batches": self.batches, "samples": self.samples,
                "seconds": round(self.seconds, 3),
                "backoff": {name: b.stats() for name, b in self.backoffs.items()}}

    def unload(self) -> None:
        for scorer in self.scorers:
            scorer.unload()


def _sample(ref: Any) -> str:
    """A sample by the engine's reference to it: (shard URL, row index) on the local engine."""
    if isinstance(ref, tuple) and len(ref) == 2:
        return f"row {ref[1]} of {shown_url(str(ref[0]))}"
    return f"sample {ref}"


def _grown(mem, allocated_before: int, used_before: Optional[int]) -> int:
    """Bytes this process added since the readings: PyTorch's allocator, or the whole device
    where it can be read (libraries with their own allocators), whichever grew more."""
    grown = mem.allocated() - allocated_before
    used = mem.device_used()
    if used is not None and used_before is not None:
        grown = max(grown, used - used_before)
    return max(0, grown)


# -- pools ------------------------------------------------------------------------------------
