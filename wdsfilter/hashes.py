"""Content hashes of images, the one implementation of each: the hash scorer (score/scorers/hash.py)
writes them in the scoring pass and `wdsfilter dedup --eval` computes them for eval images.

* sha256: of the image member's bytes as the shard holds them (an exact, byte-for-byte copy);
* phash: imagehash's perceptual hash (DCT of the 32x32 LANCZOS-reduced luma, the 8x8 lowest
  frequencies against their median: 64 bits), stored as a signed int64 whose bits are imagehash's
  hex string (`phash_hex`), so `imagehash.hex_to_hash(phash_hex(v))` is the library's object.
  Written with imagehash itself: a numpy DCT gave the same bits and was not measurably faster
  (6.9 vs 7.1 ms on a 1024 px photo; 97% of the time is Pillow's LANCZOS resize).
"""
from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

INSTALL = "pip install 'wdsfilter[dedup]' (or imagehash)"
_SIGN = 1 << 63


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def phash(image) -> int:
    """imagehash.phash of a PIL image, as a signed int64 (see the module docstring)."""
    from .errors import require
    imagehash = require("imagehash", "the perceptual hash (phash)", INSTALL)
    bits = imagehash.phash(image).hash.ravel()
    return _signed(int.from_bytes(np.packbits(bits).tobytes(), "big"))


def majority(hashes: Iterable[int]) -> int:
    """Bitwise majority of several hashes (a video's frames; ties give 1): the frame-reduced hash,
    so a clip is one 64-bit hash that near-dedup compares like an image's."""
    values = np.array([_unsigned(h) for h in hashes], dtype=np.uint64)
    bits = np.unpackbits(values.astype(">u8").view(np.uint8).reshape(len(values), 8), axis=1)
    voted = (2 * bits.sum(axis=0) >= len(values)).astype(np.uint8)
    return _signed(int.from_bytes(np.packbits(voted).tobytes(), "big"))


def phash_hex(value: int) -> str:
    """The 16 hex digits imagehash prints for this hash."""
    return format(_unsigned(value), "016x")


def hamming(a: int, b: int) -> int:
    return bin(_unsigned(a) ^ _unsigned(b)).count("1")


def _signed(u: int) -> int:
    return u - (1 << 64) if u & _SIGN else u


def _unsigned(v: int) -> int:
    return int(v) & ((1 << 64) - 1)
