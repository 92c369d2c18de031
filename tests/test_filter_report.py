"""The HTML report (report.html): self-contained, the right samples beside each threshold, dropped
rows per reason, written by `wdsfilter score` too, and rendered by a real browser (Debian's
chromium, headless) with every thumbnail decoded."""
import io
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from filterkit import all_rows, gnu_tar_shards, run_cli, score_folder

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    shards = gnu_tar_shards(str(folder), [24, 20], refused={(0, 5)}, corrupt={(1, 4)})
    out = score_folder(shards, folder / "scores", min_scores={"brightness": 0.35})
    return out, all_rows(out)


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


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")
def test_a_real_browser_renders_every_thumbnail(run, tmp_path):
    from PIL import Image
    out, _ = run
    page = os.path.join(out, "report.html")
    n_imgs = open(page, encoding="utf-8").read().count("<img ")
    assert n_imgs > 0
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run(flags + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # The page's script counted the images the browser decoded (complete and naturalWidth > 0).
    assert f'data-images="ok {n_imgs}"' in dom.stdout, re.findall(r'data-images="[^"]*"', dom.stdout)
    shot = tmp_path / "report.png"
    r = subprocess.run(flags + ["--window-size=1200,1600", f"--screenshot={shot}", "file://" + page],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    image = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"))
    assert image.shape[:2] == (1600, 1200)
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50  # not blank
    bars = np.all(np.abs(image.astype(int) - (0x66, 0x99, 0xcc)) < 8, axis=-1).sum()
    assert bars > 500  # the histogram's bars were drawn
