"""CRAFT's score maps -> text boxes: easyocr's getDetBoxes (craft_utils.getDetBoxes_core, poly=False),
each component worked on inside its own box instead of the whole map.

easyocr allocates a full-size segmentation map for every connected component and compares the
whole label map with the component's label, so its cost grows as components x map pixels: on a
368x654 map (a 1280x720 frame at 736) 30 text components took 63 ms and 100 took 160 ms per
frame on one core, more than the network on a GPU. Every step easyocr takes for a component stays
within the component's bounding box widened by its dilation (`niter`): its pixels, the link
area it removes, the dilation and the points of the rectangle. The same steps on that window
give the same boxes, bit for bit (tests/test_ocr_craft_boxes.py compares them with easyocr's).
"""
from __future__ import annotations

import math
from typing import List

import numpy as np


def det_boxes(textmap: np.ndarray, linkmap: np.ndarray, text_threshold: float, link_threshold: float,
              low_text: float) -> List[np.ndarray]:
    """easyocr.craft_utils.getDetBoxes(textmap, linkmap, ..., poly=False)[0]: (4, 2) float32 boxes
    in score-map pixels, clockwise from the top-left-most corner, in easyocr's order."""
    import cv2

    textmap, linkmap = np.ascontiguousarray(textmap), np.ascontiguousarray(linkmap)  # detect() hands views
    img_h, img_w = textmap.shape
    _, text_score = cv2.threshold(textmap, low_text, 1, 0)
    _, link_score = cv2.threshold(linkmap, link_threshold, 1, 0)
    combined = np.clip(text_score + link_score, 0, 1)
    count, labels, stats, _ = cv2.connectedComponentsWithStats(combined.astype(np.uint8), connectivity=4)
    link_only = np.logical_and(link_score == 1, text_score == 0)  # easyocr computes it per component
    boxes = []
    for k in range(1, count):
        size = stats[k, cv2.CC_STAT_AREA]
        if size < 10:
            continue
        x, y = stats[k, cv2.CC_STAT_LEFT], stats[k, cv2.CC_STAT_TOP]
        w, h = stats[k, cv2.CC_STAT_WIDTH], stats[k, cv2.CC_STAT_HEIGHT]
        # The component lies in its box, so the maximum over it is the maximum over the box's pixels of it.
        mine = labels[y:y + h, x:x + w] == k
        if np.max(textmap[y:y + h, x:x + w][mine]) < text_threshold:
            continue
        niter = int(math.sqrt(size * min(w, h) / (w * h)) * 2)
        sx, ex, sy, ey = max(x - niter, 0), min(x + w + niter + 1, img_w), max(y - niter, 0), min(y + h + niter + 1, img_h)
        # easyocr's segmap, which is zero outside this window: the component, less link-only pixels, dilated.
        segmap = np.zeros((ey - sy, ex - sx), dtype=np.uint8)
        segmap[labels[sy:ey, sx:ex] == k] = 255
        segmap[link_only[sy:ey, sx:ex]] = 0
        kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (1 + niter, 1 + niter))
        segmap = cv2.dilate(segmap, kernel)
        rows, cols = np.where(segmap != 0)  # row-major, as np.where over the whole map
        np_contours = np.stack([cols + sx, rows + sy], axis=1)
        box = cv2.boxPoints(cv2.minAreaRect(np_contours))
        # align diamond-shape (easyocr's rule)
        bw, bh = np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[1] - box[2])
        if abs(1 - max(bw, bh) / (min(bw, bh) + 1e-5)) <= 0.1:
            left, right = min(np_contours[:, 0]), max(np_contours[:, 0])
            top, bottom = min(np_contours[:, 1]), max(np_contours[:, 1])
            box = np.array([[left, top], [right, top], [right, bottom], [left, bottom]], dtype=np.float32)
        box = np.roll(box, 4 - box.sum(axis=1).argmin(), 0)  # clockwise from the top-left-most corner
        boxes.append(np.array(box))
    return boxes
