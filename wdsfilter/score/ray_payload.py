"""A row's prepared inputs as Ray Data columns (the Ray runner's counterpart of transport.py).

A row's prepared inputs cross from its read task to a model actor as two columns: PAYLOAD, every
array of the row (numpy arrays, CPU tensors: pixels, tokens, OCR frames) copied once into one
uint8 vector, which Ray stores as an Arrow tensor column (no pickling of the pixels; in the
actor the arrays are views of one writable copy of the vector); and PAYLOAD_META, the small
rest pickled: the structure with a Slot in each array's place, and the prepare() errors.
"""
from __future__ import annotations

import pickle
from typing import List, NamedTuple, Tuple

import numpy as np

from .transport import walk_leaves

PAYLOAD, PAYLOAD_META = "payload", "payload_meta"
_ALIGN = 16  # every array starts on a 16-byte boundary of its row's vector (rows are padded to it)
EMPTY = np.zeros(0, np.uint8)  # PAYLOAD of a row with nothing to score: same dtype and ndim, so one tensor column


class Slot(NamedTuple):
    offset: int
    dtype: str  # numpy dtype string
    shape: Tuple[int, ...]
    torch: bool  # give it back as a torch tensor


def pack_payload(obj) -> Tuple[np.ndarray, bytes]:
    """(uint8 vector of every array in obj, pickled structure with Slots); arrays Ray or numpy
    cannot view as bytes (object arrays, bfloat16 tensors) stay in the pickled part."""
    arrays: List[Tuple[int, np.ndarray]] = []
    total = 0

    def take(x):
        nonlocal total
        is_torch = type(x).__module__.startswith("torch") and hasattr(x, "numpy")
        try:
            if is_torch:
                a = np.ascontiguousarray(x.detach().cpu().numpy())
            elif isinstance(x, np.ndarray) and x.dtype != object:
                a = np.ascontiguousarray(x)
            else:
                return x
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): pickled with the rest
            return x
        slot = Slot(total, a.dtype.str, tuple(a.shape), is_torch)
        arrays.append((total, a))
        total += -(-a.nbytes // _ALIGN) * _ALIGN
        return slot

    skeleton = walk_leaves(obj, take, Slot)
    data = np.empty(total, np.uint8)
    for offset, a in arrays:
        data[offset:offset + a.nbytes] = a.reshape(-1).view(np.uint8)
    return data, pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_payload(data, meta: bytes):
    """What pack_payload was given; its arrays are views of one writable copy of `data`."""
    skeleton = pickle.loads(meta)
    buf = np.array(data, dtype=np.uint8, copy=True) if data is not None else np.zeros(0, np.uint8)

    def put(x):
        if not isinstance(x, Slot):
            return x
        dtype = np.dtype(x.dtype)
        n = int(np.prod(x.shape, dtype=np.int64)) * dtype.itemsize
        a = buf[x.offset:x.offset + n].view(dtype).reshape(x.shape)
        if x.torch:
            import torch
            return torch.from_numpy(a)
        return a

    return walk_leaves(skeleton, put, Slot)

