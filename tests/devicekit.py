"""A simulated GPU for the scoring tests (no tests in this module): the "sim:NAME" model devices.

Importing this module registers the "sim" device kind with wdsfilter.score.memory, so a run with
devices=["sim:NAME"] plans and backs off as on a GPU of the size the test chose, while the model
computes on the CPU. A spawned model worker receives the device pickled: unpickling it imports
this module there (tests/ is on the workers' sys.path) and so registers the kind in that process.
"""
from __future__ import annotations

from typing import Dict, Optional

from wdsfilter.score.memory import DeviceMemory, register_device_kind


class SimulatedDevice(DeviceMemory):
    """A GPU of `total` bytes for tests, one per name and process (pickling re-attaches to the
    receiving process's device of that name). Freed blocks stay cached, as in PyTorch, until
    empty_cache(); alloc() raises torch.cuda.OutOfMemoryError when the request does not fit."""

    kind = "simulated"
    _registry: Dict[str, "SimulatedDevice"] = {}

    def __init__(self, name: str, total: int, overhead: int = 0):
        self.name = name
        self._total = int(total)
        self._overhead = int(overhead)
        self.used = 0  # allocated by this process
        self.cached = 0  # freed but kept by the caching allocator
        self.occupied = 0  # taken by other processes
        self._peak = 0
        self.ooms = 0

    @classmethod
    def create(cls, name: str, total: int, overhead: int = 0) -> "SimulatedDevice":
        dev = cls(name, total, overhead)
        cls._registry[name] = dev
        return dev

    @classmethod
    def get(cls, name: str, total: Optional[int] = None, overhead: int = 0) -> "SimulatedDevice":
        dev = cls._registry.get(name)
        if dev is None:
            if total is None:
                raise KeyError(f"no simulated device {name!r} in this process")
            dev = cls.create(name, total, overhead)
        return dev

    def __reduce__(self):
        return (SimulatedDevice.get, (self.name, self._total, self._overhead))

    # -- the allocator ----------------------------------------------------------------------
    def alloc(self, nbytes: int) -> None:
        nbytes = int(nbytes)
        from_cache = min(self.cached, nbytes)
        fresh = nbytes - from_cache
        if fresh > self._total - self.occupied - self.used - self.cached:
            self.ooms += 1
            import torch
            raise torch.cuda.OutOfMemoryError(
                f"simulated device {self.name}: tried to allocate {nbytes} bytes; {self.used} allocated, "
                f"{self.cached} cached, {self.occupied} used by others, {self._total} total")
        self.cached -= from_cache
        self.used += nbytes
        self._peak = max(self._peak, self.used)

    def release(self, nbytes: int) -> None:
        nbytes = min(int(nbytes), self.used)
        self.used -= nbytes
        self.cached += nbytes

    def occupy(self, nbytes: int) -> None:
        """Memory taken outside this process's PyTorch allocator: another process (what makes a
        planned batch OOM later), or a library with its own allocator (onnxruntime's arena)."""
        self.occupied += int(nbytes)

    # -- DeviceMemory -------------------------------------------------------------------------
    def free(self) -> int:
        return self._total - self.occupied - self.used - self.cached

    def total(self) -> int:
        return self._total

    def allocated(self) -> int:
        return self.used

    def peak(self) -> int:
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self.used

    def empty_cache(self) -> None:
        self.cached = 0

    def process_overhead(self) -> int:
        return self._overhead

    def device_used(self) -> Optional[int]:
        return self._total - self.free()


register_device_kind("sim", SimulatedDevice.get)
