"""Embeddings as a by-product of scoring (`wdsfilter score --save-embeddings`, the CLIP scorer):

    OUT/embeddings/<shard>.img.npy   float16 (rows, dim): image embeddings, L2-normalised
    OUT/embeddings/<shard>.txt.npy   float16 (rows, dim): caption embeddings, L2-normalised

Row i is the score file's row with index i, so `(img * txt).sum(1)` is clip_score within fp16
precision. A video's image embedding is its frames' reduced the way its score is: the frame
with the highest (max) or lowest (min) score, or the mean of the frame embeddings (mean: its dot
product with the caption is the mean score, and its norm is at most 1). A row without a CLIP
score (rejected, failed) is all zeros. A shard where no sample has a CLIP score gets no files.

A scorer hands its embeddings over in the row field FIELD ({"img": vector, "txt": vector});
the files are written, atomically, before the shard's completion marker, so a resumed run
rewrites them together with the score file.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from ..writing import atomic_path

FIELD = "__embeddings__"
FOLDER = "embeddings"


def write_embeddings(out: str, name: str, rows: List[dict]) -> Optional[Dict[str, str]]:
    """Write the shard's files from its rows (in index order); None when no row has embeddings."""
    import numpy as np
    first = next((r[FIELD] for r in rows if r.get(FIELD) is not None), None)
    if first is None:
        return None
    folder = os.path.join(out, FOLDER)
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for part, vector in first.items():
        table = np.zeros((len(rows), len(vector)), dtype=np.float16)
        for row in rows:
            emb = row.get(FIELD)
            if emb is not None:
                table[row["index"]] = emb[part]
        path = os.path.join(folder, f"{name}.{part}.npy")
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, table)
        paths[part] = path
    return paths
