"""Many workers on one run folder, under faults: 4 worker processes on a local run folder and 4 on
a moto S3 run folder, over the same shards, killed (SIGKILL) and stopped (SIGSTOP) at random
moments while new ones start, until both runs are done; then every sample is in exactly one row
(or the ledger), the rows are a one-process run's, every marker's files are whole, and each shard's
results are one worker's (tests/workerkit.py; tools/fuzz_workers.py runs many seeds)."""
import os

import pytest
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    from remotekit import s3_server
    with s3_server() as (endpoint, client):
        yield endpoint, client


@pytest.mark.slow  # 8+ worker processes, kills and a stall past a 3 s lease
@pytest.mark.parametrize("seed", [7])
def test_workers_killed_and_stopped_at_random_leave_the_rows_of_one_run(seed, s3, tmp_path, monkeypatch):
    import workerkit
    from remotekit import BUCKET
    endpoint, client = s3
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    shards, _ = make_shards(str(tmp_path / "shards"), [9] * 16, bad={3: (2,)}, no_caption={5: (1,)})
    names = [f"shard-{i:04d}" for i in range(16)]
    reference = str(tmp_path / "reference")
    r = CliRunner().invoke(main, workerkit.worker_args(shards, reference), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    folders = {"local": workerkit.LocalFolder(str(tmp_path / "out")),
               "s3": workerkit.S3Folder(client, BUCKET, f"join-{seed}")}
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TMPDIR"))}
    env["PYTHONPATH"] = os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])
    trial = workerkit.play(seed, shards, folders, env, str(tmp_path / "logs"))
    assert workerkit.violations(trial, reference, names, folders) == [], trial.kills
    for name, fleet in trial.fleets.items():  # in each folder: a worker killed, one fenced after a stop
        assert any(w.killed for w in fleet.workers), (name, trial.kills)
        assert any(w.fenced_stop and w.proc.exitcode == 3 for w in fleet.workers), (name, trial.kills)
