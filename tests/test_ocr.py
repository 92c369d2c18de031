"""The OCR scorer with the rapidocr backend (PP-OCRv4 detector bundled in its wheel: real weights,
no network) on real rendered text: the sample shards' OCR images and subtitled videos, and clips
built here."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime")
pytest.importorskip("onnxruntime")

import wdsfilter  # noqa: E402
from shardkit import write_shard  # noqa: E402
from videokit import audio_only_mp4, make_video, text_frame  # noqa: E402
from wdsfilter.core.errors import ConfigError, DataError  # noqa: E402
from wdsfilter.score.scorers.base import make_scorer  # noqa: E402
from wdsfilter.score.scorers.ocr import OcrInput, OcrScorer  # noqa: E402

pytestmark = pytest.mark.slow  # runs the rapidocr detector (tests/conftest.py says what slow means)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """sample_shards/ when the OCR shards are committed, else the same shards from their generator."""
    committed = os.path.join(REPO, "sample_shards")
    names = ("ocr-images-000000.tar", "videos-000000.tar")
    if all(os.path.isfile(os.path.join(committed, n)) for n in names):
        return committed
    from tools import make_sample_shards
    out = str(tmp_path_factory.mktemp("ocr-shards"))
    make_sample_shards.write_ocr(out)
    make_sample_shards.write_videos(out)
    return out


@pytest.fixture(scope="module")
def scorer():
    s = OcrScorer(backend="rapidocr", frames=3, backend_options={"threads": 2})
    s.load("cpu")
    return s


@pytest.fixture(scope="module")
def plain_scorer():
    """OCR as 0.x ran it: frames detected at their own size, every box counted unread. For tests of
    the scorer's own bookkeeping (frame reduction), a fraction of the default's cost on CPU."""
    s = OcrScorer(backend="rapidocr", frames=3, min_text_score=None, backend_options={"threads": 2, "min_side": 0})
    s.load("cpu")
    return s


def read(path, image_key):
    cfg = wdsfilter.StageConfig(caption_key="txt", image_key=image_key)
    return list(wdsfilter.sample_pipeline([path], cfg))


def score_shard(scorer, path, image_key):
    samples = read(path, image_key)
    rows = scorer.score_batch([scorer.prepare(s) for s in samples])
    return [(s["json"]["has_text"], r) for s, r in zip(samples, rows)]


def test_text_images_score_clearly_higher_than_plain_and_noise_images(scorer, shards):
    results = score_shard(scorer, os.path.join(shards, "ocr-images-000000.tar"), "png")
    text = [r["ocr_area"] for has, r in results if has]
    other = [r["ocr_area"] for has, r in results if not has]
    assert len(text) == 8 and len(other) == 8
    assert min(text) > 0.05, text  # a line or two of large text covers a tenth of the frame
    assert max(other) < 0.01, other
    for _, r in results:
        assert r["ocr_frames"] == 1 and r["ocr_area_frames"] == [r["ocr_area"]]
        assert 0.0 <= r["ocr_area"] <= 1.0


def test_videos_with_burned_in_subtitles_score_clearly_higher(scorer, shards):
    results = score_shard(scorer, os.path.join(shards, "videos-000000.tar"), "mp4")
    text = [r for has, r in results if has]
    other = [r for has, r in results if not has]
    assert len(text) == 4 and len(other) == 4
    for r in text + other:
        assert r["ocr_frames"] == 3 and len(r["ocr_area_frames"]) == 3
        assert r["ocr_area"] == pytest.approx(np.mean(r["ocr_area_frames"]))
    # The subtitle is in every frame: every sampled frame of a subtitled clip has text.
    assert min(min(r["ocr_area_frames"]) for r in text) > 0.04
    assert max(max(r["ocr_area_frames"]) for r in other) < 0.01


def test_frame_reduce_on_a_clip_with_text_in_its_middle_only(plain_scorer):
    scorer = plain_scorer
    blank = np.full((240, 320, 3), 230, np.uint8)
    sign = text_frame("BREAKING NEWS", bg=(230, 230, 230), size=40)
    clip = make_video([sign if 6 <= i < 11 else blank for i in range(16)])  # frames 0.75 s to 1.25 s
    prepared = scorer.prepare({"__key__": "k", "video": clip, "__media_ext__": "mp4"})
    assert prepared.frames.shape == (3, 240, 320, 3)  # at 0.33, 1.0, 1.67 s: only the middle has text
    try:
        rows = {}
        for reduce in ("mean", "max", "min"):
            scorer.frame_reduce = reduce
            rows[reduce] = scorer.score_batch([prepared])[0]
    finally:
        scorer.frame_reduce = "mean"
    first, middle, last = rows["max"]["ocr_area_frames"]
    assert first == 0.0 and last == 0.0 and middle > 0.05
    assert rows["max"]["ocr_area"] == middle
    assert rows["min"]["ocr_area"] == 0.0
    assert rows["mean"]["ocr_area"] == pytest.approx(middle / 3)


def test_frames_of_one_size_share_a_detector_call_and_batching_changes_nothing(scorer):
    small = text_frame("OPEN", width=200, height=150, size=30, xy=(20, 50))
    inputs = [
        scorer.prepare({"image": wdsfilter_image(text_frame("SALE"))}),
        scorer.prepare({"image": wdsfilter_image(small)}),
        scorer.prepare({"video": make_video([text_frame("NEWS")] * 8), "__media_ext__": "mp4"}),
        scorer.prepare({"image": wdsfilter_image(np.full((240, 320, 3), 255, np.uint8))}),
    ]
    assert scorer.batch_key(inputs[0]) == scorer.batch_key(inputs[2]) == (240, 320)
    assert scorer.batch_key(inputs[1]) == (150, 200)
    calls = []
    detect = scorer.detector.detect
    scorer.detector.detect = lambda frames: calls.append(frames.shape) or detect(frames)
    try:
        together = scorer.score_batch(inputs)
    finally:
        del scorer.detector.detect
    assert sorted(calls) == [(1, 150, 200, 3), (5, 240, 320, 3)]  # 1 + 3 video frames + 1 of 320x240
    alone = [scorer.score_batch([x])[0] for x in inputs]
    for a, b in zip(together, alone):
        assert a["ocr_area_frames"] == pytest.approx(b["ocr_area_frames"], abs=1e-6)
    assert together[0]["ocr_area"] > 0.03 and together[1]["ocr_area"] > 0.03 and together[3]["ocr_area"] == 0.0


def wdsfilter_image(array):
    from PIL import Image
    return Image.fromarray(array)


def test_large_images_are_scaled_down_and_the_ratio_is_scale_free(scorer):
    small = text_frame("SALE 50% OFF", size=36, xy=(20, 90))
    large = text_frame("SALE 50% OFF", width=2400, height=1800, size=270, xy=(150, 675))
    prepared = scorer.prepare({"image": wdsfilter_image(large)})
    assert prepared.frames.shape == (1, 960, 1280, 3)  # long side capped at max_side=1280
    r_small, r_large = (row["ocr_area"] for row in scorer.score_batch([scorer.prepare({"image": wdsfilter_image(small)}),
                                                                       prepared]))
    assert r_small > 0.05
    assert r_large == pytest.approx(r_small, abs=0.03)


def test_broken_videos_become_reasons_and_the_rest_is_scored(scorer, tmp_path):
    shard = write_shard(tmp_path / "videos-broken-000000.tar", [
        ("000000.mp4", os.urandom(3000)), ("000000.txt", "random bytes"),
        ("000001.mp4", audio_only_mp4()), ("000001.txt", "silence"),
        ("000002.mp4", make_video([text_frame("HELLO")] * 8)), ("000002.txt", "a sign"),
    ])
    reasons, rows = {}, {}
    for sample in read(shard, "mp4"):
        try:
            rows[sample["__key__"]] = scorer.score_batch([scorer.prepare(sample)])[0]
        except DataError as e:
            reasons[sample["__key__"]] = e
    assert {k: e.reason for k, e in reasons.items()} == {"000000": "corrupt_video", "000001": "no_video_stream"}
    assert "000000.mp4" in str(reasons["000000"]) and shard in str(reasons["000000"])  # names the sample
    assert rows["000002"]["ocr_area"] > 0.03


def test_committed_broken_video_shard(scorer):
    path = os.path.join(REPO, "sample_shards", "broken", "corrupt-video-000000.tar")
    if not os.path.isfile(path):
        pytest.skip("sample_shards/broken/corrupt-video-000000.tar is not generated yet")
    reasons, scored = [], 0
    for sample in read(path, "mp4"):
        try:
            scorer.score_batch([scorer.prepare(sample)])
            scored += 1
        except DataError as e:
            reasons.append(e.reason)
    assert sorted(reasons) == ["corrupt_video", "no_video_stream"] and scored == 1


def test_max_area_adds_a_keep_column_for_a_minimum_threshold():
    s = OcrScorer(max_area=0.05, backend_options={"threads": 2})
    assert s.columns() == ["ocr_area", "ocr_area_frames", "ocr_frames", "ocr_keep"]
    s.load("cpu")
    rows = s.score_batch([s.prepare({"image": wdsfilter_image(text_frame("BIG SALE", size=40))}),
                          s.prepare({"image": wdsfilter_image(np.full((240, 320, 3), 200, np.uint8))})])
    assert rows[0]["ocr_area"] > 0.05 and rows[0]["ocr_keep"] is False
    assert rows[1]["ocr_keep"] is True
    assert OcrScorer().columns() == ["ocr_area", "ocr_area_frames", "ocr_frames"]


def test_the_scorer_pickles_as_config_and_a_copy_scores_the_same(scorer):
    x = scorer.prepare({"image": wdsfilter_image(text_frame("COPY"))})
    expected = scorer.score_batch([x])[0]
    copy = pickle.loads(pickle.dumps(scorer))  # what DataLoader workers (spawn) receive
    assert copy.detector._model is None and copy.detector.device is None
    assert pickle.loads(pickle.dumps(x)).frames.shape == x.frames.shape
    with pytest.raises(RuntimeError):
        copy.score_batch([x])  # not loaded
    copy.load("cpu")
    assert copy.score_batch([x])[0]["ocr_area_frames"] == pytest.approx(expected["ocr_area_frames"])


def test_timings_split_detection_from_post_processing(scorer):
    scorer.timings(reset=True)
    scorer.score_batch([scorer.prepare({"image": wdsfilter_image(text_frame("TIME"))})])
    t = scorer.timings()
    assert set(t) == {"preprocess", "forward", "postprocess", "read", "area"}
    assert all(v > 0 for v in t.values()), t


def test_registry_and_options():
    s = make_scorer("ocr", frames=5, frame_reduce="max", keyframes=True)
    assert isinstance(s, OcrScorer) and s.frames == 5 and s.media == ("image", "video")
    assert "5 keyframes/video" in s.describe() and "reduce=max" in s.describe()
    for bad in (dict(backend="tesseract"), dict(frame_reduce="median"), dict(frames=0), dict(max_area=1.5),
                dict(area_method="sum"), dict(backend_options={"no_such_option": 1}),
                dict(backend_options={"limit_type": "avg"}), dict(backend_options={"min_side": -1}),
                dict(min_text_score=1.5), dict(min_text_score="none")):
        with pytest.raises(ConfigError):
            OcrScorer(**bad)


def test_missing_media_is_a_reason():
    with pytest.raises(DataError) as e:
        OcrScorer().prepare({"__key__": "k", "caption": "no media"})
    assert e.value.reason == "missing_image"


def test_rapidocr_on_a_gpu_without_onnxruntime_cuda_runs_on_cpu():
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has a CUDA provider")
    s = OcrScorer(backend_options={"threads": 1})
    s.load("cuda:1")
    assert s.detector.provider == "CPUExecutionProvider"
    assert "running on CPU" in s.describe()
    assert s.score_batch([s.prepare({"image": wdsfilter_image(text_frame("GPU"))})])[0]["ocr_area"] > 0.03


def test_ocr_input_is_plain_data():
    x = OcrInput(np.zeros((2, 8, 8, 3), np.uint8), "video", (0.5, 1.5), 0.01)
    assert pickle.loads(pickle.dumps(x)).times == (0.5, 1.5)


def test_benchmark_reports_frames_per_second_and_where_the_time_goes(shards):
    if shards != os.path.join(REPO, "sample_shards"):
        pytest.skip("tools/bench_ocr.py reads the committed sample_shards/")
    from tools import bench_ocr
    # The tool's measurement, not the default scorer's speed: frames at their own size, boxes not read.
    out = bench_ocr.main(["--copies", "1", "--threads", "1", "--batch", "8", "--frames", "1", "--min-side", "0",
                          "--min-text-score", "none"])
    assert out["scorer"].startswith("ocr: rapidocr") and "boxes not read" in out["scorer"]
    assert out["images"]["frames"] == 16 and out["videos"]["frames"] == 8
    for kind in ("images", "videos"):
        r = out[kind]
        assert r["frames_per_s"] > 0
        assert sum(r["share"].values()) == pytest.approx(1.0, abs=1e-6)
        assert r["share"]["detection"] > 0 and r["share"]["post"] > 0
        assert set(r["area_methods"]) >= {"shapely", "raster", "max_abs_diff"}
    assert out["videos"]["seconds_by_stage"]["decode"] > 0


def test_the_plans_model_threads_reach_onnxruntime_whose_threads_do_not_spin():
    """torch.set_num_threads does not reach onnxruntime, which builds its sessions with one thread
    per core (beside the decode workers): ModelRunner.configure(threads=N) builds the detector's
    and the reader's sessions again with N, and scores stay the same."""
    import torch

    from wdsfilter.score.modelrunner import ModelRunner
    scorer = OcrScorer(backend="rapidocr", frames=3)
    runner = ModelRunner([scorer], "cpu")
    runner.load()
    sessions = lambda: (scorer.detector._model, scorer.reader._rec.session.session)  # noqa: E731
    x = scorer.prepare({"image": wdsfilter_image(text_frame("THREADS"))})
    before = scorer.score_batch([x])[0]
    assert all(s.get_session_options().intra_op_num_threads == 0 for s in sessions())  # onnxruntime's default
    torch_threads = torch.get_num_threads()
    try:
        runner.configure(batch_size=4, threads=1)
        for s in sessions():
            options = s.get_session_options()
            assert options.intra_op_num_threads == 1
            assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert scorer.score_batch([x])[0] == before
        # A thread count the user set stays.
        chosen = OcrScorer(backend="rapidocr", frames=3, backend_options={"threads": 2})
        runner = ModelRunner([chosen], "cpu")
        runner.load()
        runner.configure(batch_size=4, threads=1)
        assert chosen.detector._model.get_session_options().intra_op_num_threads == 2
        assert chosen.reader._rec.session.session.get_session_options().intra_op_num_threads == 2
    finally:
        torch.set_num_threads(torch_threads)
