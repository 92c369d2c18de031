"""The report's SVG charts of a score column: its histogram and the share a minimum (or maximum)
at each value would keep, with round values on the axes (nice_ticks) and the thresholds drawn."""
from __future__ import annotations

import math
from typing import List, Tuple

from .html import escape
from .statistics import position, step

W, H = 640, 190  # chart size in SVG units
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 20, 30  # margins: the y labels, the x labels, the axis titles

def _x(v: float, lo: float, hi: float) -> float:
    return LEFT + (W - LEFT - RIGHT) * (position(min(max(v, lo), hi), lo, hi) if hi > lo else 0.5)


def _y(share: float) -> float:
    """The height of `share` (0 at the x axis, 1 at the top of the plot)."""
    return (H - BOTTOM) - (H - BOTTOM - TOP) * share


NICE = (1, 2, 2.5, 5, 10)


def nice_ticks(lo: float, hi: float, most: int = 6, integer: bool = False) -> List[Tuple[float, str]]:
    """(value, label) of at most `most` round values from lo to hi: multiples of a step that is
    1, 2, 2.5 or 5 times a power of ten (0.1, 0.25, 0.5, 2, 500, ...), labelled with the digits
    the step needs; integer: steps of 1 or more, without 2.5. A range too narrow to divide (a
    column of one value) gets its one value; one whose width overflows, 5 steps labelled short."""
    span = hi - lo
    if not math.isfinite(span):
        return [(step(lo, hi, i, 4), f"{step(lo, hi, i, 4):.3g}") for i in range(5)]
    if span <= 2e-9 * max(1.0, abs(lo)):  # histogram_bins widens a one-value column by 1e-9
        return [(lo, f"{lo:.6g}")]
    raw = span / (most - 1)  # a step this large or larger leaves at most `most` values in the range
    exp = math.floor(math.log10(raw))
    for m in NICE:
        if integer and m == 2.5:
            continue
        if m * 10.0 ** exp >= raw * (1 - 1e-9):
            break
    if m == 10:
        m, exp = 1, exp + 1
    size = max(m * 10.0 ** exp, 1.0) if integer else m * 10.0 ** exp
    digits = 0 if integer else max(0, -exp + (1 if m == 2.5 else 0))
    out = []
    for k in range(math.ceil(lo / size - 1e-9), math.floor(hi / size + 1e-9) + 1):
        v = k * size + 0.0  # -0.0 reads "0"
        if abs(v) < 1e7 and digits <= 6:
            label = f"{v:.{digits}f}"
        else:  # as many significant digits as the step needs: 1e+308, 5e+307, 1.2345e-07
            sig = math.floor(math.log10(abs(v))) - exp + 1 + (m == 2.5) if v else 1
            label = f"{v:.{min(max(sig, 1), 17)}g}"
        out.append((v, label))
    return out


def _x_axis(lo: float, hi: float, integer: bool) -> List[str]:
    parts = [f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#999"/>']
    for v, label in nice_ticks(lo, hi, 7, integer):
        x = _x(v, lo, hi)
        parts.append(f'<line x1="{x:.1f}" y1="{H - BOTTOM}" x2="{x:.1f}" y2="{H - BOTTOM + 4}" stroke="#999"/>'
                     f'<text class="tick x" x="{x:.1f}" y="{H - BOTTOM + 15}" font-size="10" '
                     f'text-anchor="middle">{label}</text>')
    return parts


def _y_axis(ticks: List[Tuple[float, str]], top: float, title: str) -> List[str]:
    """Grid lines and labels of the y axis (values 0 .. top), its title above the plot's left corner."""
    parts = [f'<text class="axis-title" x="4" y="11" font-size="10">{escape(title)}</text>']
    for v, label in ticks:
        y = _y(v / top)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#e6e6e6"/>'
                     f'<text class="tick y" x="{LEFT - 5}" y="{y + 3.5:.1f}" font-size="10" '
                     f'text-anchor="end">{label}</text>')
    return parts


def _threshold_lines(cuts: List[tuple], lo: float, hi: float) -> List[str]:
    """Each threshold's dashed line, then the labels over every line (a minimum and a maximum on
    one axis: labels one above the other, each with a halo, readable over bars and lines)."""
    lines, labels = [], []
    for i, (value, label, color) in enumerate(cuts):
        x = _x(min(max(value, lo), hi), lo, hi)
        right = x > W - RIGHT - 90  # near the right edge the label goes left of its line
        lines.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="5,3"><title>{escape(label)}</title></line>')
        labels.append(f'<text class="cut" x="{x - 3 if right else x + 3:.1f}" y="{TOP + 10 + 12 * i}" font-size="10" '
                      f'fill="{color}" text-anchor="{"end" if right else "start"}" stroke="#fafafa" stroke-width="3" '
                      f'paint-order="stroke">{escape(label)}</text>')
    return lines + labels


def _svg(parts: List[str], kind: str) -> str:
    return f'<svg class="{kind}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">{"".join(parts)}</svg>'


def histogram_svg(hist: dict, cuts: List[tuple]) -> str:
    """Rows per bin: bars, the y axis in rows (round counts up to a round top), the x axis in round
    values of the column, the thresholds."""
    edges, counts = hist["edges"], hist["counts"]
    lo, hi = edges[0], edges[-1]
    ticks = nice_ticks(0, max(max(counts), 1), 5, integer=True)
    size = ticks[1][0] - ticks[0][0] if len(ticks) > 1 else 1
    top = max(size * math.ceil(max(counts) / size), 1)  # the axis ends on a tick
    ticks = [(i * size, f"{int(i * size):,}") for i in range(int(top // size) + 1)]
    parts = _y_axis(ticks, top, "rows per bin") + _x_axis(lo, hi, bool(hist.get("per_value")))
    for i, c in enumerate(counts):
        x0, x1 = _x(edges[i], lo, hi), _x(edges[i + 1], lo, hi)
        parts.append(f'<rect x="{x0:.1f}" y="{_y(c / top):.1f}" width="{max(x1 - x0 - 1, 0.5):.1f}" '
                     f'height="{_y(0) - _y(c / top):.1f}" fill="#69c"><title>{edges[i]:.4g} .. {edges[i + 1]:.4g}: '
                     f'{c} rows</title></rect>')
    return _svg(parts + _threshold_lines(cuts, lo, hi), "histogram")


def kept_share_svg(hist: dict, cuts: List[tuple], minimum: bool) -> str:
    """Share of the rows with a value that a minimum (or maximum) at x would keep."""
    edges, counts = hist["edges"], hist["counts"]
    total = sum(counts) or 1
    lo, hi = edges[0], edges[-1]
    points = []
    for i, x in enumerate(edges):
        kept = sum(counts[i:]) if minimum else sum(counts[:i])
        points.append(f"{_x(x, lo, hi):.1f},{_y(kept / total):.1f}")
    ticks = [(f, f"{f:.0%}") for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    parts = _y_axis(ticks, 1.0, f"share kept by {'a minimum' if minimum else 'a maximum'} at x")
    parts += _x_axis(lo, hi, bool(hist.get("per_value")))
    parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#284" stroke-width="2"/>')
    return _svg(parts + _threshold_lines(cuts, lo, hi), "kept-share")
