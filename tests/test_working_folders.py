"""A run killed with kill -9 leaves its working folders in $TMPDIR (a bucket's staging copy, the
worker tallies): the next run that makes one sweeps them, and only them: a live process's folder,
a folder kept for the user and another program's folder stay (scratch.py)."""
import os
import signal
import subprocess as sp
import sys
import time

import pytest
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main

pytest.importorskip("moto")
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def s3():
    from remotekit import s3_server
    with s3_server() as (_, client):
        yield client


@pytest.mark.slow  # a run killed with SIGKILL, then another
def test_a_killed_runs_working_folders_are_swept_by_the_next_run_and_no_other(tmp_path, monkeypatch, s3):
    from remotekit import BUCKET
    from wdsfilter.core.scratch import Scratch
    tmp = tmp_path / "tmp"
    os.makedirs(tmp)
    monkeypatch.setenv("TMPDIR", str(tmp))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    shards = make_shards(str(tmp_path / "shards"), [4, 4])[0]
    out, hold = f"s3://{BUCKET}/runs/killed", str(tmp_path / "hold")
    args = ["score", *shards, "--out", out, "--scorer", "scorekit:BrightnessScorer", "--device", "cpu",
            "--batch-size", "4", "--workers", "0", "--no-progress", "--format", "jsonl"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    killed = sp.Popen([sys.executable, "-m", "wdsfilter", *args, "--scorer-opt", f"bright.hold_file={hold}",
                       "--scorer-opt", "bright.hold_key=s1_"], env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True,
                      start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(hold + ".waiting"):  # scoring its second shard: staging and tallies in use
            assert killed.poll() is None, killed.communicate()[0]
            assert time.monotonic() < deadline, "the run never reached its second shard"
            time.sleep(0.05)
        os.killpg(killed.pid, signal.SIGKILL)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    left = sorted(n for n in os.listdir(tmp) if n.startswith(f"wdsfilter-out-{killed.pid}-")
                  or n.startswith(f"wdsfilter-stats-{killed.pid}-"))
    assert [n.split("-")[1] for n in left] == ["out", "stats"], os.listdir(tmp)  # nothing could remove them
    live = Scratch("stats")  # another process's, alive: this one's
    kept = Scratch("out")
    kept.keep()  # a staging copy named in a log for the user
    kept.close()
    foreign = tmp / f"wdsfilter-out-{killed.pid}-not-ours"  # no .owner: not made by this rule
    os.makedirs(foreign)
    r = CliRunner().invoke(main, [*args, "--resume"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    remaining = set(os.listdir(tmp))
    assert not remaining & set(left)  # swept
    assert {os.path.basename(live.path), os.path.basename(kept.path), foreign.name} <= remaining
    assert remaining == {os.path.basename(live.path), os.path.basename(kept.path), foreign.name}  # and its own removed
    live.remove()
