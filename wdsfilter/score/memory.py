"""Memory of the devices a model runs on, behind one small interface.

The planner and the OOM back-off only talk to a DeviceMemory, so the CUDA logic is exercised in
tests on a simulated GPU (tests/devicekit.py registers the "sim:NAME" devices: N bytes; a test
scorer "allocates" per sample and gets a real torch.cuda.OutOfMemoryError when it does not fit),
and the host is measured for real with psutil.

    CudaMemory      torch.cuda.mem_get_info / memory_allocated / max_memory_allocated
    HostMemory      psutil (available RAM) and this process's RSS and peak RSS (VmHWM)
"""
from __future__ import annotations

import abc
import gc
import os
import threading
from typing import Callable, Dict, Optional
from .faults import is_alloc_failure

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


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def prefer_expandable_segments() -> None:
    """Model processes use PyTorch's expandable segments unless the user configured the allocator:
    batches of changing sizes (back-off, OCR frames of other sizes, CLIP and OCR in one process)
    otherwise leave reserved blocks that no later request fits, and the card fills beyond what the
    planner measured. Read when CUDA initialises, so this runs first in every model process."""
    if not any(os.environ.get(name) for name in (ALLOC_CONF, "PYTORCH_ALLOC_CONF")):
        os.environ[ALLOC_CONF] = "expandable_segments:True"


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
        # What the card holds for this process is the allocator's reserve, not only what tensors
        # use: on an H100 (gpu_check step 2) the workers held 16-31% more than the allocated peaks
        # the plan was built from. The larger of the two is what must fit.
        import torch
        return int(max(torch.cuda.max_memory_allocated(self.index), torch.cuda.max_memory_reserved(self.index)))

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


# Device kinds besides cpu and cuda[:N], by prefix: "PREFIX:NAME" -> factory(NAME) -> DeviceMemory.
# The tests register "sim" (tests/devicekit.py: a GPU of N bytes that computes on the CPU), so
# the planner's and the back-off's CUDA paths run without a GPU. Such a device's model computes on
# the CPU; its DeviceMemory must pickle to a call that registers it again, because a spawned model
# worker receives it pickled (modelworker.ProcessPool).
DEVICE_KINDS: Dict[str, Callable[[str], DeviceMemory]] = {}


def register_device_kind(prefix: str, factory: Callable[[str], DeviceMemory]) -> None:
    DEVICE_KINDS[prefix] = factory


def registered_device(device: str) -> Optional[DeviceMemory]:
    """The DeviceMemory of a "PREFIX:NAME" device of a registered kind, else None."""
    prefix, sep, name = device.partition(":")
    return DEVICE_KINDS[prefix](name) if sep and prefix in DEVICE_KINDS else None


def device_memory(device: str) -> DeviceMemory:
    """The DeviceMemory of a model device string: cpu, cuda, cuda:N, or a registered kind's."""
    if device == "cpu":
        return HostMemory()
    if device.startswith("cuda"):
        return CudaMemory(int(device.split(":")[1]) if ":" in device else 0)
    memory = registered_device(device)
    if memory is None:
        raise ValueError(f"unknown device {device!r}")
    return memory


def torch_device(device: str) -> str:
    """The torch device a scorer loads on (a registered kind's device computes on the CPU)."""
    return "cpu" if device.partition(":")[0] in DEVICE_KINDS else device


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory (any torch version), a cuBLAS/cuDNN allocation failure, or host MemoryError."""
    if isinstance(exc, MemoryError) or is_alloc_failure(exc):
        return True
    try:
        import torch
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower():
        return True
    # On the CPU: torch's allocator ("DefaultCPUAllocator: can't allocate memory", a RuntimeError
    # without "out of memory": a CRAFT batch over the host's limit) and onnxruntime's ("Failed to
    # allocate memory for requested buffer", its own RuntimeException class).
    return any(s in str(exc) for s in CPU_ALLOC_FAILED) and isinstance(exc, Exception)


CPU_ALLOC_FAILED = ("DefaultCPUAllocator: can't allocate memory", "Failed to allocate memory")


def host_status() -> dict:
    import psutil
    vm = psutil.virtual_memory()
    return {"total": int(vm.total), "available": int(vm.available), "cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
            "rss": int(psutil.Process().memory_info().rss)}  # this process's: the planner counts it
