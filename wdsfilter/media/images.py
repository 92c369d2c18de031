"""Image size from the header, and decoding behind the size guard.

A 30000x30000 PNG can be ~100 KB on disk: the size must be checked before any pixel is decoded.
PIL's `Image.open` is lazy (it parses the header only), so the guard costs one header parse.
"""
from __future__ import annotations

import io
import warnings
from typing import Optional, Tuple

from PIL import Image

from ..core.errors import DataError

# Our guard replaces PIL's global bomb check, which would raise before we can count the sample;
# it is restored to a finite bound inside decode_image as a second line of defence.
_PIL_BOMB_LIMIT = None


class OversizedImage(DataError):
    pass


def image_size(data: bytes) -> Tuple[int, int]:
    """(width, height) from the header only. Raises DataError('corrupt_image') if unreadable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(data) as img:
                return img.size
    except (Image.DecompressionBombError, DataError):
        raise
    except Exception as e:
        raise DataError("corrupt_image", f"image header unreadable: {e}") from None


# Content Pillow would open (it goes by content, under any member name) but that is not read:
# - ICO: its plugin decodes the icon's largest image while opening it (IcoImageFile._open calls
#   load()), before any size is known: a 109 KB .ico embedding a 30000x30000 PNG took 900 MB just
#   to read its "header";
# - EPS (PostScript, plain or in its DOS binary wrapper): decoding runs Ghostscript, where it is
#   installed, on the shard's bytes: a program interpreting untrusted input.
# The magic numbers are the ones Pillow's own _accept functions test.
_REFUSED = (
    (b"\0\0\1\0", "an ICO icon file: Pillow decodes its largest image while opening it, before any size check"),
    (b"%!PS", "a PostScript (EPS) file: decoding it would run Ghostscript on the shard's bytes"),
    (b"\xc5\xd0\xd3\xc6", "a PostScript (EPS) file: decoding it would run Ghostscript on the shard's bytes"),
)


def open_image(data: bytes) -> Image.Image:
    """Pillow's lazy open (the header only), for content it may read; every image wdsfilter reads
    (the decode stage, the validator, the report's thumbnails) is opened here."""
    for magic, what in _REFUSED:
        if data.startswith(magic):
            raise DataError("corrupt_image", f"{what}, so it is not read; store images as JPEG, PNG or WebP")
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = _PIL_BOMB_LIMIT  # we do the size check ourselves, from the header
    try:
        return Image.open(io.BytesIO(data))
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def check_size(size: Tuple[int, int], max_pixels: Optional[int], max_side: Optional[int]) -> Optional[str]:
    """A reason string when the size is over the limits, else None."""
    w, h = size
    if max_pixels and w * h > max_pixels:
        return f"{w}x{h} = {w * h / 1e6:.1f} MP is over max_pixels={max_pixels / 1e6:.1f} MP"
    if max_side and max(w, h) > max_side:
        return f"{w}x{h} has a side over max_side={max_side}"
    return None


# Key in a decoded image's `info` holding its (width, height) before a reduced-scale decode.
FULL_SIZE = "wdsfilter_full_size"
# Key in an image's `info` when only its header was read (StageConfig.defer_jpeg): a JPEG within
# the size guard whose pixels a consumer decodes itself, from the member's bytes.
DEFERRED = "wdsfilter_deferred"


def is_jpeg(data: bytes) -> bool:
    """A JPEG by its first bytes (SOI and a marker), whatever the member's extension says."""
    return data[:3] == b"\xff\xd8\xff"


def deferred_jpeg(data: bytes, max_pixels: Optional[int], max_side: Optional[int]) -> Optional[Image.Image]:
    """The JPEG's header as an unloaded image marked DEFERRED, when it is a JPEG whose header reads
    and whose size is within the guard; None otherwise (the image is decoded the usual way, which
    says what is wrong with it)."""
    if not is_jpeg(data):
        return None
    try:
        img = open_image(data)
    except Exception:  # noqa: BLE001 - decode_image names what is wrong
        return None
    if img.format != "JPEG" or check_size(img.size, max_pixels, max_side):
        return None
    img.info[DEFERRED] = True
    return img


def decode_image(data: bytes, max_pixels: Optional[int], max_side: Optional[int] = None,
                 oversize: str = "skip", mode: str = "RGB", floor: Optional[Tuple[int, int]] = None) -> Image.Image:
    """Decode behind the guard. Raises DataError('oversized_image' | 'corrupt_image').
    floor: (short side, long side) the consumer needs (a scorer whose model input is smaller than
    the image); a larger JPEG is decoded at the smallest DCT scale that keeps both, and its full
    size is kept in img.info[FULL_SIZE]."""
    try:
        img = open_image(data)
    except DataError:
        raise
    except Exception as e:
        raise DataError("corrupt_image", f"image header unreadable: {e}") from None
    full = img.size
    problem = check_size(full, max_pixels, max_side)
    if problem:
        if oversize == "reduce" and img.format == "JPEG":
            # JPEG draft mode decodes at 1/2, 1/4 or 1/8 scale straight from the DCT data.
            target = _draft_target(img.size, max_pixels, max_side)
            if target:
                img.draft(mode, target)
                img.info[FULL_SIZE] = full
            if check_size(img.size, max_pixels, max_side):
                raise OversizedImage("oversized_image", problem + " (even at 1/8 scale)")
        else:
            hint = "" if oversize == "reduce" else "; oversize='reduce' decodes JPEGs at reduced scale"
            raise OversizedImage("oversized_image", problem + hint)
    elif floor and img.format == "JPEG":
        scale = draft_scale(full, floor)
        if scale > 1:
            img.draft(mode, (full[0] // scale, full[1] // scale))
            img.info[FULL_SIZE] = full
    try:
        img.load()
        return img.convert(mode) if mode and img.mode != mode else img
    except Exception as e:
        raise DataError("corrupt_image", f"image does not decode: {type(e).__name__}: {e}") from None


def _draft_target(size: Tuple[int, int], max_pixels: Optional[int], max_side: Optional[int]):
    """The size to request from JPEG draft mode: the mildest of its 1/2, 1/4, 1/8 scales that fits.
    (draft picks the largest scale whose result is still at least the requested size.)"""
    w, h = size
    for scale in (2, 4, 8):
        sw, sh = -(-w // scale), -(-h // scale)
        if not check_size((sw, sh), max_pixels, max_side):
            return sw, sh
    return None


def draft_scale(size: Tuple[int, int], floor: Optional[Tuple[int, int]]) -> int:
    """The largest JPEG DCT scale denominator (8, 4, 2, or 1: none) whose decoded image keeps its
    short side >= floor[0] and its long side >= floor[1] (libjpeg rounds scaled sizes up)."""
    if not floor:
        return 1
    short, long = min(size), max(size)
    for scale in (8, 4, 2):
        if -(-short // scale) >= floor[0] and -(-long // scale) >= floor[1]:
            return scale
    return 1
