"""The easyocr backend's preprocessing in torch (easyocr_backend.torch_preprocess, what runs on a
CUDA device) against easyocr's own resize_aspect_ratio + normalizeMeanVariance (what runs on a
CPU), on scikit-image's photos, photos with text drawn by PIL, and odd sizes: the same network
input size, the same ratio (adjustResultCoordinates maps the boxes back with it), and values
within one grey level. No model: CRAFT's score maps and boxes from both are compared in
tests/test_ocr_easyocr.py."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("easyocr")
skimage_data = pytest.importorskip("skimage.data")

import cv2  # noqa: E402
from easyocr.imgproc import normalizeMeanVariance, resize_aspect_ratio  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402
from wdsfilter.score.ocr_backends.easyocr_backend import STD, EasyOcrBackend, torch_preprocess  # noqa: E402

# One grey level in normalised units, per channel: normalizeMeanVariance divides by std*255.
GREY_LEVEL = np.array([s * 255.0 for s in STD], dtype=np.float32)


def rgb(name):
    img = getattr(skimage_data, name)()
    return np.ascontiguousarray(img if img.ndim == 3 else np.repeat(img[:, :, None], 3, axis=2))


def with_text(img, words, size):
    im = Image.fromarray(img)
    draw = ImageDraw.Draw(im)
    draw.text((10, img.shape[0] // 3), words, fill=(255, 255, 0), font=ImageFont.load_default(size=size))
    draw.text((img.shape[1] // 3, img.shape[0] // 2), words, fill=(0, 0, 0), font=ImageFont.load_default(size=size // 2))
    return np.asarray(im)


def easyocr_input(backend, frame):
    """easyocr's own preprocessing, as the backend runs it on a CPU: (network input HWC, ratio)."""
    resized, ratio, _ = resize_aspect_ratio(frame, backend.canvas_size, interpolation=cv2.INTER_LINEAR,
                                            mag_ratio=backend._magnification(*frame.shape[:2]))
    return normalizeMeanVariance(resized), ratio


def torch_input(backend, frames, dtype=torch.float32):
    ratio, height, width = backend._resize(*frames.shape[1:3])
    x = torch_preprocess(torch.from_numpy(np.ascontiguousarray(frames)), height, width, dtype)
    return x.permute(0, 2, 3, 1).float().numpy(), ratio


CASES = {
    # (frame, backend options): enlarged to the default min_side 736 (the usual case: 1280x720
    # frames go to 1308x736), reduced under a canvas_size cap, reduced by exactly 2 (cv2 switches
    # INTER_LINEAR to its area code there, which for 2x is the same average), and left at its size
    # (no interpolation at all: the values must then be equal to the last bit).
    "astronaut": (lambda: rgb("astronaut"), {}),
    "coffee+text": (lambda: with_text(rgb("coffee"), "OPEN 24h", 48), {}),
    "chelsea+text 137x251": (lambda: with_text(rgb("chelsea"), "CAT", 40)[:137, :251], {}),
    "rocket 45x101": (lambda: rgb("rocket")[200:245, 300:401], {}),
    "text (grey) reduced": (lambda: rgb("text"), {"canvas_size": 301, "min_side": 0}),
    "coffee+text halved": (lambda: with_text(rgb("coffee"), "SALE", 60), {"canvas_size": 300, "min_side": 0}),
    "astronaut 2x tiled, own size": (lambda: np.concatenate([rgb("astronaut")[:, :401]] * 2, axis=1)[:487],
                                     {"min_side": 0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_preprocessing_matches_easyocrs(case):
    make, options = CASES[case]
    frame = make()
    backend = EasyOcrBackend(**options)
    expected, expected_ratio = easyocr_input(backend, frame)
    got, ratio = torch_input(backend, np.stack([frame, frame[::-1]]))  # a batch; the second frame flipped
    assert ratio == expected_ratio  # the float itself: boxes are mapped back with it
    assert got.shape[1:] == expected.shape and got.shape[1:3] == backend._net_size(*frame.shape[:2])
    flipped, _ = easyocr_input(backend, np.ascontiguousarray(frame[::-1]))
    for g, e in ((got[0], expected), (got[1], flipped)):
        levels = np.abs(g - e) * GREY_LEVEL  # differences in grey levels
        if ratio == 1.0:
            assert np.array_equal(g, e)  # no resize: the same float32 arithmetic, padding included
            continue
        # cv2 interpolates a uint8 frame with 11-bit fixed-point weights and rounds to uint8; torch
        # interpolates in float32 and rounds (torch_preprocess). The exact bilinear value is the
        # same, so the two round to the same grey level or, where the weights' error (under 1/4
        # grey level) straddles a half, to neighbouring ones: at most one grey level, on a minority
        # of values. Padding (no interpolation there) must be equal.
        assert levels.max() <= 1.0 + 1e-3
        assert np.abs(levels - levels.round()).max() < 1e-3  # whole grey levels apart: 0 or 1
        assert 0 < (levels > 0.5).mean() < 0.2  # measured 8-13% on these frames
        _, height, width = backend._resize(*frame.shape[:2])
        assert np.array_equal(g[height:], e[height:]) and np.array_equal(g[:, width:], e[:, width:])


def test_network_dtype_is_the_float32_result_cast():
    frame = rgb("chelsea")[:100, :150]
    backend = EasyOcrBackend()
    _, height, width = backend._resize(*frame.shape[:2])
    pixels = torch.from_numpy(frame[None].copy())
    half = torch_preprocess(pixels, height, width, torch.float16)
    full = torch_preprocess(pixels, height, width, torch.float32)
    assert half.dtype == torch.float16 and half.shape == (1, 3, 736, 1120)
    assert torch.equal(half, full.half())

