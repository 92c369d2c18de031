"""Compressed shards (.tar.gz, .tar.bz2, .tar.xz): which compression a shard has, from its first
bytes, and its tar stream decompressed behind max_decompressed_bytes, so that a zip bomb stops
at the cap as a damaged shard instead of filling memory or disk. The tar readers (reading.py,
validate/tar_reader.py) read through open_layers; the shard writer keeps a shard's compression.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
from typing import Optional

_CHUNK = 1 << 20  # what a read of "everything" asks the decompressor for at a time


class DecompressionCapError(tarfile.ReadError):
    """A compressed shard decompresses past max_decompressed_bytes (a zip bomb, or a mistake).
    Bad data in a file that was read, not a failed stream: a ReadError, never an OSError."""


class _Capped:
    """The decompressed stream of a compressed shard, counting what it gives."""

    def __init__(self, f, cap: int, kind: str):
        self.f, self.cap, self.kind, self.n = f, cap, kind, 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size if size >= 0 else _CHUNK)
        self.n += len(data)
        if self.n > self.cap:
            raise DecompressionCapError(f"the {self.kind} shard decompresses past max_decompressed_bytes="
                                        f"{self.cap:,}; members after that point are not read")
        return data


class _Replay:
    """A stream whose first bytes were read to sniff its compression, given back first."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def read(self, size: int = -1) -> bytes:
        if self.head:
            data = self.head if size < 0 or size >= len(self.head) else self.head[:size]
            self.head = self.head[len(data):]
            return data
        return self.f.read(size)


_LAYERS = ((b"\x1f\x8b", "gzip", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
           (b"BZh", "bz2", lambda f: bz2.BZ2File(f, "rb")), (b"\xfd7zXZ\x00", "xz", lambda f: lzma.LZMAFile(f, "rb")))


def compression(head: bytes) -> Optional[str]:
    """"gzip", "bz2" or "xz" from a shard's first 6 bytes; None for a plain tar."""
    return next((kind for magic, kind, _ in _LAYERS if head.startswith(magic)), None)


def open_layers(stream, cap: int):
    """The tar stream inside `stream`: a compressed shard (.tar.gz, bz2, xz) is decompressed here,
    behind the cap on decompressed bytes; a plain one is passed through untouched."""
    if hasattr(stream, "peek"):
        head = stream.peek(6)[:6]
    else:
        head = stream.read(6)
        stream = _Replay(head, stream)
    kind = compression(head)
    if kind is None:
        return stream
    return _Capped(next(opener for _, k, opener in _LAYERS if k == kind)(stream), cap, kind)
