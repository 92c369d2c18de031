"""Semantic duplicates: saved CLIP image embeddings whose cosine is >= t, searched within k-means
clusters as SemDeDup (Abbas et al., 2023) and NeMo Curator do, so no pair across clusters is
compared and memory is one cluster's vectors at a time.

    1. k-means (faiss, spherical, NITER iterations) on a sample of TRAIN_PER_CLUSTER vectors a
       centroid (at most TRAIN_ROWS): ~CLUSTER_ROWS rows per cluster, at most MAX_CLUSTERS;
    2. every vector's PROBES nearest centroids, read a block at a time from the memory-mapped .npy
       files of the run (clip-retrieval's layout, runfolder/embeddings.py): all centroids compared up
       to COARSE_FROM of them, past that a two-level k-means and an IVF over it (_clusters);
    3. per cluster, its home vectors (nearest centroid) in a faiss flat inner-product index, and a
       range search (cosine >= t) of every vector having that centroid among its PROBES nearest:
       a pair split by a border meets when one's home is among the other's nearest; each cluster
       costs PROBES x CLUSTER_ROWS^2 dot products, so the search grows with the rows, not their square.

Measured on the synthetic run of tools/bench_dedup.py (random 512-d vectors, the worst case for
clusters: no themes), rows grouped by an all-pairs search that the clusters found: 20,000 rows:
10 clusters, 2 probes 0.994; 20 clusters, 3 probes 1.0 (the same groups); 200,000 rows, 200 clusters, 3 probes:
0.993 (0.969 with the IVF assignment at 4 of 14 lists). Real embeddings cluster (themes), where
the borders split fewer pairs (tests/test_dedup_semantic.py). The clusters remain a speed/recall
trade, not an exact search.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import require

TRAIN_ROWS = 200_000
TRAIN_PER_CLUSTER = 64  # sample vectors per centroid (faiss asks for at least 39)
NITER = 10
CLUSTER_ROWS = 1_000
MAX_CLUSTERS = TRAIN_ROWS // 40  # 5,000 (5 million rows): faiss's 39 sample vectors a centroid; past it clusters grow
COARSE_FROM = 256       # more centroids than this (256,000 rows): two-level k-means (_clusters)
COARSE_PROBES = 8
BLOCK = 4_096
PROBES = 3  # clusters each vector is compared in (its nearest centroids)
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


def cosines_to(embeddings: Embeddings, row: int, others: Sequence[int]) -> Dict[int, float]:
    """{other row: cosine of its image embedding to `row`'s}, for the rows that have one (vectors
    are in row order, source.embeddings: found by binary search, nothing built per row)."""
    wanted = np.array([row, *others], dtype=np.int64)
    at = np.minimum(np.searchsorted(embeddings.rows, wanted), max(len(embeddings.rows) - 1, 0))
    found = embeddings.rows[at] == wanted if len(embeddings.rows) else np.zeros(len(wanted), bool)
    if not found[0]:
        return {}
    vectors = np.unique(at[found])
    taken = dict(zip(vectors.tolist(), embeddings.take(embeddings.mapped(), vectors)))
    kept = taken[int(at[0])]
    return {int(r): float(np.dot(taken[int(v)], kept)) for r, v, ok in zip(wanted[1:], at[1:], found[1:]) if ok}


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a vector holding inf: NaN, left out by semantic_pairs
        return x / np.maximum(norms, 1e-12)  # a video's mean embedding has a norm below 1


def _kmeans(faiss, x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k spherical centroids of x (its normalised mean for one; x itself when it has no more rows)."""
    if k <= 1 or len(x) <= k:
        return _normalise(x.mean(axis=0, keepdims=True)) if k <= 1 else x
    km = faiss.Kmeans(x.shape[1], k, niter=NITER, seed=seed, spherical=True, verbose=False)
    km.train(x)
    return km.centroids


def _clusters(faiss, x: np.ndarray, k: int, seed: int):
    """About k spherical k-means centroids of the sample x and an index answering each vector's
    nearest ones. Up to COARSE_FROM centroids: one k-means, every centroid compared (flat). Past
    that, two levels (as faiss.contrib.clustering.two_level_clustering does): sqrt(k) top centroids,
    then each top cluster's sample split into its share of the k, and an IVF whose lists are the
    top clusters (COARSE_PROBES of them scanned): training and assignment cost about sqrt(k) a
    vector instead of k, so they grow as n^1.5, not n^2."""
    dim = x.shape[1]
    if k <= COARSE_FROM:
        index = faiss.IndexFlatIP(dim)
        index.add(_kmeans(faiss, x, k, seed))
        return index
    top = _kmeans(faiss, x, int(np.sqrt(k)), seed)
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(top)
    home = quantizer.search(x, 1)[1][:, 0]
    share = np.bincount(home, minlength=len(top))
    fine = [_kmeans(faiss, x[home == j], int(round(k * share[j] / len(x))), seed)
            for j in range(len(top)) if share[j]]  # a top cluster no sample vector chose adds none
    index = faiss.IndexIVFFlat(quantizer, dim, len(top), faiss.METRIC_INNER_PRODUCT)
    index.is_trained = True  # its lists are the top clusters; each fine centroid joins its nearest
    index.add(np.concatenate(fine).astype(np.float32))
    index.nprobe = COARSE_PROBES
    return index


def semantic_pairs(emb: Embeddings, threshold: float, seed: int = 0,
                   seconds: Optional[Dict[str, float]] = None,
                   skipped: Optional[List[int]] = None) -> Tuple[np.ndarray, np.ndarray, int]:
    """(a, b, clusters): row numbers of pairs with cosine >= threshold found within a cluster;
    `seconds` gets the time of each step (semantic_kmeans, semantic_assign, semantic_search).
    A vector holding NaN or inf (a scorer's or a file's fault) has no cosine with any other: it is
    left out of the k-means, the clusters and the search, and its row number goes into `skipped`."""
    seconds = {} if seconds is None else seconds
    t = time.perf_counter()
    n = emb.count
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    faiss = require("faiss", "semantic dedup", INSTALL)
    mapped = emb.mapped()
    dim = mapped[0].shape[1]
    k = max(1, min(n // CLUSTER_ROWS, MAX_CLUSTERS))
    assign = np.zeros((n, 1), dtype=np.int32)
    finite = np.ones(n, dtype=bool)
    index = None
    if k > 1:
        # Trained on a bounded sample (TRAIN_PER_CLUSTER a centroid, at most TRAIN_ROWS): the
        # training costs sample x k x NITER, not n x k.
        rng = np.random.default_rng(seed)
        sample = emb.take(mapped, np.sort(rng.choice(n, min(n, TRAIN_ROWS, k * TRAIN_PER_CLUSTER), replace=False)))
        index = _clusters(faiss, sample[np.isfinite(sample).all(axis=1)], k, seed)
        k = index.ntotal
        seconds["semantic_kmeans"], t = time.perf_counter() - t, time.perf_counter()
        assign = np.zeros((n, min(PROBES, k)), dtype=np.int32)
    for start, block in emb.blocks(mapped):  # which vectors are numbers, and (k > 1) their clusters
        ok = np.isfinite(block).all(axis=1)
        finite[start:start + len(block)] = ok
        if index is not None:
            assign[start:start + len(block)] = index.search(np.where(ok[:, None], block, 0), assign.shape[1])[1]
    assign = np.maximum(assign, 0)  # a coarse search finding fewer than PROBES: -1, counted as cluster 0
    if index is not None:
        seconds["semantic_assign"], t = time.perf_counter() - t, time.perf_counter()
    valid = np.flatnonzero(finite)
    if skipped is not None:
        skipped.extend(emb.rows[~finite].tolist())
    # Per cluster c: its home vectors (nearest centroid c) against every vector with c among its
    # PROBES nearest, so a pair whose homes differ still meets when one's home is the other's
    # second nearest, each comparison made once.
    home_order = valid[np.argsort(assign[valid, 0], kind="stable")]  # vectors of each cluster, in row order
    home_bounds = np.concatenate(([0], np.cumsum(np.bincount(assign[valid, 0], minlength=k))))
    owner = np.repeat(valid, assign.shape[1])
    flat = assign[valid].ravel()
    order = owner[np.argsort(flat, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(flat, minlength=k))))
    a: List[np.ndarray] = []
    b: List[np.ndarray] = []
    for c in range(k):
        home = home_order[home_bounds[c]:home_bounds[c + 1]]
        queries = order[bounds[c]:bounds[c + 1]]
        if not len(home) or len(queries) < 2:
            continue
        index = faiss.IndexFlatIP(dim)  # range search: the GEMM and the threshold in faiss, no m x m matrix kept
        index.add(emb.take(mapped, home))
        x = emb.take(mapped, queries)
        for lo in range(0, len(queries), BLOCK):
            # faiss keeps sims > radius: searched just below, then >= threshold as the oracle has it
            lims, sims, found = index.range_search(x[lo:lo + BLOCK], float(threshold) - 1e-6)
            q = queries[lo + np.repeat(np.arange(len(lims) - 1), np.diff(lims).astype(np.int64))]
            h = home[found]
            other = (q != h) & (sims >= threshold)
            a.append(emb.rows[q[other]])
            b.append(emb.rows[h[other]])
    seconds["semantic_search"] = time.perf_counter() - t
    if not a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), k
    return np.concatenate(a), np.concatenate(b), k
