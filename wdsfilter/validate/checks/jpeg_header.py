"""JPEG dimensions straight from the header segments, for the validator's hot path.

PIL's Image.open costs several times what this walk does, and most images of a web-scale set are
JPEGs. The walk accepts only headers on which PIL's JPEG opener (Pillow 9-13) cannot fail and
gives the same size: segments back to back up to the first scan, one 8-bit frame of 1, 3 or 4
components, well-formed quantization tables. Anything else (fill bytes, junk between segments,
an MPO index, a short ICC segment, 12-bit data, a second frame, ...) returns None and the image
goes through PIL as the stages' size guard does (images.image_size).
"""
from __future__ import annotations

from typing import Optional, Tuple

_FRAMES = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# Segments PIL skips or reads without failing: APP0-APP15 (but see MPF/ICC below), DHT, DAC, DRI, COM.
_PLAIN = frozenset(range(0xE0, 0xF0)) | {0xC4, 0xCC, 0xDD, 0xFE}


def _tables_ok(body: bytes) -> bool:
    """DQT: whole tables of 1 + 64 or 1 + 128 bytes (PIL raises on a short one)."""
    j, n = 0, len(body)
    while j < n:
        j += 1 + (64 if body[j] < 16 else 128)
    return j == n


def jpeg_size(data: bytes) -> Optional[Tuple[int, int, int]]:
    """(width, height, offset of the start-of-scan marker), or None when PIL must look."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    size = None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xDA:
            return size and (size[0], size[1], i)
        end = i + 2 + ((data[i + 2] << 8) | data[i + 3])
        if end > n or end < i + 4:
            return None
        body = data[i + 4:end] if marker in _FRAMES or marker in (0xDB, 0xE2) else b""
        if marker in _FRAMES:
            if size is not None or len(body) < 6 or body[0] != 8 or body[5] not in (1, 3, 4):
                return None
            w, h = (body[3] << 8) | body[4], (body[1] << 8) | body[2]
            if not w or not h:
                return None
            size = (w, h)
        elif marker == 0xDB:
            if not _tables_ok(body):
                return None
        elif marker == 0xE2 and (body.startswith(b"MPF\0") or (body.startswith(b"ICC_PROFILE\0") and len(body) < 14)):
            return None
        elif marker not in _PLAIN:
            return None
        i = end
    return None
