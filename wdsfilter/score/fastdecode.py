"""Image preparation for models whose input is smaller than the image: reduced-scale JPEG decoding
and a fast resize, producing uint8 pixels (normalised later, on the model's device).

Today's reference is open_clip's eval transform on a fully decoded PIL image: Resize (shortest
side, PIL bicubic with antialiasing), CenterCrop, ToTensor, Normalize. Two things make it slow on
768-1024 px photos for a 224 px model: PIL's antialiased bicubic resize of the full image costs
about twice the JPEG decode, and the float32 tensor it returns is 4x the bytes of uint8.

    ImageTransform(preprocess_cfg)          picklable; built from the model's config alone
        .decode_floor()  -> (short, long)   smallest decoded size the transform needs (for
                                            images.decode_image: JPEG draft at 1/2, 1/4, 1/8)
        (image)          -> uint8 (3, H, W) the pixels open_clip's transform would produce
        .normalize(batch, dtype) -> float   on the model's device: /255, -mean, /std

The resize runs in torch's antialiased uint8 kernel (the one torchvision v2 uses; written to
match PIL's coefficients): on a full decode the pixels equal open_clip's within 1/255
(tests/test_fastdecode.py). The JPEG draft changes pixels more: a DCT-domain downscale is a
different low-pass filter than bicubic. `reducing_gap` (PIL's own name and meaning, as in
Image.thumbnail) keeps the reduced image's short side at least that many times the model input,
so the final resize still does real antialiasing; None turns the draft off. With the default
1.25, on scikit-image's photos resized to 768-1024 px JPEGs for a 224 px model, pixels differ from
open_clip's by 0.8/255 on average (each image under 3/255) and single pixels on sharp detail by up
to ~70/255; per core this is 2.4x a plain PIL decode + resize (tools/bench_decode.py). 1.5 halves
the difference (0.35/255) for 1.9x; 1.0 doubles it (1.6/255) for 2.7x. tests/test_fastdecode.py
asserts these bounds, and the CLIP score difference they cause on the tiny model.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional, Tuple
from ..core.errors import ConfigError

# Default reducing gap: JPEGs are decoded at the smallest DCT scale that keeps the short side at
# least 1.25x the model input (1/2 scale from a 560 px short side for a 224 px model).
REDUCING_GAP = 1.25
_TORCH_MODES = {"bicubic": "bicubic", "bilinear": "bilinear"}


def combine_floors(floors) -> Optional[Tuple[int, int]]:
    """The decoded size that satisfies every consumer: (short, long) element-wise maximum; None
    (decode at full size) when any consumer needs the full image."""
    short = long = 0
    for floor in floors:
        if floor is None:
            return None
        short, long = max(short, int(floor[0])), max(long, int(floor[1]))
    return (short, long)


# Resizing the whole of a thin image to its short side would make a strip this many times longer
# than the crop (a 242-byte PNG of 1x40000 pixels: 6 GB at 224 px) only to keep its middle: past
# this, the middle band is cut from the source first (with a margin for the filter), then resized;
# its pixels may then differ from open_clip's by the rounding of the band's edges (a sub-pixel
# shift). Up to this aspect ratio the pixels are open_clip's exactly.
_MAX_STRIP = 64


def _middle_band(pixels, new_h: int, new_w: int, top: int, left: int, side: int):
    """(band of `pixels` around the crop, its resized height and width, the crop's top and left in
    it): what the resize of the whole image keeps, up to the rounding of the band's edges."""
    h, w = pixels.shape[0], pixels.shape[1]
    if new_h > side:
        scale, start, length = new_h / h, top, h
    else:
        scale, start, length = new_w / w, left, w
    margin = 2 + math.ceil(4 / min(scale, 1.0))  # the bicubic filter's reach, in source pixels
    lo = max(0, math.floor(start / scale) - margin)
    hi = min(length, math.ceil((start + side) / scale) + margin)
    size = max(side, round((hi - lo) * scale))
    offset = min(max(0, int(round(start - lo * scale))), size - side)
    if new_h > side:
        return pixels[lo:hi], size, new_w, offset, left
    return pixels[:, lo:hi], new_h, size, top, offset


class ImageTransform:
    """open_clip's eval preprocessing (a PreprocessCfg dict) as uint8, with the fast path for the
    usual case (resize_mode "shortest", square input, bicubic or bilinear); other settings run
    open_clip's own PIL transforms and stop before ToTensor, so their pixels are exactly today's."""

    def __init__(self, preprocess_cfg: Dict[str, Any], reducing_gap: Optional[float] = REDUCING_GAP):
        if reducing_gap is not None and not reducing_gap >= 1.0:
            raise ConfigError(f"reducing_gap must be >= 1.0 or None (no reduced-scale decoding), got {reducing_gap!r}")
        self.cfg = dict(preprocess_cfg)
        size = self.cfg["size"]
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.mean = tuple(float(m) for m in self.cfg["mean"])
        self.std = tuple(float(s) for s in self.cfg["std"])
        self.reducing_gap = reducing_gap
        self.fast = (self.cfg.get("resize_mode", "shortest") == "shortest" and self.size[0] == self.size[1]
                     and self.cfg.get("interpolation", "bicubic") in _TORCH_MODES)
        self._pil = None  # open_clip's PIL steps, built on first use of the general path

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pil"] = None
        return state

    def decode_floor(self) -> Optional[Tuple[int, int]]:
        """(short side, long side) the decoded image must keep; None: decode at full size."""
        if self.reducing_gap is None:
            return None
        need = math.ceil(max(self.size) * self.reducing_gap)
        if self.cfg.get("resize_mode") == "longest":
            return (0, need)
        return (need, 0)  # shortest, squash: both sides reach the input size

    def __call__(self, image, original_size: Optional[Tuple[int, int]] = None):
        """uint8 (3, H, W) tensor of a PIL image or an (H, W, 3) uint8 array. `original_size`:
        the image's (width, height) before a reduced-scale decode, so the crop is placed exactly
        where open_clip would place it on the full image."""
        import numpy as np
        import torch
        from PIL import Image

        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        if image.mode != "RGB":
            image = image.convert("RGB")
        if not self.fast:
            return self._general(image)
        with warnings.catch_warnings():
            # PIL's array is read-only; it is only read (resized or copied by the crop).
            warnings.simplefilter("ignore", UserWarning)
            pixels = torch.from_numpy(np.asarray(image))
        return self._resize_crop(pixels, original_size or image.size)

    def _resize_crop(self, pixels, original_size):
        """(H, W, 3) uint8 -> (3, S, S): torchvision Resize(S) (short side S, long side truncated
        as torchvision computes it from the full-size image) then CenterCrop(S)."""
        import torch.nn.functional as F

        side = self.size[0]
        w, h = original_size
        if w <= h:
            new_w, new_h = side, int(side * h / w)
        else:
            new_w, new_h = int(side * w / h), side
        top, left = int(round((new_h - side) / 2.0)), int(round((new_w - side) / 2.0))
        if max(new_w, new_h) > _MAX_STRIP * side:
            pixels, new_h, new_w, top, left = _middle_band(pixels, new_h, new_w, top, left, side)
        # A (1, 3, H, W) view of HWC memory: channels-last, the layout torch's fast uint8
        # antialiased kernels take (no copy, no float conversion).
        x = pixels.permute(2, 0, 1).unsqueeze(0)
        if (x.shape[2], x.shape[3]) != (new_h, new_w):
            mode = _TORCH_MODES[self.cfg.get("interpolation", "bicubic")]
            try:
                x = F.interpolate(x, size=(new_h, new_w), mode=mode, antialias=True, align_corners=False)
            except (RuntimeError, NotImplementedError):  # an older torch without the uint8 kernel
                x = F.interpolate(x.float(), size=(new_h, new_w), mode=mode, antialias=True, align_corners=False)
                x = x.round_().clamp_(0, 255).to(pixels.dtype)
        return x[0, :, top:top + side, left:left + side].contiguous()

    def _general(self, image):
        import numpy as np
        import torch
        if self._pil is None:
            from open_clip.transform import PreprocessCfg, image_transform_v2
            steps = image_transform_v2(PreprocessCfg(**self.cfg), is_train=False).transforms
            self._pil = [t for t in steps if type(t).__name__ not in ("MaybeToTensor", "ToTensor", "Normalize")]
        for step in self._pil:
            image = step(image)
        if image.mode != "RGB":
            image = image.convert("RGB")
        return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()

    def normalize(self, pixels, dtype=None):
        """uint8 (..., 3, H, W) on any device -> float, exactly ToTensor + Normalize (same
        operations in the same order, so fp32 results on a CPU are bit-identical), then `dtype`."""
        import torch
        mean = torch.tensor(self.mean, dtype=torch.float32, device=pixels.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=pixels.device).view(-1, 1, 1)
        out = pixels.to(torch.float32).div_(255).sub_(mean).div_(std)
        return out if dtype is None or dtype == torch.float32 else out.to(dtype)


# --decode-device: the model's device decodes a batch's JPEGs (torchvision.io.decode_jpeg, nvJPEG
# on CUDA), in groups of at most this many decoded bytes, each group resized and cropped before the
# next is decoded: the device memory it takes is bounded whatever the images' sizes (a 64 MP JPEG
# is 192 MB decoded), and the planner counts it as the scorer's workspace (Scorer.workspace_bytes).
DECODE_WORKSPACE = 256 << 20


def device_pixels(transform: ImageTransform, jpegs, sizes, device, fallback) -> list:
    """uint8 (3, S, S) on `device` for each JPEG (a uint8 tensor of the file's bytes) of (width,
    height) `sizes`: decoded on the device in groups (DECODE_WORKSPACE), then the transform's own
    resize and centre crop (torch's antialiased kernels, on the device). A JPEG its group could not
    decode is decoded alone; one that fails alone (a CMYK or truncated file nvJPEG refuses) is
    `fallback(i)`: the CPU path's pixels for input i, or its DataError, as the decode workers give."""
    out: list = [None] * len(jpegs)
    group: list = []
    held = 0
    for i, (w, h) in enumerate(sizes):
        need = int(w) * int(h) * 3
        if group and held + need > DECODE_WORKSPACE:
            _decode_group(transform, jpegs, sizes, group, device, fallback, out)
            group, held = [], 0
        group.append(i)
        held += need
    if group:
        _decode_group(transform, jpegs, sizes, group, device, fallback, out)
    return out


def _decode_group(transform: ImageTransform, jpegs, sizes, group: list, device, fallback, out: list) -> None:
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        decoded = decode_jpeg([jpegs[i] for i in group], mode=ImageReadMode.RGB, device=device)
    except RuntimeError:  # one bad file fails the call: each alone, the bad ones by the CPU path
        decoded = []
        for i in group:
            try:
                decoded.append(decode_jpeg(jpegs[i], mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                decoded.append(None)
    for i, image in zip(group, decoded):
        if image is None or tuple(image.shape[1:]) != (int(sizes[i][1]), int(sizes[i][0])):
            out[i] = fallback(i)  # the size its header gave is the size the crop is placed for
            continue
        out[i] = transform._resize_crop(image.permute(1, 2, 0), (int(sizes[i][0]), int(sizes[i][1])))
