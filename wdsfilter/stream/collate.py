"""A batch of tuple samples, as webdataset's default_collation_fn (what open_clip's pipeline batches
with) makes it: tensors and arrays stacked per field, numbers as a numpy array, anything else a list.
Tensors are stacked by torch's default_collate, which in a DataLoader worker stacks straight into
shared memory: webdataset's torch.stack filled fresh memory that the worker then copied again into
shared memory to send the batch (a batch of 64 images of 224 px is 38 MB, written twice)."""
from __future__ import annotations

from typing import Sequence


def collate_tuples(samples: Sequence[tuple]) -> tuple:
    import webdataset as wds
    assert len({len(sample) for sample in samples}) == 1, "keys don't match in different samples"  # webdataset's words
    fields = list(zip(*samples))
    return tuple(_stack_tensors(field) if _is_tensor(field[0]) else wds.filters.combine_values(field)
                 for field in fields)


def _is_tensor(value) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _stack_tensors(field: tuple):
    import torch.utils.data
    shapes = {x.shape for x in field}
    assert len(shapes) == 1, f"all shapes must be equal in collation, got {shapes}"  # webdataset's words
    return torch.utils.data.default_collate(list(field))


def _torch():
    import sys
    return sys.modules.get("torch")  # a tensor exists only where torch was imported
