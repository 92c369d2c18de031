"""wdsfilter.validate on real shards: every broken case of the manifest (committed and generated
afresh), the clean sample shards, and agreement with what the pipeline really keeps."""
import json
import os
import pickle
from collections import Counter

import numpy as np
import pytest

from tools import make_sample_shards as mss
from wdsfilter import ConfigError, StageConfig
from wdsfilter.validate import ShardResult, validate
from wdsfilter.validate.findings import KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")
# One configuration under which every broken case shows exactly its own findings: JSON captions as a
# fallback (keys-misc), videos as media (corrupt-video), the token the image-token case expects.
BROKEN_OPTIONS = dict(caption_key="txt;json:caption", image_key="jpg;png;mp4", image_token="<__dj__image>")


def expected(manifest):
    return Counter((e["kind"], e["shard"], e["member"], e["key"]) for c in manifest["cases"] for e in c["expect"])


def found(report):
    return Counter((f.kind, os.path.basename(f.shard), f.member, f.key) for f in report.findings)


def committed_manifest():
    with open(os.path.join(BROKEN, "MANIFEST.json"), encoding="utf-8") as f:
        return json.load(f)


def test_committed_broken_shards_give_exactly_the_manifest_findings():
    manifest = committed_manifest()
    report = validate(BROKEN, jobs=2, **BROKEN_OPTIONS)
    assert found(report) == expected(manifest)
    assert set(manifest["finding_kinds"]) <= set(KINDS)
    assert report.counts == Counter(kind for kind, *_ in expected(manifest).elements())
    assert report.exit_code == 1 and not report.passed


def test_freshly_generated_broken_set_gives_exactly_its_manifest_findings(tmp_path):
    manifest = mss.write_broken(str(tmp_path))
    report = validate(str(tmp_path / "broken"), jobs=1, **BROKEN_OPTIONS)
    assert found(report) == expected(manifest)


def test_truncated_shard_says_how_many_samples_were_readable():
    case = next(c for c in committed_manifest()["cases"] if c["case"] == "truncated")
    report = validate(os.path.join(BROKEN, case["shards"][0]), jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "truncated_tar"]
    assert f"{case['complete_samples_before_break']} complete sample(s)" in finding.message
    assert report.shards[0].samples == report.shards[0].kept == case["complete_samples_before_break"]


@pytest.mark.parametrize("shard, options", [
    ("images-000000.tar", {}),
    ("images-000001.tar", {}),
    ("json-captions-000000.tar", {"caption_key": "json:description"}),
    ("ocr-images-000000.tar", {}),
    ("videos-000000.tar", {"image_key": "mp4"}),
])
def test_clean_shards_report_clean(shard, options):
    report = validate(os.path.join(SHARDS, shard), jobs=1, **options)
    assert not report.findings and not report.counts
    assert report.samples > 0 and report.kept_share == 1.0 and report.exit_code == 0


def test_video_stats_have_duration_frames_and_size():
    report = validate(os.path.join(SHARDS, "videos-000000.tar"), image_key="mp4", jobs=1)
    videos = report.shards[0].videos
    assert videos["count"] == 8 and videos["frames"] == 8 * 16 and videos["sizes"] == {"320x240": 8}
    assert videos["min_duration_s"] == pytest.approx(2.0, abs=0.15) and videos["duration_s"] == pytest.approx(16, abs=1)
    deep = validate(os.path.join(SHARDS, "videos-000000.tar"), image_key="mp4", jobs=1, deep=True)
    assert deep.shards[0].videos["frames"] == 8 * 16  # counted by decoding every frame


def test_json_captions_with_the_default_key_are_all_filtered_with_a_suggestion():
    report = validate(os.path.join(SHARDS, "json-captions-000000.tar"), jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "all_filtered"]
    assert finding.severity == "error" and "0 of 32 samples" in finding.message
    hint = "caption found under json:description in 100% of samples; use --caption-key json:description"
    assert hint in finding.message and report.suggestions()[0] == hint
    assert report.counts["missing_caption"] == 32 and report.kept == 0 and report.exit_code == 1


def test_kept_share_is_what_the_pipeline_keeps():
    """The validator reuses the stages' pieces; the real pipeline must agree shard by shard."""
    from wdsfilter.stream.pipeline import sample_pipeline

    report = validate(BROKEN, jobs=1, **BROKEN_OPTIONS)
    cfg = StageConfig(**BROKEN_OPTIONS, check_first_shard=False, starvation_samples=0, starvation_seconds=0)
    out = Counter(s["__url__"] for s in sample_pipeline([r.shard for r in report.shards], cfg))
    assert {r.shard: r.kept for r in report.shards} == {r.shard: out.get(r.shard, 0) for r in report.shards}
    assert 0 < report.kept < report.samples


def _png_with_broken_data(rng):
    data = bytearray(mss.make_image(rng, (96, 72), fmt="png"))
    start = data.index(b"IDAT") + 40
    data[start:start + 40] = b"\xab" * 40  # inside the compressed data: header and IEND intact
    return bytes(data)


def test_deep_mode_decodes_what_the_header_check_cannot_see(tmp_path):
    rng = np.random.default_rng(3)
    members = mss.normal_members(rng, ["000000"]) + [("000001.png", _png_with_broken_data(rng)),
                                                     ("000001.txt", "a broken png")]
    url = mss.write_tar(str(tmp_path / "deep-000000.tar"), members)
    assert not validate(url, jobs=1).counts
    deep = validate(url, jobs=1, deep=True)
    assert found(deep) == Counter({("corrupt_image", "deep-000000.tar", "000001.png", "000001"): 1})
    assert deep.kept == 1


def test_size_limits_from_headers(tmp_path):
    rng = np.random.default_rng(4)
    members = [("small.jpg", mss.make_image(rng, (40, 30))), ("small.txt", "small"),
               ("wide.jpg", mss.make_image(rng, (400, 40))), ("wide.txt", "wide"),
               ("fine.jpg", mss.make_image(rng, (120, 90))), ("fine.txt", "fine")]
    url = mss.write_tar(str(tmp_path / "sizes-000000.tar"), members)
    report = validate(url, jobs=1, min_side=64, max_aspect=4, max_side=300)
    # An oversized image is reported as that alone (the stages drop it there).
    assert found(report) == Counter({("undersized_image", "sizes-000000.tar", "small.jpg", "small"): 1,
                                     ("oversized_image", "sizes-000000.tar", "wide.jpg", "wide"): 1})
    report = validate(url, jobs=1, min_side=24, max_aspect=4)
    assert [(f.kind, f.member) for f in report.findings] == [("extreme_aspect", "wide.jpg")]
    assert report.kept == 3
    assert validate(url, jobs=1, max_side=300).kept == 2  # the stages' size guard drops what is oversized
    # oversize="reduce" decodes JPEGs at 1/8 scale: nothing is lost, nothing to report.
    assert not validate(url, jobs=1, config=StageConfig(max_side=300, oversize="reduce")).counts


def test_findings_are_capped_per_kind_but_all_counted(tmp_path):
    rng = np.random.default_rng(5)
    members = []
    for i in range(60):
        members += [(f"{i:04d}.JPG", mss.make_image(rng, (32, 24))), (f"{i:04d}.txt", "x")]
    url = mss.write_tar(str(tmp_path / "many-000000.tar"), members)
    report = validate(url, jobs=1, max_findings=10)
    assert report.counts["mixed_case_extension"] == 60
    assert len(report.findings) == 10 and report.omitted == {"mixed_case_extension": 50}
    assert report.to_dict()["omitted"] == {"mixed_case_extension": 50}


def test_shard_results_hold_no_sample_bytes(tmp_path):
    """What a worker sends to the parent stays small however big the shard is."""
    rng = np.random.default_rng(6)
    noise = mss.encode_image(mss.noise_image(rng, (256, 192), block=2), "jpg")
    members = []
    for i in range(80):
        members += [(f"{i:05d}.jpg", noise), (f"{i:05d}.txt", "noise"), (f"{i:05d}.json", {"caption": "noise"})]
    url = mss.write_tar(str(tmp_path / "big-000000.tar"), members)
    report = validate(url, jobs=1)
    result = report.shards[0]
    assert isinstance(result, ShardResult) and result.samples == 80 and result.bytes > 80 * len(noise)
    assert len(pickle.dumps(result)) < 8_000 < result.bytes // 100


def test_unsafe_members_are_never_loaded():
    manifest = committed_manifest()
    case = next(c for c in manifest["cases"] if c["case"] == "unsafe")
    report = validate(os.path.join(BROKEN, case["shards"][0]), jobs=1)  # would raise if unpickled
    assert report.counts == Counter({"unsafe_member": 3}) and report.kept == report.samples


def test_parallel_and_serial_runs_agree():
    one = validate(SHARDS, jobs=1).to_dict()
    two = validate(SHARDS, jobs=2).to_dict()
    for d in (one, two):
        d["summary"].pop("seconds")
        for s in d["shards"]:
            s.pop("seconds")
    assert one == two


def test_configuration_errors_raise_at_once(tmp_path):
    with pytest.raises(ConfigError, match="malformed caption key"):
        validate(SHARDS, caption_key="json:")
    with pytest.raises(ConfigError, match="does not exist"):
        validate(str(tmp_path / "nope.tar"))
    with pytest.raises(ConfigError, match="fail_on"):
        validate(SHARDS, fail_on="info")
    with pytest.raises(ConfigError, match="max_aspect"):
        validate(SHARDS, max_aspect=0.5)


def test_config_file_json_and_yaml(tmp_path):
    shard = os.path.join(SHARDS, "json-captions-000000.tar")
    (tmp_path / "cfg.json").write_text(json.dumps({"caption_key": "json:description"}))
    (tmp_path / "cfg.yaml").write_text("caption_key: json:description\nmax_pixels: 1000000\n")
    assert validate(shard, config=str(tmp_path / "cfg.json"), jobs=1).passed
    assert validate(shard, config=str(tmp_path / "cfg.yaml"), jobs=1).options.stage.max_pixels == 1_000_000
    # Options given directly win over the file.
    assert not validate(shard, config=str(tmp_path / "cfg.json"), caption_key="txt", jobs=1).passed
    (tmp_path / "bad.json").write_text(json.dumps({"caption_kye": "txt"}))
    with pytest.raises(ConfigError, match="unknown option"):
        validate(shard, config=str(tmp_path / "bad.json"))


def test_wdsfilter_validate_is_callable():
    import wdsfilter
    report = wdsfilter.validate(os.path.join(SHARDS, "images-000000.tar"), jobs=1)
    assert report.passed and report.samples == 32


def test_json_captions_that_are_not_text_are_reported(tmp_path):
    rng = np.random.default_rng(5)
    members = []
    for key, caption in (("000000", "a red square"), ("000001", ["a cat", "a mat"]), ("000002", 7)):
        members += [(f"{key}.jpg", mss.make_image(rng, (40, 30))), (f"{key}.json", {"caption": caption})]
    url = mss.write_tar(str(tmp_path / "captions-000000.tar"), members)
    report = validate(url, jobs=1, caption_key="json:caption")
    assert found(report) == Counter({("caption_not_text", "captions-000000.tar", "000001.json", "000001"): 1,
                                     ("caption_not_text", "captions-000000.tar", "000002.json", "000002"): 1})
    assert "is a JSON list" in report.findings[0].message and report.kept == 1


POOL = """
import multiprocessing, sys
multiprocessing.set_start_method(sys.argv[1])
from wdsfilter.storage.remote_options import RemoteOptions
from wdsfilter.validate.runner import pool_context
before = {m: m in sys.modules for m in ("s3fs", "botocore.session", "wdsfilter.validate.shard_check")}
options = {"requester_pays": True} if sys.argv[2] == "s3fs" else {}  # an option only s3fs reads
context = pool_context(["s3://bucket/a.tar", "s3://bucket/b.tar"], RemoteOptions(storage_options=options))
preload = getattr(__import__("multiprocessing.forkserver").forkserver._forkserver, "_preload_modules", None)
print(before, {m: m in sys.modules for m in before}, context.get_start_method(), preload)
"""


@pytest.mark.parametrize("stack", ["botocore", "s3fs"])
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_validate_workers_inherit_the_remote_client_stack(method, stack):
    # Each worker imported s3fs (aiobotocore, aiohttp: ~1 s of a core) for itself, and the main process
    # again for the sizes.json check: a forked pool now inherits the imports, a forkserver preloads them.
    # S3 with plain options is read through botocore itself (storage/remote_s3.py): s3fs is not imported.
    import subprocess
    import sys
    env = dict(os.environ, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_EC2_METADATA_DISABLED="true")
    out = subprocess.run([sys.executable, "-c", POOL, method, stack], capture_output=True, text=True,
                         check=True, env=env).stdout
    module = "'botocore.session'" if stack == "botocore" else "'s3fs'"
    if method == "fork":
        assert out.startswith("{'s3fs': False, 'botocore.session': False, ") and f"{module}: True, " in out, out
        assert " fork " in out and (stack == "s3fs" or "{'s3fs': False, 'botocore.session': True" in out), out
    else:
        preload = "'botocore.session'" if stack == "botocore" else "'fsspec', 's3fs'"
        assert f"forkserver ['wdsfilter.validate.shard_check', {preload}]" in out, out
