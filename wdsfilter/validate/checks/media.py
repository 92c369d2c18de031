"""Images, member by member (videos: video.py).

Images: the size comes from the header (jpeg_header.jpeg_size, else images.image_size: nothing is
decoded) and goes through the stages' own size guard (images.check_size). By default a cheap end-of-data check then catches
files that were cut short (a JPEG without its end-of-image marker after the last scan, a PNG
without IEND, a WebP shorter than its RIFF size): the usual way images break in transfer. --deep
decodes every image instead, through images.decode_image exactly as the decode stage does.

A MediaInfo replaces the member's bytes before samples are grouped, so no image or video bytes
outlive the member checks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ...core.errors import DataError
from ...media.images import OversizedImage, check_size, decode_image, image_size
from ..findings import FindingLog
from .jpeg_header import jpeg_size

_BYTESIO = re.compile(r"<_io\.BytesIO object at 0x[0-9a-f]+>")


@dataclass
class MediaInfo:
    """What the checks learnt about one image or video member. Truthy, so the grouping step treats
    it like the non-empty member it stands for."""

    kind: str  # "image" or "video"
    drop: Optional[str] = None  # why the decode stage would drop the sample, or None
    width: int = 0
    height: int = 0


class ImageStats:
    def __init__(self):
        self.count = 0
        self.formats: dict = {}
        self.min_side = None
        self.max_side = 0
        self.pixels = 0

    def add(self, fmt: str, w: int, h: int) -> None:
        self.count += 1
        self.formats[fmt] = self.formats.get(fmt, 0) + 1
        lo, hi = min(w, h), max(w, h)
        self.min_side = lo if self.min_side is None else min(self.min_side, lo)
        self.max_side = max(self.max_side, hi)
        self.pixels += w * h

    def to_dict(self) -> dict:
        return {"count": self.count, "formats": dict(sorted(self.formats.items())), "min_side": self.min_side,
                "max_side": self.max_side if self.count else None, "mean_megapixels": round(self.pixels / self.count / 1e6, 4) if self.count else None}


def sniff(data: bytes) -> str:
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:4] in (b"GIF8",):
        return "GIF"
    return "other"


def _jpeg_scan_start(data: bytes) -> int:
    """Offset of the first start-of-scan marker, walking the header segments (a search could hit
    the scan of an EXIF thumbnail inside APP1); -1 if there is none."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return -1
        marker = data[i + 1]
        if marker == 0xDA:
            return i
        if marker == 0xFF:  # fill byte
            i += 1
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return -1


MARKED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF")  # the formats cut_short can read the end of


def cut_short(data: bytes, fmt: str, scan: Optional[int] = None) -> Optional[str]:
    """Why the image's data ends early, or None. Looks at markers only, decodes nothing. `scan`:
    the JPEG's start-of-scan offset when the caller has walked its header already."""
    if fmt == "JPEG":
        # Entropy-coded data escapes 0xFF, so an end-of-image marker after the first scan can only
        # be the real one; searched from the end, it is found at once in a complete file.
        sos = _jpeg_scan_start(data) if scan is None else scan
        if sos < 0:
            return "JPEG has no image data (no start-of-scan marker)"
        if data.rfind(b"\xff\xd9", sos) < 0:
            return "JPEG data is cut short (no end-of-image marker after the scan data)"
    elif fmt == "PNG":
        if data.rfind(b"IEND", max(0, len(data) - 4096)) < 0:
            return "PNG data is cut short (no IEND chunk at the end)"
    elif fmt == "WEBP":
        if 8 + int.from_bytes(data[4:8], "little") > len(data):
            return f"WebP data is cut short ({len(data)} bytes, its header says {8 + int.from_bytes(data[4:8], 'little')})"
    elif fmt == "GIF":
        if not data.rstrip(b"\0").endswith(b";"):
            return "GIF data is cut short (no trailer byte)"
    return None


def check_image(name: str, key: str, data: bytes, options, log: FindingLog, stats: ImageStats) -> MediaInfo:
    stage = options.stage
    header = jpeg_size(data)  # most images: the same size as PIL gives, for a fraction of the time
    scan = header[2] if header else None
    size = header and header[:2]
    if size is None:
        try:
            size = image_size(data)
        except DataError as e:
            log.add("corrupt_image", name, key, _reason(e))
            return MediaInfo("image", "corrupt_image")
        except Exception as e:  # PIL's own bomb check or anything hostile bytes can raise
            log.add("corrupt_image", name, key, f"image header unreadable: {type(e).__name__}: {e}")
            return MediaInfo("image", "corrupt_image")
    w, h = size
    fmt = sniff(data)
    stats.add(fmt, w, h)
    info = MediaInfo("image", None, w, h)
    problem = check_size((w, h), stage.max_pixels, stage.max_side)
    if problem and not _reduce_fits(stage, fmt, w, h):
        log.add("oversized_image", name, key, f"{problem} (from the header; never decoded)")
        info.drop = "oversized_image"
        return info
    if options.min_side and min(w, h) < options.min_side:
        log.add("undersized_image", name, key, f"{w}x{h} has a side under min_side={options.min_side}")
    if options.max_aspect and max(w, h) / max(min(w, h), 1) > options.max_aspect:
        log.add("extreme_aspect", name, key, f"{w}x{h} has aspect ratio {max(w, h) / max(min(w, h), 1):.1f} "
                                             f"> max_aspect={options.max_aspect}")
    # The quick check reads end markers; it can only suspect. A suspected image, and one in a
    # format with no end marker to read (BMP, PPM, TIFF: rare in web data), is decoded as the
    # decode stage would, so the verdict is the stages' (a GIF cut after its first frame decodes).
    suspect = None if options.deep else cut_short(data, fmt, scan)
    if options.deep or suspect or fmt not in MARKED_FORMATS:
        try:  # exactly what the decode stage does, size guard included
            decode_image(data, stage.max_pixels, stage.max_side, stage.oversize, stage.image_mode)
        except OversizedImage as e:
            log.add("oversized_image", name, key, _reason(e))
            info.drop = "oversized_image"
        except DataError as e:
            log.add("corrupt_image", name, key, (f"{suspect}: " if suspect else "") + _reason(e))
            info.drop = "corrupt_image"
        except Exception as e:
            log.add("corrupt_image", name, key, (f"{suspect}: " if suspect else "")
                    + f"image does not decode: {type(e).__name__}: {e}")
            info.drop = "corrupt_image"
    return info


def _reason(e: DataError) -> str:
    """The DataError's message without its reason prefix and PIL's in-memory file repr."""
    text = str(e)
    if text.startswith(e.reason + ": "):
        text = text[len(e.reason) + 2:]
    return _BYTESIO.sub("", text).replace("  ", " ").strip()


def _reduce_fits(stage, fmt: str, w: int, h: int) -> bool:
    """With oversize='reduce' the decode stage decodes JPEGs at down to 1/8 scale: no drop if that fits."""
    if stage.oversize != "reduce" or fmt != "JPEG":
        return False
    return check_size((-(-w // 8), -(-h // 8)), stage.max_pixels, stage.max_side) is None
