"""A batch of tuple samples, as webdataset's default_collation_fn (what open_clip's pipeline batches
with) makes it: tensors and arrays stacked per field, numbers as a numpy array, anything else a list.
Tensors of one dtype are stacked by torch's default_collate, which in a DataLoader worker stacks
straight into shared memory: webdataset's torch.stack filled fresh memory that the worker then
copied again into shared memory to send the batch (a batch of 64 images of 224 px is 38 MB, written
twice). Mixed dtypes are stacked by torch.stack, which promotes them, as webdataset does."""
from __future__ import annotations

import sys
from typing import Sequence


def collate_tuples(samples: Sequence[tuple]) -> tuple:
    import webdataset as wds
    if len({len(sample) for sample in samples}) > 1:
        raise AssertionError("keys don't match in different samples")  # webdataset's words (also under -O)
    return tuple(_stack_tensors(field) if _is_tensor(field[0]) else wds.filters.combine_values(field)
                 for field in zip(*samples))


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
