"""OUT/README.md beside `filter --write-shards`' shards: the dataset card with which Hugging Face
`datasets.load_dataset(OUT)` reads them as WebDataset shards.

Without it HF picks its builder from OUT's files, and the sidecars (a `_stats.json` per shard and
`sizes.json`) outnumber the tars: it took the JSON builder and loaded the stats. The card's
`configs` name the shards as the data files, so the sidecars stay where open_clip (sizes.json),
img2dataset and DataComp (`_stats.json`) and our own readers look for them.

HF's webdataset builder infers its columns from the first 5 samples of the first shard and
refuses samples with other members, so a folder that mixes JPEG and PNG samples (kept as their
sources stored them) did not load. Where the written samples do not all have the same members,
the card declares every member as a column (an image extension as an image, text as a string,
json as JSON, other bytes as binary): each sample loads, None where it lacks a member. Images
are not converted to one format: re-encoding changes the bytes the scores were computed on (and
PNG to JPEG loses alpha and detail). A member HF decodes into a type no card can declare (npy,
msgpack, audio, video) leaves the columns to HF's inference, and such a mixed folder needs
`features=` from the user.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterable, Optional

from ..storage.atomic import atomic_path
from ..runfolder.names import CARD

# HF's webdataset builder: how it decodes a member, by its last extension (its DECODERS and
# IMAGE_EXTENSIONS), as the card must declare it.
IMAGES = {"bmp", "gif", "jpg", "jpeg", "jpe", "jfif", "png", "apng", "webp", "tif", "tiff", "ppm", "pgm", "pbm",
          "pnm", "jp2", "j2k", "ico", "tga", "avif"}
TYPED = {"txt": "string", "text": "string", "transcript": "string", "json": "json", "jsn": "json",
         "cls": "int64", "cls2": "int64", "index": "int64", "inx": "int64", "id": "int64"}
UNDECLARABLE = {"ten", "tb", "mp", "msg", "npy", "npz", "cbor", "pth", "gz", "bz2", "xz", "zst", "lz4",
                "wav", "flac", "mp3", "ogg", "opus", "mp4", "mkv", "avi", "mpeg", "mov", "webm", "glb", "ply", "stl"}


def dtype(field: str) -> Optional[str]:
    """The card's dtype of a member extension (a sample's field), None where none fits."""
    last = field.rsplit(".", 1)[-1].lower()
    if last in UNDECLARABLE:
        return None
    return "image" if last in IMAGES else TYPED.get(last, "binary")


def card_text(prefix: str, shards: Iterable[dict]) -> str:
    """The card for the shards PREFIX-*.tar whose stats (`_stats.json`: successes, fields) are
    `shards`. Features only where the fields differ between samples and every one has a dtype."""
    fields: Dict[str, int] = {}  # field -> samples that have it, over every shard
    samples, known = 0, True
    for stats in shards:
        per_shard = stats.get("fields")
        if not isinstance(per_shard, dict) or not isinstance(stats.get("successes"), int):
            known = False  # written by an older version: unknown
            continue
        samples += stats["successes"]
        for name, n in per_shard.items():
            fields[name] = fields.get(name, 0) + int(n)
    mixed = any(n != samples for n in fields.values())
    lines = ["---", "configs:", "- config_name: default", "  data_files:", "  - split: train",
             f"    path: {json.dumps(prefix + '-*.tar')}"]
    types = {name: dtype(name) for name in sorted(fields)}
    if known and mixed and all(types.values()):
        lines += ["dataset_info:", "  features:"]
        # the sample's key and shard: the columns HF's inference adds too
        for name, kind in {**types, "__key__": "string", "__url__": "string"}.items():
            lines += [f"  - name: {json.dumps(name)}", f"    dtype: {kind}"]
    lines += ["---", "", "WebDataset shards written by `wdsfilter filter --write-shards` (docs/filter.md).",
              "`datasets.load_dataset(\"<this folder>\")` reads the shards; the `_stats.json` files and",
              "`sizes.json` beside them are sidecars for open_clip and img2dataset's tools, not data.", ""]
    return "\n".join(lines)


def write_card(out: str, prefix: str, stats_files: Iterable[str]) -> str:
    shards = []
    for path in stats_files:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        shards.append(data if isinstance(data, dict) else {})
    path = os.path.join(out, CARD)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(card_text(prefix, shards))
    return path
