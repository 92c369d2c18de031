"""Build a tiny CLIP model offline: an open_clip ViT trained for a fixed number of steps on the sample shards.

    python tools/make_tiny_clip.py                       # -> models/tiny-clip/ (120 steps: the same model everywhere)
    python tools/make_tiny_clip.py --steps 400 --out /tmp/tiny-clip
    python tools/make_tiny_clip.py --seconds 20          # a time budget instead (the model then depends on the CPU)

The output folder is open_clip's `local-dir:` layout (open_clip_config.json + open_clip_model.safetensors):

    model, _, preprocess = open_clip.create_model_and_transforms("local-dir:models/tiny-clip")
    tokenizer = open_clip.get_tokenizer("local-dir:models/tiny-clip")

or by model name + checkpoint, after registering the architecture that the folder also holds:

    open_clip.add_model_config("models/tiny-clip")      # registers "wdsfilter-tiny-clip"
    open_clip.create_model_and_transforms("wdsfilter-tiny-clip",
                                          pretrained="models/tiny-clip/open_clip_model.safetensors")

Why it exists: real CLIP weights need a download, and tests and the README's main job must run on a
machine without network. The model learns colours and shapes from the shards' own samples plus
--scenes fresh scenes drawn by the same generator (tools/make_sample_shards.py), and nothing else:
its scores mean something on these shards only. The fresh scenes matter: about a fifth of the
shards' captions describe another scene on purpose, and a model fit on 96 pairs alone memorises
those wrong pairs too, so how well it told them apart depended on the seed and the CPU.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from typing import List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "wdsfilter-tiny-clip"
DEFAULT_OUT = os.path.join(REPO, "models", "tiny-clip")
# Captions are in .txt in the img2dataset-style shards and in json "description" in the other one.
CAPTION_KEY = "txt;json:description"
DEFAULT_SHARDS = ("sample_shards/images-*.tar", "sample_shards/json-captions-*.tar")
WEIGHTS_FILE = "open_clip_model.safetensors"
CONFIG_FILE = "open_clip_config.json"

# Steps of the default model; the tests' model (tests/conftest.py) is the same one. A time budget
# made the model depend on the machine: 13 steps on a busy one, whose scores ranked a mismatched
# caption first. At 100 steps a matched pair beat a mismatched one in 96-99% of pairs (seeds 0-2).
DEFAULT_STEPS = 120
# One thread: torch's threads spin-wait when the cores are busy, and the model is too small to gain.
DEFAULT_THREADS = 1

# A ViT small enough to train on a CPU in a minute; the text tower keeps open_clip's default BPE
# tokenizer (vocabulary 49408), so open_clip.get_tokenizer works on the folder unchanged.
MODEL_CFG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "patch_size": 16, "width": 64, "head_width": 32, "layers": 2, "mlp_ratio": 2.0},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2, "mlp_ratio": 2.0},
}
PREPROCESS_CFG = {
    "size": 64, "mode": "RGB", "mean": [0.48145466, 0.4578275, 0.40821073],
    "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic", "resize_mode": "shortest",
}


def source_hash() -> str:
    """Hash of this file: a cached model is reused only if it was built by the same code."""
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def find_shards(patterns: Sequence[str]) -> List[str]:
    shards = []
    for pattern in patterns:
        pattern = pattern if os.path.isabs(pattern) else os.path.join(REPO, pattern)
        shards.extend(sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern])
    shards = [s for s in shards if os.path.isfile(s)]
    if not shards:
        from wdsfilter.core.errors import ConfigError
        raise ConfigError(f"no shards found for {list(patterns)}; generate the sample shards first "
                          f"(python tools/make_sample_shards.py) or pass --shards")
    return shards


def write_config(folder: str, info: Optional[dict] = None) -> None:
    """open_clip's local-dir config, plus a plain model config for open_clip.add_model_config.
    The "wdsfilter" entry marks the model as the tiny one (open_clip ignores unknown keys)."""
    os.makedirs(folder, exist_ok=True)
    config = {"model_cfg": MODEL_CFG, "preprocess_cfg": PREPROCESS_CFG}
    if info is not None:
        config["wdsfilter"] = info
    with open(os.path.join(folder, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, MODEL_NAME + ".json"), "w") as f:
        json.dump(MODEL_CFG, f, indent=2)


def load_samples(shards: Sequence[str], preprocess, tokenizer, batch_size: int = 64):
    """Read every sample once through wdsfilter.loader; the tensors are kept in memory and reused
    each epoch (decoding the same JPEGs again every epoch would take most of the time budget)."""
    import torch
    import wdsfilter

    loader = wdsfilter.loader(list(shards), caption_key=CAPTION_KEY, transform=preprocess,
                              tokenizer=tokenizer, batch_size=batch_size, num_workers=0)
    images, tokens = [], []
    for batch_images, batch_tokens in loader:
        images.append(batch_images)
        tokens.append(batch_tokens)
    if not images:
        from wdsfilter.core.errors import ConfigError
        raise ConfigError(f"no sample came out of {list(shards)}:\n{loader.stats.summary()}")
    return torch.cat(images), torch.cat(tokens), loader.stats


def _sample_shard_generator():
    """tools/make_sample_shards.py as a module, loaded by path (works as a script and as tools.*)."""
    import importlib.util

    path = os.path.join(REPO, "tools", "make_sample_shards.py")
    spec = importlib.util.spec_from_file_location("_wdsfilter_make_sample_shards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_scenes(n: int, seed: int, preprocess, tokenizer):
    """n fresh (image, caption) pairs from the sample-shard generator's scene model, every caption
    right, sizes and JPEG encoding as in the image shards. Returns (images, tokens) tensors."""
    import io
    import numpy as np
    import torch
    from PIL import Image

    gen = _sample_shard_generator()
    rng = np.random.default_rng([seed, 2024])
    images, captions = [], []
    for _ in range(n):
        scene = gen.random_scene(rng)
        w, h = (int(v) for v in rng.integers(128, 257, size=2))
        data = gen.encode_image(gen.draw_scene(scene, (w, h), rng), "jpg")
        images.append(preprocess(Image.open(io.BytesIO(data)).convert("RGB")))
        captions.append(gen.describe(scene))
    return torch.stack(images), tokenizer(captions)


def augment(images, generator):
    """Random flips and crops (resized back): the same scene never looks exactly the same twice,
    which keeps a model this size from memorising individual images. Colours are left alone."""
    import torch
    import torch.nn.functional as F

    n, _, h, w = images.shape
    flip = torch.rand(n, generator=generator) < 0.5
    images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    scale = 0.75 + 0.25 * torch.rand(n, generator=generator)
    shift = (1 - scale)[:, None] * (2 * torch.rand(n, 2, generator=generator) - 1)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 1, 1], theta[:, :, 2] = scale, scale, shift
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def pair_losses(image_features, text_features, logit_scale):
    """CLIP's symmetric contrastive loss, one value per pair (open_clip's ClipLoss is their mean)."""
    import torch
    import torch.nn.functional as F

    logits = logit_scale * image_features @ text_features.T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels, reduction="none") + F.cross_entropy(logits.T, labels, reduction="none")) / 2


def compact_vocabulary(model, tokens):
    """Train on the captions' own vocabulary only: the text tower keeps open_clip's 49408-token
    embedding so the folder works with open_clip's tokenizer, but the captions use about a hundred
    of those tokens. The others get no gradient and no weight decay, so AdamW never moves them, yet
    updating all 3.2M of their weights every step was a third of the training time. The used rows
    move to a small embedding and the tokens are renumbered in the same order (the text tower pools
    at the highest token id, end-of-text, which stays the highest). Returns (renumbered tokens,
    restore), restore() writes the trained rows back into the full embedding: the saved model is
    the one that training the full embedding would give, up to float rounding."""
    import torch

    full = model.token_embedding
    used = torch.unique(tokens)  # sorted, so renumbering keeps the order
    small = torch.nn.Embedding(len(used), full.embedding_dim)
    with torch.no_grad():
        small.weight.copy_(full.weight[used])
    lookup = torch.zeros(full.num_embeddings, dtype=tokens.dtype)
    lookup[used] = torch.arange(len(used), dtype=tokens.dtype)
    model.token_embedding = small

    def restore():
        with torch.no_grad():
            full.weight[used] = small.weight
        model.token_embedding = full

    return lookup[tokens], restore


def train(model, images, tokens, *, steps: Optional[int], seconds: float, batch_size: int, lr: float, seed: int,
          keep: float = 0.8, log_every: int = 100):
    """Contrastive training on in-memory tensors until `steps` (if given) or `seconds` run out.

    Some captions of the shards describe another scene on purpose (caption_matches false). Fit
    with every pair, a model this size memorises those too and then scores them as high as the
    right ones. So each batch learns only from the `keep` share of pairs the model already agrees
    with most (small-loss selection, as in co-teaching; ramped in over the first third), without
    ever looking at caption_matches. Returns (steps done, mean loss of the last 20 steps, first loss)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-6)
    n = len(images)
    batch_size = min(batch_size, n)
    model.train()
    start = time.monotonic()
    step, order, pos, recent, first = 0, torch.randperm(n, generator=generator), 0, [], None
    while True:
        elapsed = time.monotonic() - start
        progress = step / steps if steps else elapsed / seconds
        if progress >= 1.0:
            break
        warmup = min(1.0, (step + 1) / 50)
        for group in opt.param_groups:  # warm up, then cosine decay over the budget
            group["lr"] = lr * warmup * 0.5 * (1 + math.cos(math.pi * progress))
        if pos + batch_size > n:
            order, pos = torch.randperm(n, generator=generator), 0
        idx = order[pos:pos + batch_size]
        pos += batch_size
        losses = pair_losses(*model(augment(images[idx], generator), tokens[idx]))
        kept = max(1, math.ceil(len(losses) * (1 - (1 - keep) * min(1.0, 3 * progress))))
        loss = losses.topk(kept, largest=False).values.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        value = losses.mean().item()
        first = value if first is None else first
        recent = (recent + [value])[-20:]
        step += 1
        if log_every and step % log_every == 0:
            print(f"step {step}: loss {sum(recent) / len(recent):.3f} ({time.monotonic() - start:.0f}s)", flush=True)
    model.eval()
    return step, sum(recent) / max(len(recent), 1), first


def build(out: str = DEFAULT_OUT, shards: Sequence[str] = DEFAULT_SHARDS, *, seconds: Optional[float] = None,
          steps: Optional[int] = DEFAULT_STEPS, seed: int = 0, batch_size: int = 64, lr: float = 2e-3,
          keep: float = 0.8, scenes: int = 2048, threads: int = DEFAULT_THREADS, quiet: bool = False,
          replace: bool = True) -> dict:
    """Train the tiny model for `steps` (or, with steps=None, for `seconds`) and save it to `out`,
    atomically. With replace=False an `out` that
    already exists (another process built the same model meanwhile) is kept. Returns the training info."""
    if steps is None and not seconds:
        raise ValueError("give steps (the same model everywhere) or seconds")
    import torch
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    random.seed(seed)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    shard_paths = find_shards(shards)
    out = os.path.abspath(out)
    staging = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write_config(staging)  # config only: open_clip builds the architecture, randomly initialised
        spec = "local-dir:" + staging
        logging.disable(logging.WARNING)  # open_clip warns "no weights found": expected here
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(spec)
        finally:
            logging.disable(logging.NOTSET)
        tokenizer = open_clip.get_tokenizer(spec)
        t0 = time.monotonic()
        images, tokens, stats = load_samples(shard_paths, preprocess, tokenizer)
        from_shards = len(images)
        if scenes:
            extra_images, extra_tokens = render_scenes(scenes, seed, preprocess, tokenizer)
            images, tokens = torch.cat([images, extra_images]), torch.cat([tokens, extra_tokens])
        read_s = time.monotonic() - t0
        if not quiet:
            print(f"read {from_shards} samples from {len(shard_paths)} shard(s) and drew {scenes} fresh scenes "
                  f"in {read_s:.1f}s", flush=True)
        tokens, restore = compact_vocabulary(model, tokens)
        done, loss, first = train(model, images, tokens, steps=steps, seconds=seconds, batch_size=batch_size,
                                  lr=lr, seed=seed, keep=keep, log_every=0 if quiet else 100)
        restore()
        info = {"tiny": True, "trained_on": [os.path.relpath(s, REPO) if s.startswith(REPO) else s for s in shard_paths],
                "caption_key": CAPTION_KEY, "samples": from_shards, "fresh_scenes": scenes, "steps": done, "seed": seed, "keep": keep,
                "first_loss": round(first, 4), "final_loss": round(loss, 4), "source_hash": source_hash(),
                "train_seconds": round(time.monotonic() - t0 - read_s, 1)}
        write_config(staging, info)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(staging, WEIGHTS_FILE))
        if replace and os.path.isdir(out):
            shutil.rmtree(out)
        try:
            os.replace(staging, out)
        except OSError:
            if replace or not os.path.isdir(out):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        torch.set_num_threads(previous_threads)
    if not quiet:
        shown = os.path.relpath(out) if out.startswith(os.getcwd() + os.sep) else out
        print(f"saved {shown} ({done} steps, loss {info['first_loss']:.3f} -> {info['final_loss']:.3f}); "
              f"load it with open_clip.create_model_and_transforms('local-dir:{shown}')")
    return info


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (open_clip local-dir layout)")
    parser.add_argument("--shards", nargs="+", default=list(DEFAULT_SHARDS),
                        help="shards to train on (paths or globs, relative to the repository)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"train exactly this many steps: the same model on every machine [{DEFAULT_STEPS}]")
    parser.add_argument("--seconds", type=float, default=None,
                        help="train for this long instead of a number of steps (the model then depends on the CPU)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=float, default=0.8,
                        help="share of pairs per batch to learn from, those with the lowest loss (noisy captions)")
    parser.add_argument("--scenes", type=int, default=2048,
                        help="fresh scenes drawn by the sample-shard generator, added to the shards' samples")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.steps is not None and args.seconds is not None:
        parser.error("--steps and --seconds exclude each other")
    steps = args.steps if args.steps is not None or args.seconds is not None else DEFAULT_STEPS
    build(args.out, args.shards, seconds=args.seconds, steps=steps, seed=args.seed,
          batch_size=args.batch_size, lr=args.lr, keep=args.keep, scenes=args.scenes, threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)  # run as a script from anywhere: the repository's wdsfilter is importable
    sys.exit(main())
