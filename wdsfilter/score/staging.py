"""Host-to-device copies of a batch: pinned staging buffers and non_blocking copies on CUDA, a
plain concatenation on a CPU.

A copy from pageable memory makes the CUDA driver stage it through its own pinned buffer first
and blocks the host until it is done; from page-locked (pinned) memory the copy is one DMA that
can overlap with the host's work (non_blocking=True). Pinning is expensive (cudaHostAlloc, ~ms
per MB), so a Staging keeps one buffer per dtype and grows it, never allocating per batch.

A buffer is refilled only after the copy that last read it has finished (a CUDA event per
buffer), so a batch retried after an out-of-memory error cannot overwrite pixels in flight.

    staging = Staging.for_device("cuda:0")         # pin=True, non_blocking=True
    images = staging.to_device([t1, t2], "cuda:0")  # one cat into the pinned buffer, one copy
"""
from __future__ import annotations

from typing import Dict, List


class Staging:
    def __init__(self, pin: bool, non_blocking: bool, reuse: bool = None):
        """reuse (default: pin): gather batches into the kept buffer; without pinning that is only
        useful to test this path on a machine without a GPU."""
        self.pin = pin
        self.non_blocking = non_blocking
        self.reuse = pin if reuse is None else reuse
        self._buffers: Dict[object, object] = {}  # dtype -> flat tensor
        self._copied: Dict[object, object] = {}   # dtype -> CUDA event recorded after its last copy

    @classmethod
    def for_device(cls, device) -> "Staging":
        """Pinned buffers and asynchronous copies for CUDA devices only: on a CPU the batch is
        already where the model is, and pinned memory would only cost."""
        kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
        cuda = kind == "cuda"
        return cls(pin=cuda, non_blocking=cuda)

    def buffer(self, dtype, numel: int):
        """A flat host buffer of at least `numel` elements (grown by doubling, kept for reuse)."""
        import torch
        event = self._copied.pop(dtype, None)
        if event is not None:
            event.synchronize()
        buf = self._buffers.get(dtype)
        if buf is None or buf.numel() < numel:
            size = max(numel, 2 * buf.numel() if buf is not None else 0)
            buf = torch.empty(size, dtype=dtype, pin_memory=self.pin)
            self._buffers[dtype] = buf
        return buf[:numel]

    def to_device(self, tensors: List, device, dim: int = 0):
        """torch.cat(tensors, dim) on `device`: on CUDA through the pinned buffer, copied with
        non_blocking; on a CPU the plain concatenation (no extra copy)."""
        import torch
        if not self.reuse:
            return torch.cat(tensors, dim).to(device)
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        numel = 1
        for n in shape:
            numel *= n
        host = self.buffer(tensors[0].dtype, numel).view(shape)
        torch.cat(tensors, dim, out=host)
        out = host.to(device, non_blocking=self.non_blocking)
        if self.non_blocking:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(out.device))
            self._copied[tensors[0].dtype] = event
        return out

    def release(self) -> None:
        for event in self._copied.values():
            event.synchronize()
        self._copied.clear()
        self._buffers.clear()
