"""OCR text area: the share of an image, or of sampled video frames, covered by detected text.

    scorer = OcrScorer(backend="rapidocr", frames=3, frame_reduce="mean", max_area=0.2)
    prepared = [scorer.prepare(sample) for sample in samples]   # DataLoader workers, CPU
    scorer.load("cuda:0")
    rows = scorer.score_batch(prepared)
    # [{"ocr_area": 0.31, "ocr_area_frames": [0.3, 0.33, 0.3], "ocr_frames": 3, "ocr_keep": False}, ...]

Per frame, the detector finds text boxes (small frames enlarged to its working size first,
ocr_backends/base.working_scale), each box is read by rapidocr's recogniser and kept when it is
read as text with confidence >= min_text_score (ocr_backends/recognizer.py; None: keep every box
unread), and the area is the union of the kept boxes and polygons (overlaps counted once, clipped to the frame)
over the frame's area (wdsfilter/score/geometry.py), so it is in [0, 1] and does not depend on
the frame's resolution; that is why frames can be scaled down to `max_side` first, which bounds
the detector's memory. A video's per-frame ratios are reduced by mean, max or min ("max": drop a
clip if any sampled frame is text-heavy; "min": only if all are, e.g. burned-in subtitles).

Columns: ocr_area (reduced), ocr_area_frames (list of per-frame ratios; one element for an
image), ocr_frames (frames scored), and ocr_keep (ocr_area <= max_area) when max_area is set, so
a minimum threshold ocr_keep >= 1 filters like a maximum on ocr_area.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...stream.config import StageConfig
from ...core.errors import ConfigError, DataError
from ...media.images import FULL_SIZE, decode_image
from ..geometry import AREA_METHODS, area_ratio
from ..ocr_backends.base import BACKENDS, DetectorBackend, make_backend
from ..ocr_backends.recognizer import BoxReader
from .base import Noted, Scorer
from ..ocr_backends.rapidocr_backend import DET_MODEL
from ...media.frames import sample_frames

FRAME_REDUCE = ("mean", "max", "min")
_REDUCE = {"mean": np.mean, "max": np.max, "min": np.min}


@dataclass
class OcrInput:
    """What prepare() hands the model worker: the frames of one sample and what decoding took."""

    frames: np.ndarray          # (N, H, W, 3) uint8 RGB, one size
    media: str                  # "image" or "video"
    times: Tuple[float, ...] = ()   # frame timestamps in seconds (videos)
    decode_seconds: float = 0.0     # time spent in prepare (video demux/decode/convert, image resize)
    # An image's (width, height) before any reduced-scale decode or max_side resize: the boxes are
    # handed to dependent scorers in these coordinates (None: the frames' own, as for videos).
    full_size: Optional[Tuple[int, int]] = None


# Private output (scorers.base.private), once a dependent scorer asked (hand_boxes): per frame, the
# kept text polygons ((K, 2) float arrays of x, y) in the sample's original image coordinates
# (OcrInput.full_size), for dependent scorers (tmars). Never a column.
BOXES = "__ocr_boxes__"


@dataclass(eq=False)  # identity equality keeps it hashable, like every other Scorer
class OcrScorer(Scorer):
    backend: str = "rapidocr"          # rapidocr (weights in its wheel) or easyocr
    max_area: Optional[float] = None   # adds the ocr_keep column (ocr_area <= max_area)
    frames: int = 3                    # frames sampled per video
    frame_reduce: str = "mean"         # mean, max or min over a video's frames
    keyframes: bool = False            # sample keyframes only (no decoding between them)
    max_side: Optional[int] = 1280     # frames are scaled so their long side is at most this
    area_method: str = "shapely"       # union area: "shapely" (exact) or "raster" (cv2.fillPoly)
    model_dir: Optional[str] = None    # easyocr: where craft_mlt_25k.pth lives; rapidocr: the .onnx folder
    download: bool = True              # easyocr: fetch the weights when missing
    # Read each detected box with rapidocr's recogniser (in its wheel) and keep only those read with
    # at least this confidence (rapidocr's own pipeline: 0.5). None: every detected box counts.
    min_text_score: Optional[float] = 0.5
    # ...and where a frame has at least min_weak_boxes boxes read as a letter or digit with at least
    # weak_text_score, all of those (handwriting, softened photos of text: recognizer.text_boxes).
    # None: only the sure ones.
    weak_text_score: Optional[float] = 0.1
    min_weak_boxes: int = 3
    backend_options: Dict[str, Any] = field(default_factory=dict)  # any other backend option
    config: Optional[StageConfig] = None  # the run's stage config (its max_pixels guards video frames)

    name = "ocr"
    media = ("image", "video")

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown OCR backend {self.backend!r}; available: {', '.join(sorted(BACKENDS))}")
        if self.frame_reduce not in FRAME_REDUCE:
            raise ConfigError(f"frame_reduce must be one of {FRAME_REDUCE}, got {self.frame_reduce!r}")
        if not isinstance(self.frames, int) or self.frames < 1:
            raise ConfigError(f"frames must be an integer >= 1, got {self.frames!r}")
        if self.max_area is not None and not 0 <= float(self.max_area) <= 1:
            raise ConfigError(f"max_area is a share of the frame, in [0, 1]; got {self.max_area!r}")
        if self.max_side is not None and self.max_side < 32:
            raise ConfigError(f"max_side must be >= 32 (or None for no limit), got {self.max_side}")
        if self.area_method not in AREA_METHODS:
            raise ConfigError(f"area_method must be one of {AREA_METHODS}, got {self.area_method!r}")
        options = self._make_detector()
        if self.min_text_score is not None and (isinstance(self.min_text_score, bool) or
                                                not isinstance(self.min_text_score, (int, float)) or
                                                not 0 <= self.min_text_score <= 1):
            raise ConfigError(f"min_text_score is a recogniser confidence in [0, 1] (or None to keep every "
                              f"detected box unread), got {self.min_text_score!r}")
        if self.weak_text_score is not None and (
                isinstance(self.weak_text_score, bool) or not isinstance(self.weak_text_score, (int, float))
                or not 0 <= self.weak_text_score <= (self.min_text_score if self.min_text_score is not None else 1)):
            raise ConfigError(f"weak_text_score is a recogniser confidence in [0, min_text_score] (or None: only "
                              f"boxes read with min_text_score count), got {self.weak_text_score!r}")
        if isinstance(self.min_weak_boxes, bool) or not isinstance(self.min_weak_boxes, int) or self.min_weak_boxes < 1:
            raise ConfigError(f"min_weak_boxes must be an integer >= 1, got {self.min_weak_boxes!r}")
        self.reader: Optional[BoxReader] = None
        if self.min_text_score is not None:
            self.reader = BoxReader(self.min_text_score, threads=options.get("threads", 0),
                                    weak_score=self.weak_text_score, min_weak=self.min_weak_boxes)
            try:
                self.reader.weights_path()  # rapidocr-onnxruntime must be installed: found out now, not at load
            except ConfigError:
                if self.backend != "easyocr":
                    raise
                # easyocr where rapidocr cannot be installed (Python 3.13): detection alone, said aloud.
                import logging
                logging.getLogger("wdsfilter").warning(
                    "ocr: rapidocr-onnxruntime (whose wheel ships the recogniser) is not installed, so detected "
                    "boxes are not read and every box counts as text (min_text_score ignored); see docs/ocr.md")
                self.reader = None
        self.max_pixels = (self.config or StageConfig()).max_pixels
        self._area_seconds = 0.0
        self._boxes = False  # hand_boxes(): a dependent scorer reads the kept polygons

    def _make_detector(self) -> Dict[str, Any]:
        """The detector backend from the options (its weights under model_dir where set)."""
        options = dict(self.backend_options)
        if self.backend == "easyocr":
            options.setdefault("model_dir", self.model_dir)
            options.setdefault("download", self.download)
        elif self.model_dir:
            options.setdefault("model_path", os.path.join(self.model_dir, DET_MODEL))
        try:
            self.detector: DetectorBackend = make_backend(self.backend, **options)
        except TypeError as e:  # an option the backend does not have
            raise ConfigError(f"OCR backend {self.backend!r}: {e}") from None
        return options

    def local_files(self) -> List[str]:
        """The detector's weights where they are a file of this machine: easyocr's (fetched on
        this machine), or rapidocr's in model_dir (its default ones ship in the wheel)."""
        if self.backend == "easyocr" or self.model_dir:
            path = self.detector.weights_path()
            return [os.path.abspath(path)] if os.path.isfile(path) else []
        return []

    def relocate(self, moved: Dict[str, str]) -> None:
        """The detector's weights read from a copy: model_dir becomes the copy's folder."""
        path = os.path.abspath(self.detector.weights_path())
        if path in moved:
            self.model_dir = os.path.dirname(moved[path])
            self._make_detector()

    def hand_boxes(self) -> None:
        """Add the kept polygons to every output as the private BOXES (a dependent scorer's bind()
        asks: tmars); without it the outputs are the columns alone."""
        self._boxes = True

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        return cls(**options).columns()  # torch-free to build: every option is checked before torch

    def columns(self) -> List[str]:
        return _columns(self.max_area)

    def column_types(self) -> Dict[str, str]:
        return {"ocr_area": "float64", "ocr_area_frames": "list<float64>", "ocr_frames": "int64", "ocr_keep": "bool"}

    # -- CPU side (DataLoader workers) ---------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        if sample.get("video") is not None:
            what = _where(sample)
            sampled = sample_frames(sample["video"], self.frames, keyframes=self.keyframes, max_side=self.max_side,
                                    max_pixels=self.max_pixels, what=what)
            prepared = OcrInput(sampled.frames, "video", tuple(sampled.times), time.perf_counter() - t0)
            return Noted(prepared, "corrupt_video", sampled.partial) if sampled.partial else prepared
        image = sample.get("image")
        if image is None:
            raise DataError("missing_image", "the OCR scorer needs an image or a video (this sample has neither)")
        # a decoded PIL image's size (or the size it had before a reduced-scale decode); an array's
        # .size is its element count, not a size: its shape says it below
        full = getattr(image, "info", {}).get(FULL_SIZE) or (None if isinstance(image, np.ndarray)
                                                              else getattr(image, "size", None))
        frame = self._image_array(image)
        full = tuple(int(v) for v in full) if full else (frame.shape[1], frame.shape[0])
        return OcrInput(frame[None], "image", (), time.perf_counter() - t0, full)

    def _image_array(self, image) -> np.ndarray:
        from PIL import Image

        if isinstance(image, (bytes, bytearray, memoryview)):  # an undecoded member: same guard as the stages
            cfg = self.config or StageConfig()
            image = decode_image(bytes(image), cfg.max_pixels, cfg.max_side, cfg.oversize, "RGB")
        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        if not isinstance(image, Image.Image):
            raise DataError("corrupt_image", f"the OCR scorer cannot read an image of type {type(image).__name__}")
        if image.mode != "RGB":
            image = image.convert("RGB")
        w, h = image.size
        if self.max_side and max(w, h) > self.max_side:
            # The area ratio is scale-free, so detecting on a smaller copy only bounds memory and time.
            scale = self.max_side / max(w, h)
            image = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR,
                                 reducing_gap=2.0)
        return np.asarray(image, dtype=np.uint8)

    def decode_floor(self) -> Optional[Tuple[int, int]]:
        # Frames are scaled to max_side anyway; a JPEG twice that size can be decoded at 1/2.
        return (0, self.max_side) if self.max_side else None

    def frame_count(self, prepared: OcrInput) -> int:
        """Frames of the input (the planner and back-off count frames, not samples)."""
        return len(prepared.frames)

    def batch_key(self, prepared: OcrInput) -> Any:
        # Frames of one size share a detector batch (the network input is the same shape).
        return tuple(prepared.frames.shape[1:3])

    # -- model side ----------------------------------------------------------------------------
    def fetch(self) -> None:
        self.detector.fetch()

    def load(self, device: str) -> None:
        self.detector.load(device)
        if self.reader is not None:
            self.reader.load(device)

    def set_threads(self, threads: int) -> None:
        """The plan's model threads on the CPU (ModelRunner.configure). torch.set_num_threads does
        not reach onnxruntime, whose sessions take their thread count when built (0: one per
        core, beside the decode workers): a session built with another count is built again.
        A thread count the user set (backend_options threads) is kept."""
        device = self.detector.device
        if not device or not str(device).startswith("cpu") or self.backend_options.get("threads"):
            return
        for part in (self.detector, self.reader):
            if part is not None and getattr(part, "threads", threads) != threads:
                part.threads = threads
                part.load(device)

    def unload(self) -> None:
        device = self.detector.device
        self.detector.unload()
        if self.reader is not None:
            self.reader.unload()
        if device and str(device).startswith("cuda"):
            import torch
            torch.cuda.empty_cache()

    def score_batch(self, inputs: List[OcrInput]) -> List[Dict[str, Any]]:
        if self.detector.device is None:
            raise RuntimeError("OcrScorer.score_batch called before load(device)")
        # Every frame of every input, grouped by size: one detector call per size.
        groups: Dict[Tuple[int, int], List[Tuple[int, int]]] = defaultdict(list)
        for i, x in enumerate(inputs):
            for j in range(len(x.frames)):
                groups[tuple(x.frames.shape[1:3])].append((i, j))
        ratios: List[List[float]] = [[0.0] * len(x.frames) for x in inputs]
        boxes: List[list] = [[[] for _ in x.frames] for x in inputs]
        for (h, w), where in groups.items():
            batch = np.stack([inputs[i].frames[j] for i, j in where])
            polygons = self.detector.detect(batch)
            if self.reader is not None:
                polygons = [self.reader.keep(frame, polys) for frame, polys in zip(batch, polygons)]
            t0 = time.perf_counter()
            for (i, j), polys in zip(where, polygons):
                ratios[i][j] = area_ratio(polys, w, h, self.area_method)
                if self._boxes:
                    boxes[i][j] = _to_original(polys, w, h, inputs[i].full_size)
            self._area_seconds += time.perf_counter() - t0
        rows = [self._row(r) for r in ratios]
        if self._boxes:
            for row, b in zip(rows, boxes):
                row[BOXES] = b
        return rows

    def _row(self, frame_ratios: List[float]) -> Dict[str, Any]:
        area = float(_REDUCE[self.frame_reduce](frame_ratios))
        row = {"ocr_area": area, "ocr_area_frames": [float(r) for r in frame_ratios], "ocr_frames": len(frame_ratios)}
        if self.max_area is not None:
            row["ocr_keep"] = area <= self.max_area
        return row

    # -- reporting and planning ----------------------------------------------------------------
    def timings(self, reset: bool = False) -> Dict[str, float]:
        """Seconds spent in the model worker so far: preprocess (resize + normalise), forward
        (the network), postprocess (score maps to polygons), read (the recogniser on the boxes, 0
        with min_text_score=None) and area (polygon union)."""
        out = dict(self.detector.timings, read=self.reader.seconds if self.reader else 0.0, area=self._area_seconds)
        if reset:
            self.detector.reset_timings()
            self._area_seconds = 0.0
            if self.reader is not None:
                self.reader.seconds = 0.0
        return out

    def weights_path(self) -> str:
        return self.detector.weights_path()

    def describe(self) -> str:
        frames = f"{self.frames} {'keyframes' if self.keyframes else 'frames'}/video, reduce={self.frame_reduce}"
        limit = f", max_area={self.max_area}" if self.max_area is not None else ""
        read = "boxes not read"
        if self.reader is not None:
            read = f"boxes read with confidence >= {self.min_text_score}"
            if self.weak_text_score is not None:
                read += f" (>= {self.weak_text_score} where {self.min_weak_boxes} or more are)"
        return (f"ocr: {self.detector.describe()}, {read}, {frames}, max_side={self.max_side}, "
                f"area={self.area_method}{limit}")


def _to_original(polys, width: int, height: int, full_size: Optional[Tuple[int, int]]) -> List[np.ndarray]:
    """The polygons of a width x height frame as (K, 2) float64 arrays in `full_size` coordinates."""
    sx, sy = (full_size[0] / width, full_size[1] / height) if full_size else (1.0, 1.0)
    scale = np.array([sx, sy], dtype=np.float64)
    return [np.asarray(p, dtype=np.float64).reshape(-1, 2) * scale for p in polys]


def _where(sample: Dict[str, Any]) -> str:
    key, url, ext = sample.get("__key__", "?"), sample.get("__url__", ""), sample.get("__media_ext__", "video")
    return f"sample {key}.{ext}" + (f" of shard {url}" if url else "")


def _columns(max_area: Optional[float]) -> List[str]:
    cols = ["ocr_area", "ocr_area_frames", "ocr_frames"]
    return cols + ["ocr_keep"] if max_area is not None else cols
