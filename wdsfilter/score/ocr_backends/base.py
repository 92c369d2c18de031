"""The interface of a text detector backend: boxes and polygons on a batch of frames, on a device.

A backend object is a small picklable config until `load(device)`: the scorer carries it into
DataLoader workers (which never touch it: frame decoding needs no model) and the model worker
loads it. A backend only detects; reading the boxes (the OCR scorer's min_text_score) is
reader.py's, the same for both backends, and so is the scale rule for small frames (working_scale).
"""
from __future__ import annotations

import abc
import time
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...core.errors import ConfigError
from ..registry import build

# name -> "module:Class" (imported when used: each pulls its own heavy dependency)
BACKENDS = {
    "easyocr": "wdsfilter.score.ocr_backends.easyocr_backend:EasyOcrBackend",
    "rapidocr": "wdsfilter.score.ocr_backends.rapidocr_backend:RapidOcrBackend",
}

# Polygons of one frame: a list of (K, 2) float arrays of x, y pixel coordinates of that frame.
Polygons = List[np.ndarray]


class DetectorBackend(abc.ABC):
    """Subclasses are dataclasses of their options; see easyocr_backend.py and rapidocr_backend.py."""

    name: str = ""

    def __post_init__(self):
        self.device: Optional[str] = None
        self._model = None
        self.timings: Dict[str, float] = {"preprocess": 0.0, "forward": 0.0, "postprocess": 0.0}

    # -- what the memory planner reads before loading -------------------------------------------
    @abc.abstractmethod
    def weights_path(self) -> str:
        """The detector's weights file (it may not exist yet where downloads are allowed)."""

    def fetch(self) -> Optional[str]:
        """Download what load() needs (called once, in the parent, before model workers start)."""
        return None

    # -- model worker ---------------------------------------------------------------------------
    @abc.abstractmethod
    def load(self, device: str) -> None:
        """Load the detector onto `device` ("cpu", "cuda:1", ...) and only that device."""

    def _frames(self, frames) -> np.ndarray:
        """The (B, H, W, 3) array detect() takes; raises if it is called before load() or with
        anything else."""
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__}.detect called before load()")
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"frames must be (B, H, W, 3), got {frames.shape}")
        return frames

    @abc.abstractmethod
    def detect(self, frames: np.ndarray) -> List[Polygons]:
        """frames: (B, H, W, 3) uint8 RGB of one size. Returns, per frame, its text polygons in
        that frame's pixel coordinates. Adds its time to self.timings (preprocess = resizing and
        normalising, forward = the network, postprocess = turning score maps into polygons)."""

    def unload(self) -> None:
        self._model = None
        self.device = None

    def describe(self) -> str:
        return f"{self.name} ({self.weights_path()}) on {self.device or 'not loaded'}"

    # -- helpers --------------------------------------------------------------------------------
    def __getstate__(self):
        # Pickle the options only: a loaded model never travels to DataLoader workers.
        state = dict(self.__dict__)
        state["_model"] = None
        state["device"] = None
        return state

    @contextmanager
    def _timed(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] += time.perf_counter() - t0

    def reset_timings(self) -> Dict[str, float]:
        out = dict(self.timings)
        for k in self.timings:
            self.timings[k] = 0.0
        return out


def parse_device(device: str) -> Tuple[str, int]:
    """"cuda:1" -> ("cuda", 1); "cuda" -> ("cuda", 0); "cpu" -> ("cpu", 0)."""
    kind, _, index = str(device).partition(":")
    try:
        return kind, int(index) if index else 0
    except ValueError:
        raise ConfigError(f"bad device {device!r}; expected e.g. 'cpu', 'cuda', 'cuda:1'") from None


# The short side small frames are enlarged to before detection: rapidocr's own pipeline (its
# config.yaml: limit_type "min", limit_side_len 736). See working_scale.
MIN_SIDE = 736


def working_scale(height: int, width: int, min_side: Optional[int], max_long: Optional[int],
                  hard_max: int) -> float:
    """How much a frame is scaled for the detector network, the one rule of both backends.

    * Large frames: the long side is capped at `max_long` (None: no cap), which bounds memory.
    * Small frames: the short side is brought up to `min_side` (None or 0: never enlarged), as
      rapidocr's own pipeline does. Detectors miss text that is small relative to their receptive
      field: skimage.data.text() (448x172, handwriting) has no box at its own size and six at
      short side 736. Where the two rules disagree (a 1280x720 frame capped to 960x540 would have
      a short side under 736) the short-side floor wins, so the scale does not jump at a size.
    * Always: the long side is at most `hard_max` (a 2000x100 banner enlarged to short side 736
      would ask for a 14720x736 input).

    The detector's boxes are mapped back to the frame it was given, so the text area is a share of
    that frame whatever the scale (tests/test_ocr_photos.py)."""
    long, short = max(height, width), min(height, width)
    ratio = min(1.0, max_long / long) if max_long else 1.0
    if min_side and short * ratio < min_side:
        ratio = min_side / short
    return min(ratio, hard_max / long)


def make_backend(name: str, **options) -> DetectorBackend:
    return build(BACKENDS, name, "OCR backend", **options)
