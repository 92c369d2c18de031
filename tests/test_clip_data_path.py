"""The CLIP data path: uint8 pixels, one tokenisation, reduced-scale decoding, precision per
device and pinned staging, checked against today's results (open_clip's preprocess and tokenizer
on fully decoded images, fp32) on the sample shards with the tiny model."""
import os

import open_clip
import pytest
import torch
import torch.nn.functional as F

import wdsfilter
from wdsfilter import ConfigError, StageConfig
from wdsfilter.score import build_config
from wdsfilter.score import models
from wdsfilter.score.models import resolve_precision, token_count, tokenize
from wdsfilter.score.transport import Prepare
from wdsfilter.score.scorers.clip import ClipScorer
from wdsfilter.score.staging import Staging
from wdsfilter.stream.stages import MARKER

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = [os.path.join(REPO, "sample_shards", name) for name in
          ("images-000000.tar", "images-000001.tar", "json-captions-000000.tar")]
STAGE = StageConfig(caption_key="txt;json:description")
# Stated tolerance of the scores (docs/clip.md): the reduced-scale decode moves the tiny model's
# clip_score by at most this much on the sample shards; a full decode (reducing_gap=None) by 1e-3.
SCORE_TOLERANCE = 0.01  # measured 0.008 (full decode: 1.1e-4)

torch.set_num_threads(2)


def todays_scores(tiny_clip):
    """clip_score as the code before this change computed it: full decode, open_clip's preprocess
    (float32) and tokenizer, fp32 model, cosine of the normalised embeddings."""
    model, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + tiny_clip)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny_clip)
    scores = {}
    samples = list(wdsfilter.sample_pipeline(SHARDS, STAGE))
    with torch.no_grad():
        image = F.normalize(model.eval().encode_image(torch.stack([preprocess(s["image"]) for s in samples])), dim=-1)
        text = F.normalize(model.encode_text(tokenizer([s["caption"] for s in samples])), dim=-1)
    for s, v in zip(samples, (image * text).sum(-1).tolist()):
        scores[s["__key__"]] = v
    return scores


def engine_scores(scorer):
    """The scoring engine's decode side (its stage config, with the scorer's decode floor) and
    score_batch."""
    from wdsfilter.score.config import ScoreConfig
    stage = ScoreConfig(out="unused", stage=STAGE).scoring_stage_config([scorer])
    items = [i for i in wdsfilter.sample_pipeline(SHARDS, stage, extra=[Prepare([scorer])])
             if MARKER not in i and "clip" in i["inputs"]]
    rows = scorer.score_batch([i["inputs"]["clip"] for i in items])
    return {i["__key__"]: r["clip_score"] for i, r in zip(items, rows)}, stage.decode_floor


def test_scores_stay_equal_to_todays_within_the_stated_tolerance(tiny_clip):
    today = todays_scores(tiny_clip)
    fast = ClipScorer("local-dir:" + tiny_clip, config=STAGE)
    fast.load("cpu")
    ours, floor = engine_scores(fast)
    assert floor == (80, 0)  # 1.25 x the tiny model's 64 px
    assert set(ours) == set(today) and len(today) >= 60
    diff = max(abs(ours[k] - today[k]) for k in today)
    assert diff < SCORE_TOLERANCE, diff
    exact = ClipScorer("local-dir:" + tiny_clip, config=STAGE, reducing_gap=None)
    exact.load("cpu")
    full, floor = engine_scores(exact)
    assert floor is None
    assert max(abs(full[k] - today[k]) for k in today) < 1e-3
    print(f"max |clip_score - today's|: reduced decode {diff:.4f}, full decode "
          f"{max(abs(full[k] - today[k]) for k in today):.5f}")


def test_prepared_pixels_are_uint8(tiny_clip):
    scorer = ClipScorer("local-dir:" + tiny_clip, config=STAGE)
    sample = next(iter(wdsfilter.sample_pipeline(SHARDS[:1], STAGE)))
    prepared = scorer.prepare(sample)
    assert prepared["image"].dtype == torch.uint8 and prepared["image"].shape == (3, 64, 64)
    assert prepared["tokens"].dtype == torch.long


def test_captions_are_tokenised_once_and_equal_open_clips(monkeypatch):
    tokenizer = open_clip.get_tokenizer("ViT-B-32")  # open_clip's SimpleTokenizer, context 77
    calls = []
    bpe = tokenizer.bpe
    monkeypatch.setattr(tokenizer, "bpe", lambda word: calls.append(word) or bpe(word))
    captions = ["a red circle", "", "Ünïcode  spaces\tand\nnewlines", "word " * 90, "a " * 74, "a " * 75, "a " * 76]
    for caption in captions:
        calls.clear()
        tokens, truncated = tokenize(tokenizer, caption, 77)
        # Each word through BPE once at most (counting, then encoding again, would be twice), and
        # no more words than the context needs.
        words = tokenizer.pat.findall(tokenizer.clean_fn(caption))
        assert len(calls) <= min(len(words), 77) and bool(calls) == bool(words)
        assert torch.equal(tokens, tokenizer(caption)[0])
        assert truncated == (token_count(tokenizer, caption) > 77)
    assert tokenize(tokenizer, "a " * 76, 77)[1] and not tokenize(tokenizer, "a " * 75, 77)[1]


def test_precision_is_resolved_per_device(monkeypatch):
    cpu, cuda1 = torch.device("cpu"), torch.device("cuda:1")
    assert resolve_precision("auto", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    assert resolve_precision("auto", cuda1) == "fp16" and resolve_precision("fp32", cuda1) == "fp32"
    asked = []
    monkeypatch.setattr(models, "bf16_supported", lambda device: asked.append(device) or device.index == 1)
    assert resolve_precision("bf16", cuda1) == "bf16"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")
    with pytest.raises(ConfigError, match=r"bf16 is not supported on cuda:0 \(Tesla T4\)"):
        resolve_precision("bf16", torch.device("cuda:0"))
    assert asked == [cuda1, torch.device("cuda:0")]  # the worker's own device, not GPU 0
    with pytest.raises(ConfigError, match="precision"):
        resolve_precision("fp8", cpu)


def test_precision_flag_reaches_the_clip_scorer(tiny_clip):
    cfg = build_config("out", ("clip",), precision="fp32", model="local-dir:" + tiny_clip)
    assert cfg.scorer_options["clip"]["precision"] == "fp32"
    with pytest.raises(ConfigError, match="precision"):
        ClipScorer("local-dir:" + tiny_clip, precision="fp64")


def test_staging_pins_and_copies_asynchronously_on_cuda_only():
    cuda, cpu = Staging.for_device("cuda:1"), Staging.for_device(torch.device("cpu"))
    assert (cuda.pin, cuda.non_blocking, cuda.reuse) == (True, True, True)
    assert (cpu.pin, cpu.non_blocking, cpu.reuse) == (False, False, False)
    parts = [torch.randint(0, 255, (n, 3, 8, 8), dtype=torch.uint8) for n in (2, 3)]
    assert torch.equal(cpu.to_device(parts, "cpu"), torch.cat(parts))
    # The reuse path (the one CUDA takes, without pinning here): one kept buffer, grown, reused.
    staged = Staging(pin=False, non_blocking=False, reuse=True)
    first = staged.to_device(parts, "cpu")
    assert torch.equal(first, torch.cat(parts))
    buffer = staged._buffers[torch.uint8]
    assert staged.to_device(parts[:1], "cpu").data_ptr() == buffer.data_ptr()  # no new allocation
    bigger = [torch.ones(9, 3, 8, 8, dtype=torch.uint8)]
    assert torch.equal(staged.to_device(bigger, "cpu"), bigger[0]) and staged._buffers[torch.uint8].numel() >= 9 * 192
    staged.release()
    assert not staged._buffers
