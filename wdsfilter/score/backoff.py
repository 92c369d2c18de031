"""Out-of-memory back-off: run one scorer over a list of prepared inputs in sub-batches of its own
planned size, counted in frames (scorer.frame_count: an image is 1, a k-frame video k); on CUDA
out-of-memory (cuBLAS/cuDNN allocation failures included), host MemoryError or host-memory
pressure, halve this scorer's sub-batch (the other scorers keep theirs), free the cache and
retry the same inputs. After `grow_after` sub-batches in a row without a failure it doubles the
size again, up to the plan; a size that fails again after growing waits twice as long before the
next try, so a batch that really does not fit is not retried over and over. An input's outcome is
recorded only once its sub-batch returned, so no sample is lost or scored twice. Errors that are not about memory are isolated to the sample that
causes them (its row gets the reason); a scorer that fails on everything stops the run, and so
does a sticky device error (illegal memory access, device-side assert: see faults.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, List, Optional, Tuple

from ..core.errors import DataError, RunError, WdsFilterError
from .faults import DeviceFailedError, sticky_device_error
from .memory import CPU_ALLOC_FAILED, DeviceMemory, is_oom
from .outputs import REASON as OUTPUT_REASON, OutputCheck
from .scorers.base import overridden

# Outcome of one input: ("ok", {column: value}) or ("error", reason, message).
Outcome = Tuple


class ScorerError(RunError):
    """A scorer is broken (wrong output shape, or it fails on every sample): not a data error."""


# Sub-batches in a row without a memory failure after which a halved size is doubled again.
GROW_AFTER = 16
GROW = "grow"  # the kind of a BackoffEvent that doubled the size


@dataclass
class BackoffEvent:
    kind: str  # cuda_oom | host_oom | host_pressure | grow
    from_size: int
    to_size: int
    detail: str


class Backoff:
    def __init__(self, scorer, memory: DeviceMemory, batch_size: int, host: Optional[DeviceMemory] = None,
                 min_free_host: Optional[int] = None, max_failures_before_success: int = 8,
                 grow_after: int = GROW_AFTER, scored_before: int = 0):
        """batch_size: the planned sub-batch in frames (samples for a scorer without frame_count).
        scored_before: rows the run scored before this process (a --retry-failed, which sees only
        samples that failed): a scorer with successes is no broken one, so the bug guard
        (max_failures_before_success) is off."""
        self.scorer = scorer
        self.frame_count = overridden(scorer, "frame_count")  # None: every input is one frame
        self.memory = memory
        self.planned = int(batch_size)
        self.batch_size = int(batch_size)
        self.host = host
        self.min_free_host = min_free_host
        self.max_failures_before_success = max_failures_before_success
        self.events: List[BackoffEvent] = []
        self.successes = 0
        self.scored_before = int(scored_before)
        self.check = OutputCheck(scorer)  # what each sample's output may hold
        self.at = 0
        self.failures_without_success = 0
        self.calls = 0
        self.grow_after = max(1, int(grow_after))
        self.wait = self.grow_after  # sub-batches without failure before the next doubling
        self.streak = 0  # sub-batches in a row without a memory failure
        self.grown = False  # the last change was a doubling (a failure now makes the next one wait longer)

    def _halve(self, failed_size: int, kind: str, detail: str) -> None:
        new = max(1, failed_size // 2)
        self.events.append(BackoffEvent(kind, failed_size, new, detail[:300]))
        self.batch_size = min(self.batch_size, new)
        self.streak = 0
        if self.grown:  # the doubled size failed again: try it less often
            self.wait *= 2
            self.grown = False

    def _succeeded(self) -> None:
        self.streak += 1
        if self.batch_size < self.planned and self.streak >= self.wait:
            if self._host_pressure():  # the host is still short of RAM: stay small
                self.streak = 0
                return
            new = min(self.planned, self.batch_size * 2)
            self.events.append(BackoffEvent(GROW, self.batch_size, new, f"{self.streak} sub-batches in a row fit"))
            self.batch_size, self.streak, self.grown = new, 0, True

    def _frames(self, inputs: List[Any]) -> List[int]:
        if self.frame_count is None:
            return [1] * len(inputs)
        return [max(1, int(self.frame_count(x))) for x in inputs]

    def _take(self, frames: List[int], i: int) -> Tuple[int, int]:
        """(inputs, frames) of the next sub-batch from input i: as many inputs as fit the current
        size in frames, at least one."""
        n, total = 0, 0
        while i + n < len(frames) and (n == 0 or total + frames[i + n] <= self.batch_size):
            total += frames[i + n]
            n += 1
        return n, total

    def _host_pressure(self) -> Optional[str]:
        if self.host is None or not self.min_free_host:
            return None
        free = self.host.free()
        if free < self.min_free_host:
            return f"free host RAM {free / 2**20:.0f} MiB is under {self.min_free_host / 2**20:.0f} MiB"
        return None

    def run(self, inputs: List[Any]) -> List[Outcome]:
        results: List[Optional[Outcome]] = [None] * len(inputs)
        frames = self._frames(inputs)
        i = 0
        isolate_until = 0  # inputs before this index are retried one at a time
        while i < len(inputs):
            n, size = (1, frames[i]) if i < isolate_until else self._take(frames, i)
            if n > 1:
                pressure = self._host_pressure()
                if pressure:
                    self.memory.empty_cache()
                    self._halve(size, "host_pressure", pressure)
                    if self.batch_size < size:
                        continue
            chunk = inputs[i:i + n]
            self.at = i  # the input being scored: a ScorerError names its sample (modelrunner)
            failure = None
            self.calls += 1
            try:
                out = self.scorer.score_batch(chunk)
            except Exception as e:  # noqa: BLE001 - sorted below; the exception object is not kept
                failure = self._classify(e, n)
            if failure is not None:
                kind, reason, message = failure
                if kind == "oom":
                    # The failed call's tensors are gone with its frames; give the cache back.
                    self.memory.empty_cache()
                    if n > 1:
                        self._halve(size, reason, message)
                        continue
                    results[i] = ("error", "out_of_memory", message)
                    i += 1
                    continue
                if n > 1:  # find the sample that fails; the others still get scores
                    isolate_until = i + n
                    continue
                results[i] = ("error", reason, message)
                i += 1
                continue
            if not isinstance(out, list) or len(out) != n:
                raise self._bad_output(out, n)
            for j, scores in enumerate(out):
                if not isinstance(scores, dict):
                    raise self._bad_output(out, n)
                self.at = i + j
                results[i + j] = self._checked(scores)
            if i >= isolate_until:  # a one-by-one retry after a scorer error says nothing about memory
                self._succeeded()
            i += n
        return results  # type: ignore[return-value]

    def _checked(self, scores: dict) -> Outcome:
        """One sample's output: ok, or its error when a column cannot hold it (outputs.py), which
        counts as the scorer failing on that sample (the guard against a broken scorer)."""
        problem = self.check.problem(scores)
        if problem is None:
            self.successes += 1
            self.failures_without_success = 0
            return ("ok", scores)
        self._failed_alone(problem)
        return ("error", OUTPUT_REASON, problem)

    def _failed_alone(self, message: str, cause: Optional[BaseException] = None) -> None:
        """A sample the scorer failed on (alone): a scorer that fails on its first
        max_failures_before_success samples and scores none, in a run that scored none before,
        is a bug or a broken model, not bad data (ScorerError: the run stops)."""
        if self.successes or self.scored_before:
            return
        self.failures_without_success += 1
        if self.failures_without_success >= self.max_failures_before_success:
            raise ScorerError(f"scorer {self.scorer.name!r} failed on the first {self.failures_without_success} "
                              f"samples and scored none; this looks like a bug or a broken model, not bad data. "
                              f"Last error: {message}") from cause

    def _bad_output(self, out: Any, n: int) -> ScorerError:
        return ScorerError(f"scorer {self.scorer.name!r}: score_batch returned "
                           f"{type(out).__name__} of length {len(out) if hasattr(out, '__len__') else '?'}"
                           f" for {n} inputs; expected a list of {n} dicts")

    def _classify(self, e: Exception, n: int):
        """(kind, reason, message) for a failed call; raises when the scorer itself is broken."""
        message = f"{type(e).__name__}: {e}"
        sticky = sticky_device_error(e)
        if sticky:  # the device is unusable: scoring on would fail every later sample (faults.py)
            raise DeviceFailedError(sticky) from e
        if is_oom(e):
            host = isinstance(e, MemoryError) or any(m in str(e) for m in CPU_ALLOC_FAILED)
            return "oom", ("host_oom" if host else "cuda_oom"), message
        if isinstance(e, DataError):
            return "data", e.reason, message
        if isinstance(e, (ScorerError, WdsFilterError)) and not isinstance(e, DataError):
            raise e
        if n == 1:
            self._failed_alone(message, e)
        return "error", "score_error", message

    def stats(self) -> dict:
        """planned/final sizes are in frames for a scorer that counts them (an image is one frame)."""
        return {"planned_batch_size": self.planned, "final_batch_size": self.batch_size,
                "smallest_batch_size": min([self.batch_size] + [e.to_size for e in self.events]),
                "events": [asdict(e) for e in self.events], "calls": self.calls, "scored": self.successes}
