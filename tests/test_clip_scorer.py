"""ClipScorer on a real open_clip model: the tiny one the `tiny_clip` fixture trains on the sample shards."""
import os
import pickle
import shutil

import open_clip
import pytest
import torch
import torch.nn.functional as F

import wdsfilter
from wdsfilter import ConfigError, DataError, StageConfig
from wdsfilter.score.scorers.base import make_scorer
from wdsfilter.score.scorers.clip import ClipScorer
from videokit import h264_mp4

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_SHARDS = [os.path.join(REPO, "sample_shards", f"images-00000{i}.tar") for i in range(2)]
ADVICE = ("--pretrained", "local-dir:", "tools/make_tiny_clip.py")

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def samples():
    """Decoded samples of the img2dataset-style sample shards (json carries caption_matches)."""
    return list(wdsfilter.sample_pipeline(IMAGE_SHARDS, StageConfig(caption_key="txt")))


@pytest.fixture(scope="module")
def scorer(tiny_clip):
    scorer = make_scorer("clip", model="local-dir:" + tiny_clip)
    scorer.load("cpu")
    return scorer


def score_all(scorer, prepared, batch_size=64):
    rows = []
    for i in range(0, len(prepared), batch_size):
        rows += scorer.score_batch(prepared[i:i + batch_size])
    return rows


def test_prepare_matches_open_clip_own_transform_and_tokenizer(tiny_clip, samples):
    # Built from the config alone (no weights), equal to what open_clip attaches to the loaded model.
    scorer = ClipScorer("local-dir:" + tiny_clip)
    _, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + tiny_clip)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny_clip)
    std = torch.tensor(scorer.transform.std).view(3, 1, 1)
    for sample in samples[:5]:
        prepared = scorer.prepare(dict(sample))
        # uint8 pixels, within one level of open_clip's (torch's resize kernel vs PIL's).
        assert prepared["image"].dtype == torch.uint8
        pixels = scorer.transform.normalize(prepared["image"])
        assert ((pixels - preprocess(sample["image"])).abs() * std * 255).max() <= 1.0 + 1e-3
        assert torch.equal(prepared["tokens"], tokenizer(sample["caption"])[0])
        assert prepared["image"].shape == (3, 64, 64) and prepared["tokens"].shape == (32,)


def test_scores_are_cosines_of_normalised_embeddings(scorer, tiny_clip, samples):
    model = open_clip.create_model("local-dir:" + tiny_clip).eval()  # loaded independently
    prepared = [scorer.prepare(s) for s in samples[:16]]
    rows = scorer.score_batch(prepared)
    with torch.no_grad():
        image = model.encode_image(scorer.transform.normalize(torch.stack([p["image"] for p in prepared])))
        text = model.encode_text(torch.stack([p["tokens"] for p in prepared]))
    manual = (F.normalize(image, dim=-1) * F.normalize(text, dim=-1)).sum(-1)
    scores = torch.tensor([r["clip_score"] for r in rows])
    assert torch.allclose(scores, manual, atol=1e-5)
    assert scores.abs().max() <= 1.0
    # Not logits: those are the cosine times the learnt scale (> 1 after training).
    assert model.logit_scale.exp().item() > 1.5


def test_batched_scores_equal_one_at_a_time(scorer, samples):
    prepared = [scorer.prepare(s) for s in samples[:24]]
    batched = [r["clip_score"] for r in scorer.score_batch(prepared)]
    single = [scorer.score_batch([p])[0]["clip_score"] for p in prepared]
    assert max(abs(a - b) for a, b in zip(batched, single)) < 1e-4


def test_matched_captions_score_higher_than_mismatched(scorer, samples):
    rows = score_all(scorer, [scorer.prepare(s) for s in samples])
    matched = [r["clip_score"] for r, s in zip(rows, samples) if s["json"]["caption_matches"]]
    mismatched = [r["clip_score"] for r, s in zip(rows, samples) if not s["json"]["caption_matches"]]
    assert len(mismatched) >= 10 and len(matched) >= 10
    gap = sum(matched) / len(matched) - sum(mismatched) / len(mismatched)
    assert gap > 0.05, f"matched captions outscore mismatched ones by only {gap:.3f}"
    # And per pair, not only on average: a random matched sample beats a random mismatched one
    # (the AUC of clip_score as a test of caption_matches), as the README's model does everywhere.
    auc = sum(m > x for m in matched for x in mismatched) / (len(matched) * len(mismatched))
    assert auc >= 0.8, f"AUC {auc:.3f}"


def test_name_plus_checkpoint_path_scores_like_local_dir(scorer, tiny_clip, samples):
    open_clip.add_model_config(tiny_clip)  # registers the folder's wdsfilter-tiny-clip.json
    by_name = ClipScorer("wdsfilter-tiny-clip", pretrained=os.path.join(tiny_clip, "open_clip_model.safetensors"))
    by_name.load("cpu")
    prepared = [scorer.prepare(s) for s in samples[:8]]
    assert [r["clip_score"] for r in by_name.score_batch(prepared)] == \
        pytest.approx([r["clip_score"] for r in scorer.score_batch(prepared)], abs=1e-6)


def test_long_caption_is_truncated_and_flagged(scorer, tiny_clip, samples):
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny_clip)
    image = samples[0]["image"]
    # A caption of exactly the context (start + 30 words + end) fits; one more word does not.
    words = ["red"] * 30
    assert len(tokenizer.encode(" ".join(words))) + 2 == scorer.context_length == 32
    fits = scorer.prepare({"image": image, "caption": " ".join(words)})
    over = scorer.prepare({"image": image, "caption": " ".join(words + ["circle"])})
    long = scorer.prepare({"image": image, "caption": "a red circle on a blue background " * 20})
    assert not fits["truncated"] and over["truncated"] and long["truncated"]
    assert long["tokens"].shape == (32,) and long["tokens"][-1].item() == tokenizer.eot_token_id
    rows = scorer.score_batch([fits, over, long])
    assert [r["clip_truncated"] for r in rows] == [False, True, True]
    assert all(-1 <= r["clip_score"] <= 1 for r in rows)


def test_image_tokens_are_stripped_from_captions(tiny_clip, samples):
    scorer = ClipScorer("local-dir:" + tiny_clip, config=StageConfig(image_token="<__dj__image>"))
    image = samples[0]["image"]
    plain = scorer.prepare({"image": image, "caption": "a red circle"})
    tagged = scorer.prepare({"image": image, "caption": "<__dj__image> a red <image> circle"})
    assert torch.equal(plain["tokens"], tagged["tokens"])
    with pytest.raises(DataError) as e:
        scorer.prepare({"image": image, "caption": "<image>"})
    assert e.value.reason == "empty_caption"
    with pytest.raises(DataError) as e:
        scorer.prepare({"caption": "no media"})
    assert e.value.reason == "missing_image"
    with pytest.raises(DataError) as e:
        scorer.prepare({"video": b"not a video", "caption": "a clip", "__key__": "k1", "__url__": "s.tar"})
    assert e.value.reason == "corrupt_video" and "k1" in str(e.value) and "s.tar" in str(e.value)


def test_pickle_round_trip_before_load(tiny_clip, samples):
    scorer = ClipScorer("local-dir:" + tiny_clip)
    first = scorer.prepare(dict(samples[0]))  # builds the transform and tokenizer in this process
    clone = pickle.loads(pickle.dumps(scorer))
    assert clone._tokenizer is None and clone._model is None  # rebuilt where used, not shipped
    again = clone.prepare(dict(samples[0]))
    assert torch.equal(first["image"], again["image"]) and torch.equal(first["tokens"], again["tokens"])
    clone.load("cpu")
    assert -1 <= clone.score_batch([again])[0]["clip_score"] <= 1


def test_low_precision_autocast_stays_close_to_fp32(scorer, tiny_clip, samples):
    prepared = [scorer.prepare(s) for s in samples[:32]]
    fp32 = torch.tensor([r["clip_score"] for r in scorer.score_batch(prepared)])
    bf16 = ClipScorer("local-dir:" + tiny_clip, precision="bf16")
    bf16.load("cpu")  # CPU autocast supports bf16; on CUDA bf16 is checked on the worker's device
    diff = (torch.tensor([r["clip_score"] for r in bf16.score_batch(prepared)]) - fp32).abs().max().item()
    assert 0 < diff < 2e-2  # autocast really ran, and the cosine stays usable
    assert "precision=bf16" in bf16.describe()


def test_describe_names_model_weights_device_and_tiny_caveat(scorer, tiny_clip):
    text = scorer.describe()
    assert "local-dir:" + tiny_clip in text and "open_clip_model.safetensors" in text
    assert "tiny local model trained on sample shards" in text and "only meaningful on these shards" in text
    assert "plus 2048 fresh scenes from their generator" in text
    assert "device=cpu" in text and "precision=fp32" in text  # auto is fp32 on CPU


def test_missing_checkpoint_or_folder_is_a_config_error_with_advice(tiny_clip, tmp_path):
    with pytest.raises(ConfigError) as e:
        ClipScorer("ViT-B-32", pretrained=str(tmp_path / "no-such" / "open_clip_model.safetensors"))
    assert "does not exist" in str(e.value) and all(a in str(e.value) for a in ADVICE)
    with pytest.raises(ConfigError, match="does not exist") as e:
        ClipScorer("local-dir:" + str(tmp_path / "nothing-here"))
    assert all(a in str(e.value) for a in ADVICE)
    # A folder with the config but no weights: open_clip alone would score with random weights.
    shutil.copy(os.path.join(tiny_clip, "open_clip_config.json"), tmp_path / "open_clip_config.json")
    with pytest.raises(ConfigError, match="no weights"):
        ClipScorer("local-dir:" + str(tmp_path))
    with pytest.raises(ConfigError, match="cannot be used with"):
        ClipScorer("local-dir:" + tiny_clip, pretrained="laion2b_s34b_b79k")
    with pytest.raises(ConfigError, match="is a folder"):
        ClipScorer("ViT-B-32", pretrained=tiny_clip)
    with pytest.raises(ConfigError, match="is not a model folder") as e:  # forgot to build it
        ClipScorer(str(tmp_path / "tiny-clip"))
    assert all(a in str(e.value) for a in ADVICE)


def test_unknown_model_or_tag_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        ClipScorer("ViT-B-33")
    assert "unknown CLIP model 'ViT-B-33'" in str(e.value) and "open_clip.list_models()" in str(e.value)
    assert "did you mean" in str(e.value)
    with pytest.raises(ConfigError, match="hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"):
        ClipScorer("laion/CLIP-ViT-B-32-laion2B-s34B-b79K")
    with pytest.raises(ConfigError, match="neither a pretrained tag of ViT-B-32 nor a file.*laion2b_s34b_b79k"):
        ClipScorer("ViT-B-32", pretrained="laion9b")
    with pytest.raises(ConfigError, match="precision"):
        ClipScorer("ViT-B-32", pretrained="random", precision="fp8")


def test_failed_download_is_a_config_error_and_prepare_needs_no_weights(monkeypatch, tmp_path, samples):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network, quickly
    scorer = ClipScorer("ViT-B-32", pretrained="openai", cache_dir=str(tmp_path))
    prepared = scorer.prepare(dict(samples[0]))  # config only: works without the weights
    assert prepared["image"].shape == (3, 224, 224) and prepared["tokens"].shape == (77,)
    assert "QuickGELU" in scorer.describe()  # openai weights use it, the ViT-B-32 config does not
    with pytest.raises(ConfigError, match="could not download weights ViT-B-32 / 'openai'") as e:
        scorer.load("cpu")
    assert all(a in str(e.value) for a in ADVICE)
    with pytest.raises(ConfigError, match="could not fetch open_clip_config.json of hf-hub:") as e:
        ClipScorer("hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", cache_dir=str(tmp_path))
    assert all(a in str(e.value) for a in ADVICE)


VIDEO_SHARD = os.path.join(REPO, "sample_shards", "videos-000000.tar")


def test_videos_are_scored_on_sampled_frames_each_against_the_caption(tiny_clip, samples):
    from PIL import Image
    from wdsfilter.media.frames import sample_frames

    videos = list(wdsfilter.sample_pipeline(VIDEO_SHARD, StageConfig(caption_key="txt", image_key="mp4")))
    assert len(videos) == 8 and all(v["video"] is not None for v in videos)
    model = open_clip.create_model("local-dir:" + tiny_clip).eval()
    _, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + tiny_clip)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny_clip)
    by_reduce = {}
    for reduce in ("mean", "max", "min"):
        scorer = ClipScorer("local-dir:" + tiny_clip, frames=4, frame_reduce=reduce)
        scorer.load("cpu")
        # Videos and images mixed in one batch: each gets its own frames and caption.
        prepared = [scorer.prepare(s) for s in videos[:3]] + [scorer.prepare(samples[0])]
        rows = scorer.score_batch(prepared)
        assert [r["clip_frames"] for r in rows] == [4, 4, 4, 1]
        by_reduce[reduce] = rows
        # Batching changes nothing.
        assert all(abs(a - b) < 1e-4 for r, p in zip(rows, prepared)
                   for a, b in zip(r["clip_score_frames"], scorer.score_batch([p])[0]["clip_score_frames"]))
    # The per-frame scores are the cosines of each sampled frame (independently decoded and
    # preprocessed here) with the caption; the reductions are taken over them.
    for video, row in zip(videos[:3], by_reduce["mean"]):
        frames = sample_frames(video["video"], 4, max_side=512).frames
        with torch.no_grad():
            image = F.normalize(model.encode_image(torch.stack([preprocess(Image.fromarray(f)) for f in frames])), dim=-1)
            text = F.normalize(model.encode_text(tokenizer([video["caption"]])), dim=-1)
        expected = (image @ text.T).squeeze(1).tolist()
        # open_clip's PIL resize here, torch's uint8 resize in the scorer: within one grey level.
        assert max(abs(a - b) for a, b in zip(row["clip_score_frames"], expected)) < 1e-3
        assert row["clip_score"] == pytest.approx(sum(expected) / 4, abs=1e-3)
    for i in range(3):
        frames = by_reduce["mean"][i]["clip_score_frames"]
        assert by_reduce["max"][i]["clip_score"] == pytest.approx(max(frames), abs=1e-5)
        assert by_reduce["min"][i]["clip_score"] == pytest.approx(min(frames), abs=1e-5)
    image_row = by_reduce["mean"][3]
    assert image_row["clip_score_frames"] == [image_row["clip_score"]]


def test_video_options_are_checked_at_once(tiny_clip):
    with pytest.raises(ConfigError, match="frames"):
        ClipScorer("local-dir:" + tiny_clip, frames=0)
    with pytest.raises(ConfigError, match="frame_reduce"):
        ClipScorer("local-dir:" + tiny_clip, frame_reduce="median")


def test_a_cut_short_video_is_scored_from_its_frames_and_noted(scorer, tmp_path):
    """A faststart MP4 cut at 60%: prepare() returns the frames that are there wrapped in Noted
    (corrupt_video, the sampler's message); the row it completes is partial and says so."""
    from wdsfilter.score.transport import Prepare
    from wdsfilter.score.rows import complete_row, new_row
    from wdsfilter.score.scorers.base import Noted
    from wdsfilter.core.thresholds import Thresholds
    data = h264_mp4(tmp_path / "clip.mp4", 75)
    cut = data[:int(len(data) * 0.6)]
    whole = scorer.prepare({"video": data, "caption": "noise", "__key__": "w"})
    assert isinstance(whole, dict)
    noted = scorer.prepare({"video": cut, "caption": "noise", "__key__": "c"})
    assert isinstance(noted, Noted) and noted.reason == "corrupt_video" and "cut short" in noted.message
    assert noted.input["image"].shape == whole["image"].shape  # the same frames asked for, from what is there
    (item,) = Prepare([scorer])([{"__key__": "c", "__url__": "s.tar", "video": cut, "caption": "noise"}])
    assert isinstance(item["inputs"]["clip"], dict)  # the model worker gets the plain input
    (scores,) = score_all(scorer, [item["inputs"]["clip"]])
    row = new_row("c", "s.tar", 0)
    complete_row(row, [scorer], scores, item["errors"], Thresholds())
    # partial (scored from the frames there) is kept without thresholds, as filter and the loader keep it
    assert row["status"] == "partial" and row["reason"] == "corrupt_video" and row["kept"]
    assert row["message"] == f"clip: {noted.message}" and row["clip_score"] == scores["clip_score"]
