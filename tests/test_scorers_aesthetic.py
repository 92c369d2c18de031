"""The aesthetic scorer (wdsfilter/score/scorers/aesthetic.py): LAION's vendored heads against a
reading of the same files without torch, on fixed vectors and on LAION's real CLIP embeddings
grouped by human rating (tests/data/aesthetic, from LAION-AI/aesthetic-predictor); the CLIP models
the heads do not fit refused before any model loads; and a run that gets its embedding from the
CLIP scorer's one image encode."""
from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from wdsfilter.core.errors import ConfigError
from wdsfilter.score import build_config, score
from wdsfilter.score.models import ClipSource
from wdsfilter.score.scorers.aesthetic import HEAD_DIR, HEADS, AestheticScorer, choose_head, head_path
from wdsfilter.score.scorerset import resolve_scorers

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "aesthetic")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sha256 of the files at LAION-AI/aesthetic-predictor commit 6d122ad (aesthetic_heads/README.md)
UPSTREAM = {"vit_b_32": "c7b14cead230694acc7b9447974d3cad78003c72da032e402a303b6c2429e85f",
            "vit_b_16": "8ad3923d7ecf019df20ecd2ab5542a3075fbba0278d239c0371345f3d7fcbde0",
            "vit_l_14": "2cd4e60f4f24ae3bcd57b847b13c1f3ba27edc28cc1a7f9ce74ee9f421243cba"}


def head_without_torch(name: str):
    """(weight, bias) in float64 read straight from the .pth zip: torch's format stores each tensor
    as raw little-endian float32 in archive/data/N; the weight is the one of `width` values."""
    with zipfile.ZipFile(head_path(name)) as z:
        storages = [np.frombuffer(z.read(n), "<f4").astype(np.float64) for n in z.namelist()
                    if "/data/" in n and not n.endswith("/")]
    (weight,) = [s for s in storages if s.size == HEADS[name].width]
    (bias,) = [s for s in storages if s.size == 1]
    return weight, float(bias[0])


def loaded(name: str) -> AestheticScorer:
    scorer = AestheticScorer(head=name)
    scorer.resolved = name  # what bind() decides from the run's CLIP
    scorer.load("cpu")
    return scorer


def rating_embeddings(family: str) -> np.ndarray:
    return np.concatenate([np.load(os.path.join(DATA, f"{family}_embeddings", f"rating{i}.npy")) for i in range(10)])


def test_the_vendored_heads_are_laions_files():
    for name, digest in UPSTREAM.items():
        with open(head_path(name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, name
    assert "MIT License" in open(os.path.join(HEAD_DIR, "LICENSE")).read()
    assert "LAION AI" in open(os.path.join(HEAD_DIR, "LICENSE")).read()


@pytest.mark.parametrize("name", sorted(HEADS))
def test_head_output_equals_an_independent_computation(name):
    weight, bias = head_without_torch(name)
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((32, HEADS[name].width))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    if name != "vit_b_16":  # LAION's real embeddings for the two heads it published them for
        vectors = np.concatenate([vectors, rating_embeddings(name)])
    scorer = loaded(name)
    # one embedding per image, and a 3-frame "video": its frames' scores, reduced by their mean
    inputs = [torch.from_numpy(v[None]).float() for v in vectors] + [torch.from_numpy(vectors[:3]).float()]
    rows = scorer.score_batch(inputs)
    expected = vectors.astype(np.float32).astype(np.float64) @ weight + bias
    assert [r["aesthetic"] for r in rows[:-1]] == pytest.approx(expected, abs=1e-4)
    assert rows[-1]["aesthetic_frames"] == pytest.approx(expected[:3], abs=1e-4)
    assert rows[-1]["aesthetic"] == pytest.approx(expected[:3].mean(), abs=1e-4)


@pytest.mark.parametrize("name", ["vit_b_32", "vit_l_14"])
def test_the_score_rises_with_the_human_rating(name):
    from scipy.stats import spearmanr
    groups = rating_embeddings(name)
    assert groups.shape == (10, HEADS[name].width)
    scores = [r["aesthetic"] for r in loaded(name).score_batch([torch.from_numpy(g[None]) for g in groups])]
    rho = spearmanr(range(10), scores).statistic
    assert rho >= 0.9, scores


def refusal(model, pretrained=None, head="auto") -> str:
    with pytest.raises(ConfigError) as e:
        choose_head(ClipSource.resolve(model, pretrained), head)
    return str(e.value)


def test_clip_models_without_a_head_are_refused_naming_the_ones_with():
    named = "ViT-B-32, ViT-B-16 or ViT-L-14 with --pretrained openai"
    assert named in refusal("ViT-B-32")  # its default weights are LAION's, not OpenAI's
    assert "pass --pretrained openai" in refusal("ViT-B-32", "laion2b_s34b_b79k", head="vit_b_32")
    assert "trained on ViT-B-32" in refusal("ViT-B-16", "random", head="vit_b_32")  # same width, other model
    assert "takes the 512-value image embeddings" in refusal("ViT-L-14", "random", head="vit_b_32")
    assert named in refusal("RN50", "openai")
    with pytest.raises(ConfigError, match="auto or one of vit_b_32"):
        AestheticScorer(head="vit_h_14")
    for model, head in (("ViT-B-32", "vit_b_32"), ("ViT-L-14", "vit_l_14"), ("ViT-B-16", "vit_b_16"),
                        ("ViT-B-32-quickgelu", "vit_b_32")):
        assert choose_head(ClipSource.resolve(model, "openai"), "auto") == head
    # The run: --scorer aesthetic brings clip, runs it first and binds to it; a misfit is refused there.
    scorers = resolve_scorers(build_config("out", ("aesthetic",), model="ViT-L-14", pretrained="openai"))
    assert [s.name for s in scorers] == ["clip", "aesthetic"] and scorers[1].resolved == "vit_l_14"
    with pytest.raises(ConfigError, match="trained on OpenAI CLIP image embeddings"):
        resolve_scorers(build_config("out", ("aesthetic",), model="ViT-B-32"))


def test_the_tiny_test_clip_is_refused_in_one_line(tiny_clip, tmp_path):
    for head in ("auto", "vit_b_32"):
        assert "tiny test CLIP" in refusal("local-dir:" + tiny_clip, head=head)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "wdsfilter", "score", os.path.join(REPO, "sample_shards", "images-000000.tar"),
                           "--scorer", "aesthetic", "--model", "local-dir:" + tiny_clip, "--out", str(out), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tiny test CLIP" in lines[0], done.stderr
    assert not (out / "scores").exists()


@pytest.fixture(scope="module")
def clip512(tmp_path_factory) -> str:
    """A small open_clip model (random weights, seed 0) whose image embedding has 512 values, in
    open_clip's local-dir layout: the width of the ViT-B-32 head, at a fraction of its cost."""
    from safetensors.torch import save_file

    from open_clip.model import CLIP
    from tools.make_tiny_clip import MODEL_CFG, PREPROCESS_CFG
    folder = str(tmp_path_factory.mktemp("clip512"))
    cfg = dict(MODEL_CFG, embed_dim=512)
    torch.manual_seed(0)
    model = CLIP(**cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "open_clip_model.safetensors"))
    with open(os.path.join(folder, "open_clip_config.json"), "w") as f:
        json.dump({"model_cfg": cfg, "preprocess_cfg": PREPROCESS_CFG}, f)
    return folder


@pytest.mark.slow  # a scoring run with a (small) CLIP model
def test_a_run_scores_clips_own_image_embedding(clip512, tmp_path):
    """Images and video frames: `aesthetic` is the head applied to the very embedding the run saves
    (--save-embeddings; a video's is the mean of its frames', and the head is linear)."""
    shards = [os.path.join(REPO, "sample_shards", n) for n in ("images-000000.tar", "videos-000000.tar")]
    out = tmp_path / "out"
    score(shards, out=str(out), scorers=("aesthetic",), model="local-dir:" + clip512,
          scorer_options={"aesthetic": {"head": "vit_b_32"}}, caption_key="txt;json:description",
          image_key="jpg;png;jpeg;webp;mp4", save_embeddings=True, device="cpu", workers=0, progress=False)
    import pyarrow.parquet as pq

    from wdsfilter.runfolder.tables import read_rows
    weight, bias = head_without_torch("vit_b_32")
    checked, clips = 0, 0
    for meta in sorted(glob.glob(str(out / "embeddings" / "metadata" / "*.parquet"))):
        stem = os.path.basename(meta)[:-len(".parquet")]
        emb = np.load(str(out / "embeddings" / "img_emb" / f"{stem}.npy")).astype(np.float64)
        rows = {r["index"]: r for r in read_rows(str(out / "scores" / f"{stem}.parquet"))}
        for i, m in enumerate(pq.read_table(meta).to_pylist()):
            row = rows[m["index"]]
            assert row["aesthetic"] == pytest.approx(emb[i] @ weight + bias, abs=5e-3)  # fp16 embeddings
            assert len(row["aesthetic_frames"]) == row["clip_frames"]
            checked, clips = checked + 1, clips + (row["clip_frames"] > 1)
    summary = json.load(open(out / "summary.json"))
    assert checked == summary["rows"] == summary["scored"] and clips == 8  # every row: the images and the 3-frame clips


@pytest.mark.slow  # runs a (small) CLIP model
def test_the_image_is_encoded_once_for_clip_and_aesthetic(clip512):
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.modelrunner import ModelRunner
    from wdsfilter.score.transport import Prepare
    from wdsfilter.core.tally import Tally
    cfg = build_config("out", ("aesthetic",), model="local-dir:" + clip512, caption_key="txt;json:description",
                       scorer_options={"aesthetic": {"head": "vit_b_32"}})
    scorers = resolve_scorers(cfg)
    items = [(i, x["inputs"]) for i, x in enumerate(sample_pipeline(
        [os.path.join(REPO, "sample_shards", "images-000000.tar")], cfg.scoring_stage_config(scorers), Tally(),
        extra=[Prepare(scorers)])) if "inputs" in x][:8]
    runner = ModelRunner(scorers, "cpu")
    runner.load()
    runner.configure(8)
    clip = runner.scorers[0]
    calls = []
    encode = clip._model.encode_image
    clip._model.encode_image = lambda *a, **k: calls.append(1) or encode(*a, **k)
    results = runner.score(items)
    assert len(calls) == 1  # one batch, one image encode, for both scorers
    assert all(r[1]["aesthetic"] is not None and "__clip_image__" not in r[1] for r in results)
