"""One keep rule (wdsfilter/runfolder/keep.py) for the three deciders: a real scoring run's `kept`
column (and its filtered shards), `wdsfilter filter` (the shards it writes) and
`wdsfilter.loader(scores=...)` (the samples it yields) keep the same samples, with and without
thresholds, over scored, partial, failed and rejected rows and a shard no sample of which could be
scored. Before, without thresholds, score kept only scored rows, filter scored and partial ones,
and the loader every sample with a row (failed and rejected ones too)."""
import os
import shutil

import pytest

from scorekit import BrightnessScorer, ByteLengthScorer
from shardkit import image_bytes, write_shard
from wdsfilter.runfolder import keep_reason
from wdsfilter.runfolder.tables import read_rows
from wdsfilter.core.thresholds import Thresholds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCORERS = [BrightnessScorer(fail_word="refuse-me"), ByteLengthScorer()]
# (min_scores, max_scores): none; one that drops some scored rows; one whose column the partial
# rows lack (so they are dropped as "no caption_bytes"); both
THRESHOLDS = [({}, {}), ({"brightness": 0.3}, {}), ({}, {"caption_bytes": 8}),
              ({"brightness": 0.3}, {"caption_bytes": 8})]


def mixed_members(n, prefix, every_failed=False):
    """Per 4 samples: scored, partial (caplen refuses), failed (both refuse), rejected (corrupt
    JPEG); every_failed: every sample refused by both scorers (an unscorable shard)."""
    members = []
    for i in range(n):
        key, caption = f"{prefix}{i:03d}", f"sample {i}"
        if every_failed or i % 4 == 2:
            caption += " refuse-me skip-caplen"
        elif i % 4 == 1:
            caption += " skip-caplen"
        data = (b"\xff\xd8\xff\xe0 not a jpeg" if i % 4 == 3 and not every_failed
                else image_bytes(size=(24 + i, 20), color=(20 * i % 256, 90, 30)))
        members += [(f"{key}.jpg", data), (f"{key}.txt", caption)]
    return members


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keep")
    return [write_shard(str(folder / "mixed-000000.tar"), mixed_members(12, "m")),
            write_shard(str(folder / "unscorable-000000.tar"), mixed_members(5, "u", every_failed=True)),
            # images only: every video sample is rejected (missing_image)
            shutil.copy(os.path.join(ROOT, "sample_shards", "videos-000000.tar"), folder / "videos-000000.tar")]


def score_kept(out):
    folder = os.path.join(out, "scores")
    rows = [r for f in sorted(os.listdir(folder)) for r in read_rows(os.path.join(folder, f))]
    return rows, {r["key"] for r in rows if r["kept"]}


def tar_keys(folder):
    import webdataset as wds
    tars = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".tar"))
    return {s["__key__"] for s in wds.WebDataset(tars, shardshuffle=False)} if tars else set()


def loader_kept(shards, out, mins, maxes):
    import wdsfilter
    loader = wdsfilter.loader([str(s) for s in shards], batch_size=1, output="dict", scores=out,
                              min_scores=mins, max_scores=maxes)
    return {s["__key__"] for batch in loader for s in batch}


@pytest.mark.parametrize("mins,maxes", THRESHOLDS)
def test_score_filter_and_loader_keep_the_same_samples(shards, tmp_path, mins, maxes):
    from wdsfilter.filtering import filter_scores
    from wdsfilter.score import score
    out = str(tmp_path / "out")
    score([str(s) for s in shards], out=out, scorers=SCORERS, device="cpu", progress=False, workers=0,
          batch_size=16, min_scores=mins, max_scores=maxes, write_shards=str(tmp_path / "scored"))
    rows, by_score = score_kept(out)
    assert {r["status"] for r in rows} == {"scored", "partial", "failed", "rejected"}
    # the rule, spelled out: scored or partial, and every threshold column within its bounds
    th = Thresholds.build(mins, maxes)
    expected = {r["key"] for r in rows if r["status"] in ("scored", "partial")
                and all(r[c] is not None for c in th.columns()) and th.passes(r)}
    assert by_score == expected and by_score == {r["key"] for r in rows if keep_reason(r, th) is None}
    assert not any(k.startswith("u") for k in by_score)  # the unscorable shard gives nothing
    assert tar_keys(str(tmp_path / "scored")) == by_score  # score --write-shards

    result = filter_scores(out, min_scores=mins, max_scores=maxes, write_shards=str(tmp_path / "filtered"),
                           report=None)
    assert result.kept == len(by_score) and tar_keys(str(tmp_path / "filtered")) == by_score
    assert loader_kept(shards, out, mins, maxes) == by_score
    if not mins and not maxes:  # no threshold: every row some scorer scored, partial ones included
        assert any(r["status"] == "partial" and r["key"] in by_score for r in rows)


def test_keep_reason_says_why():
    th = Thresholds.build({"a": 0.5}, {"b": 1})
    assert keep_reason({"status": "scored", "a": 0.6, "b": 1}, th) is None
    assert keep_reason({"status": "failed", "reason": "caption_refused"}, None).reason == "not scored: caption_refused"
    rejected = keep_reason({"status": "rejected", "reason": "corrupt_image"}, th)
    assert rejected.reason == "rejected: corrupt_image" and rejected.no_score
    missing = keep_reason({"status": "partial", "a": None, "b": 0}, th)
    assert missing.reason == "no a" and missing.no_score
    text = keep_reason({"status": "scored", "a": "0.9", "b": 0}, th)  # a string in a hand-edited table
    assert text.reason == "no a" and text.no_score
    low = keep_reason({"status": "scored", "a": 0.1, "b": 0}, th)
    assert low.reason == "a < 0.5" and not low.no_score and low.explain({"a": 0.1}) == "a=0.1 < 0.5"
    assert keep_reason({"status": "scored", "a": float("nan"), "b": 0}, th).no_score


@pytest.mark.slow
def test_the_ray_engine_keeps_what_filter_and_the_loader_keep(shards, tmp_path):
    """The same run on Ray: its `kept` column is the one rule's, with and without thresholds."""
    pytest.importorskip("ray")
    from raykit import local_ray
    from wdsfilter.filtering import filter_scores
    from wdsfilter.score import score_on_ray
    with local_ray():
        for n, (mins, maxes) in enumerate((THRESHOLDS[0], THRESHOLDS[3])):
            out = str(tmp_path / f"ray{n}")
            score_on_ray([str(s) for s in shards], out=out, scorers=SCORERS, progress=False, batch_size=16,
                         min_scores=mins, max_scores=maxes)
            rows, by_score = score_kept(out)
            assert by_score == {r["key"] for r in rows if keep_reason(r, Thresholds.build(mins, maxes)) is None}
            assert by_score and any(r["status"] == "failed" for r in rows)
            result = filter_scores(out, min_scores=mins, max_scores=maxes, write_shards=str(tmp_path / f"f{n}"),
                                   report=None)
            assert tar_keys(str(tmp_path / f"f{n}")) == by_score and result.kept == len(by_score)
            assert loader_kept(shards, out, mins, maxes) == by_score


@pytest.mark.parametrize("tops,bottoms,mins", [({"brightness": 40}, {}, {}),
                                                ({"brightness": 50}, {"caption_bytes": 70}, {"brightness": 0.2})],
                         ids=["top", "top-bottom-min"])
def test_score_with_a_share_keeps_what_filter_and_the_loader_keep(shards, tmp_path, tops, bottoms, mins):
    """`score --top/--bottom`: the shares are resolved over the run's rows when it ends, by the
    code `filter` resolves them with; the run's kept count, its thresholds.json, `filter --top`
    and the loader (its top_shares, or thresholds.json's bounds) keep the same samples."""
    import json

    from wdsfilter.filtering import filter_scores
    from wdsfilter.score import score
    out = str(tmp_path / "out")
    score([str(s) for s in shards], out=out, scorers=SCORERS, device="cpu", progress=False, workers=0,
          batch_size=16, min_scores=mins, top_shares=tops, bottom_shares=bottoms)
    rows, _ = score_kept(out)
    # the rule, spelled out: the k-th largest (smallest) value of the rows with a value, k = ceil(P% of them)
    lo, hi = dict(mins), {}
    for shares, top in ((tops, True), (bottoms, False)):
        for c, p in shares.items():
            values = sorted((r[c] for r in rows if r[c] is not None), reverse=top)
            cut = values[-(-len(values) * p // 100) - 1]
            (lo if top else hi)[c] = max(lo.get(c, cut), cut) if top else cut
    expected = {r["key"] for r in rows if keep_reason(r, Thresholds.build(lo, hi)) is None}
    assert expected and len(expected) < sum(r["status"] in ("scored", "partial") for r in rows)

    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["kept"] == len(expected)
    saved = json.load(open(os.path.join(out, "thresholds.json")))
    assert saved == {"min_scores": lo, "max_scores": hi}
    result = filter_scores(out, min_scores=mins, top_shares=tops, bottom_shares=bottoms,
                           write_shards=str(tmp_path / "filtered"), report=None)
    assert result.kept == len(expected) and tar_keys(str(tmp_path / "filtered")) == expected
    assert loader_kept(shards, out, saved["min_scores"], saved["max_scores"]) == expected
    import wdsfilter
    loader = wdsfilter.loader([str(s) for s in shards], batch_size=1, output="dict", scores=out, min_scores=mins,
                              top_shares=tops, bottom_shares=bottoms)
    assert {s["__key__"] for batch in loader for s in batch} == expected
