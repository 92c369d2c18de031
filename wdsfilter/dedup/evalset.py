"""Eval images for decontamination (`wdsfilter dedup --eval`): a folder of image files (searched
recursively) or WebDataset shards (.tar, .tar.gz, ...: every image member), hashed as the hash
scorer hashes a training row (wdsfilter/media/hashes.py), so a training row matches an eval image
exactly (same sha256 of the bytes) or near (phash within the near distance).

An eval image that cannot be read is counted and named, never a reason to stop: the summary says
how many eval images were compared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, List, Sequence, Tuple

import numpy as np

from ..core.errors import ConfigError, DataError
from ..runfolder.names import RUN_JSON
from ..media.hashes import phash, sha256_hex
from ..media.images import decode_image
from ..stream.config import StageConfig
from ..stream.reading import tar_members
from ..core.specs import split_name
from ..core.tally import Tally
from ..runfolder.layout import read_run_json
from ..score.scorers.clip import ClipScorer
from ..runfolder.embeddings import FIELD

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif")
SHARD_EXTS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass
class EvalSet:
    names: List[str] = field(default_factory=list)   # "file" or "shard.tar/member"
    sha: List[Tuple[int, int]] = field(default_factory=list)
    phash: List[int] = field(default_factory=list)
    unreadable: List[str] = field(default_factory=list)  # "name: why"

    def sha_array(self) -> np.ndarray:
        return np.array(self.sha, dtype=np.uint64).reshape(-1, 2)


def read_eval(sources: Sequence[str], max_pixels: int = 64_000_000) -> EvalSet:
    out = EvalSet()
    for name, data in _images(sources):
        try:
            image = decode_image(data, max_pixels, floor=(128, 128))  # the hash scorer's decode floor
        except DataError as e:
            out.unreadable.append(f"{name}: {e}")
            continue
        digest = sha256_hex(data)
        out.names.append(name)
        out.sha.append((int(digest[:16], 16), int(digest[16:32], 16)))
        out.phash.append(phash(image))
    return out


def _images(sources: Sequence[str]) -> Iterator[Tuple[str, bytes]]:
    for source in sources:
        if os.path.isdir(source):
            for root, dirs, files in os.walk(source):
                dirs.sort()
                for f in sorted(files):
                    path = os.path.join(root, f)
                    if f.lower().endswith(SHARD_EXTS):
                        yield from _shard_images(path)
                    elif f.rsplit(".", 1)[-1].lower() in IMAGE_EXTS:
                        with open(path, "rb") as fh:
                            yield os.path.relpath(path, source), fh.read()
        elif os.path.isfile(source) and source.lower().endswith(SHARD_EXTS):
            yield from _shard_images(source)
        elif os.path.isfile(source) and source.rsplit(".", 1)[-1].lower() in IMAGE_EXTS:
            with open(source, "rb") as fh:
                yield os.path.basename(source), fh.read()
        else:
            raise ConfigError(f"--eval {source}: not a folder, an image file or a tar shard; pass a folder of eval "
                              f"images or their WebDataset shards")


def _shard_images(path: str) -> Iterator[Tuple[str, bytes]]:
    for member in tar_members([{"url": path}], StageConfig(), Tally(0, 0)):
        if not isinstance(member, dict) or "data" not in member:
            continue
        _, ext = split_name(member["fname"])
        if ext and ext.rsplit(".", 1)[-1].lower() in IMAGE_EXTS:
            yield f"{os.path.basename(path)}/{member['fname']}", member["data"]


def clip_of_run(run_dir: str):
    """The run's CLIP scorer, rebuilt from run.json (the same model and weights), set to hand back
    image embeddings; loaded on the CPU."""
    path = os.path.join(run_dir, RUN_JSON)
    scorers = read_run_json(run_dir).get("scorers") or []  # confined to the folder, damage named
    clip = next((s for s in scorers if s.get("name") == "clip"), None)
    if clip is None:
        raise ConfigError(f"semantic eval matching needs the run's CLIP model, and {path} names none; "
                          f"score with --scorer clip --save-embeddings")
    opts = clip.get("options", {})
    # the folder names the model, never where downloads go (cache_dir: open_clip's default)
    scorer = ClipScorer(model=opts.get("model", "ViT-B-32"), pretrained=opts.get("pretrained"),
                        precision="fp32", save_embeddings=True)
    scorer.load("cpu")
    return scorer


def embed_eval(scorer, sources: Sequence[str], names: Sequence[str], max_pixels: int = 64_000_000,
               batch: int = 32) -> np.ndarray:
    """(len(names), dim) float32 unit image embeddings of the eval images named (those read_eval
    read), decoded and transformed as the run's CLIP scorer does."""
    wanted = set(names)
    vectors: dict = {}
    pending: List[tuple] = []

    def flush():
        rows = scorer.score_batch([scorer.prepare({"image": img, "caption": "an image"}) for _, img in pending])
        for (name, _), row in zip(pending, rows):
            vectors[name] = np.asarray(row[FIELD]["img"], dtype=np.float32)
        pending.clear()

    for name, data in _images(sources):
        if name in wanted and name not in vectors:
            pending.append((name, decode_image(data, max_pixels, floor=scorer.decode_floor())))
            if len(pending) >= batch:
                flush()
    if pending:
        flush()
    out = np.stack([vectors[n] for n in names])
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
