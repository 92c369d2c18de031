"""craft_boxes.det_boxes, easyocr's getDetBoxes worked per component window, against easyocr's own
getDetBoxes on score maps with text-like blobs, links between them, components at the map's edges,
square ones (easyocr's diamond rule), specks under its size floor and blobs under text_threshold:
the same boxes, in the same order, to the bit."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("easyocr")

import cv2  # noqa: E402
from easyocr.craft_utils import getDetBoxes  # noqa: E402
from wdsfilter.score.ocr_backends.craft_boxes import det_boxes  # noqa: E402


def score_maps(seed, height=184, width=327, words=25):
    """A text map and a link map as CRAFT draws them (smooth peaks per character, links between
    neighbouring characters), of random words, some at the edges, some faint; plus what exercises
    each of easyocr's rules: links running past a word's last character (link-only pixels, which
    easyocr removes before the box is fitted), diamonds (a rotated square: easyocr's diamond rule
    takes the axis-aligned box instead) and one-pixel specks (under its 10-pixel floor)."""
    rng = np.random.default_rng(seed)
    text = np.zeros((height, width), np.float32)
    link = np.zeros((height, width), np.float32)
    for i in range(words):
        y, x = int(rng.integers(-3, height)), int(rng.integers(-10, width))
        size, chars = int(rng.integers(2, 8)), int(rng.integers(1, 6))
        peak = float(rng.choice([0.95, 0.8, 0.6]))  # 0.6: under text_threshold 0.7
        gap = 3 * size if i % 2 else 2 * size  # every other word: characters apart, joined by links only
        for c in range(chars):
            cx = x + c * gap
            cv2.circle(text, (cx, y), size, peak, -1)
            if c:
                cv2.line(link, (cx - gap, y), (cx, y), 0.9, max(1, size // 2))
        if i % 3 == 0:  # a link running on past the last character
            cv2.line(link, (x + (chars - 1) * gap, y), (x + (chars - 1) * gap + 4 * size, y + size), 0.9, 1)
    for _ in range(3):
        cy, cx, r = int(rng.integers(10, height - 10)), int(rng.integers(10, width - 10)), int(rng.integers(4, 9))
        diamond = np.array([[cx, cy - r], [cx + r, cy], [cx, cy + r], [cx - r, cy]], np.int32)
        cv2.fillPoly(text, [diamond], 0.95)
    text, link = cv2.GaussianBlur(text, (5, 5), 1.5), cv2.GaussianBlur(link, (3, 3), 1)
    text[rng.random((height, width)) < 0.001] = 0.9  # specks: components under 10 pixels
    return text, link


@pytest.mark.parametrize("seed", range(6))
def test_the_same_boxes_as_easyocrs_getdetboxes(seed):
    text, link = score_maps(seed)
    maps = np.stack([text, link], axis=-1)  # detect() hands views of one (H, W, 2) array
    for thresholds in ((0.7, 0.4, 0.4), (0.5, 0.3, 0.3)):
        expected, _, _ = getDetBoxes(maps[:, :, 0], maps[:, :, 1], *thresholds, poly=False)
        got = det_boxes(maps[:, :, 0], maps[:, :, 1], *thresholds)
        assert len(expected) >= 5 and len(got) == len(expected)
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and np.array_equal(g, e)


def test_maps_without_text_give_no_boxes():
    flat = np.full((40, 60), 0.1, np.float32)
    assert det_boxes(flat, flat, 0.7, 0.4, 0.4) == [] == getDetBoxes(flat, flat, 0.7, 0.4, 0.4)[0]
