"""The one threshold test (wdsfilter.core.thresholds) and the one atomic write (wdsfilter.storage.atomic)."""
import json
import os
import subprocess
import sys

import pytest

from wdsfilter.storage.atomic import atomic_path, is_temporary, remove_temporaries, temporary_path, write_json
from wdsfilter.core.errors import ConfigError
from wdsfilter.core.thresholds import Bound, Thresholds, parse_threshold


def test_bounds_pass_fail_and_missing_values():
    th = Thresholds.build({"clip_score": 0.28}, {"ocr_area": "0.2"})
    assert th.maxima == {"ocr_area": 0.2}
    assert th.passes({"clip_score": 0.28, "ocr_area": 0.2})  # bounds are inclusive
    assert not th.passes({"clip_score": 0.279, "ocr_area": 0.1})
    assert not th.passes({"clip_score": 0.5, "ocr_area": 0.21})
    for missing in (None, float("nan")):
        assert not th.passes({"clip_score": missing, "ocr_area": 0.1})
    assert not th.passes({"ocr_area": 0.1})  # no column at all: no score
    failure = th.first_failure({"clip_score": 0.1, "ocr_area": 0.9})
    assert (failure.column, failure.minimum) == ("clip_score", True)
    assert failure.explain(0.1) == "clip_score=0.1 < 0.28"
    assert th.first_failure({"clip_score": 0.3, "ocr_area": 0.9}).explain(0.9) == "ocr_area=0.9 > 0.2"
    assert th.describe() == "clip_score >= 0.28, ocr_area <= 0.2"
    assert th.columns() == ["clip_score", "ocr_area"]
    assert not Thresholds.build() and Thresholds.build().passes({})


@pytest.mark.parametrize("minima, maxima, message", [
    ({"clip_score": "high"}, None, "minimum threshold for 'clip_score' must be a number"),
    (None, {"ocr_area": float("nan")}, "maximum threshold for 'ocr_area' is NaN"),
    ({"x": 0.5}, {"x": 0.4}, "no sample can be kept: the minimum 0.5 of x is above its maximum 0.4"),
    ("not a mapping", None, "must map score columns to numbers"),
])
def test_bad_thresholds_are_config_errors(minima, maxima, message):
    with pytest.raises(ConfigError, match=message):
        Thresholds.build(minima, maxima)


def test_parse_threshold():
    assert parse_threshold(" clip_score = 0.28") == ("clip_score", 0.28)
    with pytest.raises(ConfigError, match=r"--max expects COLUMN=VALUE \(e.g. ocr_area=0.2\)"):
        parse_threshold("ocr_area", "--max")
    with pytest.raises(ConfigError, match="'x' is not a number"):
        parse_threshold("clip_score=x")


def test_atomic_write_leaves_no_temporary_on_error(tmp_path):
    dest = tmp_path / "table.json"
    with pytest.raises(RuntimeError):
        with atomic_path(str(dest)) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("writer failed")
    assert os.listdir(tmp_path) == []  # neither the destination nor the temporary
    write_json(str(dest), {"a": 1}, fsync=True)
    assert json.loads(dest.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["table.json"]


def test_a_killed_writers_temporary_is_recognised_and_removed(tmp_path):
    """A process killed between write and rename leaves `.<name>.tmp-<pid>`: the next run's
    cleanup finds it by name, for every kind of output (summary.json included)."""
    script = ("import os, sys; from wdsfilter.storage.atomic import atomic_path\n"
              "cm = atomic_path(sys.argv[1]); tmp = cm.__enter__(); open(tmp, 'w').write('x'); os._exit(0)")
    for name in ("summary.json", "00.parquet", "histograms.png"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], check=True)
    left = sorted(os.listdir(tmp_path))
    assert len(left) == 3 and all(is_temporary(n) for n in left)
    assert not is_temporary("summary.json") and is_temporary(os.path.basename(temporary_path("x/summary.json")))
    (tmp_path / "keep.json").write_text("{}")
    assert remove_temporaries(str(tmp_path)) == 3
    assert os.listdir(tmp_path) == ["keep.json"]


def test_filtering_judges_with_the_same_bounds():
    # wdsfilter filter's resolved thresholds are thresholds.Bound objects: one rule for both.
    from wdsfilter.runfolder.judge import Threshold, bounds, drop_reason
    ts = [Threshold(Bound("clip_score", 0.2, True), "--min clip_score=0.2"),
          Threshold(Bound("clip_score", 0.3, True), "--top clip_score=30%"),
          Threshold(Bound("ocr_area", 0.5, False), "--max ocr_area=0.5")]
    assert bounds(ts) == ({"clip_score": 0.3}, {"ocr_area": 0.5})
    ok = {"status": "scored", "clip_score": 0.3, "ocr_area": 0.5}
    assert drop_reason(ok, ts) is None and Thresholds.strictest(t.bound for t in ts).passes(ok)
    assert drop_reason({**ok, "clip_score": 0.25}, ts) == "clip_score < 0.3"
    assert drop_reason({**ok, "ocr_area": float("nan")}, ts) == "no ocr_area"
    assert drop_reason({**ok, "status": "failed", "reason": "scorer_error"}, ts) == "not scored: scorer_error"
    assert ts[0].passes(None) is None and ts[2].passes(0.6) is False


def test_shorthands_expand_once_the_same_for_score_filter_and_the_loader(tmp_path):
    """min_clip / max_ocr_area become clip_score / ocr_area bounds by one expansion: the scoring
    run's config, filter's command line and the loader's options give the same bounds (one
    wdsfilter.Selection, built from the same keywords everywhere)."""
    from wdsfilter.score import build_config
    from wdsfilter.core.selection import Selection, selection_of
    from wdsfilter.core.thresholds import expand_shorthands
    lo, hi = expand_shorthands({"clip_score": 0.1, "brightness": 0.5}, None, min_clip=0.28, max_ocr_area=0.2)
    assert (lo, hi) == ({"clip_score": 0.28, "brightness": 0.5}, {"ocr_area": 0.2})
    assert expand_shorthands(None, None, min_clip=None, max_ocr_area=None) == ({}, {})
    cfg = build_config(str(tmp_path / "out"), ("clip", "ocr"), min_clip=0.28, max_ocr_area=0.2,
                       min_scores={"brightness": 0.5})
    rules = cfg.selection
    assert (rules.minima, rules.maxima) == ({"brightness": 0.5, "clip_score": 0.28}, {"ocr_area": 0.2})
    loader_rules = selection_of(None, dict(min_clip=0.28, max_ocr_area=0.2, min_scores={"brightness": 0.5}),
                                "wdsfilter.loader")
    assert loader_rules == rules
    assert Selection.parse(["brightness=0.5"], ["ocr_area=0.2"]).merged(
        Selection.from_keywords(min_clip=0.28)) == rules
