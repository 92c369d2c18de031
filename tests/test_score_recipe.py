"""One recipe file for a whole run (issue 24, item 4): `--config run.yaml` with shards, scorers
and their options, thresholds, stage options and engine; the command line overrides it; every run
writes its resolved recipe to OUT/run.yaml and `score --config OUT/run.yaml` runs it again."""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.score.recipe import RECIPE_FILE, read_recipe

SCORER = "scorekit:BrightnessScorer"


def cli(*args):
    return CliRunner().invoke(main, ["score", *args, "--device", "cpu", "--workers", "0", "-q"])


def table(out):
    rows = []
    for name in sorted(os.listdir(os.path.join(out, "scores"))):
        t = pq.read_table(os.path.join(out, "scores", name)).to_pydict()
        rows += list(zip(t["key"], t["brightness"], t["kept"]))
    return rows


def test_a_run_writes_its_recipe_and_the_recipe_runs_it_again(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [3, 4])
    first = str(tmp_path / "first")
    result = cli(*urls, "--scorer", SCORER, "--scorer-opt", "bright.size=4", "--min", "brightness=0.3",
                 "--caption-key", "txt;json:caption", "--out", first)
    assert result.exit_code == 0, result.output
    recipe = read_recipe(os.path.join(first, RECIPE_FILE))
    assert recipe["shards"] == [os.path.abspath(u) for u in urls] and recipe["scorers"] == [SCORER]
    assert recipe["scorer_options"] == {"bright": {"size": 4}}
    assert recipe["thresholds"] == {"min": {"brightness": 0.3}}  # only the rules set (wdsfilter.Selection.to_dict)
    assert recipe["stage"] == {"caption_key": "txt;json:caption"} and recipe["device"] == "cpu" and recipe["engine"] == "local"
    again = str(tmp_path / "again")
    replay = cli("--config", os.path.join(first, RECIPE_FILE), "--out", again)  # no shard, no scorer given
    assert replay.exit_code == 0, replay.output
    assert table(again) == table(first) and any(kept for _, _, kept in table(first))
    assert not all(kept for _, _, kept in table(first))
    second = read_recipe(os.path.join(again, RECIPE_FILE))
    assert {**second, "out": None} == {**recipe, "out": None}
    # Into its own folder it refuses as any run does, and --overwrite replays it there.
    refused = cli("--config", os.path.join(first, RECIPE_FILE))
    assert refused.exit_code == 2, refused.output
    assert cli("--config", os.path.join(again, RECIPE_FILE), "--overwrite").exit_code == 0


def test_a_yaml_recipe_with_the_command_line_over_it(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [3, 4])
    recipe = tmp_path / "run.yaml"
    recipe.write_text(f"""# the whole run in one file
shards: {json.dumps(urls)}
out: {tmp_path / 'out'}
scorers: [{SCORER}]
scorer_options:
  bright: {{size: 4}}
thresholds:
  min: {{brightness: 0.9}}
stage:
  caption_key: txt
""")
    result = cli("--config", str(recipe), "--min", "brightness=0.2", "--scorer-opt", "bright.size=2")
    assert result.exit_code == 0, result.output
    resolved = read_recipe(str(tmp_path / "out" / RECIPE_FILE))
    assert resolved["thresholds"]["min"] == {"brightness": 0.2}  # the command line's, not the file's 0.9
    assert resolved["scorer_options"] == {"bright": {"size": 2}}
    summary = json.load(open(tmp_path / "out" / "summary.json"))
    assert summary["rows"] == 7 and summary["thresholds"]["brightness"]["min"] == 0.2


def test_a_stage_options_file_is_still_a_config_and_a_wrong_key_is_one_line(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [3])
    stage = tmp_path / "stage.json"
    stage.write_text(json.dumps({"caption_key": "txt;json:caption"}))
    ok = cli(*urls, "--scorer", SCORER, "--config", str(stage), "--out", str(tmp_path / "a"))
    assert ok.exit_code == 0, ok.output
    assert read_recipe(str(tmp_path / "a" / RECIPE_FILE))["stage"] == {"caption_key": "txt;json:caption"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("scorers: [clip]\nmin_clip: 0.3\n")
    result = cli(*urls, "--config", str(bad), "--out", str(tmp_path / "b"))
    assert result.exit_code == 2 and "unknown key(s) ['min_clip']" in result.output
    assert len([line for line in result.output.splitlines() if "error" in line]) == 1
    nothing = cli("--config", str(stage), "--out", str(tmp_path / "c"))
    assert nothing.exit_code == 2 and "no SHARDS" in nothing.output


def test_filter_takes_the_threshold_shorthands_of_score(tmp_path):
    """--min-clip/--max-ocr-area are --min clip_score=X/--max ocr_area=X on filter as on score."""
    urls, _ = make_shards(tmp_path / "shards", [3])
    out = str(tmp_path / "out")
    assert cli(*urls, "--scorer", SCORER, "--out", out).exit_code == 0
    for short, long in ((["--min-clip", "0.3"], ["--min", "clip_score=0.3"]),
                        (["--max-ocr-area", "0.1"], ["--max", "ocr_area=0.1"])):
        a = CliRunner().invoke(main, ["filter", out, "--dry-run", *short])
        b = CliRunner().invoke(main, ["filter", out, "--dry-run", *long])
        assert a.exit_code == b.exit_code == 2 and a.output == b.output, (a.output, b.output)
        assert long[1].split("=")[0] in a.output
    kept = CliRunner().invoke(main, ["filter", out, "--dry-run", "--min", "brightness=0", "--min-clip", "0.3"])
    assert kept.exit_code == 2 and "clip_score" in kept.output  # joined to the --min given, not in place of it


def test_score_top_keeps_what_filter_top_keeps_and_its_recipe_replays_it(tmp_path):
    """`score --top COL=P%` (issue 24 item 4): the share resolved over the run when it ends, the
    run's kept count the one `filter RUN --top COL=P%` gives; run.yaml carries it (top:), and the
    replay resolves the same cut; the command line's share replaces the recipe's."""
    urls, _ = make_shards(tmp_path / "shards", [5, 6])
    first = str(tmp_path / "first")
    result = CliRunner().invoke(main, ["score", *urls, "--scorer", SCORER, "--top", "brightness=30%", "--out", first,
                                       "--device", "cpu", "--workers", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "--top brightness=30%: 4 of the 11 rows with a brightness -> brightness >=" in result.output
    quiet = cli(*urls, "--scorer", SCORER, "--top", "brightness=30%", "--out", str(tmp_path / "quiet"))
    assert quiet.output.strip().splitlines() == [quiet.output.strip()] and quiet.output.startswith("scored 11 of 11")
    summary = json.load(open(os.path.join(first, "summary.json")))
    filtered = CliRunner().invoke(main, ["filter", first, "--top", "brightness=30%", "--dry-run"])
    assert filtered.exit_code == 0, filtered.output
    assert f"all thresholds: {summary['kept']} of 11 kept" in filtered.output and summary["kept"] >= 4
    cut = summary["thresholds"]["brightness"]["min"]
    assert cut == sorted(b for _, b, _ in table(first))[-4]  # the 4th largest of 11: ceil(30% of 11)
    recipe = read_recipe(os.path.join(first, RECIPE_FILE))
    assert recipe["thresholds"] == {"top": {"brightness": 30.0}}
    again = str(tmp_path / "again")
    assert cli("--config", os.path.join(first, RECIPE_FILE), "--out", again).exit_code == 0
    assert json.load(open(os.path.join(again, "summary.json")))["thresholds"] == summary["thresholds"]
    over = str(tmp_path / "over")
    assert cli("--config", os.path.join(first, RECIPE_FILE), "--out", over, "--top", "brightness=60%").exit_code == 0
    assert read_recipe(os.path.join(over, RECIPE_FILE))["thresholds"]["top"] == {"brightness": 60.0}
    assert json.load(open(os.path.join(over, "summary.json")))["kept"] >= 7  # ceil(60% of 11)
