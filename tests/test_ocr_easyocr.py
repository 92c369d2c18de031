"""The easyocr backend with CRAFT checkpoints built here (no network): loaded through easyocr's own
loading code (easyocr.detection.get_detector: torch.load + copyStateDict), kept off DataParallel
and on the requested device. Random weights say nothing about quality, so the random checkpoint
only has to run through the real code and give ratios in [0, 1]; two checkpoints whose last layer
is a constant (every pixel "text", or none) check the post-processing end to end."""
from __future__ import annotations

import functools
import os
import pickle
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
easyocr = pytest.importorskip("easyocr")

from easyocr.craft import CRAFT  # noqa: E402
from PIL import Image  # noqa: E402
from videokit import make_video, text_frame  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.score.scorers.ocr import OcrScorer  # noqa: E402

FILENAME = "craft_mlt_25k.pth"  # the name easyocr looks for (easyocr.config.detection_models)
NETWORK = "craft"
pytestmark = pytest.mark.slow  # runs easyocr's CRAFT detector (tests/conftest.py says what slow means)


@functools.lru_cache(maxsize=1)
def craft_state():
    torch.manual_seed(0)
    return CRAFT().state_dict()  # building CRAFT takes a second or two: once per module


def save_craft(directory, last_bias=None, prefix="", state=None):
    """A CRAFT state dict from easyocr's own class. last_bias: zero the last conv and set its bias,
    so both score maps are that constant everywhere. prefix="module.": as DataParallel saves it."""
    state = {k: v.clone() for k, v in (state or craft_state()).items()}
    if last_bias is not None:
        state["conv_cls.8.weight"].zero_()
        state["conv_cls.8.bias"].fill_(last_bias)
    os.makedirs(directory, exist_ok=True)
    torch.save({prefix + k: v for k, v in state.items()}, os.path.join(directory, FILENAME))
    return str(directory)


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return save_craft(tmp_path_factory.mktemp("craft-random"))


def easy(directory, **backend_options):
    # min_text_score=None: these checkpoints are random or constant, so their boxes would read as
    # nothing and be dropped; the tests here are about the detector, with frames enlarged to the
    # working size as in use (min_side 736 by default; the all-text checkpoint still covers each
    # original frame after its boxes are mapped back).
    return OcrScorer(backend="easyocr", model_dir=directory, download=False, min_text_score=None,
                     backend_options={"verify_checksum": False, **backend_options})


def image(array):
    return {"image": Image.fromarray(array)}


def test_random_checkpoint_runs_through_easyocr_on_the_given_device(random_dir):
    s = easy(random_dir, min_side=0)  # random weights: the plumbing, not the detection, at frame size
    assert s.weights_path() == os.path.join(random_dir, FILENAME)
    s.load("cpu")
    net = s.detector._model
    assert type(net) is CRAFT  # the bare module, never torch.nn.DataParallel
    assert {p.device.type for p in net.parameters()} == {"cpu"}
    inputs = [s.prepare(image(text_frame("SALE"))), s.prepare(image(text_frame("OPEN", width=200, height=150))),
              s.prepare({"video": make_video([text_frame("NEWS")] * 8), "__media_ext__": "mp4"})]
    rows = s.score_batch(inputs)
    assert [r["ocr_frames"] for r in rows] == [1, 1, 3]
    for r in rows:
        assert all(0.0 <= v <= 1.0 for v in r["ocr_area_frames"]) and 0.0 <= r["ocr_area"] <= 1.0
    t = s.timings()
    assert t["forward"] > 0 and t["preprocess"] > 0


def test_non_cpu_devices_get_the_bare_module_moved_there(random_dir):
    # The GPU path without a GPU: "meta" takes the same branch as "cuda:N" (load on CPU through
    # easyocr, then .to(device)); a DataParallel wrapper would have spread it over every GPU.
    s = easy(random_dir)
    s.load("meta")
    assert type(s.detector._model) is CRAFT
    assert {p.device.type for p in s.detector._model.parameters()} == {"meta"}


def test_constant_checkpoints_cover_all_or_nothing(tmp_path):
    # Saved with DataParallel's "module." prefix: easyocr's copyStateDict strips it, so this also
    # shows the weights went through easyocr's loader. Both frames are enlarged before detection
    # (short sides 120 and 45), to 256 rather than the default 736: the same enlarge-and-map-back
    # path on a seventh of the pixels (CRAFT on CPU is slow).
    everything = easy(save_craft(tmp_path / "all", last_bias=1.0, prefix="module."), min_side=256)
    nothing = easy(save_craft(tmp_path / "none", last_bias=-1.0), min_side=256)
    assert all(s.detector._magnification(h, w) > 1 for s in (everything, nothing) for h, w in ((120, 160), (45, 100)))
    frames = [image(text_frame("A", width=160, height=120, size=20)), image(np.zeros((45, 100, 3), np.uint8))]
    for s in (everything, nothing):
        s.load("cpu")
    full = everything.score_batch([everything.prepare(f) for f in frames])
    empty = nothing.score_batch([nothing.prepare(f) for f in frames])
    # One box over the whole score map, scaled back to frame pixels (CRAFT's maps are half size)
    # and clipped to the frame: all of it, less the map's 1-pixel border.
    assert [r["ocr_area"] for r in full] == [pytest.approx(1.0, abs=0.03)] * 2
    assert [r["ocr_area"] for r in empty] == [0.0, 0.0]


def boxes_craft(frame, mag_ratio, low_text=0.4):
    """The random CRAFT with its last layer rescaled so that boxes appear and follow the picture:
    its text map spans ~0.05 (nothing would pass the thresholds), so it is stretched to put the
    top 15% of this frame's values over low_text and the top 1% at low_text + 0.6 (over
    text_threshold 0.7); the link map is off (-1), so boxes are the text map's components."""
    from easyocr.imgproc import normalizeMeanVariance, resize_aspect_ratio
    state = {k: v.clone() for k, v in craft_state().items()}
    net = CRAFT()
    net.load_state_dict(state)
    resized, _, _ = resize_aspect_ratio(frame, 2560, interpolation=__import__("cv2").INTER_LINEAR, mag_ratio=mag_ratio)
    with torch.inference_mode():
        text = net.eval()(torch.from_numpy(normalizeMeanVariance(resized))[None].permute(0, 3, 1, 2))[0][0, ..., 0]
    p85, p99 = np.percentile(text.numpy(), [85, 99])
    stretch = 0.6 / (p99 - p85)
    weight, bias = state["conv_cls.8.weight"], state["conv_cls.8.bias"]
    weight[0] *= stretch
    bias[0] = stretch * (bias[0] - p85) + low_text
    weight[1].zero_()
    bias[1] = -1.0
    return state


def test_craft_finds_the_same_boxes_after_torch_preprocessing(tmp_path):
    """What runs on CUDA (torch_preprocess: uint8 frames resized and normalised by torch) against
    easyocr's own preprocessing, through the same CRAFT on a CPU: the score maps differ by about a
    hundredth of their spread (inputs one grey level apart on ~10% of values,
    tests/test_ocr_preprocess.py), and detect() finds the same boxes, each corner within a pixel or
    two of the frame (thresholding a map that moved a little moves a component's edge by at most a
    map pixel, two frame pixels at these enlargements)."""
    from easyocr.imgproc import normalizeMeanVariance, resize_aspect_ratio
    from skimage import data
    from wdsfilter.score.ocr_backends.base import make_backend
    from wdsfilter.score.ocr_backends.easyocr_backend import torch_preprocess
    sale = text_frame("SALE 50%", width=240, height=160, size=30)
    frames = [sale, np.ascontiguousarray(data.coffee()[::3, ::3][:130, :190]),  # odd sizes, enlarged to 256
              np.ascontiguousarray(np.repeat(data.text()[::2, ::2, None], 3, axis=2))]  # handwriting, grey
    # min_side 256 rather than 736: the same enlarge-and-map-back path on a seventh of the pixels.
    options = {"download": False, "verify_checksum": False, "min_side": 256}
    mag = make_backend("easyocr", **options)._magnification(*sale.shape[:2])
    folder = save_craft(tmp_path / "craft", state=boxes_craft(sale, mag))
    backends = [make_backend("easyocr", model_dir=folder, torch_preprocess=on, **options) for on in (False, True)]
    for b in backends:
        b.load("cpu")
    easy, ours = backends
    assert easy._staging is None and ours._staging is not None  # on a CPU easyocr's code unless asked
    assert pickle.loads(pickle.dumps(ours))._staging is None
    counts = []
    for frame in frames:
        ratio, height, width = ours._resize(*frame.shape[:2])
        resized, _, _ = resize_aspect_ratio(frame, ours.canvas_size, interpolation=__import__("cv2").INTER_LINEAR,
                                            mag_ratio=ours._magnification(*frame.shape[:2]))
        with torch.inference_mode():
            maps_easy = ours._model(torch.from_numpy(normalizeMeanVariance(resized))[None].permute(0, 3, 1, 2))[0]
            maps_ours = ours._model(torch_preprocess(torch.from_numpy(frame[None].copy()), height, width,
                                                     torch.float32))[0]
        text_easy, text_ours = maps_easy[0, ..., 0].numpy(), maps_ours[0, ..., 0].numpy()
        spread = np.percentile(text_easy, 99) - np.percentile(text_easy, 1)
        assert np.abs(text_ours - text_easy).max() < 0.03 * spread
        boxes_easy, boxes_ours = easy.detect(frame[None])[0], ours.detect(frame[None])[0]
        assert len(boxes_ours) == len(boxes_easy)
        for a, b in zip(sorted(boxes_easy, key=lambda p: p.min(0).tolist()),
                        sorted(boxes_ours, key=lambda p: p.min(0).tolist())):
            assert np.abs(a - b).max() <= 2.0
        counts.append(len(boxes_easy))
    assert min(counts) >= 2  # boxes to compare on every frame (measured: 3, 4 and 7)
    assert ours.timings["preprocess"] > 0 and ours.timings["forward"] > 0


def test_release_checksum_is_enforced_unless_turned_off(random_dir):
    s = OcrScorer(backend="easyocr", model_dir=random_dir, download=False)  # verify_checksum on
    with pytest.raises(ConfigError, match="checksum"):
        s.load("cpu")


def test_missing_weights_without_downloads_name_the_fix(tmp_path):
    s = OcrScorer(backend="easyocr", model_dir=str(tmp_path / "empty"), download=False)
    with pytest.raises(ConfigError) as e:
        s.load("cpu")
    assert FILENAME in str(e.value) and "rapidocr" in str(e.value)


def test_pickles_without_the_model(random_dir):
    s = easy(random_dir)
    s.load("cpu")
    copy = pickle.loads(pickle.dumps(s))
    assert copy.detector._model is None and copy.detector.model_dir == random_dir
    assert s.weights_path() == os.path.join(random_dir, FILENAME)


def test_a_failed_download_is_a_config_error_telling_to_pass_local_weights(tmp_path, monkeypatch):
    """The real download code (easyocr's urlretrieve) against a port where nothing listens: what a
    machine without network gets, at once and without the network."""
    from easyocr import config
    monkeypatch.setitem(config.detection_models[NETWORK], "url", "http://127.0.0.1:9/craft_mlt_25k.zip")
    folder = tmp_path / "models"
    s = OcrScorer(backend="easyocr", model_dir=str(folder), download=True)
    with pytest.raises(ConfigError) as e:
        s.load("cpu")
    message = str(e.value)
    assert "could not download the easyocr detector weights craft_mlt_25k.pth" in message
    assert "--ocr-model-dir FOLDER --no-ocr-download" in message and "--ocr-backend rapidocr" in message
    assert not os.path.exists(folder / "temp.zip")  # no partial download left behind


def test_easyocr_through_the_score_command_with_a_local_checkpoint(random_dir, tmp_path):
    """--ocr-backend easyocr with --ocr-model-dir and --no-ocr-download: loaded through easyocr's
    own code in the run's model worker, its memory measured for the plan, every sample scored."""
    from click.testing import CliRunner
    from shardkit import write_shard
    from wdsfilter.cli import main
    from wdsfilter.runfolder.tables import read_rows
    buf = []
    for i, words in enumerate(["SALE", None, "OPEN", None]):
        frame = text_frame(words, width=160, height=120, size=24, xy=(10, 40)) if words else \
            np.full((120, 160, 3), 200, np.uint8)
        data = __import__("io").BytesIO()
        Image.fromarray(frame).save(data, "PNG")
        buf += [(f"{i:04d}.png", data.getvalue()), (f"{i:04d}.txt", f"sample {i}")]
    url = write_shard(tmp_path / "text-000000.tar", buf)
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["score", url, "--scorer", "ocr", "--ocr-backend", "easyocr",
                                       "--ocr-model-dir", random_dir, "--no-ocr-download", "--scorer-opt",
                                       'ocr.backend_options={"verify_checksum": false, "min_side": 0}', "--image-key", "png",
                                       "--device", "cpu", "--out", out, "--no-progress", "-v"])  # -v: the whole plan
    assert result.exit_code == 0, result.output
    assert "scorer: ocr: easyocr CRAFT detector" in result.output and random_dir in result.output
    footprint = re.search(r"model on cpu +\S+ \S+ +\(measured: .*ocr (\d+\.\d) MiB", result.output)
    assert footprint and float(footprint.group(1)) > 40  # CRAFT's 83 MB of weights, as RSS growth
    rows = read_rows(os.path.join(out, "scores", "text-000000.parquet"))
    assert [r["status"] for r in rows] == ["scored"] * 4
    assert all(0.0 <= r["ocr_area"] <= 1.0 and r["ocr_frames"] == 1 for r in rows)
    # The same flags without the checkpoint: the error names the file and the offline backend.
    result = CliRunner().invoke(main, ["score", url, "--scorer", "ocr", "--ocr-backend", "easyocr",
                                       "--ocr-model-dir", str(tmp_path / "none"), "--no-ocr-download",
                                       "--image-key", "png", "--device", "cpu", "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and FILENAME in result.output and "--ocr-backend rapidocr" in result.output


def test_bench_times_both_preprocessings_and_both_box_extractions(random_dir):
    """tools/bench_ocr.py's easyocr rows run the real code both ways on the same batches (no
    forward: cheap), and its getDetBoxes comparison checks that the boxes are the same."""
    from tools import bench_ocr
    s = easy(random_dir, min_side=256)
    s.load("cpu")
    frames = [np.stack([text_frame("SALE", width=160, height=120)] * 2), text_frame("OPEN", width=200, height=150)[None]]
    p = bench_ocr.compare_preprocessing(s, frames, batch=4, repeat=1)
    assert p["device"] == "cpu" and all(p[k + "_ms_per_frame"] > 0 for k in ("easyocr", "upload", "torch"))
    boxes = bench_ocr.compare_box_extraction(components=(0, 10), repeat=1)
    assert [b["same_boxes"] for b in boxes] == [True, True] and boxes[1]["boxes"] == 10
