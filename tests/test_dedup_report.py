"""The dedup section of report.html: after `wdsfilter dedup` on a real hash run over photos with
planted duplicates (scikit-image's, tests/dedupkit.py) and an eval folder, `wdsfilter filter
--report` shows the largest duplicate groups and the eval matches as rows of thumbnails read from
the shards, the same section `wdsfilter dedup` writes alone as RUN_DIR/dedup/report.html."""
import html
import json
import os
import re
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dedupkit import _photo, build, dedup_of_another_file, jpeg
from wdsfilter.cli import main

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """(run folder, truth {key: (photo, variant)}, eval folder): three photos with every planted
    variant and two distinct textures, one hash-only scoring run."""
    folder = tmp_path_factory.mktemp("dedup-report")
    shards, truth = build(folder / "shards", bases=("coffee", "rocket", "chelsea"), alikes=["brick", "grass"])
    cli("score", *shards, "--out", folder / "run", "--scorer", "hash", "--device", "cpu", "--no-progress",
        "--workers", "0", "--image-key", "jpg;png", "-q")
    evals = folder / "eval"
    evals.mkdir()
    (evals / "coffee.jpg").write_bytes(jpeg(_photo("coffee")))  # the very bytes of the original
    return str(folder / "run"), truth, str(evals)


def section(page):
    """The dedup section's HTML (from its heading to the end of the page's content)."""
    start = page.index('<h2 id="dedup">')
    return page[start:min(i for i in (page.find("<script>", start), page.find("</body>", start)) if i >= 0)]


def grids(part):
    """[(heading text, [(verdict, caption, key), ...])] of each row of cards after a heading."""
    out = []
    for head, grid in re.findall(r'<p(?: class="group")?>([^<]*)</p><div class="grid">(.*?</div></div>)</div>', part,
                                 re.S):
        cards = re.findall(r'<div class="card (?:kept|dropped)"[^>]*><img src="data:image/jpeg;base64,[^"]+"[^>]*>'
                           r'<div class="verdict">([^<]*)</div><div class="cap">([^<]*)</div>'
                           r'<div class="meta">([^<]*) in [^<]*</div></div>', grid)
        out.append((html.unescape(head), [tuple(html.unescape(x) for x in c) for c in cards]))
    return out


def marks(run):
    rows = {}
    for f in sorted(os.listdir(os.path.join(run, "dedup"))):
        if f.endswith(".parquet"):
            rows.update({r["key"]: r for r in pq.read_table(os.path.join(run, "dedup", f)).to_pylist()})
    return rows


def test_filter_report_shows_the_largest_groups_and_eval_matches_as_thumbnails(photos, tmp_path):
    run, truth, evals = photos
    before = tmp_path / "before.html"
    cli("filter", run, "--report", before)
    assert 'id="dedup"' not in before.read_text()  # no dedup yet: no section
    cli("dedup", run, "--eval", evals)
    page = tmp_path / "report.html"
    cli("filter", run, "--dedup", "--report", page)
    part = section(page.read_text())
    summary = json.load(open(os.path.join(run, "dedup", "summary.json")))
    got = marks(run)
    shown = grids(part)
    assert len(summary["largest"]) >= 3 and len(shown) == len(summary["largest"]) + 1
    for g, (head, cards) in zip(summary["largest"], shown):
        # each group: its size and kind, its members' thumbnails in order, the survivor named,
        # captions read from the shards
        assert head.startswith(f"group {g['group']}: {g['size']} rows ({g['kind']})")
        assert [k for _, _, k in cards] == [m["key"] for m in g["members"]]
        for (verdict, caption, key), member in zip(cards, g["members"]):
            assert (verdict == "survivor") == got[key]["survivor"] and got[key]["group"] == g["group"]
            if verdict != "survivor":  # each card: its phash distance to the survivor (issue 35 item 12)
                bits = member["bits"]
                assert verdict == f"duplicate (not the survivor): {bits} bit{'s' * (bits != 1)} from the survivor"
                assert bits <= 5
            assert caption == "a photo ({}, {})".format(*truth[key])
        assert len({truth[k][0] for _, _, k in cards}) == 1  # a group is one photo
    head, cards = shown[-1]
    matched = {k: r["eval_match"] for k, r in got.items() if r["eval_match"]}
    assert matched and {truth[k][0] for k in matched} == {"coffee"}
    assert sorted((k, v) for v, _, k in cards) == sorted((k, f"eval match: {m}") for k, m in matched.items())
    assert "eval image(s) compared" in part and "exact" in part and "near" in part
    # One section, two pages: dedup's own report.html holds the same markup.
    assert section(open(os.path.join(run, "dedup", "report.html")).read()) == part
    if CHROMIUM:  # every thumbnail decodes in a real browser
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                              f"file://{page}"], capture_output=True, text=True, timeout=120)
        n = page.read_text().count("<img ")
        assert f'data-images="ok {n}"' in dom.stdout, re.findall(r'data-images="[^"]*"', dom.stdout)
    # A dedup older than the scores is still shown, under a note saying so.
    dedup_of_another_file(run)
    cli("filter", run, "--report", page)
    part = section(page.read_text())
    assert re.search(r'<p class="note">the dedup in .* is older than the score files of 1 shard', part)
    assert len(grids(part)) == len(shown)
