"""--decode-device: the CLIP scorer's JPEGs decoded in batches on the model's device
(torchvision.io.decode_jpeg, resize and crop there), run here on the CPU (decode_jpeg's
device="cpu": the same code as on a GPU, nvJPEG aside).

Stated tolerance: on real photos (scikit-image's wheel) the device path's pixels are those of
PIL's full decode through the same transform within 1/255 (decode_jpeg on the CPU and PIL decode
these JPEGs to the same pixels: the difference is the resize's rounding only); the CLIP scores of
the sample shards match the decode workers' full-decode path within 1e-4 and today's default
(reduced-scale decoding) within 0.01. Non-JPEG images and JPEGs the device refuses take the CPU path
per sample, with the CPU path's pixels or its reason."""
import io
import os

import numpy as np
import pytest
import torch
from PIL import Image

from wdsfilter import StageConfig
from wdsfilter.core.errors import ConfigError, DataError
from wdsfilter.media.images import decode_image
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.score.config import ScoreConfig
from wdsfilter.score.engines.local import decode_on_device
from wdsfilter.score.fastdecode import ImageTransform, device_pixels
from wdsfilter.score.scorers.clip import ClipScorer
from tools import make_tiny_clip

skimage = pytest.importorskip("skimage")
DATA = os.path.join(os.path.dirname(skimage.__file__), "data")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = [os.path.join(REPO, "sample_shards", f"images-00000{i}.tar") for i in range(2)]
CFG = {"size": 224, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
       "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic", "resize_mode": "shortest",
       "fill_color": 0}


def jpeg(image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def as_tensor(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def cpu_path(transform, datas):
    def fallback(i):
        image = decode_image(datas[i], None, floor=transform.decode_floor())
        return transform(image, image.info.get("wdsfilter_full_size"))
    return fallback


def test_device_pixels_match_pil_within_one_level_and_bad_files_take_the_cpu_path():
    transform = ImageTransform(CFG, reducing_gap=None)  # full decodes on both sides
    photos = [Image.open(os.path.join(DATA, n)).convert("RGB").reduce(2) for n in ("astronaut.png", "coffee.png",
                                                                                   "rocket.jpg")]
    datas = [jpeg(p) for p in photos] + [jpeg(photos[0], progressive=True), jpeg(photos[1].convert("L")),
                                          jpeg(photos[2].convert("CMYK"))]
    truncated = datas[0][:len(datas[0]) // 2]
    datas.append(truncated)  # in the middle of a group: the group is decoded again one by one
    datas.append(datas[1])
    sizes = [Image.open(io.BytesIO(d)).size for d in datas]
    got = []
    out = device_pixels(transform, [as_tensor(d) for d in datas], sizes, torch.device("cpu"),
                        lambda i: got.append(i) or "cpu path")
    assert got == [6] and out[6] == "cpu path"  # only the truncated file
    for i, data in enumerate(datas):
        if i == 6:
            continue
        reference = transform(decode_image(data, None))
        diff = (out[i].int() - reference.int()).abs()
        assert out[i].shape == (3, 224, 224) and int(diff.max()) <= 1, (i, int(diff.max()))
    with pytest.raises(DataError) as e:  # the CPU path's own reason for the truncated one
        cpu_path(transform, datas)(6)
    assert e.value.reason == "corrupt_image"


def test_groups_are_bounded_by_the_workspace(monkeypatch):
    import wdsfilter.score.fastdecode as fastdecode
    calls = []
    real = __import__("torchvision.io", fromlist=["decode_jpeg"]).decode_jpeg

    def counting(data, **kw):
        calls.append(len(data) if isinstance(data, list) else 1)
        return real(data, **kw)
    monkeypatch.setattr("torchvision.io.decode_jpeg", counting)
    monkeypatch.setattr(fastdecode, "DECODE_WORKSPACE", 2 * 300 * 400 * 3)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (300, 400, 3), dtype=np.uint8))
    data = jpeg(image)
    out = device_pixels(ImageTransform(CFG, None), [as_tensor(data)] * 5, [(400, 300)] * 5, torch.device("cpu"),
                        None)
    assert calls == [2, 2, 1] and all(o.shape == (3, 224, 224) for o in out)


@pytest.fixture(scope="module")
def fresh_clip(tmp_path_factory):
    """The tiny architecture with fresh weights: the decode path is under test, not what it learnt."""
    folder = str(tmp_path_factory.mktemp("tiny") / "tiny-clip")
    make_tiny_clip.write_config(folder)
    torch.manual_seed(0)
    import open_clip
    model = open_clip.create_model("local-dir:" + folder)
    torch.save(model.state_dict(), os.path.join(folder, "open_clip_pytorch_model.bin"))
    return "local-dir:" + folder


def prepared_samples(scorer):
    """The sample shards through the scoring run's stages (JPEGs left undecoded where the scorer
    decodes them on its device) and the scorer's prepare()."""
    cfg = ScoreConfig(out="unused", stage=StageConfig(caption_key="txt", image_key="jpg;png;webp")) \
        .scoring_stage_config([scorer])
    out = []
    for sample in sample_pipeline(SHARDS, cfg):
        if "__marker__" not in sample:
            out.append((sample["__key__"], scorer.prepare(sample)))
    return cfg, out


def scores(scorer, prepared):
    return {key: row["clip_score"] for (key, _), row in zip(prepared, scorer.score_batch([p for _, p in prepared]))}


@pytest.mark.slow  # a model (the tiny CLIP) scores the sample shards three ways
def test_scores_match_the_decode_workers_path(fresh_clip):
    device = ClipScorer(fresh_clip, decode_on_device=True, reducing_gap=None)
    full = ClipScorer(fresh_clip, reducing_gap=None)
    today = ClipScorer(fresh_clip)
    cfg, on_device = prepared_samples(device)
    assert cfg.defer_jpeg and not prepared_samples(today)[0].defer_jpeg
    kinds = [("jpeg" in p) for _, p in on_device]
    assert kinds.count(True) == 48 and kinds.count(False) == 16  # the JPEGs cross as bytes; PNG and WebP as pixels
    assert all(p["jpeg"].dtype == torch.uint8 and p["jpeg"].ndim == 1 for _, p in on_device if "jpeg" in p)
    for scorer in (device, full, today):
        scorer.load("cpu")
    got = scores(device, on_device)
    want_full = scores(full, prepared_samples(full)[1])
    want_today = scores(today, prepared_samples(today)[1])
    assert got.keys() == want_full.keys() == want_today.keys()
    assert max(abs(got[k] - want_full[k]) for k in got) < 1e-4
    assert max(abs(got[k] - want_today[k]) for k in got) < 0.01


def test_decode_device_settings():
    assert decode_on_device("auto", ["cuda:0", "cuda:1"]) and not decode_on_device("auto", ["cpu"])
    assert not decode_on_device("cpu", ["cuda:0"]) and decode_on_device("cuda", ["cuda:0"])
    with pytest.raises(ConfigError, match="model workers are on cpu"):
        decode_on_device("cuda", ["cpu"])
    with pytest.raises(ConfigError, match="--device cpu has none"):
        ScoreConfig(out="unused", decode_device="cuda", device="cpu")
    with pytest.raises(ConfigError, match="decode_device must be"):
        ScoreConfig(out="unused", decode_device="gpu")
