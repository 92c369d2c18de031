"""`wdsfilter filter --top ... --dry-run` (no report, no --dedup) reads each score file once for
the share and the counts (issue 21 item 7): one open for its footer and its columns, where it
read every file three times before (footer, the share column, the count); the first file's
footer is read once more when the run is opened (the run's columns). The opens are counted
by the "open" audit events the run folder's reader announces for every file pyarrow opens
(runfolder.tables._native), in a child process (an audit hook cannot be removed)."""
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
result = filter_scores(sys.argv[1], tops=["clip_score=30%"], maxes=["ocr_area=0.5"], dry_run=True)
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
