"""`wdsfilter filter --top ... --dry-run` (no report, no --dedup) reads each score file once for
the share and the counts (issue 21 item 7): one open for its footer and its columns, where it
read every file three times before (footer, the share column, the count); the first file's
footer is read once more when the run is opened (the run's columns). The opens are counted
by the "open" audit events the run folder's reader announces for every file pyarrow opens
(runfolder.tables.audited), in a child process (an audit hook cannot be removed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq

from filterkit import REPO

CHILD = r"""
import collections, json, sys
opens = collections.Counter()
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and "/scores/" in args[0]:
        opens[args[0]] += 1
sys.addaudithook(hook)
from wdsfilter.filtering import filter_scores
result = filter_scores(sys.argv[1], top_shares={"clip_score": 30}, max_scores={"ocr_area": 0.5}, dry_run=True)
print(json.dumps({"opens": dict(opens), "kept": result.kept, "rows": result.rows,
                  "cut": result.thresholds[1].value, "reasons": result.reasons}))
"""


def test_a_dry_run_share_reads_each_score_file_once(tmp_path):
    sys.path.insert(0, REPO)
    from tools.bench_filter import make_run
    folder = str(tmp_path / "run")
    make_run(folder, 6000, 6, seed=3)  # the benchmark's layout: ties, 1% nulls
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD, folder], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    files = sorted(os.path.join(folder, "scores", f) for f in os.listdir(os.path.join(folder, "scores")))
    # once each: the footer read with the columns; the first file twice (its footer gives the run's columns)
    assert sorted(got["opens"]) == files and got["opens"] == {f: 1 + (f == files[0]) for f in files}, got["opens"]
    # the counts are those of the rule spelled out over the files read whole
    table = [pq.read_table(f, columns=["clip_score", "ocr_area"]).to_pydict() for f in files]
    clip = np.array([v if v is not None else np.nan for t in table for v in t["clip_score"]])
    area = np.array([v for t in table for v in t["ocr_area"]])
    values = np.sort(clip[~np.isnan(clip)])[::-1]
    cut = values[int(np.ceil(len(values) * 0.3)) - 1]  # the k-th largest, k = ceil(30% of the values)
    assert got["cut"] == cut and got["rows"] == 6000
    assert got["kept"] == int(((clip >= cut) & (area <= 0.5)).sum())
    # dropped by their first reason, the thresholds in the order they resolve: --max, then --top
    assert got["reasons"] == {f"clip_score < {cut:.4g}": int(((clip < cut) & (area <= 0.5)).sum()),
                              "ocr_area > 0.5": int((area > 0.5).sum()),
                              "no clip_score": int((np.isnan(clip) & (area <= 0.5)).sum())}


def test_a_run_past_the_held_rows_streams_whether_its_markers_count_rows_or_not(tmp_path, monkeypatch):
    """quantile.IN_MEMORY_ROWS bounds the rows filter holds: a run whose markers count more is not
    read into memory; one whose markers do not count them (older, hand-made: rows 0) is found past
    the limit as the reads add up, and streams. Either way the cut and the counts are the same."""
    sys.path.insert(0, REPO)
    import wdsfilter.filtering.apply as apply
    import wdsfilter.runfolder.quantile as quantile
    from tools.bench_filter import make_run
    from wdsfilter.filtering import filter_scores
    folder = str(tmp_path / "run")
    make_run(folder, 6000, 6, seed=4)  # markers without a row count
    held = []
    real = apply._read_tables
    monkeypatch.setattr(apply, "_read_tables", lambda run, spec, *more: held.append(real(run, spec, *more)) or held[-1])

    def run():
        r = filter_scores(folder, top_shares={"clip_score": 30}, max_scores={"ocr_area": 0.5}, dry_run=True)
        return r.kept, r.rows, r.thresholds[1].value, r.reasons
    whole = run()
    assert held[-1] is not None and len(held[-1]) == 6
    monkeypatch.setattr(quantile, "IN_MEMORY_ROWS", 2500)
    assert run() == whole and held[-1] is None  # found by the reads
    for name in os.listdir(os.path.join(folder, "done")):  # as `wdsfilter score` writes them: rows counted
        path = os.path.join(folder, "done", name)
        marker = json.load(open(path))
        json.dump({**marker, "rows": 1000}, open(path, "w"))
    assert run() == whole and held[-1] is None
    monkeypatch.setattr(quantile, "IN_MEMORY_ROWS", 6000)
    assert run() == whole and held[-1] is not None


BLAS_CHILD = r"""
import json, os, sys
if sys.argv[2] == "filter":
    from click.testing import CliRunner
    from wdsfilter.cli import main
    result = CliRunner().invoke(main, ["filter", sys.argv[1], "--top", "clip_score=30%", "--dry-run"])
    assert result.exit_code == 0, result.output
import numpy  # noqa: F401 - the plain import: the control
# OpenBLAS's threads carry the process's name; pyarrow's allocator thread (jemalloc_bg_thd) is not counted
names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
print(json.dumps({"threads": names.count(open("/proc/self/comm").read()), "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_filter_loads_numpy_without_blas_threads_and_leaves_the_environment(tmp_path):
    """`wdsfilter filter` imports numpy with OpenBLAS at one thread (no linear algebra; the threads
    cost a tenth of a dry run's CPU), puts the environment back for what it starts, and leaves a
    user's own OPENBLAS_NUM_THREADS alone."""
    sys.path.insert(0, REPO)
    from tools.bench_filter import make_run
    folder = str(tmp_path / "run")
    make_run(folder, 600, 1, seed=5)  # one score file: read without a thread pool, whose exiting threads would count
    base = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base.pop("OPENBLAS_NUM_THREADS", None)

    def child(mode, **env):
        proc = subprocess.run([sys.executable, "-c", BLAS_CHILD, folder, mode], capture_output=True, text=True,
                              env={**base, **env}, cwd=REPO, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    plain, filtered = child("plain"), child("filter")
    assert filtered["env"] is None and plain["env"] is None
    assert filtered["threads"] == 1  # the main thread: no BLAS thread
    if (os.cpu_count() or 1) > 1:
        assert plain["threads"] > 1  # the control: OpenBLAS starts its threads on a plain import
    assert child("filter", OPENBLAS_NUM_THREADS="2")["env"] == "2"
