"""`wdsfilter score` and `wdsfilter.score.score` end to end on sample_shards/ on CPU with the tiny
CLIP model (tests/conftest.py's tiny_clip fixture), then training-time filtering by the scores."""
import os
import re
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner

import wdsfilter
from wdsfilter.cli import main
from wdsfilter.core.specs import split_name
from wdsfilter.score import score
from wdsfilter.runfolder.tables import read_rows

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
    assert result.output.count("plan:") == 1  # printed as the run went, not again in the summary


def test_video_flags_go_to_every_scorer_that_samples_frames():
    from wdsfilter.score import build_config
    both = build_config("o", ["clip", "ocr"], frames=5, frame_reduce="max", keyframes=True)
    assert both.scorer_options == {s: {"frames": 5, "frame_reduce": "max", "keyframes": True} for s in ("clip", "ocr")}
    assert build_config("o", ["clip"], frames=2).scorer_options == {"clip": {"frames": 2}}
    with pytest.raises(wdsfilter.ConfigError, match="frames .--frames. applies to the ocr scorer"):
        build_config("o", ["tests.scorekit:BrightnessScorer"], frames=2)


def test_cli_configuration_errors_exit_2_with_the_reason(tiny_clip, tmp_path):
    runner = CliRunner()
    base = ["score", SHARDS[0], "--device", "cpu", "--out", str(tmp_path / "o")]
    r = runner.invoke(main, base + ["--model", "local-dir:" + tiny_clip, "--min", "ocr_area=0.1"])
    assert r.exit_code == 2 and "threshold(s) on ['ocr_area'], which no scorer of this run writes" in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--model", "ViT-B-32"])
    assert r.exit_code == 2 and "model (--model) applies to the clip scorer, which is not in this run (ocr)" in r.output
    r = runner.invoke(main, base + ["--model", "local-dir:" + tiny_clip, "--ocr-backend", "easyocr", "--no-ocr-download"])
    assert r.exit_code == 2 and "ocr_backend (--ocr-backend), ocr_download (--ocr-download) apply to the ocr scorer" \
        in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--frames", "5", "--scorer-opt", "ocr.frames=4"])
    assert r.exit_code == 2 and "disagree" in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--max", "ocr_area"])
    assert r.exit_code == 2 and "--max expects COLUMN=VALUE (e.g. ocr_area=0.2)" in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--min", "ocr_area=0.5", "--max-ocr-area", "0.2"])
    assert r.exit_code == 2 and "the minimum 0.5 of ocr_area is above its maximum 0.2" in r.output
    r = runner.invoke(main, base + ["--scorer", "ocr", "--frames", "0"])
    assert r.exit_code == 2 and "frames must be an integer >= 1" in r.output
    r = runner.invoke(main, base + ["--model", "local-dir:" + tiny_clip, "--batch-size", "0"])
    assert r.exit_code == 2 and "batch_size must be 'auto' or an integer >= 1" in r.output


# -- clip + ocr in one pass ------------------------------------------------------------------------
MIXED = [os.path.join(SS, p) for p in ("images-000000.tar", "ocr-images-000000.tar", "videos-000000.tar",
                                       "broken/corrupt-video-000000.tar")]
MIXED_KEYS = ["--caption-key", CAPTION_KEY, "--image-key", "jpg;png;webp;mp4"]
# OCR as wdsfilter 0.x ran it: frames detected at their own size (no enlarging to short side 736)
# and every detected box counted unread. The tests below check the run's plumbing (rows, frames,
# thresholds, files, the summary); on the sample shards' large type it separates text from no text
# as clearly. The default path (enlarged, boxes read) runs through the engine in
# test_ocr_video_flags_generic_max_jsonl_and_the_progress_bar's --keyframes run and in test_ocr*.py.
CHEAP_OCR = ["--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null"]


def sample_json(path):
    import json
    with tarfile.open(path) as tar:
        return {info.name[:-5]: json.load(tar.extractfile(info)) for info in tar if info.name.endswith(".json")}


def test_clip_and_ocr_in_one_pass_over_images_text_images_and_videos(tiny_clip, tmp_path):
    """The issue's combined run through the CLI with the rapidocr backend (weights in its wheel):
    every sample gets a row, text scores clearly above blank and noise, videos keep per-frame
    ratios, broken videos get reasons, both thresholds filter the shards and the summary counts
    each; then the loader filters the same way from the score files (min and max)."""
    pytest.importorskip("rapidocr_onnxruntime")
    out, filtered = str(tmp_path / "out"), str(tmp_path / "filtered")
    min_clip, max_area = 0.3, 0.05
    result = CliRunner().invoke(main, ["score", *MIXED, *MIXED_KEYS, "--scorer", "clip", "--scorer", "ocr",
                                       "--model", "local-dir:" + tiny_clip, "--ocr-backend", "rapidocr",
                                       "--frames", "3", "--frame-reduce", "mean", "--min-clip", str(min_clip),
                                       "--max-ocr-area", str(max_area), "--write-shards", filtered,
                                       "--device", "cpu", "--out", out, "--no-progress", *CHEAP_OCR])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "scorer: ocr: rapidocr PP-OCRv4 detector" in text and "3 frames/video, reduce=mean" in text
    assert "boxes not read" in text
    rows = rows_of(out)
    expected = {(os.path.basename(p), k) for p in MIXED for k in keys_in_tar(p)}
    assert set(rows) == expected  # every sample has a row
    for r in rows.values():
        scored = r["clip_score"] is not None or r["ocr_area"] is not None
        assert scored or r["reason"], r  # its scores, or the reason it has none

    # Text images: clearly more text area than the gradients and noise of the same shard.
    meta = sample_json(MIXED[1])
    ocr = {k: rows[("ocr-images-000000.tar", k)] for k in meta}
    text_areas = [r["ocr_area"] for k, r in ocr.items() if meta[k]["has_text"]]
    other_areas = [r["ocr_area"] for k, r in ocr.items() if not meta[k]["has_text"]]
    assert len(text_areas) == len(other_areas) == 8
    assert min(text_areas) > 0.05 and max(other_areas) < 0.01
    assert all(r["status"] == "scored" and r["ocr_frames"] == 1 and r["ocr_area_frames"] == [r["ocr_area"]]
               for r in ocr.values())

    # Videos: three ratios each, their mean is ocr_area; CLIP scores the same three frames.
    meta = sample_json(MIXED[2])
    videos = {k: rows[("videos-000000.tar", k)] for k in meta}
    for k, r in videos.items():
        assert r["ocr_frames"] == 3 and len(r["ocr_area_frames"]) == 3
        assert r["ocr_area"] == pytest.approx(sum(r["ocr_area_frames"]) / 3)
        assert r["status"] == "scored" and r["clip_frames"] == 3 and len(r["clip_score_frames"]) == 3
        assert r["clip_score"] == pytest.approx(sum(r["clip_score_frames"]) / 3)
        if meta[k]["has_text"]:
            assert min(r["ocr_area_frames"]) > 0.04
        else:
            assert max(r["ocr_area_frames"]) < 0.01

    # Broken videos: a reason in their rows, the valid clip of that shard is scored.
    broken = {k: r for (shard, k), r in rows.items() if shard == "corrupt-video-000000.tar"}
    reasons = sorted(r["reason"] for r in broken.values() if r["status"] == "failed")
    assert reasons == ["corrupt_video", "no_video_stream"]  # one reason, though both scorers failed
    assert sum(1 for r in broken.values() if r["ocr_frames"] == 3) == 1

    # kept = both thresholds met; a sample without one of the two scores is not kept.
    def passes(r):
        return (r["clip_score"] is not None and r["clip_score"] >= min_clip
                and r["ocr_area"] is not None and r["ocr_area"] <= max_area)
    assert all(r["kept"] == passes(r) for r in rows.values())
    kept = {i for i, r in rows.items() if r["kept"]}
    clip_rows = [r for r in rows.values() if r["clip_score"] is not None]
    assert 0 < len(kept) < len(clip_rows)
    assert not any(rows[i]["ocr_area"] > max_area for i in kept)
    for path in MIXED:
        name = os.path.basename(path)
        assert keys_in_tar(os.path.join(filtered, name)) == [k for k in keys_in_tar(path) if (name, k) in kept]

    # The summary counts each threshold and the combination.
    def count(col, ok):
        values = [r[col] for r in rows.values()]
        return (sum(1 for v in values if v is not None and ok(v)), sum(1 for v in values if v is not None and not ok(v)),
                sum(1 for v in values if v is None))
    k, d, n = count("clip_score", lambda v: v >= min_clip)
    assert f"clip_score >= {min_clip:g}: kept {k}, dropped {d}, no score {n}" in text
    k, d, n = count("ocr_area", lambda v: v <= max_area)
    assert f"ocr_area <= {max_area:g}: kept {k}, dropped {d}, no score {n}" in text
    assert f"kept {len(kept)} of {len(rows)} (all thresholds met)" in text
    import json
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["max_thresholds"]["ocr_area"] == {"max": max_area, "kept": k, "dropped": d, "no_score": n}
    assert summary["kept"] == len(kept)
    assert open(os.path.join(out, "histograms.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "ocr_area: n=" in text and "ocr_frames: n=" in text

    # Training-time filtering by the same files: both bounds, and the maximum alone.
    import wdsfilter
    common = dict(caption_key=CAPTION_KEY, image_key="jpg;png;webp;mp4", scores=out, output="dict", batch_size=16)
    loader = wdsfilter.loader(MIXED, min_clip=min_clip, max_ocr_area=max_area, **common)
    got = {(os.path.basename(s["__url__"]), s["__key__"]) for batch in loader for s in batch}
    assert got == kept
    loader = wdsfilter.loader(MIXED, max_scores={"ocr_area": max_area}, **common)
    got = {(os.path.basename(s["__url__"]), s["__key__"]) for batch in loader for s in batch}
    low_text = {i for i, r in rows.items() if r["ocr_area"] is not None and r["ocr_area"] <= max_area}
    assert got == low_text and any(shard == "videos-000000.tar" for shard, _ in got)
    assert loader.stats.dropped["filtered_by_score"] == sum(
        1 for r in rows.values() if r["ocr_area"] is not None and r["ocr_area"] > max_area)


def test_ocr_video_flags_generic_max_jsonl_and_the_progress_bar(tmp_path):
    """--keyframes, --frames, --frame-reduce max and --max COLUMN=X on the sample videos, JSONL
    score files (per-frame lists included), and the progress bar's samples/s on stderr."""
    pytest.importorskip("rapidocr_onnxruntime")
    path = os.path.join(SS, "videos-000000.tar")
    out = str(tmp_path / "out")
    args = ["score", path, "--image-key", "mp4", "--caption-key", "txt", "--scorer", "ocr", "--frames", "2",
            "--frame-reduce", "max", "--device", "cpu"]
    # The flags' plumbing: OCR as 0.x ran it (CHEAP_OCR); the --keyframes run below has the defaults.
    result = CliRunner().invoke(main, args + ["--max", "ocr_area=0.05", "--format", "jsonl", "--out", out,
                                              *CHEAP_OCR])
    assert result.exit_code == 0, result.output
    assert "2 frames/video, reduce=max" in result.stdout and "boxes not read" in result.stdout
    # tqdm's final line; under one sample/s it shows the inverse rate ("4.28s/ samples", measured on
    # a loaded 2-core CPU with small frames enlarged to short side 736 and boxes read).
    assert re.search(r"scoring: .*8 samples.*(samples/s|s/ samples)", result.stderr), result.stderr
    meta = sample_json(path)
    rows = {r["key"]: r for r in read_rows(os.path.join(out, "scores", "videos-000000.jsonl"))}
    assert set(rows) == set(meta)
    for key, r in rows.items():
        assert r["status"] == "scored" and r["ocr_frames"] == 2 and len(r["ocr_area_frames"]) == 2
        assert r["ocr_area"] == max(r["ocr_area_frames"])
        assert r["kept"] == (not meta[key]["has_text"])  # subtitles cover more than 5 % of the frame
    assert "ocr_area <= 0.05: kept 4, dropped 4" in result.stdout
    # Terminal histograms: a column of one value is one line (every clip has 2 frames).
    assert "  ocr_frames: all 8 values are 2\n" in result.stdout, result.stdout
    # --keyframes: these 2 s clips have one keyframe each (x264's keyframe interval is longer), so
    # one frame per clip however many are asked for. The OCR defaults (small frames enlarged to
    # short side 736, boxes read) through the engine's model worker: the subtitles still stand out.
    result = CliRunner().invoke(main, args + ["--keyframes", "--out", str(tmp_path / "key"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "2 keyframes/video, reduce=max" in result.stdout and "boxes read with confidence >= 0.5" in result.stdout
    rows = read_rows(os.path.join(str(tmp_path / "key"), "scores", "videos-000000.parquet"))
    assert len(rows) == 8 and all(r["ocr_frames"] == 1 and r["ocr_area_frames"] == [r["ocr_area"]] for r in rows)
    assert all((r["ocr_area"] > 0.04) if meta[r["key"]]["has_text"] else (r["ocr_area"] < 0.01) for r in rows)


def test_long_captions_are_truncated_and_counted_in_the_summary(tiny_clip, tmp_path):
    from shardkit import image_bytes, write_shard
    long = "a red circle " + " ".join(["and a blue square"] * 40)  # far over the tiny model's 32 tokens
    members = []
    for i, caption in enumerate(["a red circle", long, "a blue square", long + " again"]):
        members += [(f"{i:04d}.jpg", image_bytes(size=(64, 64))), (f"{i:04d}.txt", caption)]
    url = write_shard(tmp_path / "long-000000.tar", members)
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["score", url, "--scorer", "clip", "--model", "local-dir:" + tiny_clip,
                                       "--caption-key", "txt", "--device", "cpu", "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "clip_truncated: true 2, false 2" in result.output
    rows = read_rows(os.path.join(out, "scores", "long-000000.parquet"))
    assert [r["clip_truncated"] for r in rows] == [False, True, False, True]
    assert all(r["status"] == "scored" for r in rows)



def test_bench_score_compares_the_engine_and_reports_ocr_time_shares(capsys):
    """tools/bench_score.py --quick for OCR: the three rates on images and videos, then frames/s
    and the decode/detection/post-processing shares of images and of videos (bench_ocr)."""
    pytest.importorskip("rapidocr_onnxruntime")
    from tools import bench_score
    # The tool's plumbing, not OCR's speed: frames at their own size, boxes not read (both the
    # engine comparison and the bench_ocr breakdown say so in the scorer line they print).
    out = bench_score.main(["--quick", "--scorer", "ocr", "--ocr-min-side", "0", "--ocr-min-text-score", "none"])
    assert out["samples"] == 2 * (16 + 8) and out["frames"] == 2 * (16 + 8 * 3)
    assert set(out["rates"]) == {"decode", "model", "e2e", "wall"} and out["ratio"] > 0
    for kind, frames in (("images", 16), ("videos", 24)):
        r = out["breakdown"][kind]
        assert r["frames"] == frames and r["frames_per_s"] > 0
        assert set(r["share"]) == {"decode", "detection", "post", "other"}
    assert out["breakdown"]["videos"]["share"]["decode"] > 0
    printed = capsys.readouterr().out
    assert "ratio end to end / min(decode, model)" in printed and "frames/s | decode" in printed
    assert printed.count("boxes not read") == 2
