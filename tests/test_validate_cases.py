"""Each broken case of sample_shards/broken/MANIFEST.json on its own (committed and generated
afresh), each finding complete (shard, member, key, severity), and kept shares per shard and
overall."""
import json
import os
from collections import Counter

import pytest

from shardkit import image_bytes, write_shard
from tools import make_sample_shards as mss
from wdsfilter.validate import validate
from wdsfilter.validate.findings import KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")
BROKEN_OPTIONS = dict(caption_key="txt;json:caption", image_key="jpg;png;mp4", image_token="<__dj__image>")

with open(os.path.join(BROKEN, "MANIFEST.json"), encoding="utf-8") as _f:
    MANIFEST = json.load(_f)
CASES = {c["case"]: c for c in MANIFEST["cases"]}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fresh")
    return str(folder / "broken"), {c["case"]: c for c in mss.write_broken(str(folder))["cases"]}


def check_case(folder, case):
    report = validate([os.path.join(folder, s) for s in case["shards"]], jobs=1, **BROKEN_OPTIONS)
    got = Counter((f.kind, os.path.basename(f.shard), f.member, f.key) for f in report.findings)
    want = Counter((e["kind"], e["shard"], e["member"], e["key"]) for e in case["expect"])
    assert got == want, case["case"]
    for f in report.findings:
        assert f.shard and f.member and f.message and f.severity == KINDS[f.kind][0]
        assert f.key or f.kind == "dotfile"  # a dotfile belongs to no key
    assert report.counts == Counter(e["kind"] for e in case["expect"])
    errors = any(KINDS[e["kind"]][0] == "error" for e in case["expect"])
    assert report.exit_code == (1 if errors else 0) and 0 < report.kept < report.samples + 1
    return report


@pytest.mark.parametrize("name", sorted(CASES))
def test_committed_case(name):
    check_case(BROKEN, CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_fresh_case(name, fresh):
    folder, cases = fresh
    assert cases[name] == CASES[name]  # the generator still writes what the manifest says
    check_case(folder, cases[name])


def test_every_finding_kind_of_the_manifest_is_a_known_kind_and_has_a_case():
    kinds = {e["kind"] for c in MANIFEST["cases"] for e in c["expect"]}
    assert kinds == set(MANIFEST["finding_kinds"]) and kinds <= set(KINDS)


def test_truncated_gzip_shard_says_how_many_samples_were_readable(tmp_path):
    import gzip

    import numpy as np
    data = mss.tar_bytes(mss.normal_members(np.random.default_rng(1), [f"{i:04d}" for i in range(40)]))
    gz = gzip.compress(data)
    (tmp_path / "cut-000000.tar.gz").write_bytes(gz[:len(gz) * 6 // 10])
    report = validate(str(tmp_path / "cut-000000.tar.gz"), jobs=1)
    (f,) = report.findings
    shard = report.shards[0]
    assert f.kind == "truncated_tar" and f.member == f"{shard.samples:04d}.jpg" and f.key == f"{shard.samples:04d}"
    assert 0 < shard.samples == shard.kept < 40
    assert f"{shard.samples} complete sample(s) ({3 * shard.samples} members) are readable before the break" in f.message


def test_kept_share_per_shard_and_overall(tmp_path):
    """The share of samples the stages keep: per shard and over all shards, in the report object,
    the JSON report and the text summary."""
    from wdsfilter.validate.formats import to_text

    half = write_shard(tmp_path / "half-000000.tar", [
        ("0.jpg", image_bytes()), ("0.txt", "kept"), ("1.jpg", image_bytes()),  # no caption
        ("2.jpg", image_bytes()), ("2.txt", "kept"), ("3.txt", "no image")])
    full = write_shard(tmp_path / "full-000000.tar", [(f"{i}.{e}", image_bytes() if e == "jpg" else "kept")
                                                       for i in range(4, 10) for e in ("jpg", "txt")])
    report = validate([half, full], jobs=1)
    assert [r.kept_share for r in report.shards] == [0.5, 1.0]
    assert report.kept_share == pytest.approx(8 / 10)
    data = report.to_dict()
    assert [s["kept_share"] for s in data["shards"]] == [0.5, 1.0] and data["summary"]["kept_share"] == 0.8
    assert data["dropped"] == {"missing_caption": 1, "missing_image": 1}
    text = to_text(report)
    assert "10 samples, 8 kept (80.0%)" in text.splitlines()[0]
    assert [line.split()[:3] for line in text.splitlines() if "-000000.tar" in line and "%" in line] == \
        [["half-000000.tar", "4", "50.0%"], ["full-000000.tar", "6", "100.0%"]]
    assert report.passed  # some samples dropped: warnings only


def test_all_filtered_by_the_image_key_suggests_the_video_key():
    report = validate(os.path.join(SHARDS, "videos-000000.tar"), jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "all_filtered"]
    assert "image found under mp4 in 100% of samples; use --image-key mp4" in finding.message
    assert report.kept_share == 0.0 and report.exit_code == 1


def test_mixed_set_suggestion_keeps_the_spec_that_works():
    shards = [os.path.join(SHARDS, s) for s in ("images-000000.tar", "json-captions-000000.tar")]
    report = validate(shards, jobs=1)
    assert report.suggestions() == ["32 of 64 samples have no caption under 'txt'; among them, caption found "
                                    "under json:description in 100% of samples; use --caption-key "
                                    "'txt;json:description'"]
    assert validate(shards, jobs=1, caption_key="txt;json:description").passed
