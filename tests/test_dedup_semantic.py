"""Semantic dedup's cluster search (wdsfilter/dedup/semantic.py) against an all-pairs search on
memory-mapped fp16 embedding files with planted near-copies: several k-means clusters, pairs
split over files, the exact and the coarse (IVF over the centroids) assignment."""
import os

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from wdsfilter.dedup import semantic
from wdsfilter.dedup.semantic import Embeddings, semantic_pairs

pytest.importorskip("faiss")


def grouped(n, a, b):
    labels = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)[1]
    return labels, np.bincount(labels)[labels] > 1


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """6,000 unit vectors around 30 loose themes (CLIP embeddings cluster; loose, so some pairs
    straddle a cluster border: one probe a vector misses them) in 3 .npy files, 10% of them
    near-copies of another row (some across files); vector v is row 2v."""
    rng = np.random.default_rng(1)
    n, dim = 6_000, 64
    themes = rng.standard_normal((30, dim))
    vec = themes[rng.integers(0, 30, n)] + 1.5 * rng.standard_normal((n, dim))
    copies = np.flatnonzero(rng.random(n) < 0.1)
    vec[copies] = vec[rng.integers(0, n, len(copies))] + 0.2 * rng.standard_normal((len(copies), dim))
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    folder = tmp_path_factory.mktemp("emb")
    files = []
    for i, (lo, hi) in enumerate([(0, 2_500), (2_500, 4_000), (4_000, n)]):
        files.append(str(folder / f"part-{i}.npy"))
        np.save(files[-1], vec[lo:hi].astype(np.float16))
    stored = np.concatenate([np.load(f).astype(np.float32) for f in files])
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    emb = Embeddings(files=files, offsets=np.array([0, 2_500, 4_000, n]), rows=np.arange(n, dtype=np.int64) * 2)
    return emb, stored


def test_cluster_search_finds_the_all_pairs_groups(planted):
    emb, vec = planted
    n = len(vec)
    i, j = np.nonzero(vec @ vec.T >= 0.95)
    truth, truth_grouped = grouped(n, i, j)
    assert truth_grouped.sum() > 500
    a, b, clusters = semantic_pairs(emb, 0.95)
    assert clusters == n // semantic.CLUSTER_ROWS > 1
    assert (a % 2 == 0).all() and (b % 2 == 0).all()  # row numbers, not vector numbers
    a, b = a // 2, b // 2
    assert ((vec[a] * vec[b]).sum(axis=1) >= 0.95 - 1e-6).all()  # no pair below the threshold
    labels, found = grouped(n, a, b)
    assert (found == truth_grouped).all()
    # The same groups: rows together in one are together in the other.
    assert len(set(zip(labels[found], truth[found]))) == len(set(labels[found])) == len(set(truth[found]))


def test_coarse_assignment_through_an_ivf_over_the_centroids(planted, monkeypatch):
    """Past COARSE_FROM centroids, a two-level k-means: sqrt(k) top clusters, each split into its
    share of the k, and a vector compared with the centroids of COARSE_PROBES top clusters only
    (lowered here so 6,000 rows take that path): pairs found are real, nearly all found."""
    emb, vec = planted
    n = len(vec)
    monkeypatch.setattr(semantic, "CLUSTER_ROWS", 200)
    monkeypatch.setattr(semantic, "COARSE_FROM", 8)
    monkeypatch.setattr(semantic, "COARSE_PROBES", 2)  # 2 of its 5 coarse lists: an approximate assignment
    truth_grouped = grouped(n, *np.nonzero(vec @ vec.T >= 0.95))[1]
    a, b, clusters = semantic_pairs(emb, 0.95)
    assert abs(clusters - 30) <= 2  # each top cluster's share of the 30, rounded
    a, b = a // 2, b // 2
    assert ((vec[a] * vec[b]).sum(axis=1) >= 0.95 - 1e-6).all()
    found = grouped(n, a, b)[1]
    assert not (found & ~truth_grouped).any()
    assert found.sum() >= 0.98 * truth_grouped.sum(), (found.sum(), truth_grouped.sum())


def test_rows_whose_embedding_holds_nan_or_inf_are_skipped_counted_and_named(tmp_path):
    """A scorer whose embeddings hold NaN or inf for some samples: semantic dedup groups the planted
    copies among the others, and says how many rows it skipped and which (the terminal line and
    dedup/summary.json), instead of `groups: 0`, exit 0, no word."""
    import json
    from click.testing import CliRunner

    from scorekit import make_shards
    from wdsfilter.cli import main
    make_shards(tmp_path / "shards", [24])
    out = str(tmp_path / "run")
    r = CliRunner().invoke(main, ["score", str(tmp_path / "shards"), "--scorer", "scorekit:EmbeddingScorer",
                                  "--scorer-opt", "embed.copies=5:4,11:10", "--scorer-opt", "embed.nan=7,13,15",
                                  "--scorer-opt", "embed.inf=17", "--out", out, "--device", "cpu", "--workers", "0",
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["dedup", out, "--kind", "semantic", "--semantic-threshold", "0.95"])
    assert r.exit_code == 0, r.output
    assert "2 duplicate group(s)" in r.output, r.output
    [line] = [ln for ln in r.output.splitlines() if "skipped" in ln]
    assert "4 row(s) skipped" in line and "NaN or inf" in line, line
    for i in (7, 13, 15, 17):
        assert f"shard-0000/s0_{i:05d}" in line, line
    summary = json.load(open(os.path.join(out, "dedup", "summary.json")))
    assert summary["semantic_skipped"]["rows"] == 4
    assert sorted(m["key"] for m in summary["semantic_skipped"]["first"]) == [f"s0_{i:05d}" for i in (7, 13, 15, 17)]
