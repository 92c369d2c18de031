"""Union area of detected polygons over the frame (wdsfilter/score/geometry.py)."""
from __future__ import annotations

import numpy as np
import pytest

from wdsfilter.score.geometry import area_ratio, union_area


def box(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=float)


def test_overlaps_are_counted_once():
    a, b = box(0, 0, 10, 10), box(5, 5, 15, 15)  # 100 + 100 - 25 overlap
    assert union_area([a, b], 20, 20) == pytest.approx(175)
    assert area_ratio([a, b], 20, 20) == pytest.approx(175 / 400)
    assert area_ratio([a, a, a], 20, 20) == pytest.approx(100 / 400)


def test_raster_overlaps_are_counted_once_too():
    # One fillPoly call for all polygons uses the even-odd rule: an overlap drawn twice is a hole.
    a, b = box(0, 0, 40, 40), box(20, 20, 60, 60)
    exact = union_area([a, b], 100, 100)
    assert exact == pytest.approx(2 * 1600 - 400)
    assert exact <= union_area([a, b], 100, 100, "raster") <= exact + 2 * 4 * 41
    assert union_area([a, a], 100, 100, "raster") == union_area([a], 100, 100, "raster")


def test_boxes_are_clipped_to_the_frame_and_the_ratio_stays_in_0_1():
    assert area_ratio([box(-50, -50, 500, 500)], 100, 40) == 1.0
    assert area_ratio([box(90, 30, 110, 50)], 100, 40) == pytest.approx(10 * 10 / 4000)
    assert area_ratio([box(200, 200, 300, 300)], 100, 40) == 0.0  # wholly outside


def test_rotated_polygons_and_nothing_detected():
    diamond = np.array([[50, 0], [100, 50], [50, 100], [0, 50]], dtype=float)  # area 5000
    assert area_ratio([diamond], 100, 100) == pytest.approx(0.5)
    assert area_ratio([], 64, 48) == 0.0


def test_degenerate_and_self_intersecting_polygons_do_not_break_the_union():
    line = np.array([[0, 0], [10, 10]], dtype=float)
    flat = box(0, 0, 10, 0)
    bowtie = np.array([[0, 0], [10, 10], [10, 0], [0, 10]], dtype=float)  # two triangles of 25
    assert area_ratio([line, flat], 20, 20) == 0.0
    assert union_area([bowtie], 20, 20) == pytest.approx(50)


def test_raster_method_agrees_with_the_exact_union_on_text_sized_boxes():
    rng = np.random.default_rng(0)
    for _ in range(20):
        polys = []
        for _ in range(rng.integers(1, 12)):
            x, y = rng.uniform(-20, 300), rng.uniform(-20, 220)
            w, h = rng.uniform(30, 160), rng.uniform(15, 50)
            polys.append(box(x, y, x + w, y + h))
        exact = area_ratio(polys, 320, 240, "shapely")
        raster = area_ratio(polys, 320, 240, "raster")
        # fillPoly also fills the pixels the outline passes through: never less, a little more.
        assert exact <= raster + 1e-9
        assert raster - exact < 0.02


def test_unknown_method_and_empty_frame_are_refused():
    with pytest.raises(ValueError):
        area_ratio([box(0, 0, 1, 1)], 10, 10, "sum")
    with pytest.raises(ValueError):
        area_ratio([box(0, 0, 1, 1)], 0, 10)
