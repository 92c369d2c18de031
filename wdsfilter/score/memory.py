"""Memory of the devices a model runs on, behind one small interface.

The planner and the OOM back-off only talk to a DeviceMemory, so the CUDA logic is exercised in
tests on a SimulatedDevice (N bytes; a test scorer "allocates" per sample and gets a real
torch.cuda.OutOfMemoryError when it does not fit), and the host is measured for real with psutil.

    CudaMemory      torch.cuda.mem_get_info / memory_allocated / max_memory_allocated
    HostMemory      psutil (available RAM) and this process's RSS and peak RSS (VmHWM)
    SimulatedDevice a device of `total` bytes with PyTorch's caching-allocator behaviour
"""
from __future__ import annotations

import abc
import gc
import os
import threading
from typing import Dict, Optional

# What one more process costs on a GPU before it allocates anything (its CUDA context, cuBLAS
# workspaces). Not visible to memory_allocated, so it is an estimate, shown as one in plans.
CUDA_CONTEXT_BYTES = 600 * 2**20


# What a probe or a back-off frees lives in the young generations (a failed batch's traceback,
# its tensors): collecting those takes microseconds, while a full collection with torch and a model
# loaded takes about a second, and the probe cleaned up several times per scorer.
YOUNG = 1


class DeviceMemory(abc.ABC):
    """Bytes on one device. `allocated`/`peak` are this process's; `free`/`total` the device's."""

    kind = "device"
    #: whether process_overhead() is an estimate rather than a measurement
    overhead_estimated = True

    @abc.abstractmethod
    def free(self) -> int: ...

    @abc.abstractmethod
    def total(self) -> int: ...

    @abc.abstractmethod
    def allocated(self) -> int: ...

    @abc.abstractmethod
    def peak(self) -> int:
        """Most bytes allocated since the last reset_peak()."""

    @abc.abstractmethod
    def reset_peak(self) -> None: ...

    @abc.abstractmethod
    def empty_cache(self) -> None:
        """Give cached, unused memory back (what the back-off does after an OOM)."""

    def process_overhead(self) -> int:
        """What another model process costs on this device before loading anything."""
        return 0

    def device_used(self) -> Optional[int]:
        """Bytes in use on the whole device (total - free), or None where that is not meaningful.
        It sees what PyTorch's allocator does not: onnxruntime's CUDA arena (rapidocr on a GPU),
        cuDNN/cuBLAS workspaces; so the model worker measures both and keeps the larger."""
        return None


class CudaMemory(DeviceMemory):
    kind = "cuda"

    def __init__(self, index: int = 0):
        self.index = index

    def free(self) -> int:
        import torch
        return int(torch.cuda.mem_get_info(self.index)[0])

    def total(self) -> int:
        import torch
        return int(torch.cuda.mem_get_info(self.index)[1])

    def allocated(self) -> int:
        import torch
        return int(torch.cuda.memory_allocated(self.index))

    def peak(self) -> int:
        import torch
        return int(torch.cuda.max_memory_allocated(self.index))

    def reset_peak(self) -> None:
        import torch
        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)

    def empty_cache(self) -> None:
        import torch
        gc.collect(YOUNG)
        torch.cuda.empty_cache()

    def process_overhead(self) -> int:
        return CUDA_CONTEXT_BYTES

    def device_used(self) -> Optional[int]:
        import torch
        free, total = torch.cuda.mem_get_info(self.index)
        return int(total - free)


class HostMemory(DeviceMemory):
    """Host RAM: free = psutil's `available`; allocated = this process's RSS; peak = its high
    water mark (Linux VmHWM, reset through /proc/self/clear_refs), else sampled by a thread."""

    kind = "host"
    overhead_estimated = False

    def __init__(self):
        import psutil
        self._psutil = psutil
        self._process = psutil.Process()
        self._baseline_rss = self.allocated()
        self._sampled_peak = 0
        self._sampler: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def free(self) -> int:
        return int(self._psutil.virtual_memory().available)

    def total(self) -> int:
        return int(self._psutil.virtual_memory().total)

    def allocated(self) -> int:
        return int(self._process.memory_info().rss)

    @staticmethod
    def _vm_hwm() -> Optional[int]:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def reset_peak(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            self._use_hwm = True
            return
        except OSError:
            self._use_hwm = False
        self._sampled_peak = self.allocated()
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, daemon=True, name="wdsfilter-rss")
            self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._sampled_peak = max(self._sampled_peak, self.allocated())

    def peak(self) -> int:
        if getattr(self, "_use_hwm", False):
            hwm = self._vm_hwm()
            if hwm is not None:
                return hwm
        return max(self._sampled_peak, self.allocated())

    def empty_cache(self) -> None:
        gc.collect(YOUNG)
        try:  # hand freed heap pages back so RSS (what psutil sees) drops too
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def process_overhead(self) -> int:
        """RSS of this process when it started measuring (Python, torch, the scorers' imports):
        what each extra model process costs before its model loads."""
        return self._baseline_rss

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()


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


def device_memory(device: str) -> DeviceMemory:
    """The DeviceMemory of a model device string: cpu, cuda, cuda:N, sim:NAME."""
    if device == "cpu":
        return HostMemory()
    if device.startswith("cuda"):
        return CudaMemory(int(device.split(":")[1]) if ":" in device else 0)
    if device.startswith("sim:"):
        return SimulatedDevice.get(device[4:])
    raise ValueError(f"unknown device {device!r}")


def torch_device(device: str) -> str:
    """The torch device a scorer loads on (simulated GPUs compute on the CPU)."""
    return "cpu" if device.startswith("sim:") else device


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory (any torch version), a cuBLAS/cuDNN allocation failure, or host MemoryError."""
    from .faults import is_alloc_failure
    if isinstance(exc, MemoryError) or is_alloc_failure(exc):
        return True
    try:
        import torch
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def host_status() -> dict:
    import psutil
    vm = psutil.virtual_memory()
    return {"total": int(vm.total), "available": int(vm.available), "cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)}
