"""A row's prepared inputs as table columns (an engine that moves rows as tables: Ray Data), in
the local engine's encoding (transport.py).

A row's prepared inputs cross from its read task to a model worker as two columns: PAYLOAD, every
array of the row (numpy arrays, CPU tensors: pixels, tokens, OCR frames) copied once into one
uint8 vector (transport.pack into a plain buffer), which Ray stores as an Arrow tensor column, so
the pixels are not pickled; in the model worker the arrays are views of one writable copy of the
vector (transport.unpack). PAYLOAD_META is the small rest, pickled: the structure with a TensorSlot in
each array's place, and the prepare() errors.
"""
from __future__ import annotations

import pickle
from typing import Tuple

import numpy as np

from .transport import Packed, pack, unpack

PAYLOAD, PAYLOAD_META = "payload", "payload_meta"
EMPTY = np.zeros(0, np.uint8)  # PAYLOAD of a row with nothing to score: same dtype and ndim, so one tensor column


def _plain_buffer(nbytes: int):
    import torch
    return torch.empty(nbytes, dtype=torch.uint8)


def pack_payload(obj) -> Tuple[np.ndarray, bytes]:
    """(uint8 vector of every array in obj, pickled structure with TensorSlots)."""
    packed = pack(obj, allocate=_plain_buffer)
    data = EMPTY if packed.buffer is None else packed.buffer.numpy()
    return data, pickle.dumps(packed.data, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_payload(data, meta: bytes):
    """What pack_payload was given; its arrays are views of one writable copy of `data`."""
    skeleton = pickle.loads(meta)
    if data is None or len(data) == 0:
        return skeleton
    import torch
    buffer = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))
    return unpack(Packed(skeleton, buffer))
