"""The tmars scorer (wdsfilter/score/scorers/tmars.py) against an independent oracle: real photos
from scikit-image's wheel, the same photos with a caption-like text drawn by PIL, one local run of
`--scorer tmars` (rapidocr, the tiny CLIP model), and open_clip's own preprocess and encode on an
image the test masks itself from the boxes the OCR scorer reports for it."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest

skimage_data = pytest.importorskip("skimage.data")
pytest.importorskip("rapidocr_onnxruntime")

import open_clip  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import webdataset as wds  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from wdsfilter.score import score  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402
from wdsfilter.score.scorers.ocr import BOXES, OcrScorer  # noqa: E402

pytestmark = pytest.mark.slow  # the OCR detector and the tiny CLIP model

PHOTOS = ("astronaut", "rocket")  # photos rapidocr finds no text in at this size
SIZE = (240, 160)
RING = 3  # the tmars default: the band around a box whose mean colour fills it


def photo(name: str) -> Image.Image:
    a = getattr(skimage_data, name)()
    return Image.fromarray(np.ascontiguousarray(a[..., :3])).resize(SIZE, Image.Resampling.BICUBIC)


def with_text(img: Image.Image) -> Image.Image:
    img = img.copy()
    draw = ImageDraw.Draw(img)
    draw.text((14, 62), "SALE 50% OFF", fill=(255, 255, 40), font=ImageFont.load_default(size=28),
              stroke_width=2, stroke_fill=(0, 0, 0))
    return img


def caption(name: str) -> str:
    return f"a photo of the {name}"


def oracle_mask(image: np.ndarray, polygons) -> tuple:
    """The test's own T-MARS mask: each polygon's whole-pixel bounding box filled with the rounded
    mean colour of the pixels within RING of it that lie in no box. Returns (masked, boxes)."""
    h, w = image.shape[:2]
    boxes = []
    for p in polygons:
        x0, y0 = int(np.floor(p[:, 0].min())), int(np.floor(p[:, 1].min()))
        x1, y1 = int(np.ceil(p[:, 0].max())), int(np.ceil(p[:, 1].max()))
        boxes.append((max(0, x0), max(0, y0), min(w, x1), min(h, y1)))
    inside = np.zeros((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        inside[y0:y1, x0:x1] = True
    out = image.copy()
    for x0, y0, x1, y1 in boxes:
        near = np.zeros((h, w), bool)
        near[max(0, y0 - RING):y1 + RING, max(0, x0 - RING):x1 + RING] = True
        ring = near & ~inside
        out[y0:y1, x0:x1] = np.rint(image[ring].astype(np.float64).mean(axis=0)).astype(np.uint8)
    return out, boxes


@pytest.fixture(scope="module")
def images():
    out = {}
    for name in PHOTOS:
        out[name] = photo(name)
        out[name + "-text"] = with_text(out[name])
    return out


@pytest.fixture(scope="module")
def run(images, tiny_clip, tmp_path_factory):
    """One local run of `--scorer tmars` on the photos: (its folder, its rows by key, the shard)."""
    folder = tmp_path_factory.mktemp("tmars")
    shard = str(folder / "photos-000000.tar")
    with wds.TarWriter(shard) as writer:
        for key, img in images.items():
            buf = io.BytesIO()
            img.save(buf, "PNG")
            writer.write({"__key__": key, "png": buf.getvalue(), "txt": caption(key.split("-")[0])})
    out = str(folder / "out")
    score([shard], out, ("tmars",), model="local-dir:" + tiny_clip, workers=0, progress=False)
    (name,) = os.listdir(os.path.join(out, "scores"))
    return out, {r["key"]: r for r in read_rows(os.path.join(out, "scores", name))}, shard


@pytest.fixture(scope="module")
def rows(run):
    return run[1]


@pytest.fixture(scope="module")
def ocr_boxes(images):
    """The boxes the OCR scorer reports for each text photo, asked here on its own."""
    ocr = OcrScorer(backend="rapidocr")
    ocr.hand_boxes()  # as tmars asks it to
    ocr.load("cpu")
    keys = [k for k in images if k.endswith("-text")]
    outputs = ocr.score_batch([ocr.prepare({"image": images[k]}) for k in keys])
    return {k: out[BOXES][0] for k, out in zip(keys, outputs)}


@pytest.fixture(scope="module")
def cosine(tiny_clip):
    model, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + tiny_clip)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny_clip)
    model.eval()

    def cos(img: Image.Image, text: str) -> float:
        with torch.no_grad():
            a = F.normalize(model.encode_image(preprocess(img)[None]), dim=-1)
            b = F.normalize(model.encode_text(tokenizer([text])), dim=-1)
        return float((a * b).sum())
    return cos


def test_the_run_adds_ocr_and_clip_and_writes_the_masked_columns(rows):
    row = rows["astronaut-text"]
    assert row["status"] == "scored"
    for column in ("ocr_area", "clip_score", "clip_score_masked", "clip_score_masked_frames", "masked_share",
                   "masked_boxes"):
        assert column in row


def test_the_plan_counts_both_models_and_the_masked_frames_working_memory(run):
    import json
    with open(os.path.join(run[0], "summary.json")) as f:
        plan = json.load(f)["plan"]
    lines = {what: (value, why) for what, value, why in plan["lines"]}
    model = lines["model on cpu"][1]
    assert "ocr " in model and "clip " in model and "tmars 0 B" in model  # tmars shares clip's model
    # Probed with every frame masked (attach(probe=True)): its working memory is not left at zero.
    assert not lines["tmars activations"][0].startswith("0 B")
    assert set(plan["devices"][0]["scorer_batch"]) == {"ocr", "clip", "tmars"}


def test_masked_score_is_open_clips_score_of_the_image_masked_by_the_test(rows, images, ocr_boxes, cosine):
    for name in PHOTOS:
        key = name + "-text"
        polygons = ocr_boxes[key]
        assert polygons, f"rapidocr found no text on {key}"
        masked, boxes = oracle_mask(np.asarray(images[key]), polygons)
        row = rows[key]
        # The boxes tmars filled are the OCR scorer's, in the image's pixels.
        assert row["masked_boxes"] == [float(v) for b in boxes for v in b]
        expected = cosine(Image.fromarray(masked), caption(name))
        assert abs(row["clip_score_masked"] - expected) < 1e-4, (key, row["clip_score_masked"], expected)
        covered = np.zeros(masked.shape[:2], bool)
        for x0, y0, x1, y1 in boxes:
            covered[y0:y1, x0:x1] = True
        assert row["masked_share"] == pytest.approx(covered.mean())
        # The text moved the score, and masking it moves it back away from the text's.
        assert row["clip_score_masked"] != row["clip_score"]


def test_text_free_photos_keep_their_clip_score_exactly(rows):
    for name in PHOTOS:
        row = rows[name]
        assert row["masked_share"] == 0.0 and row["masked_boxes"] == []
        assert row["clip_score_masked"] == row["clip_score"]
        assert row["clip_score_masked_frames"] == row["clip_score_frames"]


def test_the_mask_changes_no_pixel_outside_the_reported_boxes(images, ocr_boxes):
    from wdsfilter.media.masking import box_rects, mask_frame
    for key, polygons in ocr_boxes.items():
        image = np.asarray(images[key])
        rects = box_rects(polygons, image.shape[1], image.shape[0])
        masked, covered = mask_frame(image, rects)
        inside = np.zeros(image.shape[:2], bool)
        for x0, y0, x1, y1 in rects:
            inside[y0:y1, x0:x1] = True
        assert covered == inside.sum() > 0
        assert np.array_equal(masked[~inside], image[~inside])
        assert np.array_equal(masked, oracle_mask(image, polygons)[0])


def _bound(clip):
    from wdsfilter.score.scorers.tmars import TmarsScorer
    tmars = TmarsScorer()
    tmars.bind({"clip": clip, "ocr": OcrScorer(backend="rapidocr")})
    return tmars


def _video_upstream(clip, frames, polygons, text):
    """What the model runner hands tmars for a video: OCR's frames and boxes, CLIP's row."""
    from wdsfilter.score.scorers.base import Upstream
    from wdsfilter.score.scorers.ocr import OcrInput
    tokens = clip.source.tokenizer()([text])[0]
    pixels = torch.stack([clip.transform(f) for f in frames])
    row = clip.score_batch([{"image": pixels, "tokens": tokens, "truncated": False}])[0] if clip._model else None
    return {"ocr": Upstream(OcrInput(frames, "video"), {BOXES: polygons}), "clip": Upstream(None, row)}


def test_a_video_is_masked_per_frame_and_reduced_as_frame_reduce_says(images, tiny_clip, cosine):
    from wdsfilter.score.scorers.clip import ClipScorer
    frames = np.stack([np.asarray(images[k]) for k in ("astronaut", "astronaut-text", "rocket")])
    box = np.array([[12.4, 60.0], [226.0, 60.0], [226.0, 96.7], [12.4, 96.7]])  # where the text was drawn
    polygons = [[], [box], []]
    for how in ("min", "max"):
        clip = ClipScorer("local-dir:" + tiny_clip, frame_reduce=how)
        clip.load("cpu")
        tmars = _bound(clip)
        upstream = _video_upstream(clip, frames, polygons, caption("astronaut"))
        x = tmars.attach("video", upstream)
        assert tmars.frame_count(x) == 1  # only the frame with text goes through the model
        row = tmars.score_batch([x])[0]
        clip_frames = upstream["clip"].output["clip_score_frames"]
        got = row["clip_score_masked_frames"]
        assert got[0] == clip_frames[0] and got[2] == clip_frames[2]
        masked, _ = oracle_mask(frames[1], [box])
        assert abs(got[1] - cosine(Image.fromarray(masked), caption("astronaut"))) < 1e-4
        assert row["clip_score_masked"] == (min(got) if how == "min" else max(got))
        assert row["masked_boxes"] is None and row["masked_share"] == pytest.approx(
            (226 - 12) * (97 - 60) / (SIZE[0] * SIZE[1]) if how == "max" else 0.0)


def test_samples_without_text_need_no_model_call(images, tiny_clip):
    from wdsfilter.score.scorers.base import Upstream
    from wdsfilter.score.scorers.clip import TEXT, ClipScorer
    clip = ClipScorer("local-dir:" + tiny_clip)  # never loaded: a model call would fail
    tmars = _bound(clip)
    frames = np.stack([np.asarray(images["rocket"])] * 2)
    clip_row = {"clip_score_frames": [0.25, 0.125], TEXT: None}
    from wdsfilter.score.scorers.ocr import OcrInput
    x = tmars.attach("video", {"ocr": Upstream(OcrInput(frames, "video"), {BOXES: [[], []]}),
                               "clip": Upstream(None, clip_row)})
    assert tmars.frame_count(x) == 0
    row = tmars.score_batch([x])[0]
    assert row["clip_score_masked_frames"] == [0.25, 0.125] and row["clip_score_masked"] == 0.1875
    assert row["masked_share"] == 0.0


def _written_keys(folder) -> set:
    import tarfile
    keys = set()
    for name in os.listdir(folder):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                keys |= {m.name.split(".")[0] for m in tar.getmembers()}
    return keys


def test_filter_takes_clip_score_masked_like_any_column(run, tmp_path):
    from wdsfilter.filtering.apply import filter_scores
    out, rows, _ = run
    ranked = sorted(rows, key=lambda k: rows[k]["clip_score_masked"], reverse=True)
    cut = rows[ranked[2]]["clip_score_masked"]
    result = filter_scores(out, min_scores={"clip_score_masked": cut}, write_shards=str(tmp_path / "min"),
                           report=None, save_thresholds=False)
    assert result.kept == 3 and _written_keys(tmp_path / "min") == set(ranked[:3])
    result = filter_scores(out, top_shares={"clip_score_masked": 50}, write_shards=str(tmp_path / "top"), report=None,
                           save_thresholds=False)
    assert result.kept == 2 and _written_keys(tmp_path / "top") == set(ranked[:2])


def test_the_report_shows_the_largest_drops_original_beside_masked(run, tmp_path):
    import base64
    from wdsfilter.filtering.apply import filter_scores
    out, rows, _ = run
    path = str(tmp_path / "report.html")
    filter_scores(out, min_scores={"clip_score": -1}, report=path, save_thresholds=False)
    page = open(path, encoding="utf-8").read()
    section = page.split("Text masked (T-MARS)")[1].split("<h2")[0]
    masked = [k for k in rows if rows[k]["masked_boxes"]]
    by_drop = sorted(masked, key=lambda k: rows[k]["clip_score"] - rows[k]["clip_score_masked"], reverse=True)
    assert [k for k in rows if f">{k} in " in section] and \
        sorted(by_drop, key=lambda k: section.index(f">{k} in ")) == by_drop
    assert section.count('alt="original"') == section.count('alt="masked"') == len(masked)
    # The masked thumbnail is the original one with the boxes filled: changed inside them only.
    card = section.split(f">{by_drop[0]} in ")[0].rsplit('class="card masked"', 1)[1]
    thumbs = [np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB"), float)
              for uri in (card.split('src="')[1].split('"')[0], card.split('src="')[2].split('"')[0])]
    scale = thumbs[0].shape[1] / SIZE[0]
    inside = np.zeros(thumbs[0].shape[:2], bool)
    b = rows[by_drop[0]]["masked_boxes"]
    for i in range(0, len(b), 4):
        inside[int(b[i + 1] * scale) + 1:int(b[i + 3] * scale) - 1, int(b[i] * scale) + 1:int(b[i + 2] * scale) - 1] = True
    near = np.zeros_like(inside)
    for i in range(0, len(b), 4):
        near[max(0, int(b[i + 1] * scale) - 4):int(b[i + 3] * scale) + 4,
             max(0, int(b[i] * scale) - 4):int(b[i + 2] * scale) + 4] = True
    diff = np.abs(thumbs[0] - thumbs[1]).mean(axis=2)
    assert diff[inside].mean() > 20 and diff[~near].mean() < 3


def test_ray_gives_the_local_engines_masked_scores(run, tiny_clip, tmp_path):
    pytest.importorskip("ray")
    from raykit import local_ray
    from wdsfilter.score.ray_runner import score_on_ray
    _, rows, shard = run
    with local_ray():
        score_on_ray([shard], out=str(tmp_path / "ray"), scorers=("tmars",), model="local-dir:" + tiny_clip,
                     progress=False)
    (name,) = os.listdir(tmp_path / "ray" / "scores")
    got = {r["key"]: r for r in read_rows(str(tmp_path / "ray" / "scores" / name))}
    assert sorted(got) == sorted(rows)
    for key, row in rows.items():
        assert got[key]["status"] == "scored" and got[key]["masked_boxes"] == row["masked_boxes"]
        assert abs(got[key]["clip_score_masked"] - row["clip_score_masked"]) < 1e-5
        assert (got[key]["clip_score_masked"] == got[key]["clip_score"]) == (not row["masked_boxes"])
