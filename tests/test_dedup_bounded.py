"""Exact and near dedup in a bounded working memory (wdsfilter/dedup/spill.py, hashindex.py,
groups.py): with buckets forced small (many bucket files, probes across buckets, a bucket swollen by
one placeholder image read in parts) the groups, kinds and survivors are the ones an all-pairs
search gives, and the working files are gone afterwards."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from wdsfilter.dedup import dedup, hashindex
from wdsfilter.dedup.groups import UnionFind

K = 5


def run_folder(folder, rng, n=4_000, shards=3):
    """Score files in a run folder's layout (scores/, done/ markers): clustered phashes (many
    within a few bits), byte copies across shards, a placeholder image repeated 1,200 times,
    rows without hashes, clip scores with ties and gaps."""
    centres = rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64).view(np.uint64)
    flips = np.zeros(n, dtype=np.uint64)
    for _ in range(3):
        flips |= np.where(rng.random(n) < 0.7, np.uint64(1) << rng.integers(0, 64, n).astype(np.uint64), 0)
    phash = centres[rng.integers(0, 300, n)] ^ flips
    sha = rng.integers(0, 2**62, (n, 4))
    copies = np.flatnonzero(rng.random(n) < 0.08)
    src = rng.integers(0, n, len(copies))
    sha[copies], phash[copies] = sha[src], phash[src]
    placeholder = rng.choice(n, min(n, 1_200), replace=False)
    sha[placeholder], phash[placeholder] = sha[0], phash[0]
    clip = np.round(rng.random(n), 2)  # ties
    clip[rng.random(n) < 0.1] = np.nan
    missing = rng.random(n) < 0.02
    digests = [None if m else "".join(f"{v:016x}" for v in row) for m, row in zip(missing, sha.tolist())]
    os.makedirs(folder / "scores")
    os.makedirs(folder / "done")
    for s, (lo, hi) in enumerate([(i * n // shards, (i + 1) * n // shards) for i in range(shards)]):
        name = f"part-{s:03d}"
        pq.write_table(pa.table({
            "key": [f"k{i:06d}" for i in range(lo, hi)], "shard": [name + ".tar"] * (hi - lo),
            "index": pa.array(np.arange(hi - lo), pa.int64()), "status": ["scored"] * (hi - lo),
            "sha256": pa.array(digests[lo:hi], pa.string()),
            "phash": pa.array(phash[lo:hi].view(np.int64), pa.int64(), mask=missing[lo:hi]),
            "clip_score": pa.array(clip[lo:hi], pa.float64(), mask=np.isnan(clip[lo:hi]))}),
            folder / "scores" / f"{name}.parquet")
        (folder / "done" / f"{name}.json").write_text(json.dumps(
            {"url": f"/data/{name}.tar", "name": name, "score_file": str(folder / "scores" / f"{name}.parquet")}))
    return sha, phash, clip, missing


def expected(sha, phash, clip, missing):
    """Groups by all pairs: (group number per row or -1, kind per row, survivor per row)."""
    n = len(phash)
    ok = np.flatnonzero(~missing)
    digest = np.unique(sha[ok], axis=0, return_inverse=True)[1].ravel()
    same_sha = digest[:, None] == digest[None, :]
    near = np.bitwise_count(phash[ok][:, None] ^ phash[ok][None, :]) <= K
    off = ~np.eye(len(ok), dtype=bool)
    a, b = np.nonzero((same_sha | near) & off)
    labels = connected_components(coo_matrix((np.ones(len(a)), (ok[a], ok[b])), shape=(n, n)), directed=False)[1]
    sizes = np.bincount(labels)
    kind = np.full(n, None, dtype=object)
    kind[ok[(near & off).any(axis=1)]] = "near"
    kind[ok[(same_sha & off).any(axis=1)]] = "exact"
    group = np.full(n, -1)
    survivor = np.ones(n, dtype=bool)
    firsts = sorted({int(np.flatnonzero(labels == lab)[0]) for lab in np.unique(labels[sizes[labels] > 1])})
    for g, first in enumerate(firsts):
        members = np.flatnonzero(labels == labels[first])
        group[members] = g
        score = np.where(np.isnan(clip[members]), -np.inf, clip[members])
        survivor[members] = False
        survivor[members[np.lexsort((members, -score))[0]]] = True
    return group, kind, survivor


def marks(run):
    rows = []
    for f in sorted(os.listdir(run / "dedup")):
        if f.endswith(".parquet"):
            rows += pq.read_table(run / "dedup" / f).to_pylist()
    return rows


def test_small_buckets_give_the_all_pairs_groups_kinds_and_survivors(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    truth = run_folder(tmp_path / "run", rng)
    group, kind, survivor = expected(*truth)
    assert (group >= 0).sum() > 1_800 and len(set(group.tolist())) > 100
    whole = dedup(str(tmp_path / "run"), kinds=["exact", "near"], near_bits=K)
    got_whole = marks(tmp_path / "run")
    # Buckets forced small: 32 bucket files per pass, band buckets probed across files, and
    # 1,024 records read at a time (the placeholder's ~1,180 hashed copies share one bucket).
    monkeypatch.setattr(hashindex, "SORT_BYTES", 1 << 16)
    monkeypatch.setattr(hashindex, "BAND_BYTES", 1 << 16)
    small = dedup(str(tmp_path / "run"), kinds=["exact", "near"], near_bits=K, memory_mb=16)
    got = marks(tmp_path / "run")
    assert got == got_whole and small.groups == whole.groups and small.per_kind == whole.per_kind
    assert [r["group"] if r["group"] is not None else -1 for r in got] == group.tolist()
    assert [r["kind"] for r in got] == kind.tolist()
    assert [r["survivor"] for r in got] == survivor.tolist()
    assert small.duplicates == int((~survivor).sum())
    assert small.largest[0]["size"] > 1_100  # the placeholder's group
    assert not os.path.exists(tmp_path / "run" / "dedup" / "tmp")  # the working files are removed


def test_union_find_gives_the_connected_components():
    rng = np.random.default_rng(3)
    n = 50_000
    a, b = rng.integers(0, n, 30_000), rng.integers(0, n, 30_000)
    uf = UnionFind(n)
    for lo in range(0, len(a), 7_000):  # pairs arrive in blocks, as the passes find them
        uf.union(a[lo:lo + 7_000], b[lo:lo + 7_000], "near")
    uf.flatten(4_096)
    truth = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)[1]
    first = np.full(truth.max() + 1, n)
    np.minimum.at(first, truth, np.arange(n))
    assert (uf.parent == first[truth]).all()  # every row points at the first row of its component


def test_a_budget_too_small_is_a_usage_error_before_anything_is_written(tmp_path):
    from click.testing import CliRunner

    from wdsfilter.cli import main
    run_folder(tmp_path / "run", np.random.default_rng(1), n=50, shards=1)
    r = CliRunner().invoke(main, ["dedup", str(tmp_path / "run"), "--memory-mb", "8"])
    assert r.exit_code == 2 and "memory budget" in r.output and "at least 16" in r.output, r.output
    assert "Traceback" not in r.output and not os.path.exists(tmp_path / "run" / "dedup")
    r = CliRunner().invoke(main, ["dedup", str(tmp_path / "run"), "--memory-mb", "16"])
    assert r.exit_code == 0, r.output
    assert os.listdir(tmp_path / "run" / "dedup") and not os.path.exists(tmp_path / "run" / "dedup" / "tmp")
