"""The HTML report (report.html): self-contained, the right samples beside each threshold, dropped
rows per reason, written by `wdsfilter score` too, and rendered by a real browser (Debian's
chromium, headless) with every thumbnail decoded, round axis values, row counts on the y axis, no
label over another, and each card naming the threshold that dropped its row."""
import io
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from filterkit import all_rows, gnu_tar_shards, run_cli
from scorekit import BrightnessScorer

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")


class FramesScorer(BrightnessScorer):
    """Brightness, and a whole-number column of two values, as a video scorer's frame count is."""

    def columns(self):
        return super().columns() + ["bright_frames"]

    def score_batch(self, inputs):
        rows = super().score_batch(inputs)
        for row, i in zip(rows, inputs):
            row["bright_frames"] = 1 if int(i["key"][-2:]) % 4 == 0 else 3
        return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from wdsfilter.score import score
    folder = tmp_path_factory.mktemp("report")
    shards = gnu_tar_shards(str(folder), [24, 20], refused={(0, 5)}, corrupt={(1, 4)})
    out = str(folder / "scores")
    score(shards, out=out, scorers=[FramesScorer(fail_word="refuse-me")], device="cpu", progress=False, workers=0,
          batch_size=16, min_scores={"brightness": 0.35})
    return out, all_rows(out)


def browse(page, tmp_path, name, screenshot=True):
    """(the DOM after the page's script ran, the screenshot's pixels or None) from headless
    chromium. With $WDSFILTER_REPORT_SHOT set to a folder, the screenshot is taken and kept there
    as NAME.png (to look at it)."""
    from PIL import Image
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run(flags + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    keep = os.environ.get("WDSFILTER_REPORT_SHOT")
    if not (screenshot or keep):
        return dom.stdout, None
    shot = tmp_path / "report.png"
    r = subprocess.run(flags + ["--window-size=1200,1600", f"--screenshot={shot}", "file://" + page],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    if keep:
        shutil.copy(shot, os.path.join(keep, name + ".png"))
    return dom.stdout, np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"))


def section(page, title):
    """The HTML between a <p>title</p> and the next <p> or heading."""
    start = page.index(f"<p>{title}</p>")
    rest = page[start + len(title) + 7:]
    end = min([i for i in (rest.find("<p>"), rest.find("<h2"), rest.find("<h3")) if i >= 0] or [len(rest)])
    return rest[:end]


def keys_in(html):
    return re.findall(r'<div class="meta">([^<]+) in [^<]+</div>', html)


def test_score_writes_the_report_with_its_thresholds(run):
    out, rows = run
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert "brightness &gt;= 0.35 (--min brightness=0.35)" in page
    kept = sum(1 for r in rows if r["kept"])
    assert f"<b>{kept} of {len(rows)} kept</b>" in page


def test_report_is_self_contained_with_the_samples_beside_each_threshold(run, tmp_path):
    out, rows = run
    path = tmp_path / "r.html"
    r = run_cli("filter", out, "--top", "brightness=30%", "--report", str(path))
    assert r.returncode == 0, r.stderr
    page = path.read_text(encoding="utf-8")
    # No network: every image is a data: URI, no external script, style or link.
    assert not re.search(r'(src|href)="(?!data:)', page) and "http://" not in page and "https://" not in page
    imgs = re.findall(r'<img src="data:image/jpeg;base64,[A-Za-z0-9+/=]+"', page)
    assert len(imgs) >= 12
    scored = sorted(((r["brightness"], r["key"]) for r in rows if r["brightness"] is not None), reverse=True)
    cut = scored[math.ceil(len(scored) * 0.3) - 1][0]
    above = sorted((v, k) for v, k in scored if v >= cut)[:6]
    below = sorted(((v, k) for v, k in scored if v < cut), reverse=True)[:6]
    assert keys_in(section(page, f"at or just above {cut:.6g}:")) == [k for _, k in above]
    assert keys_in(section(page, f"just below {cut:.6g}:")) == [k for _, k in below]
    # Captions come from the source shards (gnu_tar_shards writes "caption I of shard S").
    for _, key in above:
        shard, index = key[1:].split("_")
        assert f">caption {int(index)} of shard {shard}</div>" in section(page, f"at or just above {cut:.6g}:")
    # Histogram and kept-share chart per column, the threshold drawn (line title and label) on both.
    assert page.count("<svg") == 2 and page.count(f"min {cut:.4g}<") == 4
    # Dropped rows per reason, with the rows that could not be scored.
    assert "<h3>not scored: caption_refused (1)</h3>" in page and "<h3>rejected: corrupt_image (1)</h3>" in page
    assert "refuse-me" in page




CARD = re.compile(r'<div class="card (kept|dropped)"[^>]*>.*?<div class="verdict">(.*?)</div>'
                  r'<div class="cap">.*?</div><div class="meta">(.*?) in [^<]*</div></div>', re.S)


def cards(dom):
    """[(border, verdict, key)] of every card in the DOM, in page order."""
    import html
    return [(b, html.unescape(v), html.unescape(k)) for b, v, k in CARD.findall(dom)]


def charts(dom):
    """{svg class: [svg markup, ...]} in page order."""
    out = {}
    for kind, body in re.findall(r'<svg class="([a-z-]+)"[^>]*>(.*?)</svg>', dom, re.S):
        out.setdefault(kind, []).append(body)
    return out


def ticks(svg, axis):
    """[(label, the label's y)] of one axis of a chart."""
    return [(t, float(y)) for y, t in re.findall(rf'<text class="tick {axis}" x="[^"]+" y="([^"]+)"[^>]*>([^<]*)</text>',
                                                 svg)]


def assert_round(labels, lo, hi):
    """The labels are every multiple of one round step (1, 2, 2.5 or 5 times a power of ten) from
    lo to hi, written with no more digits than the step needs."""
    values = [float(v) for v in labels]
    assert 3 <= len(values) <= 7, labels
    step = values[1] - values[0]
    assert np.allclose(np.diff(values), step, rtol=1e-6), labels
    exp = math.floor(math.log10(step) + 1e-6)
    mantissa = step / 10.0 ** exp
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10)), (labels, step)
    mantissa = min((1, 2, 2.5, 5, 10), key=lambda m: abs(m - mantissa))
    step = mantissa * 10.0 ** exp  # not the labels' difference: they are rounded
    multiples = range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)
    assert len(multiples) == len(values) and np.allclose(values, [k * step for k in multiples], rtol=1e-9), \
        (labels, lo, hi)
    digits = max(0, -exp + (math.isclose(mantissa, 2.5) and step < 10))
    assert all(len(v.partition(".")[2]) == digits for v in labels), labels


@needs_chromium
def test_a_real_browser_draws_round_axes_with_row_counts_and_no_label_over_another(run, tmp_path):
    """Score's report.html in headless chromium (what was looked at, with an image viewer, on the
    screenshot `browse` takes, kept with WDSFILTER_REPORT_SHOT=FOLDER as score-report.png): the
    histogram's y axis "rows per bin" reads 0, 1, 2, 3 and the bars reach those counts; the x axes
    read 0.2, 0.4, 0.6, 0.8 (brightness from 0.022 to 0.826), not 0.02235 .. 0.8264; the kept-share
    chart's title no longer sits on its 100% label; bright_frames is one "Counts" line, not a
    section; cards below the cut say "dropped: brightness < 0.35". Asserted here on the DOM chromium
    dumped (the page's script measured every text's box: data-overlaps) and on the screenshot's
    pixels."""
    out, rows = run
    page = os.path.join(out, "report.html")
    dom, image = browse(page, tmp_path, "score-report")
    n_imgs = open(page, encoding="utf-8").read().count("<img ")
    assert n_imgs > 0
    # The page's script counted the images the browser decoded (complete and naturalWidth > 0) and
    # the pairs of texts whose boxes overlap in any chart.
    assert f'data-images="ok {n_imgs}"' in dom, re.findall(r'data-images="[^"]*"', dom)
    assert 'data-overlaps="0"' in dom, re.findall(r'data-overlaps="[^"]*"', dom)
    values = [r["brightness"] for r in rows if r["brightness"] is not None]
    found = charts(dom)
    assert len(found["histogram"]) == len(found["kept-share"]) == 1  # bright_frames has no charts
    hist, share = found["histogram"][0], found["kept-share"][0]
    for svg in (hist, share):
        assert_round([t for t, _ in ticks(svg, "x")], min(values), max(values))
    # The y axis counts rows: 0 and round steps to a top at or above the tallest bar, whose height
    # is its count on that axis; the bars hold every row with a value.
    y = ticks(hist, "y")
    counts = [int(n) for n in re.findall(r": (\d+) rows</title></rect>", hist)]
    assert sum(counts) == len(values)
    labels = [int(t.replace(",", "")) for t, _ in y]
    assert labels[0] == 0 and len(set(np.diff(labels))) == 1 and labels[-1] - labels[1] < max(counts) <= labels[-1]
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([^"]+)"', hist)]
    axis_px = y[0][1] - y[-1][1]
    assert math.isclose(max(heights), axis_px * max(counts) / labels[-1], abs_tol=0.2)
    assert [t for t, _ in ticks(share, "y")] == ["0%", "25%", "50%", "75%", "100%"]
    # The whole-number column is one line with its values by rows.
    frames = [r["bright_frames"] for r in rows if r["bright_frames"] is not None]
    line = (f"bright_frames: 3 in {frames.count(3)} rows, 1 in {frames.count(1)} rows "
            f"(no value in {len(rows) - len(frames)})")
    assert re.search(r'<p class="counts">.*' + re.escape(line), dom) and "<h2>bright_frames</h2>" not in dom
    # Cards below the cut name the threshold that dropped their row.
    verdicts = {k: v for _, v, k in cards(dom)}
    by_key = {r["key"]: r for r in rows}
    below = [k for k, r in by_key.items() if r["brightness"] is not None and r["brightness"] < 0.35]
    assert {verdicts[k] for k in below if k in verdicts} == {"dropped: brightness < 0.35"}
    assert image.shape[:2] == (1600, 1200)
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50  # not blank
    bars = np.all(np.abs(image.astype(int) - (0x66, 0x99, 0xcc)) < 8, axis=-1).sum()
    assert bars > 500  # the histogram's bars were drawn


@needs_chromium
def test_each_card_names_the_threshold_that_dropped_its_row(run, tmp_path):
    """`filter --min brightness=0.35 --max brightness=0.4 --max bright_frames=2`: a card above the brightness cut whose
    row has 3 frames says "dropped: bright_frames > 2" (looked at in the screenshot,
    two-thresholds.png with WDSFILTER_REPORT_SHOT: green and red borders match the verdicts);
    bright_frames, now thresholded, gets its section, integer ticks."""
    out, rows = run
    path = tmp_path / "two.html"
    r = run_cli("filter", out, "--min", "brightness=0.35", "--max", "brightness=0.4", "--max", "bright_frames=2",
                "--report", str(path))
    assert r.returncode == 0, r.stderr
    dom, _ = browse(str(path), tmp_path, "two-thresholds", screenshot=False)
    assert 'data-overlaps="0"' in dom, re.findall(r'data-overlaps="[^"]*"', dom)
    by_key = {r["key"]: r for r in rows}
    seen = set()
    for border, verdict, key in cards(dom):
        row = by_key[key]
        if row["brightness"] is None:
            continue  # not scored: its own reason
        fails = [f for f, bad in (("brightness < 0.35", row["brightness"] < 0.35),
                                  ("brightness > 0.4", row["brightness"] > 0.4),
                                  ("bright_frames > 2", row["bright_frames"] > 2)) if bad]
        assert (verdict == "kept") == (not fails) == (border == "kept"), (key, verdict)
        assert not fails or verdict in {f"dropped: {f}" for f in fails}, (key, verdict, fails)
        seen.add(verdict)
    assert {"kept", "dropped: brightness < 0.35", "dropped: brightness > 0.4", "dropped: bright_frames > 2"} <= seen
    # the minimum's and the maximum's labels, 0.05 apart on one axis, one above the other (no overlap above)
    assert len(re.findall(r'<text class="cut"[^>]*>(?:min 0.35|max 0.4)</text>', dom)) == 4
    frames = charts(dom)["histogram"][1]
    assert [t for t, _ in ticks(frames, "x")] == ["1", "2", "3"]  # one bin per value


def test_tick_values_are_round_over_any_range():
    """nice_ticks over ranges of every scale (seeded random ones, the report's -0.08753 .. 0.8264,
    whole numbers, one value, the ends of the floats): round steps, every multiple in the range,
    the digits the step needs."""
    import sys

    from wdsfilter.report.charts import nice_ticks
    rng = np.random.default_rng(0)
    ranges = [(-0.08753, 0.8264), (0.02235, 0.8264), (0.21, 0.33), (0.0, 1.0), (-3.0, 250.0)]
    for _ in range(300):
        lo = float(rng.normal() * 10.0 ** rng.integers(-3, 6))
        ranges.append((lo, lo + float(rng.random() * 10.0 ** rng.integers(-3, 6)) + 1e-3))
    for lo, hi in ranges:
        labels = [t for _, t in nice_ticks(lo, hi, 7)]
        if len(labels) >= 3 and "e" not in "".join(labels):
            assert_round(labels, lo, hi)
        else:  # a narrow range far from zero, or a huge one: still multiples of one round step
            values = [v for v, _ in nice_ticks(lo, hi, 7)]
            assert 2 <= len(values) <= 7 and all(lo - 1e-9 * abs(lo) <= v <= hi + 1e-9 * abs(hi) for v in values)
    assert [t for _, t in nice_ticks(0.5, 3.5, 7, integer=True)] == ["1", "2", "3"]
    assert [t for _, t in nice_ticks(0, 13, 5, integer=True)] == ["0", "5", "10"]
    assert nice_ticks(0.4, 0.4 + 1e-9) == [(0.4, "0.4")]  # a column of one value
    big = nice_ticks(-sys.float_info.max, sys.float_info.max)
    assert len(big) == 5 and all(np.isfinite(v) for v, _ in big) and "nan" not in str(big)
