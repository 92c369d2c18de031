"""Content hashes of images, the one implementation of each: the hash scorer (score/scorers/hash.py)
writes them in the scoring pass and `wdsfilter dedup --eval` computes them for eval images.

* sha256: of the image member's bytes as the shard holds them (an exact, byte-for-byte copy);
* phash: imagehash's perceptual hash (DCT of the 32x32 LANCZOS-reduced luma, the 8x8 lowest
  frequencies against their median: 64 bits), stored in score files as the 16 hex digits imagehash
  prints (`str(imagehash.phash(img))`), a text every reader keeps exactly: pandas turns an int64
  column with nulls into float64 and loses bits (issue 35 item 11); polars, duckdb and pyarrow
  read the text as it is. `imagehash.hex_to_hash(v)` is the library's object. In memory (dedup,
  majority) a hash is an int: `phash()` gives it signed (int64), `phash_int()` reads a stored
  value back (the hex text, or the signed int64 runs before this stored), `phash_hex()` writes it.
  Written with imagehash itself: a numpy DCT gave the same bits and was not measurably faster
  (6.9 vs 7.1 ms on a 1024 px photo; 97% of the time is Pillow's LANCZOS resize).
"""
from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np
from ..core.errors import require

INSTALL = "pip install 'wdsfilter[dedup]' (or imagehash)"
_SIGN = 1 << 63


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def phash(image) -> int:
    """imagehash.phash of a PIL image, as a signed int64 (see the module docstring)."""
    imagehash = require("imagehash", "the perceptual hash (phash)", INSTALL)
    bits = imagehash.phash(image).hash.ravel()
    return _signed(int.from_bytes(np.packbits(bits).tobytes(), "big"))


def majority(hashes: Iterable[int]) -> int:
    """Bitwise majority of several hashes (a video's frames; ties give 1): the frame-reduced hash,
    so a clip is one 64-bit hash that near-dedup compares like an image's."""
    values = np.array([_unsigned(phash_int(h)) for h in hashes], dtype=np.uint64)
    bits = np.unpackbits(values.astype(">u8").view(np.uint8).reshape(len(values), 8), axis=1)
    voted = (2 * bits.sum(axis=0) >= len(values)).astype(np.uint8)
    return _signed(int.from_bytes(np.packbits(voted).tobytes(), "big"))


def phash_hex(value) -> str:
    """The 16 hex digits imagehash prints for this hash (an int, or already its hex text)."""
    return format(_unsigned(phash_int(value)), "016x")


def phash_int(value) -> int:
    """A hash as a signed int64: from the hex text score files hold, or an int (older runs' int64)."""
    if isinstance(value, str):
        return _signed(int(value, 16))
    return _signed(_unsigned(value))


def hamming(a, b) -> int:
    """Bits that differ between two hashes (ints or hex texts)."""
    return bin(_unsigned(phash_int(a)) ^ _unsigned(phash_int(b))).count("1")


def _signed(u: int) -> int:
    return u - (1 << 64) if u & _SIGN else u


def _unsigned(v: int) -> int:
    return int(v) & ((1 << 64) - 1)
