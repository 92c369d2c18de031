"""Photo shards with planted duplicates for the dedup tests (no tests in this module): real photos
shipped in scikit-image's wheel, written as JPEG/PNG members of real tar shards (shardkit), with
the variants whose detection docs/dedup.md measures.

Each sample's truth is (photo, variant): samples sharing a photo are duplicates of the variant's
kind; distinct photos (some chosen because they look alike: textures, star fields, two views of
one motorcycle, faces) are not.
"""
from __future__ import annotations

import io
import os
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image, ImageOps

from shardkit import write_shard

# Photos the variants are planted on.
BASES = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "retina", "camera", "coins",
         "moon", "horse", "clock", "cell", "colorwheel", "page")
# Variant -> what it is; "exact" variants are byte copies, the rest are new bytes.
VARIANTS = ("copy", "jpeg_q60", "jpeg_q30", "resize_50", "resize_75", "resize_90", "crop_95", "crop_90", "png",
            "mirror")
NEAR = ("jpeg_q60", "jpeg_q30", "resize_50", "resize_75", "resize_90", "png")  # the issue's >= 0.95 recall set


def _photo(name: str) -> Image.Image:
    import skimage.data as data
    if name.startswith("hubble_"):  # distinct regions of one star field: look alike, are not the same
        x, y = (int(v) for v in name.split("_")[1:])
        return Image.fromarray(data.hubble_deep_field()[y:y + 400, x:x + 400])
    if name.startswith("motorcycle_"):  # two views of one scene from 2 cm apart
        left, right, _ = data.stereo_motorcycle()
        return Image.fromarray(left if name.endswith("left") else right)
    if name.startswith("face_"):  # Labeled Faces in the Wild: small grey faces, upscaled
        face = (data.lfw_subset()[int(name[5:])] * 255).round().astype(np.uint8)  # floats in [0, 1]
        return Image.fromarray(face).resize((128, 128), Image.BICUBIC).convert("RGB")
    img = Image.fromarray(getattr(data, name)())
    if max(img.size) > 800:
        img = img.resize((img.width * 800 // max(img.size), img.height * 800 // max(img.size)), Image.BICUBIC)
    return img.convert("RGB")


def look_alikes() -> List[str]:
    """Distinct photos that look alike (no duplicates planted on them)."""
    return (["brick", "grass", "gravel", "motorcycle_left", "motorcycle_right"]
            + [f"hubble_{x}_{y}" for x, y in ((0, 0), (400, 0), (0, 400), (500, 450))]
            + [f"face_{i}" for i in range(24)])


def jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def variant(img: Image.Image, original: bytes, kind: str) -> Tuple[bytes, str]:
    """(bytes, extension) of one planted variant of a photo whose original member is `original`."""
    w, h = img.size
    if kind == "copy":
        return original, "jpg"
    if kind.startswith("jpeg_q"):
        return jpeg(img, int(kind[6:])), "jpg"
    if kind.startswith("resize_"):
        f = int(kind[7:]) / 100
        return jpeg(img.resize((max(1, round(w * f)), max(1, round(h * f))), Image.LANCZOS)), "jpg"
    if kind.startswith("crop_"):
        f = int(kind[5:]) / 100
        dx, dy = round(w * (1 - f) / 2), round(h * (1 - f) / 2)
        return jpeg(img.crop((dx, dy, w - dx, h - dy))), "jpg"
    if kind == "png":
        return png(img), "png"
    if kind == "mirror":
        return jpeg(ImageOps.mirror(img)), "jpg"
    raise ValueError(kind)


def build(folder, shards: int = 3, bases=BASES, variants=VARIANTS, alikes=None) -> Tuple[List[str], Dict[str, tuple]]:
    """Shards in `folder`: every photo's original (JPEG q90) and, for `bases`, each variant, spread
    over the shards so copies sit in other shards than their original. Returns (shard paths,
    {key: (photo, variant)}); the original's variant is "original"."""
    alikes = look_alikes() if alikes is None else alikes
    items = []
    for name in list(bases) + list(alikes):
        img = _photo(name)
        original = jpeg(img)
        items.append((name, "original", original, "jpg"))
        if name in bases:
            for kind in variants:
                data, ext = variant(img, original, kind)
                items.append((name, kind, data, ext))
    members: List[list] = [[] for _ in range(shards)]
    truth = {}
    for i, (name, kind, data, ext) in enumerate(items):
        key = f"{i:05d}"
        truth[key] = (name, kind)
        s = (i * 7) % shards  # neighbours land in different shards
        members[s] += [(f"{key}.{ext}", data), (f"{key}.txt", f"a photo ({name}, {kind})")]
    os.makedirs(folder, exist_ok=True)
    paths = [write_shard(os.path.join(folder, f"photos-{s:06d}.tar"), m) for s, m in enumerate(members)]
    return paths, truth


def pairs_of(truth: Dict[str, tuple], variants) -> List[Tuple[str, str]]:
    """(original key, variant key) of each planted variant of the given kinds."""
    originals = {name: key for key, (name, kind) in truth.items() if kind == "original"}
    return [(originals[name], key) for key, (name, kind) in truth.items() if kind in variants]


def hamming_matrix(values) -> np.ndarray:
    u = np.asarray(values, dtype=np.int64).view(np.uint64)
    x = u[:, None] ^ u[None, :]
    return np.unpackbits(x.astype(">u8").view(np.uint8).reshape(len(u), len(u), 8), axis=2).sum(axis=2)



def dedup_of_another_file(run: str) -> None:
    """Make the dedup in `run` one that read another version of the first score file (as after
    scoring its shard again): the size it recorded stays, its time and sha256 are another file's."""
    import json
    path = os.path.join(run, "dedup", "summary.json")
    summary = json.load(open(path))
    name = sorted(summary["shards"])[0]
    summary["shards"][name].update(mtime_ns=-1, sha256="0" * 64)
    with open(path, "w") as f:
        json.dump(summary, f)
