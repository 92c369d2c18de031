"""wdsfilter.loader dropped into real training code: a tiny open_clip model, built locally (no
download), trained a few steps on the sample shard whose captions live in json "description"."""
import json
import os
import tarfile

import open_clip
import pytest
import torch
from open_clip.loss import ClipLoss

import wdsfilter
from tools import make_tiny_clip
from wdsfilter import ConfigError

pytestmark = pytest.mark.slow  # trains a model on loader batches (tests/conftest.py says what slow means)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = os.path.join(REPO, "sample_shards", "json-captions-000000.tar")

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def fresh_clip(tmp_path_factory):
    """The tiny architecture with random weights: open_clip's own model, transform and tokenizer."""
    folder = str(tmp_path_factory.mktemp("fresh-clip"))
    make_tiny_clip.write_config(folder)  # config only, no weights
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("local-dir:" + folder)
    return model, preprocess, open_clip.get_tokenizer("local-dir:" + folder)


def json_descriptions(path):
    with tarfile.open(path) as tar:
        return {json.loads(tar.extractfile(m).read())["description"]
                for m in tar.getmembers() if m.name.endswith(".json")}


def test_one_shard_two_workers_is_refused_unless_resampled(fresh_clip):
    _, preprocess, tokenizer = fresh_clip
    with pytest.raises(ConfigError, match="1 shard\\(s\\) for 1 rank\\(s\\) x 2 worker\\(s\\)"):
        wdsfilter.loader(SHARD, caption_key="json:description", transform=preprocess, tokenizer=tokenizer,
                         batch_size=8, num_workers=2)


def test_training_steps_on_loader_batches_reduce_the_loss(fresh_clip):
    model, preprocess, tokenizer = fresh_clip
    # One shard and two workers: each worker draws shards itself (resampled), 12 batches an epoch.
    loader = wdsfilter.loader(SHARD, caption_key="json:description", transform=preprocess, tokenizer=tokenizer,
                              batch_size=8, num_workers=2, resampled=True, epoch_samples=96, seed=1)
    batches = list(loader)
    assert len(batches) == len(loader) == 12
    for images, texts in batches:
        assert images.shape == (8, 3, 64, 64) and images.dtype == torch.float32
        assert texts.shape == (8, 32) and texts.dtype == torch.long
    assert loader.stats.samples_out >= 96 and not loader.stats.dropped

    loss_fn = ClipLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    probe_images, probe_texts = batches[0]

    def probe_loss():
        model.eval()
        with torch.no_grad():
            return loss_fn(*model(probe_images, probe_texts)).item()

    start = probe_loss()
    model.train()
    for _ in range(3):  # three passes over the loader's batches
        for images, texts in batches:
            loss = loss_fn(*model(images, texts))
            opt.zero_grad()
            loss.backward()
            opt.step()
    end = probe_loss()
    assert end < start - 0.3, f"loss {start:.3f} -> {end:.3f}"
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "visual.conv1.weight" in changed and "token_embedding.weight" in changed


def test_stage_config_survives_spawn_workers(fresh_clip):
    """Spawned workers get a pickled copy of the pipeline and nothing else of the parent: a caption
    key or tokenizer kept in a global would be lost, and `txt` (the default) finds nothing here.
    One loader checks both (each spawned worker imports torch and open_clip: seconds of CPU): its
    token rows are the tokenizer's for the json descriptions, so the caption key travelled too."""
    _, preprocess, tokenizer = fresh_clip
    loader = wdsfilter.loader(SHARD, caption_key="json:description", transform=preprocess, tokenizer=tokenizer,
                              batch_size=8, num_workers=2, resampled=True, epoch_samples=32,
                              multiprocessing_context="spawn")
    batches = list(loader)
    assert [(images.shape, texts.shape) for images, texts in batches] == [((8, 3, 64, 64), (8, 32))] * 4
    assert loader.stats.samples_out >= 32
    expected = {tuple(tokenizer([d])[0].tolist()) for d in json_descriptions(SHARD)}
    got = {tuple(row.tolist()) for _, texts in batches for row in texts}
    assert got <= expected and len(got) > 1
