"""Text masking as T-MARS does it (Maini et al., ICLR 2024): every detected text box is filled with
the mean colour of the pixels around it, so a CLIP score can no longer come from text written in
the image. The one implementation: the tmars scorer masks its frames with it, and the filter
report draws its masked thumbnails with it.

    rects = box_rects(polygons, width, height)   # each polygon's bounding box, whole pixels
    masked, covered = mask_frame(frame, rects)   # (H, W, 3) uint8 copy; pixels filled

A box is the polygon's axis-aligned bounding rectangle, widened to whole pixels (floor of the
smallest, ceiling of the largest coordinate) and clipped to the frame; its fill is the mean, per
channel and rounded to the nearest integer, of the unmasked frame's pixels in a ring `ring`
pixels wide around it, leaving out pixels inside any box (a neighbouring word is not "around").
Where that ring has no such pixel, the mean of every pixel outside the boxes is used, and where
the boxes cover the whole frame, the frame's mean. Pixels outside every box are never changed.
"""
from __future__ import annotations

import math
from typing import Iterable, List, Tuple

import numpy as np

Rect = Tuple[int, int, int, int]  # x0, y0, x1, y1: pixel columns x0..x1-1, rows y0..y1-1
RING = 3  # pixels around a box whose mean colour fills it


def box_rects(polys: Iterable, width: int, height: int) -> List[Rect]:
    """The whole-pixel bounding rectangle of each polygon ((K, 2) x, y points), clipped to the
    width x height frame; polygons outside it or without area give none."""
    rects: List[Rect] = []
    for p in polys:
        a = np.asarray(p, dtype=np.float64).reshape(-1, 2)
        if not len(a) or not np.isfinite(a).all():
            continue
        x0, y0 = max(0, math.floor(a[:, 0].min())), max(0, math.floor(a[:, 1].min()))
        x1, y1 = min(width, math.ceil(a[:, 0].max())), min(height, math.ceil(a[:, 1].max()))
        if x1 > x0 and y1 > y0:
            rects.append((x0, y0, x1, y1))
    return rects


def mask_frame(frame: np.ndarray, rects: List[Rect], ring: int = RING) -> Tuple[np.ndarray, int]:
    """(a copy of the (H, W, 3) uint8 frame with every rect filled, the pixels covered by the rects)."""
    h, w = frame.shape[:2]
    covered = np.zeros((h, w), dtype=bool)
    for x0, y0, x1, y1 in rects:
        covered[y0:y1, x0:x1] = True
    out = np.array(frame, dtype=np.uint8, copy=True)
    fallback = None
    for x0, y0, x1, y1 in rects:
        ys, xs = slice(max(0, y0 - ring), min(h, y1 + ring)), slice(max(0, x0 - ring), min(w, x1 + ring))
        around = ~covered[ys, xs]  # the ring: the widened rect less every box's pixels
        if around.any():  # sums of integers are exact in float64: the mean does not depend on their order
            colour = frame[ys, xs][around].mean(axis=0, dtype=np.float64)
        else:
            if fallback is None:  # computed once, only for a frame that needs it
                outside = ~covered
                fallback = (frame[outside] if outside.any() else frame.reshape(h * w, -1)).mean(axis=0, dtype=np.float64)
            colour = fallback
        out[y0:y1, x0:x1] = np.clip(np.rint(colour), 0, 255).astype(np.uint8)
    return out, int(covered.sum())
