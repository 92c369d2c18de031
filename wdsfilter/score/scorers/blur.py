"""Blur: the variance of the Laplacian of the grey image at a fixed scale (column `sharpness`:
low is blurry), the focus measure of Pech-Pacheco et al. (ICPR 2000) that NeMo Curator's and
most dataset pipelines' blur filters use.

    wdsfilter score SHARDS --scorer blur --out OUT
    wdsfilter filter OUT --min sharpness=100

The fixed scale: the image in grey (Pillow's "L", ITU-R 601 luma, 0-255) resized so its short
side is SIDE = 256 pixels, the scale a 224-256 px model sees, with Pillow's antialiased bilinear
filter; a long side past 4 x SIDE is cut to its middle 1024 pixels (panoramas cost no more).
Measured at the image's own resolution the same photo gives a variance many times higher when
stored at twice the size (fine detail per pixel), so a threshold would mean nothing across a
dataset of mixed sizes; at one scale it measures what the model will see. An image smaller than
SIDE is enlarged, which smooths it: at the model's scale it is blurry.

The Laplacian is the 4-neighbour kernel [[0, 1, 0], [1, -4, 1], [0, 1, 0]] (OpenCV's
`cv2.Laplacian` with ksize=1) over the interior pixels (no border rule), in float64; the
variance is numpy's (population). Everything runs in prepare(), on the CPU of the decode
workers: about 1 ms an image on top of its decode. Videos: each sampled frame (`frames`,
`keyframes`, as the other scorers sample them) scored alike, kept in `sharpness_frames` and
reduced by `frame_reduce` (default mean).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from ...stream.config import StageConfig
from ...core.errors import ConfigError, DataError
from .base import FRAME_REDUCERS, Noted, Scorer, reduce_frames
from ...media.frames import sample_frames

SIDE = 256
MAX_LONG = 4 * SIDE
# Video frames are scaled to this long side while decoded: at most what SIDE needs.
VIDEO_MAX_SIDE = MAX_LONG


def grey_at_scale(image) -> np.ndarray:
    """The image (PIL, or an RGB array) in grey at the fixed scale: short side SIDE, long side at most MAX_LONG."""
    from PIL import Image
    grey = (image if isinstance(image, Image.Image) else Image.fromarray(image)).convert("L")
    w, h = grey.size
    scale = SIDE / min(w, h)
    size = (max(SIDE, round(w * scale)), max(SIDE, round(h * scale)))
    grey = grey.resize(size, Image.Resampling.BILINEAR)
    w, h = size
    if max(w, h) > MAX_LONG:  # a panorama or a tower: its middle
        left, top = (w - MAX_LONG) // 2 if w > h else 0, (h - MAX_LONG) // 2 if h > w else 0
        grey = grey.crop((left, top, left + min(w, MAX_LONG), top + min(h, MAX_LONG)))
    return np.asarray(grey)


def laplacian_variance(grey: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian over the interior pixels of a 2-D array."""
    g = grey.astype(np.float64)
    lap = g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] - 4.0 * g[1:-1, 1:-1]
    return float(lap.var())


def sharpness(image) -> float:
    return laplacian_variance(grey_at_scale(image))


class BlurScorer(Scorer):
    name = "blur"
    media = ("image", "video")

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        cls(**options)  # the options checked before torch is imported
        return ["sharpness", "sharpness_frames"]

    def __init__(self, frames: int = 3, keyframes: bool = False, frame_reduce: str = "mean",
                 config: Optional[StageConfig] = None):
        """frames, keyframes: how a video's frames are sampled; frame_reduce: how their scores
        become `sharpness` (mean, max or min). config: the run's stage config (max_pixels)."""
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
            raise ConfigError(f"blur frames must be an integer >= 1, got {frames!r}")
        if frame_reduce not in FRAME_REDUCERS:
            raise ConfigError(f"blur frame_reduce must be one of {FRAME_REDUCERS}, got {frame_reduce!r}")
        self.frames, self.keyframes, self.frame_reduce = frames, bool(keyframes), frame_reduce
        self.max_pixels = (config or StageConfig()).max_pixels

    def columns(self) -> List[str]:
        return ["sharpness", "sharpness_frames"]

    def column_types(self) -> Dict[str, str]:
        return {"sharpness": "float64", "sharpness_frames": "list<float64>"}

    def decode_floor(self):
        # JPEGs larger than the fixed scale are decoded at the DCT scale that still covers it.
        return (SIDE, SIDE)

    def prepare(self, sample: Dict[str, Any]) -> Any:
        image = sample.get("image")
        if image is not None:
            value = sharpness(image)
            return {"sharpness": value, "sharpness_frames": [value]}
        video = sample.get("video")
        if video is None:
            raise DataError("missing_image", "the blur scorer needs an image or a video (this sample has neither)")
        key, url = sample.get("__key__", "?"), sample.get("__url__", "")
        what = f"sample {key}.{sample.get('__media_ext__', 'video')}" + (f" of shard {url}" if url else "")
        sampled = sample_frames(video, self.frames, keyframes=self.keyframes, max_side=VIDEO_MAX_SIDE,
                                max_pixels=self.max_pixels, what=what)
        values = [sharpness(frame) for frame in sampled.frames]
        row = {"sharpness": reduce_frames(values, self.frame_reduce), "sharpness_frames": values}
        return Noted(row, "corrupt_video", sampled.partial) if sampled.partial else row

    def load(self, device: str) -> None:
        """No model: prepare() did the work."""

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        return [dict(x) for x in inputs]

    def describe(self) -> str:
        return (f"blur: variance of the Laplacian, grey, short side {SIDE} px (CPU, decode workers); "
                f"videos: {self.frames} {'keyframes' if self.keyframes else 'frames'}, reduce={self.frame_reduce}")

