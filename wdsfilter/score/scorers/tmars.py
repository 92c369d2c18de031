"""T-MARS: the CLIP score of the image with its text masked out (Maini et al., ICLR 2024).

    wdsfilter score SHARDS OUT --scorer tmars        # runs ocr, clip, then tmars

A scorer built on two others (Scorer.requires = ("ocr", "clip")): in the model worker, after
they scored a batch, it is given, per sample, the OCR scorer's frames (the pixels decoded once,
in the decode worker) and kept text boxes, and the CLIP scorer's per-frame scores and caption
embedding. Each frame with text has every box filled with the mean colour around it
(masking.py) and goes through the CLIP scorer's own transform and image tower (its model,
loaded once: no second copy); its score is the cosine with the caption embedding CLIP computed.
A frame without text keeps CLIP's score exactly, with no model call.

Columns: clip_score_masked (the frames' masked scores reduced as the clip scorer's frame_reduce
says: equal to clip_score where no frame has text), clip_score_masked_frames (per frame),
masked_share (share of the frame's pixels filled, reduced the same way) and masked_boxes (an
image's filled rectangles as x0, y0, x1, y1, ... in its original pixel coordinates; empty
where none; null for a video), which the filter report uses to draw the masked image.
docs/clip.md says where this differs from the T-MARS paper's code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...core.errors import ConfigError, DataError
from ...media.masking import RING, Rect, box_rects, mask_frame
from .base import Scorer, Upstream, reduce_frames
from .clip import ClipScorer, TEXT
from .ocr import OcrScorer, BOXES

COLUMNS = ("clip_score_masked", "clip_score_masked_frames", "masked_share", "masked_boxes")


@dataclass
class TmarsInput:
    """What attach() builds for one sample in the model worker (nothing of it crosses processes)."""
    frames: np.ndarray                   # the OCR scorer's (N, H, W, 3) uint8 frames
    rects: List[List[Rect]]              # per frame, its text boxes in the frame's pixels
    full_size: Optional[Tuple[int, int]]  # an image's original (width, height); None for a video
    clip_frames: List[float]             # the CLIP scorer's per-frame scores
    text: Any                            # the caption's normalised embedding (on the model's device)
    probe: bool = False                  # the planner's probe: every frame through the model

    def encoded(self) -> List[int]:
        """The frames that go through the model: those with text (all of them in the probe)."""
        return [j for j, r in enumerate(self.rects) if r or self.probe]


class TmarsScorer(Scorer):
    name = "tmars"
    media = ("image", "video")
    requires = ("ocr", "clip")
    image_pixels = False  # it masks the OCR scorer's frames: no pixels of the sample's own

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        return list(cls(**options).columns())

    def __init__(self, ring: int = RING):
        """ring: the width in pixels of the band around a box whose mean colour fills it."""
        if isinstance(ring, bool) or not isinstance(ring, int) or ring < 1:
            raise ConfigError(f"tmars ring must be an integer >= 1 (pixels), got {ring!r}")
        self.ring = ring
        self._clip = None
        self._ocr = None

    def __getstate__(self):  # the bound scorers travel on their own; bind() runs again there
        return dict(self.__dict__, _clip=None, _ocr=None)

    def columns(self) -> List[str]:
        return list(COLUMNS)

    def column_types(self) -> Dict[str, str]:
        return {"clip_score_masked": "float64", "clip_score_masked_frames": "list<float64>",
                "masked_share": "float64", "masked_boxes": "list<float64>"}

    def bind(self, required: Dict[str, Scorer]) -> None:
        clip, ocr = required["clip"], required["ocr"]
        if not isinstance(clip, ClipScorer) or not isinstance(ocr, OcrScorer):
            raise ConfigError("tmars needs the built-in clip and ocr scorers (ClipScorer, OcrScorer)")
        if (clip.frames, clip.keyframes) != (ocr.frames, ocr.keyframes):
            # Masked OCR frames are compared with CLIP's scores of the same frames.
            raise ConfigError(f"tmars compares OCR's video frames with CLIP's: both need the same frames "
                              f"(clip {clip.frames}, ocr {ocr.frames}) and keyframes (clip {clip.keyframes}, "
                              f"ocr {ocr.keyframes}); set --frames/--keyframes, not clip.frames or ocr.frames")
        ocr.hand_boxes()  # the private outputs attach() reads
        clip.hand_text()
        self._clip, self._ocr = clip, ocr

    def decode_floor(self) -> Tuple[int, int]:
        """No floor of its own: it masks the OCR scorer's frames, decoded as OCR and CLIP need."""
        return (0, 0)

    # -- CPU side ------------------------------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Any:
        # The pixels are the OCR scorer's prepared frames (attach): nothing is decoded here.
        if sample.get("image") is None and sample.get("video") is None:
            raise DataError("missing_image", "the tmars scorer needs an image or a video (this sample has neither)")
        return "video" if sample.get("image") is None else "image"

    # -- model side ----------------------------------------------------------------------------
    def attach(self, prepared: Any, upstream: Dict[str, Upstream], probe: bool = False) -> TmarsInput:
        ocr, clip = upstream["ocr"], upstream["clip"].output
        frames = ocr.input.frames
        h, w = frames.shape[1:3]
        full = ocr.input.full_size if ocr.input.media == "image" else None
        sx, sy = (w / full[0], h / full[1]) if full else (1.0, 1.0)
        scale = np.array([sx, sy])
        rects = [box_rects([p * scale for p in polys], w, h) for polys in ocr.output[BOXES]]
        if len(rects) != len(clip["clip_score_frames"]):
            raise DataError("frame_mismatch", f"OCR read {len(rects)} frames of this video and CLIP "
                                              f"{len(clip['clip_score_frames'])}: the masked score needs both")
        return TmarsInput(frames, rects, full, list(clip["clip_score_frames"]), clip[TEXT], probe)

    def frame_count(self, prepared: TmarsInput) -> int:
        """The frames this input sends through the model (the planner and back-off count them)."""
        return len(prepared.encoded())

    def load(self, device: str) -> None:
        if self._clip is None:
            raise RuntimeError("TmarsScorer.load before bind(): the run binds it to its clip and ocr scorers")

    def score_batch(self, inputs: List[TmarsInput]) -> List[Dict[str, Any]]:
        jobs: List[Tuple[int, int]] = []
        pixels = []
        shares = [[0.0] * len(x.rects) for x in inputs]
        for i, x in enumerate(inputs):
            h, w = x.frames.shape[1:3]
            for j in x.encoded():
                masked, covered = mask_frame(x.frames[j], x.rects[j], self.ring)
                shares[i][j] = covered / float(h * w)
                pixels.append(self._clip.transform(masked, x.full_size)[None])
                jobs.append((i, j))
        scores = [list(x.clip_frames) for x in inputs]  # no text: CLIP's own score, exactly
        for (i, j), value in zip(jobs, self._encode(pixels, [inputs[i].text for i, _ in jobs])):
            scores[i][j] = value
        how = self._clip.frame_reduce
        rows = []
        for x, s, share in zip(inputs, scores, shares):
            boxes = None
            if x.full_size is not None:  # an image: its filled rectangles in original pixels
                fx, fy = x.full_size[0] / x.frames.shape[2], x.full_size[1] / x.frames.shape[1]
                boxes = [float(v * f) for r in x.rects[0] for v, f in zip(r, (fx, fy, fx, fy))]
            rows.append({"clip_score_masked": reduce_frames(s, how), "clip_score_masked_frames": s,
                         "masked_share": reduce_frames(share, how), "masked_boxes": boxes})
        return rows

    def _encode(self, pixels: list, texts: list) -> List[float]:
        """The cosine of each masked frame's CLIP image embedding with its caption's, as ClipScorer
        computes clip_score (its model, transform, staging and precision)."""
        if not pixels:
            return []
        import torch
        import torch.nn.functional as F
        clip = self._clip
        images = clip.transform.normalize(clip._staging.to_device(pixels, clip.device), clip.input_dtype)
        with torch.inference_mode(), clip._autocast():
            features = clip._model.encode_image(images)
        features = F.normalize(features.float(), dim=-1)
        if not bool(features.isfinite().all()):
            raise DataError("non_finite_score", f"the masked image embeddings overflowed in "
                            f"{clip.resolved_precision}; score with --precision bf16 or fp32")
        text = torch.stack([t.to(features.device) for t in texts])
        return (features * text).sum(dim=-1).clamp(-1.0, 1.0).cpu().tolist()

    def unload(self) -> None:
        """The models belong to the clip and ocr scorers, which unload them."""

    def describe(self) -> str:
        return (f"tmars: OCR's text boxes filled with the mean colour of a {self.ring}px ring around them, "
                f"scored by the clip scorer's model")
