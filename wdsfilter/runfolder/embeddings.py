"""Embeddings as a by-product of scoring (`wdsfilter score --save-embeddings`, the CLIP scorer),
in the layout clip-retrieval's `inference` writes and its `index` (autofaiss) and `back` read:

    OUT/embeddings/img_emb/<shard>.npy          float16 (n, dim): image embeddings, L2-normalised
    OUT/embeddings/text_emb/<shard>.npy         float16 (n, dim): caption embeddings, L2-normalised
    OUT/embeddings/metadata/<shard>.parquet     n rows: key, shard, index, clip_score, caption, url, uid

so `clip-retrieval index OUT/embeddings INDEX_DIR` builds the image and text indices, and the
metadata files, read in the same sorted order, name each vector's sample. Their caption and url
(the score row's: the caption as the stages saw it, the url of the sample's .json, null where it
has none) are what clip-retrieval's back shows for a hit (its default columns_to_return are url
and caption), as img2dataset's metadata gives them.

Row i of the three files is one sample that has a CLIP score, in shard order; its `index` is its
row in the score file (a sample without a CLIP score, rejected or failed, gets no vector: a zero
vector would sit in a nearest-neighbour index). `(img * txt).sum(1)` is `clip_score` within fp16
precision. A video's image embedding is its frames' reduced the way its score is: the frame with
the highest (max) or lowest (min) score, or the mean of the frame embeddings (mean: its dot
product with the caption is the mean score, and its norm is at most 1). A shard where no sample
has a CLIP score gets no files.

A scorer hands its embeddings over in the row field FIELD ({"img": vector, "txt": vector}); the
files are written, atomically, before the shard's completion marker, so a resumed run rewrites
them together with the score file. Read back here too: a shard's vectors put back on its rows
(`read_shard`, --retry-failed) and its image vectors with their rows (`image_vectors`, dedup).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from ..core.errors import ConfigError
from ..storage.writing import atomic_path
from .layout import confined
from .names import EMBEDDING_METADATA as METADATA, EMBEDDING_PARTS as PARTS, EMBEDDINGS as FOLDER
from .tables import PARQUET, TEXT_FIELDS, audited, damaged, parquet_errors, publish_rows, write_arrow

FIELD = "__embeddings__"
METADATA_SUFFIX = PARQUET.suffix


def folders(out: str) -> List[str]:
    """Every folder the embeddings of a run in `out` are written to (resume clears them)."""
    return [os.path.join(out, FOLDER, sub) for sub in (*PARTS.values(), METADATA)]


def write_embeddings(out: str, name: str, rows: List[dict]) -> Optional[Dict[str, str]]:
    """Write the shard's files from its rows (in index order); None when no row has embeddings."""
    import numpy as np
    import pyarrow as pa
    embedded = [r for r in rows if r.get(FIELD) is not None]
    if not embedded:
        return None
    paths = {}
    for part in embedded[0][FIELD]:
        table = np.stack([np.asarray(r[FIELD][part], dtype=np.float16) for r in embedded])
        paths[part] = _path(out, PARTS[part], name + ".npy")
        with atomic_path(paths[part]) as tmp, open(tmp, "wb") as f:
            np.save(f, table)
    embedded = publish_rows(embedded)
    meta = pa.table({"key": pa.array([r["key"] for r in embedded], pa.string()),
                     "shard": pa.array([r["shard"] for r in embedded], pa.string()),
                     "index": pa.array([r["index"] for r in embedded], pa.int64()),
                     "clip_score": pa.array([r.get("clip_score") for r in embedded], pa.float64()),
                     **{f: pa.array([r.get(f) for r in embedded], pa.string()) for f in TEXT_FIELDS}})
    paths[METADATA] = _path(out, METADATA, name + METADATA_SUFFIX)
    write_arrow(meta, paths[METADATA])
    return paths


def _path(out: str, sub: str, filename: str) -> str:
    return os.path.join(out, FOLDER, sub, filename)  # atomic_path makes the folder


def read_shard(out: str, name: str) -> Optional[Dict[int, Dict[str, object]]]:
    """The saved vectors of shard `name`, by their row's index ({index: {part: vector}}); None
    where the shard has none."""
    import numpy as np
    import pyarrow.parquet as pq
    meta = _path(out, METADATA, name + METADATA_SUFFIX)
    if not os.path.exists(meta):
        return None
    indices = pq.read_table(meta, columns=["index"]).column("index").to_pylist()
    parts = {part: np.load(_path(out, sub, name + ".npy")) for part, sub in PARTS.items()
             if os.path.exists(_path(out, sub, name + ".npy"))}
    return {index: {part: table[k] for part, table in parts.items()} for k, index in enumerate(indices)}


def image_vectors(folder: str, name: str):
    """(the .npy file of shard `name`'s image vectors, the score-file index of each vector's row)
    in a run folder handed over as input (its files confined to it; a damaged one named in one
    line); None where the shard has none (no sample had a CLIP score)."""
    import numpy as np
    import pyarrow.parquet as pq
    npy = confined(folder, _path(folder, PARTS["img"], name + ".npy"))
    meta = confined(folder, _path(folder, METADATA, name + METADATA_SUFFIX))
    if not (os.path.exists(npy) and os.path.exists(meta)):
        return None
    try:
        wanted = pq.read_table(audited(meta), columns=["index"]).column(0).to_numpy()
        shape = np.load(npy, mmap_mode="r", allow_pickle=False).shape
    except (parquet_errors() + (KeyError,)) as e:
        raise damaged(meta, f"embeddings not as `wdsfilter score --save-embeddings` writes them "
                            f"({type(e).__name__}: {e})") from None
    if shape[0] != len(wanted):
        raise ConfigError(f"embeddings of shard {name} in {os.path.join(folder, FOLDER)} are damaged ({shape[0]} "
                          f"vectors, {len(wanted)} metadata rows); score the shard again (--resume after removing "
                          f"its done/ marker)")
    return npy, wanted


def has_image_vectors(folder: str) -> bool:
    path = os.path.join(folder, FOLDER, PARTS["img"])
    return os.path.isdir(path) and any(f.endswith(".npy") for f in os.listdir(path))
