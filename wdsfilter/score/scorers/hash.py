"""Content hashes for dedup (`wdsfilter dedup`, docs/dedup.md), computed in the scoring pass so no
shard is read twice: `sha256` of the image (or video) member's bytes and `phash`, a 64-bit
perceptual hash of the decoded image (wdsfilter/media/hashes.py: imagehash's phash, as the 16 hex
digits imagehash prints, so every reader keeps its bits).

    scorer = HashScorer()
    row = scorer.score_batch([scorer.prepare(sample)])[0]   # {"sha256": "9f2c...", "phash": "c3a1..."}

All the work is CPU work in prepare() (the decode workers); the model worker only hands the
values back, so the scorer combines with clip and ocr in one pass at no device cost.

Images: the phash of the image the decode stage gave. With other scorers a large JPEG may be
decoded at a reduced DCT scale (their decode floor; this scorer's own is 128 px): measured on
scikit-image's photos at 1/2, 1/4 and 1/8 scale the hash differed from the full decode's by 0
bits, 2 at most, far below the near-duplicate distance. Videos: the frame-reduced hash, the
bitwise majority of the phashes of `frames` frames sampled uniformly over the clip (as the CLIP
and OCR scorers sample them), so a clip is one hash compared like an image's; a clip and its
re-encode agree frame by frame.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ...stream.config import StageConfig
from ...core.errors import ConfigError, DataError, require
from ...media.hashes import INSTALL, majority, phash, phash_hex, sha256_hex
from ...stream.stages import IMAGE_BYTES
from .base import Noted, Scorer
from ...media.frames import sample_frames

# Video frames are scaled to this long side while decoded: phash reduces them to 32x32 anyway.
VIDEO_MAX_SIDE = 256


class HashScorer(Scorer):
    name = "hash"
    media = ("image", "video")
    image_bytes = True  # the decode stage keeps the member's bytes (StageConfig.keep_image_bytes)
    needs = (("imagehash", INSTALL),)  # checked before torch and the models (scorerset.check_before_torch)

    def __init__(self, frames: int = 3, keyframes: bool = False, config: Optional[StageConfig] = None):
        """frames, keyframes: how a video's frames are sampled for its frame-reduced phash."""
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
            raise ConfigError(f"hash frames must be an integer >= 1, got {frames!r}")
        require("imagehash", "the hash scorer", INSTALL)  # at once, not in every decode worker
        self.frames, self.keyframes = frames, bool(keyframes)
        self.max_pixels = (config or StageConfig()).max_pixels

    def columns(self) -> List[str]:
        return ["sha256", "phash"]

    def column_types(self) -> Dict[str, str]:
        return {"sha256": "string", "phash": "string"}

    def decode_floor(self):
        # phash reduces the image to 32x32: a hash-only run decodes large JPEGs at up to 1/8 scale.
        return (128, 128)

    def prepare(self, sample: Dict[str, Any]) -> Any:
        image = sample.get("image")
        if image is not None:
            data = sample.get(IMAGE_BYTES)
            if data is None:  # a pipeline that did not keep the bytes: a bug, not the sample's fault
                raise RuntimeError("the hash scorer needs the image member's bytes; the scoring stage config "
                                   "sets keep_image_bytes from Scorer.image_bytes")
            return {"sha256": sha256_hex(data), "phash": phash(image)}
        video = sample.get("video")
        if video is None:
            raise DataError("missing_image", "the hash scorer needs an image or a video (this sample has neither)")
        from PIL import Image

        key, url = sample.get("__key__", "?"), sample.get("__url__", "")
        what = f"sample {key}.{sample.get('__media_ext__', 'video')}" + (f" of shard {url}" if url else "")
        sampled = sample_frames(video, self.frames, keyframes=self.keyframes, max_side=VIDEO_MAX_SIDE,
                                max_pixels=self.max_pixels, what=what)
        row = {"sha256": sha256_hex(video), "phash": majority(phash(Image.fromarray(f)) for f in sampled.frames)}
        return Noted(row, "corrupt_video", sampled.partial) if sampled.partial else row

    def load(self, device: str) -> None:
        """No model: prepare() did the work."""

    def score_batch(self, inputs: List[Any]) -> List[Dict[str, Any]]:
        return [{"sha256": x["sha256"], "phash": phash_hex(x["phash"])} for x in inputs]

    def describe(self) -> str:
        return "hash: sha256 of the member bytes, imagehash phash (CPU, decode workers)"
