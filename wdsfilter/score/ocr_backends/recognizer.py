"""Reading detected boxes back, to keep only those that hold legible text.

A text detector alone marks anything with strokes: a horse silhouette (skimage.data.horse()) came
out as 18 to 40 % text and a cat's eyes as 7 %. Real OCR pipelines read every box and drop those
read with a low confidence (rapidocr's own pipeline: text_score 0.5). The reader here does the
same with the PP-OCRv4 recogniser that ships in the rapidocr-onnxruntime wheel (no download), for
either detector backend: each box is cut out of the frame the detector was given (a perspective
crop, rapidocr's get_crop_img_list), read by rapidocr's own TextRecognizer code (resize to height
48, CTC decoding), and kept when the confidence is at least `min_score` and the text read has at
least one letter or digit (of any script: str.isalnum). The second rule is ours: the recogniser's
alphabet has symbols, and a moving star in a clip with no text was read as "★" with confidence
0.998; a box read as symbols only is a shape, not text.

It costs a recogniser pass per box: nothing on frames without boxes, and on the CPU about as much
as the detection again on frames full of text (docs/ocr.md has the measurements).
"""
from __future__ import annotations

import importlib.util
import os
import time
from typing import List, Optional, Sequence

import numpy as np

from ...core.errors import ConfigError
from .rapidocr_backend import onnx_session

REC_MODEL = "ch_PP-OCRv4_rec_infer.onnx"


def bundled_rec_path() -> str:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("reading OCR boxes (min_text_score) needs rapidocr-onnxruntime, whose wheel ships the "
                          "recogniser: pip install rapidocr-onnxruntime, or pass min_text_score=None to keep every "
                          "detected box unread")
    return os.path.join(list(spec.submodule_search_locations)[0], "models", REC_MODEL)


def crop_box(frame: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The quadrilateral `box` of `frame`, straightened: rapidocr's get_rotate_crop_image (a
    perspective warp to the box's own width and height; a box much taller than wide is turned)."""
    import cv2

    points = _clockwise(np.asarray(box, dtype=np.float32).reshape(-1, 2))
    w = max(1, int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3]))))
    h = max(1, int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2]))))
    target = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    crop = cv2.warpPerspective(frame, cv2.getPerspectiveTransform(points, target), (w, h),
                               borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if crop.shape[0] / crop.shape[1] >= 1.5:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop)


def _clockwise(points: np.ndarray) -> np.ndarray:
    """Four corners in the order top-left, top-right, bottom-right, bottom-left (any polygon is
    first reduced to its minimum-area rectangle: easyocr may return more than four points)."""
    import cv2

    if len(points) != 4:
        points = cv2.boxPoints(cv2.minAreaRect(points)).astype(np.float32)
    by_x = points[np.argsort(points[:, 0])]
    left, right = by_x[:2][np.argsort(by_x[:2, 1])], by_x[2:][np.argsort(by_x[2:, 1])]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def is_text(text: str, score: float, min_score: float) -> bool:
    """A box read as `text` with confidence `score` counts as text."""
    return score >= min_score and any(c.isalnum() for c in text)


def text_boxes(read: Sequence[tuple], min_score: float, weak_score: Optional[float] = None,
               min_weak: int = 0) -> List[int]:
    """Which boxes of one frame are text, from their readings [(text, confidence), ...]: those read
    surely (is_text at min_score) and, where at least `min_weak` boxes of the frame are read as a
    letter or digit with confidence >= weak_score, all of those too.

    Why the second rule: a print recogniser is unsure of every character of skewed handwriting or
    a JPEG-softened photo of text (skimage's text() at q92: eight boxes, read with 0.07 to 0.43),
    while a shape is one or two blobs (a cat's eyes read "O", "D" with up to 0.6; a horse "1"). A
    detector-confidence rule does not separate them: the eyes score 0.85 on the detector, the
    handwriting 0.5 to 0.7 (docs/ocr.md, tools/measure_ocr.py)."""
    sure = [i for i, (text, score) in enumerate(read) if is_text(text, score, min_score)]
    if weak_score is None or not min_weak:
        return sure
    weak = [i for i, (text, score) in enumerate(read) if is_text(text, score, weak_score)]
    return weak if len(weak) >= min_weak else sure


class _Session:
    """What rapidocr's TextRecognizer calls: session(batch) -> outputs."""

    def __init__(self, session):
        self.session = session
        self.names = [o.name for o in session.get_outputs()]
        self.input = session.get_inputs()[0].name

    def __call__(self, x):
        return self.session.run(self.names, {self.input: x})


class BoxReader:
    """Reads boxes with rapidocr's recogniser; a picklable config until load(device)."""

    def __init__(self, min_score: float, model_path: Optional[str] = None, threads: int = 0,
                 weak_score: Optional[float] = None, min_weak: int = 0):
        self.min_score = float(min_score)
        self.weak_score = weak_score
        self.min_weak = min_weak
        self.model_path = model_path
        self.threads = threads
        self._rec = None
        self.seconds = 0.0

    def weights_path(self) -> str:
        return self.model_path or bundled_rec_path()

    def load(self, device: str) -> None:
        from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
        from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode

        path = self.weights_path()
        if not os.path.isfile(path):
            raise ConfigError(f"rapidocr recogniser model not found at {path}; reinstall rapidocr-onnxruntime, or "
                              f"pass min_text_score=None to keep every detected box unread")
        session = onnx_session(path, device, self.threads, "box reading")
        characters = session.get_modelmeta().custom_metadata_map.get("character")
        # rapidocr's TextRecognizer, with our session (on our device) instead of its OrtInferSession.
        rec = TextRecognizer.__new__(TextRecognizer)
        rec.session = _Session(session)
        rec.postprocess_op = CTCLabelDecode(character=characters.splitlines() if characters else None)
        rec.rec_batch_num = 6
        rec.rec_image_shape = [3, 48, 320]
        self._rec = rec

    def unload(self) -> None:
        self._rec = None

    def read(self, frame: np.ndarray, boxes: Sequence[np.ndarray]) -> List[tuple]:
        """(text, confidence) of each box of `frame`."""
        if not len(boxes):
            return []
        if self._rec is None:
            raise RuntimeError("BoxReader.read called before load()")
        t0 = time.perf_counter()
        out, _ = self._rec([crop_box(frame, b) for b in boxes])
        self.seconds += time.perf_counter() - t0
        return [(str(r[0]), float(r[1])) for r in out]

    def keep(self, frame: np.ndarray, boxes: Sequence[np.ndarray]) -> List[np.ndarray]:
        """The boxes read as text (text_boxes: surely, or unsure but several in the frame)."""
        read = self.read(frame, boxes)
        return [boxes[i] for i in text_boxes(read, self.min_score, self.weak_score, self.min_weak)]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_rec"] = None
        return state
