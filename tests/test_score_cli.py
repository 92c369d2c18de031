"""`wdsfilter score` and `wdsfilter.score.score` end to end on sample_shards/ on CPU with the tiny
CLIP model (tests/conftest.py's tiny_clip fixture), then training-time filtering by the scores."""
import os
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner

import wdsfilter
from wdsfilter.cli import main
from wdsfilter.naming import split_name
from wdsfilter.score import score
from wdsfilter.score.outputs import read_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SS = os.path.join(REPO, "sample_shards")
SHARDS = [os.path.join(SS, p) for p in (
    "images-000000.tar", "images-000001.tar", "json-captions-000000.tar", "broken/corrupt-jpeg-000000.tar",
    "broken/truncated-000000.tar", "broken/text-only-image-only-000000.tar")]
CAPTION_KEY = "txt;json:description"

pytestmark = pytest.mark.slow


def keys_in_tar(path):
    """Keys with at least one member complete in the file (a cut tar loses the rest)."""
    size, keys = os.path.getsize(path), []
    try:
        with tarfile.open(path) as tar:
            for info in tar:
                key, _ = split_name(info.name)
                if info.isreg() and key and info.offset_data + info.size <= size and key not in keys:
                    keys.append(key)
    except tarfile.TarError:
        pass
    return keys


def rows_of(out):
    rows = {}
    for f in sorted(os.listdir(os.path.join(out, "scores"))):
        for r in read_rows(os.path.join(out, "scores", f)):
            ident = (os.path.basename(r["shard"]), r["key"])
            assert ident not in rows
            rows[ident] = r
    return rows


def test_cli_and_api_score_the_sample_shards_and_the_loader_filters_by_them(tiny_clip, tmp_path):
    model = "local-dir:" + tiny_clip
    api_out = str(tmp_path / "api")
    summary = score(SHARDS, out=api_out, scorers=["clip"], model=model, caption_key=CAPTION_KEY, device="cpu",
                    progress=False)
    api = rows_of(api_out)
    expected = {(os.path.basename(p), k) for p in SHARDS for k in keys_in_tar(p)}
    assert set(api) == expected and summary.rows == len(expected)
    rejected = {ident: r["reason"] for ident, r in api.items() if r["status"] == "rejected"}
    assert rejected == {("corrupt-jpeg-000000.tar", "000602"): "corrupt_image",
                        ("corrupt-jpeg-000000.tar", "000603"): "corrupt_image",
                        ("text-only-image-only-000000.tar", "001302"): "missing_image",
                        ("text-only-image-only-000000.tar", "001303"): "missing_caption"}
    scored = {i: r for i, r in api.items() if r["status"] == "scored"}
    assert len(scored) == len(expected) - 4 and all(-1 <= r["clip_score"] <= 1 for r in scored.values())
    # Each image is scored with its own caption: deliberately mismatched captions score lower.
    import json
    matches = {}
    for path in SHARDS[:3]:
        with tarfile.open(path) as tar:
            for info in tar:
                if info.name.endswith(".json"):
                    matches[(os.path.basename(path), info.name[:-5])] = json.load(tar.extractfile(info))["caption_matches"]
    good = [scored[i]["clip_score"] for i, m in matches.items() if m]
    bad = [scored[i]["clip_score"] for i, m in matches.items() if not m]
    assert bad and sum(good) / len(good) > sum(bad) / len(bad)

    threshold = sorted(r["clip_score"] for r in scored.values())[len(scored) // 2]
    cli_out, filtered = str(tmp_path / "cli"), str(tmp_path / "filtered")
    proc = subprocess.run([sys.executable, "-m", "wdsfilter", "score", *SHARDS, "--scorer", "clip", "--model", model,
                           "--caption-key", CAPTION_KEY, "--device", "cpu", "--out", cli_out, "--min-clip",
                           repr(threshold), "--write-shards", filtered, "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tiny local model" in proc.stdout  # it says when the tiny local model is used
    assert f"clip_score >= {threshold:g}: kept" in proc.stdout and "samples/s" in proc.stdout
    cli = rows_of(cli_out)
    assert set(cli) == expected
    for ident, r in cli.items():
        assert r["status"] == api[ident]["status"]
        if r["status"] == "scored":
            assert r["clip_score"] == pytest.approx(api[ident]["clip_score"], abs=1e-4)
            assert r["kept"] == (r["clip_score"] >= threshold)
    kept = {i for i, r in cli.items() if r["kept"]}
    assert 0 < len(kept) < len(scored)
    for path in SHARDS:
        name = os.path.basename(path)
        assert keys_in_tar(os.path.join(filtered, name)) == [k for k in keys_in_tar(path) if (name, k) in kept]

    loader = wdsfilter.loader(SHARDS, caption_key=CAPTION_KEY, scores=cli_out, min_clip=threshold, output="dict",
                              batch_size=16)
    got = {(os.path.basename(s["__url__"]), s["__key__"]) for batch in loader for s in batch}
    assert got == kept
    assert loader.stats.dropped["filtered_by_score"] == len(scored) - len(kept)


def test_dry_run_prints_the_plan_and_scores_nothing(tiny_clip, tmp_path):
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["score", SHARDS[0], "--scorer", "clip", "--model", "local-dir:" + tiny_clip,
                                       "--device", "cpu", "--out", out, "--dry-run", "--max-memory", "4GiB"])
    assert result.exit_code == 0, result.output
    for line in ("tiny local model", "plan:", "model on cpu", "activations", "/sample", "cpu batch size",
                 "decode workers", "host RAM budget", "capped by max_memory=4.0 GiB", "dry run: nothing was scored"):
        assert line in result.output
    assert not os.path.exists(os.path.join(out, "scores"))


def test_cli_configuration_errors_exit_2_with_the_reason(tiny_clip, tmp_path):
    runner = CliRunner()
    base = ["score", SHARDS[0], "--device", "cpu", "--out", str(tmp_path / "o")]
    r = runner.invoke(main, base + ["--model", "local-dir:" + tiny_clip, "--min", "ocr_area=0.1"])
    assert r.exit_code == 2 and "threshold(s) on ['ocr_area'], which no scorer of this run writes" in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--model", "ViT-B-32"])
    assert r.exit_code == 2 and "model, pretrained apply to the clip scorer" in r.output
    r = runner.invoke(main, base + ["--model", "local-dir:" + tiny_clip, "--batch-size", "0"])
    assert r.exit_code == 2 and "batch_size must be 'auto' or an integer >= 1" in r.output
