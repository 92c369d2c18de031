"""--top/--bottom cuts are exact ranks over the whole run. A column of up to quantile.IN_MEMORY_ROWS
rows is held whole (8 bytes a row) and read once; a larger one streams: memory does not grow with
the number of rows (measured as the peak RSS of a child process)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from filterkit import REPO
from wdsfilter.runfolder.quantile import kth_smallest, share_value

MEASURE = r"""
import json, sys
import numpy as np, pyarrow.parquet
from wdsfilter.runfolder.shares import FilterSpec, resolve
from wdsfilter.runfolder import ScoreRun

def hwm():  # peak resident memory (KiB) since the last reset
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])

with open("/proc/self/clear_refs", "w") as f:  # reset the peak: the imports' own peak does not count
    f.write("5")
base = hwm()
run = ScoreRun.open(sys.argv[1])
import wdsfilter.runfolder.quantile
wdsfilter.runfolder.quantile.IN_MEMORY_ROWS = int(sys.argv[3])  # 0: every run streams
if sys.argv[2] == "stream":
    spec = FilterSpec.parse(tops=["clip_score=30%"], bottoms=["ocr_area=7.5%"])
    cuts = {t.column: t.value for t in resolve(spec, run)}
else:  # the control: what holding the column in memory costs, measured the same way
    whole = np.concatenate([pyarrow.parquet.read_table(s.score_file, columns=["ocr_area"]).column(0).to_numpy()
                            for s in run.shards])
    cuts = {"ocr_area": float(np.sort(whole)[0])}
peak = hwm()
print(json.dumps({"cuts": cuts, "growth_kib": peak - base}))
"""


def synthetic_run(folder, rows, files, seed=0):
    """A score folder in the layout `wdsfilter score` writes (scores/*.parquet with the base
    fields, done/*.json markers), with `rows` rows: clip_score rounded to 4 decimals (many ties,
    some nulls), ocr_area continuous. Returns the two columns' values (nulls left out)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(folder, "scores"))
    os.makedirs(os.path.join(folder, "done"))
    clips, areas = [], []
    for f in range(files):
        n = rows // files
        clip = np.round(rng.normal(0.3, 0.05, n), 4)
        area = rng.random(n) ** 3
        null = rng.random(n) < 0.01
        name = f"shard-{f:06d}"
        table = pa.table({"key": pa.array([f"{i:07d}" for i in range(n)]), "shard": pa.array([name] * n),
                          "index": pa.array(np.arange(n)), "status": pa.array(["scored"] * n),
                          "reason": pa.nulls(n, pa.string()), "message": pa.nulls(n, pa.string()),
                          "kept": pa.array(np.ones(n, dtype=bool)),
                          "clip_score": pa.array(clip, mask=null), "ocr_area": pa.array(area)})
        path = os.path.join(folder, "scores", name + ".parquet")
        pq.write_table(table, path)
        with open(os.path.join(folder, "done", name + ".json"), "w") as fh:
            json.dump({"url": f"/data/{name}.tar", "name": name, "score_file": path}, fh)
        clips.append(clip[~null])
        areas.append(area)
    return np.concatenate(clips), np.concatenate(areas)


def measure(folder, mode="stream", in_memory_rows=0):
    r = subprocess.run([sys.executable, "-c", MEASURE, folder, mode, str(in_memory_rows)], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def expected_cuts(clips, areas):
    c, a = np.sort(clips), np.sort(areas)
    return {"clip_score": float(c[-math.ceil(len(c) * 0.30)]), "ocr_area": float(a[math.ceil(len(a) * 0.075) - 1])}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak memory is read from Linux /proc")
def test_exact_and_flat_in_memory_over_millions_of_rows(tmp_path):
    small = synthetic_run(str(tmp_path / "small"), 400_000, 4)
    big = synthetic_run(str(tmp_path / "big"), 4_000_000, 40, seed=1)
    got_small, got_big = measure(str(tmp_path / "small")), measure(str(tmp_path / "big"))
    assert got_small["cuts"] == expected_cuts(*small)
    assert got_big["cuts"] == expected_cuts(*big)
    # 4 M rows are 64 MB of float64 in two columns; the streaming cut holds one read batch.
    control = measure(str(tmp_path / "big"), "control")
    print(f"peak RSS growth: {got_small['growth_kib'] / 1024:.1f} MiB at 0.4 M rows, "
          f"{got_big['growth_kib'] / 1024:.1f} MiB at 4 M rows; one column held whole: "
          f"{control['growth_kib'] / 1024:.1f} MiB")
    assert control["growth_kib"] > 40 * 1024  # the measure sees a column held in memory (32 MB + sort copy)
    assert got_big["growth_kib"] - got_small["growth_kib"] < 8 * 1024, (got_small, got_big)
    # Held whole (the run fits IN_MEMORY_ROWS): the same cuts, one column of float64 at a time.
    held = measure(str(tmp_path / "big"), in_memory_rows=4_000_000)
    print(f"held whole: {held['growth_kib'] / 1024:.1f} MiB at 4 M rows")
    assert held["cuts"] == expected_cuts(*big)
    # Beyond what the streaming cut's imports and reads take (got_small): 8 bytes a row, and the
    # reads in flight (a file's column per thread).
    assert held["growth_kib"] - got_small["growth_kib"] < 4_000_000 * 8 / 1024 + 16 * 1024, (held, got_small)


@pytest.mark.parametrize("top", [True, False])
def test_share_value_held_whole_is_the_streaming_value(top, monkeypatch):
    """The two ways to a share's cut (a column held whole, partitioned; the streaming histogram
    passes) give the same value and rank, ties and one-row shares included."""
    import wdsfilter.runfolder.quantile as q
    from wdsfilter.runfolder.quantile import bottom_share_value, share_value, top_share_value
    monkeypatch.setattr(q, "COLLECT", 50)
    monkeypatch.setattr(q, "BINS", 8)
    rng = np.random.default_rng(5)
    for data in (np.round(rng.normal(0.3, 0.05, 3001), 3), rng.integers(0, 5, 999).astype(float), np.array([0.5])):
        chunks = np.array_split(data, 7)
        for percent in (0.01, 7.5, 30, 50, 99.9, 100):
            streamed = (top_share_value if top else bottom_share_value)(lambda: iter(chunks), percent)
            assert share_value(data.copy(), percent, top) == streamed, (percent, len(data))


@pytest.mark.parametrize("kind", ["normal", "ties", "adjacent", "single"])
def test_kth_smallest_matches_a_full_sort(kind, monkeypatch):
    import wdsfilter.runfolder.quantile as q
    monkeypatch.setattr(q, "COLLECT", 50)  # force several narrowing passes on small data
    monkeypatch.setattr(q, "BINS", 8)
    rng = np.random.default_rng(3)
    if kind == "normal":
        data = rng.normal(size=5000)
    elif kind == "ties":
        data = rng.integers(0, 4, 5000).astype(float)
    elif kind == "adjacent":  # values one float apart: no histogram bin can split them
        one = np.float64(1.0)
        data = np.array([one, np.nextafter(one, 2), np.nextafter(np.nextafter(one, 2), 2)] * 300)
    else:
        data = np.full(1000, 0.25)
    chunks = np.array_split(rng.permutation(data), 9)
    ordered = np.sort(data)
    for k in [1, 2, len(data) // 3, len(data) // 2, len(data) - 1, len(data)]:
        assert kth_smallest(lambda: iter(chunks), k) == ordered[k - 1], k


def test_kth_smallest_over_a_span_wider_than_a_float(monkeypatch):
    """Values from near -max to near +max (their span overflows a float) and a few subnormals
    (too close to divide by): the rank is still exact."""
    import wdsfilter.runfolder.quantile as q
    monkeypatch.setattr(q, "COLLECT", 50)  # histogram passes, not one collection
    monkeypatch.setattr(q, "BINS", 8)
    rng = np.random.default_rng(4)
    data = np.concatenate([rng.normal(size=3000), [-1.7e308, 1.7e308, -1e300, 1e300], np.full(80, 5e-324),
                           np.full(70, 1e-323), np.zeros(60)])
    chunks = np.array_split(rng.permutation(data), 5)
    ordered = np.sort(data)
    for k in [1, 2, 1500, len(data) - 1, len(data)]:
        assert kth_smallest(lambda: iter(chunks), k) == ordered[k - 1], k


@pytest.mark.parametrize("kind", ["normal", "ties", "sorted", "periodic", "huge", "equal", "missing"])
def test_a_share_of_a_column_held_in_pieces_is_share_value(kind, monkeypatch):
    """`filter` counts from each file's column held in memory (judge.ShardTable) and takes its
    shares from those pieces (quantile.share_of_chunks: a sampled bracket, one pass, partition),
    NaN for missing values: the same (v, k) as share_value over the values, and n the values
    counted. Periodic data whose period is the sample's spacing makes the sample miss the rank
    (the fallback: the whole column partitioned)."""
    import wdsfilter.runfolder.quantile as q
    monkeypatch.setattr(q, "SAMPLE", 400)
    rng = np.random.default_rng(6)
    data = {"normal": np.round(rng.normal(0.3, 0.05, 4001), 4), "ties": rng.integers(0, 5, 3000).astype(float),
            "sorted": np.sort(rng.normal(size=3000)),
            "periodic": np.where(np.arange(4000) % 10 == 0, 0.0, np.arange(4000.0)), "huge": rng.random(2000) * 1.7e308 * rng.choice([-1, 1], 2000),
            "equal": np.full(500, 0.25), "missing": np.full(300, np.nan)}[kind]
    data[rng.random(len(data)) < 0.05] = np.nan
    values, before = data[~np.isnan(data)], data.copy()
    for parts in (1, 7):
        chunks = np.array_split(data, parts)
        for percent in (0.01, 7.5, 30, 50, 99.9, 100):
            for top in (True, False):
                got = q.share_of_chunks(chunks, percent, top)
                assert not np.isnan(data).all() or got[2] == 0
                if len(values):
                    assert got == (*share_value(values.copy(), percent, top), len(values)), (percent, top, parts)
    assert np.array_equal(data, before, equal_nan=True)  # the pieces were not reordered


@pytest.mark.parametrize("ends", [[float("inf")], [float("-inf")], [float("inf"), float("-inf")]])
def test_the_streaming_share_of_a_column_with_an_infinity_takes_a_few_passes(monkeypatch, ends):
    """A Parquet score column may hold an infinity: the streaming --top/--bottom (runs beyond
    IN_MEMORY_ROWS) found the same value, but an infinite end of the range put every value in one
    bin, and each pass peeled off a single value: a pass over the whole run per distinct score."""
    from wdsfilter.runfolder import quantile
    monkeypatch.setattr(quantile, "COLLECT", 100)  # the streaming path on 20k values instead of millions
    values = np.concatenate([np.random.default_rng(0).normal(size=20000), ends])
    for top, percent in ((True, 30), (False, 30), (True, 0.001), (False, 100)):
        passes = []

        def source():
            passes.append(1)
            return iter([values[:7000], values[7000:]])
        value, k = (quantile.top_share_value if top else quantile.bottom_share_value)(source, percent)
        assert (value, k) == quantile.share_value(values.copy(), percent, top)
        assert len(passes) < 30, len(passes)
