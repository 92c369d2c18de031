"""Size columns: an image's width, height, smallest side and aspect ratio from its header, and a
video's duration, frame rate and frame count from its container; nothing is decoded.

    wdsfilter score SHARDS --scorer size --out OUT
    wdsfilter filter OUT --min min_side=200 --max aspect_ratio=3        # DataComp's basic image rule

Images: the header as the validator reads it (validate/checks/jpeg_header.jpeg_size for most
JPEGs, else images.image_size: Pillow's lazy open), or, where another scorer of the run had the
image decoded, its full size (a JPEG decoded at reduced scale keeps it: images.FULL_SIZE). The
stored image is measured: DataComp's basic filter reads `original_width`/`original_height` from
its metadata, the size before img2dataset resized it; the two agree where the images were not
resized. Videos: the stored frame size of the first video stream and frames.video_info's
duration, frame rate and frame count (its packets demuxed); a clip whose data ends before its
header says is a `partial` row, as the other scorers mark it. Images have no duration, frame
rate or frame count (null).

aspect_ratio is the long side over the short side (>= 1, DataComp's definition), so one bound
drops both panoramas and towers.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ...stream.config import StageConfig
from ...core.errors import DataError
from ...media.images import FULL_SIZE, image_size
from .base import Noted, Scorer
from ...validate.checks.jpeg_header import jpeg_size
from ...media.frames import video_info

COLUMNS = ("width", "height", "min_side", "aspect_ratio", "duration", "fps", "frame_count")


def header_size(image) -> tuple:
    """(width, height) of sample["image"]: the member's bytes (the header only) or a decoded
    image (its size before a reduced-scale decode)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        found = jpeg_size(bytes(image))
        return found[:2] if found else image_size(bytes(image))
    return tuple(getattr(image, "info", {}).get(FULL_SIZE) or image.size)


class SizeScorer(Scorer):
    name = "size"
    media = ("image", "video")
    image_pixels = False  # the header is enough

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        return list(COLUMNS)

    def __init__(self, config: Optional[StageConfig] = None):
        """config: the run's stage config, for its max_pixels (videos are opened by its rule)."""
        self.max_pixels = (config or StageConfig()).max_pixels

    def columns(self) -> List[str]:
        return list(COLUMNS)

    def column_types(self) -> Dict[str, str]:
        return {"width": "int64", "height": "int64", "min_side": "int64", "aspect_ratio": "float64",
                "duration": "float64", "fps": "float64", "frame_count": "int64"}

    def decode_floor(self):
        return (0, 0)  # reads no pixels

    def prepare(self, sample: Dict[str, Any]) -> Any:
        image = sample.get("image")
        if image is not None:
            return _row(*header_size(image))
        video = sample.get("video")
        if video is None:
            raise DataError("missing_image", "the size scorer needs an image or a video (this sample has neither)")
        key, url = sample.get("__key__", "?"), sample.get("__url__", "")
        what = f"sample {key}.{sample.get('__media_ext__', 'video')}" + (f" of shard {url}" if url else "")
        info = video_info(video, self.max_pixels, what)
        row = _row(info.width, info.height, info.duration, info.fps, info.frames)
        return Noted(row, "corrupt_video", info.partial) if info.partial else row

    def load(self, device: str) -> None:
        """No model: prepare() did the work."""

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        return [dict(x) for x in inputs]

    def describe(self) -> str:
        return "size: image headers, video containers (CPU, decode workers; nothing decoded)"


def _row(width: int, height: int, duration: Optional[float] = None, fps: Optional[float] = None,
         frames: Optional[int] = None) -> Dict[str, Any]:
    short, long = min(width, height), max(width, height)
    return {"width": int(width), "height": int(height), "min_side": int(short),
            "aspect_ratio": long / short if short else None, "duration": duration, "fps": fps,
            "frame_count": frames}
