"""The Ray engine at real scale (issue 22 item 8): a cluster of two nodes on this host, each its own
`ray start` (own temp folder, own ports), scores shards from moto's S3 server on 127.0.0.1 through
`wdsfilter score --engine ray --ray-address`. The worker node is killed (kill -9 of every process it
runs) while both model actors are mid-batch: nothing is lost. The run completes or fails, and
`--resume` completes it with the rows of a one-shot local run of the same shards."""
import glob
import secrets
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("ray", reason="the Ray engine is tested where wdsfilter[ray] is installed")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, s3_server, upload  # noqa: E402
from scorekit import make_shards  # noqa: E402
from wdsfilter.score import score  # noqa: E402
from wdsfilter.runfolder.tables import read_rows  # noqa: E402

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_pids(sid: int) -> list:
    """Every process of session `sid` (a node's `ray start --block` and all it started)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    pids.append(int(name))
            except OSError:  # gone meanwhile
                pass
    return pids


class RayNode:
    """One Ray node on this host: `ray start --block` in a session of its own, so that `kill()`
    ends exactly its processes (raylet, workers, GCS on the head), none of another cluster's."""

    def __init__(self, args: list, env: dict):
        self.temp = tempfile.mkdtemp(prefix="wr", dir="/tmp")  # Ray's socket paths must stay short
        self.log = open(os.path.join(self.temp, "start.log"), "w+")
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
        self.proc = subprocess.Popen(
            [RAY, "start", "--block", "--temp-dir", self.temp, "--node-ip-address", "127.0.0.1",
             "--num-gpus", "0", "--object-store-memory", str(80 * 2**20), "--disable-usage-stats",
             *[a for p in ports for a in (p, str(free_port()))], *args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_started(self, timeout: float = 120) -> None:
        """Until `ray start` says the node runs (it registered with the cluster's GCS)."""
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.text():
            assert self.proc.poll() is None, f"ray start ended:\n{self.text()}"
            assert time.monotonic() < deadline, f"ray start did not finish:\n{self.text()}"
            time.sleep(0.1)

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def kill(self) -> None:
        """kill -9 of every process of the node, until none is left (a raylet forks workers)."""
        while True:
            pids = session_pids(self.proc.pid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.poll()  # reaps `ray start` itself; the rest are reaped by init
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.log.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def ray_env() -> dict:
    """The nodes' environment, which their workers inherit: the AWS chain (s3_server's), the test
    scorers on the path, a node's death noticed in seconds instead of tens, and the cluster's
    token (Ray's default token authentication, with a token of this cluster's own: nothing is
    read from or written to ~/.ray)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, REPO]), RAY_USAGE_STATS_ENABLED="0",
                RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16),
                RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="500",
                RAY_health_check_failure_threshold="4", RAY_health_check_timeout_ms="1000")


def rows(out: str) -> dict:
    return {os.path.basename(p): [{k: v for k, v in r.items() if k != "shard"} for r in read_rows(p)]
            for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}


def wait_for(what: str, ready, proc, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)


def test_a_worker_node_killed_mid_run_loses_nothing_and_resume_completes_it(tmp_path):
    folder = str(tmp_path / "shards")
    make_shards(folder, [6, 6, 6, 6, 5], bad={2: (3,)})
    out = f"s3://{BUCKET}/runs/two-node"  # the run folder in the bucket too (its staging copy on this host)
    hold, held = tmp_path / "hold", tmp_path / "held"
    held.mkdir()
    hold.touch()
    nodes = []
    with s3_server() as (endpoint, client):
        upload(client, folder, "set")
        try:
            env = ray_env()
            gcs = free_port()
            head = RayNode(["--head", "--port", str(gcs), "--num-cpus", "3", "--include-dashboard", "false",
                            "--ray-client-server-port", str(free_port())], env)
            nodes.append(head)
            head.wait_started()
            worker = RayNode(["--address", f"127.0.0.1:{gcs}", "--num-cpus", "2"], env)
            nodes.append(worker)
            worker.wait_started()
            command = [sys.executable, "-m", "wdsfilter", "score", f"s3://{BUCKET}/set/", "--out", out,
                       "--engine", "ray", "--ray-address", f"127.0.0.1:{gcs}", "--ray-actors", "2",
                       "--scorer", "faultkit:HoldScorer", "--scorer-opt", f"bright.hold_file={hold}",
                       "--scorer-opt", f"bright.held_dir={held}", "--batch-size", "3", "--format", "jsonl",
                       "-q"]
            run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                # Both model actors hold a batch: one of them on the worker node (Ray Data spreads
                # its actors over the nodes), which dies with it.
                def on_worker():
                    return set(map(int, os.listdir(held))) & set(session_pids(worker.proc.pid))
                wait_for("a model actor mid-batch on the worker node", on_worker, run)
                worker.kill()
                hold.unlink()
                said, _ = run.communicate(timeout=300)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.wait()
            # Completed, or failed with the failed shards named and resumable: never a crash. (Ray
            # Data logs the lost batch with its own traceback before our summary; ours ends it.)
            last = said.strip().splitlines()[-1]
            assert run.returncode == 0 or (run.returncode == 3 and "--resume" in last), said
            assert "Traceback" not in said, said  # Ray Data's log of the lost batch: one line, not its traceback
            resumed = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            fetched = download(client, "runs/two-node/", str(tmp_path / "fetched"))
        finally:
            for node in reversed(nodes):
                node.close()
    local = str(tmp_path / "local")
    score(folder, out=local, scorers=["scorekit:BrightnessScorer"], device="cpu", workers=0, progress=False,
          batch_size=3, format="jsonl")
    assert sorted(os.listdir(os.path.join(fetched, "done"))) == sorted(os.listdir(os.path.join(local, "done")))
    assert rows(fetched) == rows(local) and sum(map(len, rows(fetched).values())) == 29


def download(client, prefix: str, folder: str) -> str:
    """Every object under prefix in the test bucket, as files under folder."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    for item in (obj for page in pages for obj in page.get("Contents", ())):
        path = os.path.join(folder, item["Key"][len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(BUCKET, item["Key"], path)
    return folder
