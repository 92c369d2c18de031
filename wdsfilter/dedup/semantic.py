"""Semantic duplicates: saved CLIP image embeddings whose cosine is >= t, searched within k-means
clusters as SemDeDup (Abbas et al., 2023) and NeMo Curator do, so no pair across clusters is
compared and memory is one cluster's vectors at a time.

    1. k-means (faiss, spherical) on a sample of at most TRAIN_ROWS vectors: ~CLUSTER_ROWS rows per
       cluster; 2. every vector assigned to its nearest centroid, read a block at a time from the
       memory-mapped .npy files of the run (clip-retrieval's layout, score/embeddings.py), and
       to its second nearest too (PROBES), so a pair split by a border still meets; 3. per
       cluster, its vectors gathered (sorted by row, so each file is read in order) and compared
       all-against-all in blocks of BLOCK rows (a cluster of m rows: m x BLOCK floats at a time).

SemDeDup assigns each vector to one cluster and misses the pairs a border splits: measured on the
synthetic run of tools/bench_dedup.py (20,000 rows, 10 clusters), one cluster per vector found
0.897 of the rows an all-pairs search groups; two per vector (twice the comparisons) found them
all (the same groups). The clusters remain a speed/recall trade, not an exact search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Sequence, Tuple

import numpy as np

from ..errors import require

TRAIN_ROWS = 200_000
CLUSTER_ROWS = 2_000
BLOCK = 4_096
PROBES = 2  # clusters each vector joins (its nearest centroids)
INSTALL = "pip install 'wdsfilter[dedup]' (or faiss-cpu)"


@dataclass
class Embeddings:
    """The run's image embeddings as one virtual array over its per-shard .npy files (mapped, not
    read): vector v is row `rows[v]` of the dedup's row numbering."""
    files: List[str]
    offsets: np.ndarray  # first vector of each file; last element: the total
    rows: np.ndarray     # row number of each vector (int64)

    @property
    def count(self) -> int:
        return int(self.offsets[-1])

    def mapped(self) -> List[np.ndarray]:
        return [np.load(f, mmap_mode="r") for f in self.files]

    def take(self, mapped: Sequence[np.ndarray], vectors: np.ndarray) -> np.ndarray:
        """float32 vectors (sorted vector numbers), file by file, L2-normalised."""
        which = np.searchsorted(self.offsets, vectors, side="right") - 1
        out = np.empty((len(vectors), mapped[0].shape[1]), dtype=np.float32)
        for f in np.unique(which):
            sel = which == f
            out[sel] = mapped[f][vectors[sel] - self.offsets[f]]
        return _normalise(out)

    def blocks(self, mapped: Sequence[np.ndarray], size: int = 65_536) -> Iterator[Tuple[int, np.ndarray]]:
        for f, m in enumerate(mapped):
            for lo in range(0, len(m), size):
                yield int(self.offsets[f]) + lo, _normalise(np.asarray(m[lo:lo + size], dtype=np.float32))


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)  # a video's mean embedding has a norm below 1


def semantic_pairs(emb: Embeddings, threshold: float, seed: int = 0) -> Tuple[np.ndarray, np.ndarray, int]:
    """(a, b, clusters): row numbers of pairs with cosine >= threshold within a cluster."""
    n = emb.count
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    faiss = require("faiss", "semantic dedup", INSTALL)
    mapped = emb.mapped()
    dim = mapped[0].shape[1]
    k = max(1, min(n // CLUSTER_ROWS, 65_536))
    assign = np.zeros((n, 1), dtype=np.int32)
    if k > 1:
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, min(n, TRAIN_ROWS, k * 256), replace=False))
        km = faiss.Kmeans(dim, k, niter=20, seed=seed, spherical=True, verbose=False)
        km.train(emb.take(mapped, sample))
        index = faiss.IndexFlatIP(dim)
        index.add(km.centroids)
        probes = min(PROBES, k)
        assign = np.zeros((n, probes), dtype=np.int32)
        for start, block in emb.blocks(mapped):
            assign[start:start + len(block)] = index.search(block, probes)[1]
    # Each vector in its PROBES nearest clusters: a pair split by a border still meets in one.
    owner = np.repeat(np.arange(n), assign.shape[1])
    flat = assign.ravel()
    order = owner[np.argsort(flat, kind="stable")]  # vectors of each cluster, in row order
    bounds = np.concatenate(([0], np.cumsum(np.bincount(flat, minlength=k))))
    a: List[np.ndarray] = []
    b: List[np.ndarray] = []
    for c in range(k):
        members = order[bounds[c]:bounds[c + 1]]
        if len(members) < 2:
            continue
        x = emb.take(mapped, members)
        for lo in range(0, len(members), BLOCK):
            sims = x[lo:lo + BLOCK] @ x.T
            i, j = np.nonzero(sims >= threshold)
            i = i + lo
            upper = i < j
            a.append(emb.rows[members[i[upper]]])
            b.append(emb.rows[members[j[upper]]])
    if not a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), k
    return np.concatenate(a), np.concatenate(b), k
