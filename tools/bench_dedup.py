"""Scale benchmark of `wdsfilter dedup`: synthetic run folders of hash rows (sha256, phash,
clip_score) and fp16 512-d image embeddings in clip-retrieval's layout, with planted duplicates.

    python tools/bench_dedup.py [--rows 1000000] [--subset 20000] [--dim 512] [--kinds exact,near,semantic]
                                [--memory-mb 512] [--scale 1000000,2000000,4000000]

Prints, measured side by side in one run, each in its own process (time and peak RSS of that
process):
  1. `wdsfilter dedup` on a --subset-row run vs a brute-force exact oracle over the same rows (every
     pair compared: sha256 equality, phash Hamming <= k, embedding cosine >= t): the groups must be
     the same for exact and near (semantic: the clusters miss pairs across a border: its recall);
  2. `wdsfilter dedup` on the full --rows run vs a plain pandas/numpy approach (pandas'
     duplicated() on sha256 and on phash: exact and identical-phash only, since pandas has no
     Hamming search; all-pairs cosine is out of reach at this size, so semantic has no plain baseline);
  3. with --scale, exact + near at each row count, ours (within --memory-mb) beside plain: how the
     peak RSS grows with the rows; with --before, an earlier checkout's dedup on the same rows;
`ratio` is our time over the other's, and RSS is also given per million rows.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD_ROWS = 10_000
NEAR_BITS = 5
THRESHOLD = 0.95


def make_run(folder: str, rows: int, dim: int, seed: int = 0, embeddings: bool = True) -> None:
    """A run folder as `wdsfilter score --scorer hash --scorer clip --save-embeddings` leaves it:
    5% byte copies and 10% phash copies within 4 bits of any earlier row, 5% embedding copies at
    cosine ~0.99 of a row of the same shard (embeddings only when asked: the semantic kind)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    sha = rng.integers(0, 256, (rows, 32), dtype=np.uint8)
    phash = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
    clip = rng.random(rows)
    copies = rng.random(rows)
    src = rng.integers(0, rows, rows)
    exact = copies < 0.05
    sha[exact] = sha[src[exact]]
    phash[exact] = phash[src[exact]]
    near = (copies >= 0.05) & (copies < 0.15)
    flips = np.zeros(near.sum(), dtype=np.uint64)
    for _ in range(4):
        flips |= np.uint64(1) << rng.integers(0, 64, len(flips)).astype(np.uint64)
    phash[near] = (phash[src[near]].view(np.uint64) ^ flips).view(np.int64)
    semantic = (copies >= 0.15) & (copies < 0.20)
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    hexed = np.empty((rows, 64), dtype=np.uint8)  # the digests' hex text, two digits a byte
    hexed[:, 0::2], hexed[:, 1::2] = digits[sha >> 4], digits[sha & 15]
    for sub in ("scores", "done") + (("embeddings/img_emb", "embeddings/metadata") if embeddings else ()):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    for s, lo in enumerate(range(0, rows, SHARD_ROWS)):
        hi = min(rows, lo + SHARD_ROWS)
        name = f"bench-{s:06d}"
        n = hi - lo
        keys = [f"{i:09d}" for i in range(lo, hi)]
        digests = pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(0, 64 * n + 1, 64, dtype=np.int32)),
                                              pa.py_buffer(hexed[lo:hi].tobytes()))
        table = pa.table({"key": keys, "shard": [name + ".tar"] * n, "index": pa.array(np.arange(n), pa.int64()),
                          "status": ["scored"] * n, "reason": pa.array([None] * n, pa.string()),
                          "message": pa.array([None] * n, pa.string()), "kept": [True] * n,
                          "sha256": digests, "phash": pa.array(phash[lo:hi], pa.int64()),
                          "clip_score": pa.array(clip[lo:hi], pa.float64())})
        score_file = os.path.join(folder, "scores", name + ".parquet")
        pq.write_table(table, score_file)
        with open(os.path.join(folder, "done", name + ".json"), "w") as f:
            json.dump({"url": f"/data/{name}.tar", "name": name, "score_file": score_file}, f)
        if not embeddings:
            continue
        # Embeddings: random unit vectors, the planted ones a copy of an earlier vector plus noise.
        vec = np.random.default_rng(seed * 1000003 + s).standard_normal((n, dim)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        planted = np.flatnonzero(semantic[lo:hi])  # copies of another row of the shard, cosine ~0.99
        other = rng.integers(0, n, len(planted))
        vec[planted] = vec[other] + 0.15 * vec[planted]
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        np.save(os.path.join(folder, "embeddings", "img_emb", name + ".npy"), vec.astype(np.float16))
        pq.write_table(pa.table({"key": keys, "shard": [name + ".tar"] * n,
                                 "index": pa.array(np.arange(n), pa.int64()),
                                 "clip_score": pa.array(clip[lo:hi], pa.float64())}),
                       os.path.join(folder, "embeddings", "metadata", name + ".parquet"))


def measured(code: str, *args: str, root: str = ROOT) -> dict:
    """Run `code` in a fresh Python process (importing wdsfilter from `root`); its JSON line, plus
    its wall time and peak RSS."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code + PEAK, *args], stdout=subprocess.PIPE, cwd=root,
                            env=dict(os.environ, PYTHONPATH=root))
    out = proc.stdout.read()
    if proc.wait():
        raise SystemExit(f"benchmark step failed ({proc.returncode}): {code[:60]}")
    lines = out.decode().strip().splitlines()
    result = json.loads(lines[-2])
    result.update(seconds=time.perf_counter() - t, rss_mb=json.loads(lines[-1])["peak_mb"])
    return result


# The child's own peak RSS (VmHWM of its process image). Not wait4's ru_maxrss: Linux carries
# the pre-exec image's peak into it, and the child starts as a copy of this process (which holds
# the synthetic run's arrays: ~190 bytes a row), so ru_maxrss grew with the rows whatever the step.
PEAK = """
for _line in open("/proc/self/status"):
    if _line.startswith("VmHWM:"):
        print(json.dumps({"peak_mb": int(_line.split()[1]) / 1024}))
"""


OURS = """
import json, sys
import numpy as np
import pyarrow.parquet as pq, os
from wdsfilter.dedup import dedup
run, kinds = sys.argv[1], sys.argv[2].split(",")
import inspect
budget = {"memory_mb": int(sys.argv[5])} if "memory_mb" in inspect.signature(dedup).parameters else {}
r = dedup(run, kinds=kinds, near_bits=int(sys.argv[3]), semantic_threshold=float(sys.argv[4]), **budget)
labels = []
for f in sorted(os.listdir(os.path.join(run, "dedup"))):
    if sys.argv[6] == "labels" and f.endswith(".parquet"):  # (not on full runs: this process's peak is dedup()'s)
        labels += pq.read_table(os.path.join(run, "dedup", f), columns=["group"]).column(0).to_pylist()
if labels:
    np.save(os.path.join(run, "labels.npy"), np.array([-1 if g is None else g for g in labels]))
print(json.dumps({"groups": r.groups, "duplicates": r.duplicates, "per_kind": r.per_kind, "phases": r.seconds}))
"""

ORACLE = """
import json, sys, os, glob
import numpy as np, pyarrow.parquet as pq
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
run, kinds, k, t = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
files = sorted(glob.glob(os.path.join(run, "scores", "*.parquet")))
tables = [pq.read_table(f, columns=["sha256", "phash"]).to_pydict() for f in files]
sha = [s for tb in tables for s in tb["sha256"]]
ph = np.array([p for tb in tables for p in tb["phash"]], dtype=np.int64).view(np.uint64)
n = len(sha)
a, b = [], []
if "exact" in kinds:  # every pair compared
    for i in range(n):
        for j in range(i + 1, n):
            if sha[i] == sha[j]:
                a.append(i); b.append(j)
if "near" in kinds:
    for lo in range(0, n, 512):
        d = np.bitwise_count(ph[lo:lo + 512, None] ^ ph[None, :]) <= k
        i, j = np.nonzero(d)
        a += (i + lo).tolist(); b += j.tolist()
if "semantic" in kinds:
    emb = np.concatenate([np.load(f).astype(np.float32) for f in sorted(glob.glob(os.path.join(run, "embeddings", "img_emb", "*.npy")))])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    for lo in range(0, n, 1024):
        i, j = np.nonzero(emb[lo:lo + 1024] @ emb.T >= t)
        a += (i + lo).tolist(); b += j.tolist()
g = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
labels = connected_components(g, directed=False)[1]
np.save(os.path.join(run, "oracle.npy"), labels)
print(json.dumps({"groups": int((np.bincount(labels) > 1).sum())}))
"""

PLAIN = """
import json, sys, os, glob
import pandas as pd, pyarrow.parquet as pq, pyarrow as pa
run = sys.argv[1]
df = pa.concat_tables([pq.read_table(f, columns=["key", "shard", "index", "sha256", "phash", "clip_score"])
                       for f in sorted(glob.glob(os.path.join(run, "scores", "*.parquet")))]).to_pandas()
df = df.sort_values(["clip_score"], ascending=False, kind="stable")
dup = df.duplicated("sha256") | df.duplicated("phash")
print(json.dumps({"duplicates": int(dup.sum())}))
"""


BASE = """
import importlib, json, sys
for name in sys.argv[1].split(","):
    importlib.import_module(name)
print(json.dumps({}))
"""
OURS_IMPORTS = "numpy,pyarrow.parquet,pyarrow.compute,wdsfilter.dedup.find,wdsfilter.dedup.hashindex"
PLAIN_IMPORTS = "numpy,pandas,pyarrow.parquet"


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Two labelings of the rows (ours: -1 for a row alone) group the same rows together."""
    b = np.where(np.bincount(b)[b] > 1, b, -1)
    pairs = set(zip(a.tolist(), b.tolist()))
    grouped = [(x, y) for x, y in pairs if x >= 0 or y >= 0]
    return all(x >= 0 and y >= 0 for x, y in grouped) and len({x for x, _ in grouped}) == len(grouped) \
        == len({y for _, y in grouped})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--subset", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--kinds", default="exact,near,semantic")
    p.add_argument("--memory-mb", type=int, default=512, help="dedup's working budget (--memory-mb)")
    p.add_argument("--before", default="", help="a folder holding an earlier wdsfilter package (git archive of "
                                                  "an older commit): its dedup measured on the same full runs")
    p.add_argument("--scale", default="", help="comma-separated row counts: exact + near at each, ours and plain "
                                                 "side by side, to show how RSS grows with the rows")
    args = p.parse_args()
    kinds = args.kinds.split(",")
    common = [str(NEAR_BITS), str(THRESHOLD), str(args.memory_mb)]
    with tempfile.TemporaryDirectory() as tmp:
        small, full = os.path.join(tmp, "small"), os.path.join(tmp, "full")
        make_run(small, args.subset, args.dim, embeddings="semantic" in kinds)
        print(f"subset: {args.subset} rows, kinds {args.kinds}, near <= {NEAR_BITS} bits, cosine >= {THRESHOLD}, "
              f"budget {args.memory_mb} MB")
        for kind in kinds:
            ours = measured(OURS, small, kind, *common, "labels")
            oracle = measured(ORACLE, small, "exact" if kind == "exact" else kind, *common)
            mine, truth = np.load(os.path.join(small, "labels.npy")), np.load(os.path.join(small, "oracle.npy"))
            same = same_partition(mine, truth)
            grouped_truth = np.bincount(truth)[truth] > 1
            recall = float(((mine >= 0) & grouped_truth).sum() / max(1, grouped_truth.sum()))
            print(f"  {kind:8s} ours {ours['seconds']:7.2f} s {ours['rss_mb']:7.0f} MB | brute-force oracle "
                  f"{oracle['seconds']:7.2f} s {oracle['rss_mb']:7.0f} MB | ratio {ours['seconds'] / oracle['seconds']:.3f} "
                  f"| same groups: {same} (rows in a group found: {recall:.4f}; groups {ours['groups']} vs {oracle['groups']})")
        # The interpreter and the imports are not per row: each approach's own imports, measured alone.
        base = measured(BASE, OURS_IMPORTS + (",faiss" if "semantic" in kinds else ""))["rss_mb"]
        base_plain = measured(BASE, PLAIN_IMPORTS)["rss_mb"]
        print(f"  (RSS per million rows below is (peak - a process that only imports: ours {base:.0f} MB, "
              f"plain {base_plain:.0f} MB) / rows)")
        sizes = [args.rows] + [int(n) for n in args.scale.split(",") if n]
        for n in dict.fromkeys(sizes):
            t = time.perf_counter()
            make_run(full, n, args.dim, embeddings="semantic" in kinds and n == args.rows)
            print(f"full: {n} rows ({time.perf_counter() - t:.0f} s to write)")
            per_m = 1e6 / n
            plain = measured(PLAIN, full)
            for kind in ["exact,near"] + (["semantic"] if "semantic" in kinds and n == args.rows else []):
                ours = measured(OURS, full, kind, *common, "no-labels")
                line = (f"  {kind:10s} ours {ours['seconds']:7.2f} s, peak RSS {ours['rss_mb']:7.0f} MB "
                        f"({(ours['rss_mb'] - base) * per_m:.0f} MB per million rows); phases "
                        f"{ {k: round(v, 2) for k, v in ours['phases'].items()} }")
                if kind == "exact,near":
                    line += (f"\n  {'':10s} plain pandas duplicated() (exact + identical phash only) "
                             f"{plain['seconds']:7.2f} s, {plain['rss_mb']:7.0f} MB "
                             f"({(plain['rss_mb'] - base_plain) * per_m:.0f} MB per million rows) | "
                             f"ratio {ours['seconds'] / plain['seconds']:.2f} | duplicates: ours {ours['duplicates']}, "
                             f"plain {plain['duplicates']}")
                print(line, flush=True)
            if args.before:
                old = measured(OURS, full, "exact,near", *common, "no-labels", root=args.before)
                print(f"  {'':10s} before ({args.before}) {old['seconds']:7.2f} s, peak RSS {old['rss_mb']:7.0f} MB "
                      f"({(old['rss_mb'] - base) * per_m:.0f} MB per million rows) | ratio to plain "
                      f"{old['seconds'] / plain['seconds']:.2f} | duplicates {old['duplicates']}; phases "
                      f"{ {k: round(v, 2) for k, v in old['phases'].items()} }", flush=True)
            shutil.rmtree(full)


if __name__ == "__main__":
    main()
