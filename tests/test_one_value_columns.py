"""A score column of one value (every ocr_area 0 on images without text, seen on the first GPU
run) is said in words: the terminal summary prints "all N values are V" instead of 20 bins of an
axis of no width (0 .. 1e-09, labelled with values no row has), histograms.png writes the same
line in its panel, and report.html gives it that line instead of charts. A column of one value
and missing ones (NaN, None) counts its values only; a column of missing values only says so."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from scorekit import make_shards
from wdsfilter.cli import main

BAR = (90, 130, 200)  # statistics.plot_histograms' bar colour
PANEL = 180  # its panel height


@pytest.fixture(scope="module", params=["parquet", "jsonl"])
def run(request, tmp_path_factory):
    """`wdsfilter score` of 12 samples in 2 shards with FlatScorer's four columns beside the
    brightness (a column of many values): (its printed output, the output folder)."""
    folder = tmp_path_factory.mktemp(f"flat-{request.param}")
    urls, _ = make_shards(str(folder / "data"), [7, 5])
    out = str(folder / "out")
    r = CliRunner().invoke(main, ["score", *urls, "--scorer", "scorekit:FlatScorer", "--scorer",
                                  "scorekit:BrightnessScorer", "--out", out, "--device", "cpu", "--workers", "0",
                                  "--no-progress", "--format", request.param, "--min", "flat=0"])
    assert r.exit_code == 0, r.output
    return r.output, out, request.param


def test_the_summary_prints_one_line_for_a_column_of_one_value(run):
    output, _, _ = run
    lines = output.splitlines()

    # one line each, no statistics line and no histogram (issue 35 item 6)
    assert "  flat: all 12 values are 0" in lines and "  flat_int: all 12 values are 3" in lines
    # 0.25 in every third sample, NaN or None (null in JSONL) in the others: 5 of the 12 have a value
    assert "  flat_gaps: all 5 values are 0.25" in lines and not any(ln.startswith("  flat: n=") for ln in lines)
    assert "  no_value: no values" in lines
    assert "e-09" not in output and "e-10" not in output  # no bin edge of the widened range
    # the column of many values keeps its 20 bins, all 12 rows in them
    head = next(i for i, line in enumerate(lines) if line.startswith("  brightness: n=12 "))
    bins = lines[head + 1:head + 21]
    assert all(" .. " in b for b in bins) and sum(int(b.split()[3]) for b in bins) == 12
    assert "  flat >= 0: kept 12, dropped 0" in lines


def test_summary_json_marks_the_one_value_and_counts_every_row_in_its_bin(run):
    _, out, _ = run
    columns = json.load(open(os.path.join(out, "summary.json")))["columns"]
    for col, value, n in (("flat", 0, 12), ("flat_int", 3, 12), ("flat_gaps", 0.25, 5)):
        hist = columns[col]["histogram"]
        assert hist["one_value"] == value and hist["counts"] == [n], (col, hist)
    assert "one_value" not in columns["brightness"]["histogram"]
    assert columns["no_value"]["count"] == 0 and "histogram" not in columns["no_value"]


def test_histograms_png_draws_no_axis_for_a_column_of_one_value(run):
    _, out, _ = run
    img = np.asarray(Image.open(os.path.join(out, "histograms.png")).convert("RGB")).astype(int)
    # one panel per column with a histogram, in the summary's order: flat, flat_int, flat_gaps, brightness
    assert img.shape[0] == 4 * PANEL
    panels = [img[k * PANEL:(k + 1) * PANEL] for k in range(4)]
    bars = [(p == BAR).all(axis=2).any() for p in panels]
    assert bars == [False, False, False, True]  # brightness still has its bars
    for k in range(3):  # two lines of text (the title, the value) and no axis across the panel
        dark_columns = np.nonzero((panels[k].sum(axis=2) < 300).any(axis=0))[0]
        dark_rows = np.nonzero((panels[k].sum(axis=2) < 300).any(axis=1))[0]
        assert len(dark_columns) and dark_columns.max() < img.shape[1] // 2, k
        assert len(dark_rows) and np.count_nonzero(np.diff(dark_rows) > 1) == 1, k


def test_report_html_says_the_one_value_instead_of_drawing_charts(run):
    _, out, fmt = run
    page = open(os.path.join(out, "report.html")).read()

    def section(col):
        start = page.index(f"<h2>{col}</h2>")
        return page[start:page.index("<h2>", start + 1)]
    assert '<p class="meta">all 12 values are 0</p>' in section("flat")
    assert '<p class="meta">all 5 values are 0.25</p>' in section("flat_gaps")
    if fmt == "parquet":  # a float column of NaNs; in JSON Lines its nulls hold no number: no score column
        assert '<p class="meta">no values</p>' in section("no_value")
    else:
        assert "<h2>no_value</h2>" not in page
    for col in ("flat", "flat_gaps"):
        assert "<svg" not in section(col), col
    assert "flat = 0" in section("flat")  # the examples beside its threshold are still shown
    assert section("brightness").count("<svg") == 2  # its histogram and kept share
    # a whole-number column of one value and no threshold: the counts line, as any count column
    assert "flat_int: 3 in 12 rows" in page


def test_a_column_of_a_single_row_says_one_value(tmp_path):
    urls, _ = make_shards(str(tmp_path / "data"), [1])
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, ["score", *urls, "--scorer", "scorekit:FlatScorer", "--out", out, "--device", "cpu",
                                  "--workers", "0", "--no-progress"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "  flat_gaps: one value: 0.25" in lines
    assert '<p class="meta">one value: 0.25</p>' in open(os.path.join(out, "report.html")).read()
