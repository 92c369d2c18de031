"""PP-OCRv4 text detection with the ONNX model that ships inside the rapidocr-onnxruntime wheel.

No download, no network: the weights are a file of the installed package. This is the detector
only; the recogniser of the same wheel reads the boxes in reader.py (rapidocr's angle classifier
is never loaded). We create the onnxruntime session
ourselves rather than through rapidocr's OrtInferSession, because that one always picks GPU 0
and we must stay on the model worker's own device; pre- and post-processing are rapidocr's own
classes (DetPreProcess: resize to a multiple of 32 and normalise; DBPostProcess: threshold the
probability map, find contours, expand them by the unclip ratio).

On "cuda:N" the session uses onnxruntime's CUDA provider on GPU N when the installed onnxruntime
has one (pip install onnxruntime-gpu); otherwise it runs on CPU, says so in describe() and uses no
GPU memory.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ...core.errors import ConfigError
from .base import MIN_SIDE, DetectorBackend, Polygons, parse_device, working_scale

log = logging.getLogger("wdsfilter")

DET_MODEL = "ch_PP-OCRv4_det_infer.onnx"
LIMIT_TYPES = ("min", "max")


def bundled_model_path() -> str:
    """The det model inside the installed rapidocr_onnxruntime package (without importing it)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the rapidocr OCR backend needs rapidocr-onnxruntime: pip install rapidocr-onnxruntime")
    return os.path.join(list(spec.submodule_search_locations)[0], "models", DET_MODEL)


def _has_cuda_provider() -> bool:
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers()


def onnx_session(path: str, device: str, threads: int = 0, what: str = "detection"):
    """An onnxruntime session on `device` and only there ("cuda:N": the CUDA provider on GPU N when
    this onnxruntime has one, else the CPU with a warning). Shared by the detector and the reader."""
    import onnxruntime as ort

    kind, index = parse_device(device)
    providers = ["CPUExecutionProvider"]
    if kind == "cuda":
        if _has_cuda_provider():
            # device_id pins the session to this worker's GPU; arena grows only as needed so the
            # planner's measurement after a probe batch is close to the steady state.
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": index,
                                                           "arena_extend_strategy": "kSameAsRequested"}))
        else:
            log.warning("rapidocr on %s: this onnxruntime has no CUDA provider (pip install onnxruntime-gpu); "
                        "%s runs on CPU", device, what)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.enable_cpu_mem_arena = False  # rapidocr's choice too: memory goes back after big frames
    if threads:
        opts.intra_op_num_threads = threads
    # Decode workers share the cores: idle intra-op threads would spin-wait on them. Off, the
    # detector ran at the same frames/s alone on 2 cores with 8% less CPU (tools/bench_ocr.py).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, sess_options=opts, providers=providers)


@dataclass(eq=False)
class RapidOcrBackend(DetectorBackend):
    # None: the model bundled in the rapidocr-onnxruntime wheel.
    model_path: Optional[str] = None
    # How frames are scaled for the network (base.working_scale, shared with easyocr). "max"
    # (default): the long side is capped at limit_side_len (960), and a frame whose short side is
    # under min_side (736) is enlarged to it, as rapidocr's own pipeline does: at its own size the
    # handwriting of skimage.data.text() (448x172) has no box at all, at short side 736 it has six.
    # min_side=0 turns enlarging off (wdsfilter 0.x's behaviour). "min": rapidocr's DetPreProcess
    # rule, the short side brought to limit_side_len and never reduced.
    limit_side_len: int = 960
    limit_type: str = "max"
    min_side: int = MIN_SIDE
    thresh: float = 0.3        # probability threshold of a text pixel
    box_thresh: float = 0.5    # minimum mean probability inside a box
    unclip_ratio: float = 1.6  # how far boxes are grown around the text kernel
    max_candidates: int = 1000
    max_input_side: int = 2000  # cap on the network input's long side (rapidocr's own max_side_len)
    threads: int = 0           # onnxruntime intra-op threads on CPU; 0 = its default (all cores)

    name = "rapidocr"

    def __post_init__(self):
        super().__post_init__()
        if self.limit_type not in LIMIT_TYPES:
            raise ConfigError(f"rapidocr limit_type must be one of {LIMIT_TYPES}, got {self.limit_type!r}")
        if self.min_side < 0:
            raise ConfigError(f"rapidocr min_side must be >= 0 (0: never enlarge), got {self.min_side}")
        if self.limit_side_len < 32 or self.max_input_side < 32:
            raise ConfigError(f"rapidocr limit_side_len and max_input_side must be >= 32, got "
                              f"{self.limit_side_len} and {self.max_input_side}")
        self.provider: Optional[str] = None

    def weights_path(self) -> str:
        return self.model_path or bundled_model_path()

    def _resized_size(self, height: int, width: int):
        """The detector's input size for a frame: working_scale's rule (or, with limit_type "min",
        DetPreProcess's), rounded to multiples of 32 as DetPreProcess does, and at least 32 px a
        side (DetPreProcess returns None for tiny images)."""
        if self.limit_type == "max":
            ratio = working_scale(height, width, self.min_side, self.limit_side_len, self.max_input_side)
        else:
            ratio = min(max(1.0, self.limit_side_len / min(height, width)), self.max_input_side / max(height, width))
        h, w = int(height * ratio), int(width * ratio)
        return max(32, int(round(h / 32) * 32)), max(32, int(round(w / 32) * 32))

    def load(self, device: str) -> None:
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess, DetPreProcess

        path = self.weights_path()
        if not os.path.isfile(path):
            raise ConfigError(f"rapidocr detector model not found at {path}; reinstall rapidocr-onnxruntime "
                              f"or pass model_path")
        self._model = onnx_session(path, device, self.threads, "detection")
        self.provider = self._model.get_providers()[0]
        self._input = self._model.get_inputs()[0].name
        self._pre = DetPreProcess(self.limit_side_len, self.limit_type)
        self._post = DBPostProcess(thresh=self.thresh, box_thresh=self.box_thresh, max_candidates=self.max_candidates,
                                   unclip_ratio=self.unclip_ratio, score_mode="fast", use_dilation=True)
        self.device = device

    def describe(self) -> str:
        where = self.device or "not loaded"
        if self.provider == "CPUExecutionProvider" and self.device and not self.device.startswith("cpu"):
            where += " (running on CPU: onnxruntime has no CUDA provider)"
        return f"rapidocr PP-OCRv4 detector ({os.path.basename(self.weights_path())}) on {where}"

    def detect(self, frames: np.ndarray) -> List[Polygons]:
        import cv2

        frames = self._frames(frames)
        height, width = frames.shape[1:3]
        with self._timed("preprocess"):
            # Frames share a size, so the resized inputs do too and stack into one batch. The
            # arithmetic is DetPreProcess.normalize's ((x / 255 - mean) / std, then CHW), done on
            # the whole batch in float32 instead of frame by frame in float64.
            h, w = self._resized_size(height, width)
            if (h, w) != (height, width):
                frames = np.stack([cv2.resize(f, (w, h)) for f in frames])
            x = frames.astype(np.float32) * np.float32(self._pre.scale)
            x -= self._pre.mean.astype(np.float32)
            x /= self._pre.std.astype(np.float32)
            x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        with self._timed("forward"):
            pred = self._model.run(None, {self._input: x})[0]
        out = []
        with self._timed("postprocess"):
            for i in range(len(frames)):
                boxes, _ = self._post(pred[i:i + 1], (height, width))
                out.append([b.astype(np.float64) for b in boxes if _big_enough(b)])
        return out


def _big_enough(box: np.ndarray) -> bool:
    """rapidocr's TextDetector drops boxes with a side of 3 px or less (noise specks)."""
    box = np.asarray(box, dtype=np.float64)
    return np.linalg.norm(box[0] - box[1]) > 3 and np.linalg.norm(box[0] - box[3]) > 3
