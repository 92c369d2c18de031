"""A batch of tuple samples, as webdataset's default_collation_fn (what open_clip's pipeline batches
with) makes it: tensors and arrays stacked per field, numbers as a numpy array, anything else a list.

The loader's own batches (no collate_fn) are made as the samples come (TupleBatch): each tensor
field of one shape and dtype (a transform's image, a tokenizer's tokens) is copied into its row of
the batch's tensor when its sample arrives, and the sample's tensor is freed at once. Stacking at
the end held the batch's samples and the stack together (2 x 38 MB for 64 images of 224 px), wrote
the stack from memory instead of the cache, and grew and shrank the heap every batch (page faults
the kernel zero-fills one by one). Where the batch's tensors live is BatchMemory's: shared memory in
a DataLoader worker (as torch's default_collate stacks there: sending the batch copies nothing),
memory faulted in beforehand by a helper thread in the training loop's process. A batch whose
samples do not all fit (shapes or dtypes that differ, tensors of another kind, a short last batch)
is collated by collate_tuples: mixed dtypes stacked by torch.stack, which promotes them, as
webdataset does."""
from __future__ import annotations

import math
import os
import sys
from typing import Callable, List, Optional, Sequence


def collate_tuples(samples: Sequence[tuple]) -> tuple:
    if len({len(sample) for sample in samples}) > 1:
        raise AssertionError("keys don't match in different samples")  # webdataset's words (also under -O)
    return tuple(_collate_field(field) for field in zip(*samples))


def _collate_field(field: Sequence):
    """One field of a batch's samples: tensors stacked, anything else as webdataset combines it."""
    import webdataset as wds
    return _stack_tensors(field) if _is_tensor(field[0]) else wds.filters.combine_values(field)


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only where torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def _stack_tensors(field: tuple):
    import torch.utils.data
    shapes = {x.shape for x in field}
    if len(shapes) > 1:
        raise AssertionError(f"all shapes must be equal in collation, got {shapes}")  # webdataset's words
    if len({x.dtype for x in field}) > 1:
        return torch.stack(list(field))
    return torch.utils.data.default_collate(list(field))


class Collated:
    """Batches of `size` samples as lists, collated when taken (a user's collate_fn, a dict output)."""

    def __init__(self, collate: Callable):
        self.collate = collate

    def __call__(self, size: int) -> "ListBatch":
        return ListBatch(self.collate)


class ListBatch:
    def __init__(self, collate: Callable):
        self.collate, self.samples = collate, []

    def add(self, sample) -> None:
        self.samples.append(sample)

    def __len__(self) -> int:
        return len(self.samples)

    def finish(self):
        return self.collate(self.samples)


class TupleBatches:
    """Batches of tuple samples made as they come (TupleBatch), in `memory`'s tensors; `collate`
    (collate_tuples, at the loop's thread count: CollateAtLoopThreads) for a batch that does not fit."""

    def __init__(self, collate: Callable, memory: "BatchMemory"):
        self.collate, self.memory = collate, memory

    def __call__(self, size: int) -> "TupleBatch":
        return TupleBatch(size, self.collate, self.memory)


class TupleBatch:
    """One batch of tuple samples (see the module docstring); finish() gives collate_tuples' result."""

    def __init__(self, size: int, collate: Callable, memory: "BatchMemory"):
        self.size, self.collate, self.memory = size, collate, memory
        self.rows: List[list] = []  # the samples, None where a value was copied into its row of `out`
        self.out: Optional[list] = None  # per field: the batch's tensor being filled, or None
        self.fits = True  # every sample so far was copied field by field

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, sample) -> None:
        row = list(sample)
        if self.out is None:
            self.out = [self.memory.empty(i, (self.size, *v.shape), v) if _copyable(v) else None
                        for i, v in enumerate(row)]
        if self.fits and not self._fits(row):
            self._unpack()
        if self.fits:
            n = len(self.rows)
            for i, out in enumerate(self.out):
                if out is not None:
                    out[n].copy_(row[i])
                    row[i] = None
        self.rows.append(row)

    def _fits(self, row: list) -> bool:
        if len(row) != len(self.out):
            return False
        return all(out is None or (_copyable(v) and v.shape == out.shape[1:] and v.dtype == out.dtype)
                   for v, out in zip(row, self.out))

    def _unpack(self) -> None:
        """From now on the samples are kept as they are: the ones copied get their rows back."""
        self.fits = False
        for j, row in enumerate(self.rows):
            for i, out in enumerate(self.out):
                if out is not None:
                    row[i] = out[j]

    def finish(self):
        if len(self.rows) < self.size and self.fits:
            self._unpack()  # a short last batch: stacked at its own size
        if not self.fits:
            return self.collate([tuple(row) for row in self.rows])
        return tuple(out if out is not None else _collate_field([row[i] for row in self.rows])
                     for i, out in enumerate(self.out))


def _copyable(value) -> bool:
    """A plain dense CPU tensor outside autograd: copied into a row of a batch tensor, it is what
    torch.stack would have made of it."""
    torch = sys.modules.get("torch")
    return (torch is not None and type(value) is torch.Tensor and value.layout == torch.strided
            and value.device.type == "cpu" and not value.requires_grad and not value.is_quantized)


class BatchMemory:
    """Where a batch's tensors are made (TupleBatch), for the reader `place` is:

    - a DataLoader worker: shared memory, as torch's default_collate makes it there;
    - the training loop's process, batches made under TrainingLoopState (`place.guarded`): memory
      a helper thread faulted in while the batch before was made. A new 38 MB tensor is 9,400 page
      faults the kernel zero-fills one by one (the allocator maps tensors that large afresh each
      time); meanwhile the samples are made at one torch thread, so the loop's other cores are
      free. The thread allocates and touches memory only: it draws no random number. At most one
      batch's tensors wait ready (one per field);
    - anywhere else: torch.empty."""

    def __init__(self, place):
        self.place = place
        self._ready: dict = {}  # field -> ((shape, dtype), future of its faulted-in tensor)
        self._pool = None
        self._pid = 0

    def __getstate__(self):
        return {"place": self.place}  # the helper thread and what it prepared stay in this process

    def __setstate__(self, state):
        self.__init__(state["place"])

    def empty(self, field: int, shape: tuple, like):
        """A tensor of `shape` and `like`'s dtype for field `field` of a batch."""
        import torch
        if self.place.in_worker:
            storage = like._typed_storage()._new_shared(math.prod(shape), device=like.device)
            return like.new(storage).resize_(*shape)
        if not self.place.guarded:
            return torch.empty(shape, dtype=like.dtype)
        if self._pid != os.getpid():  # a forked child has no helper thread
            from concurrent.futures import ThreadPoolExecutor
            self._pool, self._ready, self._pid = ThreadPoolExecutor(1, thread_name_prefix="wdsfilter-batch-memory"), {}, os.getpid()
        spec = (shape, like.dtype)
        ready = self._ready.pop(field, None)
        try:
            self._ready[field] = (spec, self._pool.submit(_faulted_in, shape, like.dtype))
        except RuntimeError:  # thread pools are shut down once the main thread ends: no helper any more
            pass
        if ready is not None and ready[0] == spec:
            return ready[1].result()
        return torch.empty(shape, dtype=like.dtype)


def _faulted_in(shape: tuple, dtype):
    """An uninitialised tensor whose pages are mapped: one element written in each 4 KiB page."""
    import torch
    out = torch.empty(shape, dtype=dtype)
    if out.numel():
        out.view(-1)[::max(1, 4096 // out.element_size())] = 0
    return out
