"""Many `wdsfilter score --join` workers on one run folder against one: the throughput they add and
the object-store requests their coordination costs.

The scorer spends a fixed time per batch (SleepScorer: a stand-in for GPU time, so what is measured
is the coordination, not this machine's 2 cores) and waits at its first sample after the probe
until the bench says go, once every worker is there (its start, the same alone or among others, is
left out): samples/s are timed from go to the last marker (the scoring, claims included), and from
go to the moment the run's end (summary, report) is written, the `.finish.json` record's time. Each case runs into a local run folder and
into one in moto's S3 server on 127.0.0.1, whose WSGI application counts every request by kind.

    python tools/bench_workers.py [--quick] [--shards 32] [--samples 64] [--batch 16] [--seconds 0.25]

Prints, per store, samples/s with 1 and with 4 workers and `ratio 4 workers / 1 worker samples/s =
R` (goal >= 3.5; and the ratio to the run's end); for S3, the requests per shard spent on coordination (claims, markers, listings,
records, run.json), the worker-record writes (heartbeats, round reports) against the heartbeat
intervals the workers lived, and the data requests (score files, ledger, summary) apart.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from wdsfilter.score.scorers.base import Scorer  # noqa: E402

SCORER = "tools.bench_workers:SleepScorer"


_SCORED = []  # this process's model side scored a batch (the probe): the next prepare is the run's


class SleepScorer(Scorer):
    """`seconds` per batch, whatever its size (a GPU's time). With `go_file`, the worker waits at
    its first sample after the probe (the model in the main process: `--device cpu`) until that
    file exists, saying it is ready beside it: the time measured leaves out each worker's start
    (imports, model load, probe), which is the same alone or among others."""
    name = "sleep"

    def __init__(self, seconds: float = 0.25, go_file: str = ""):
        self.seconds, self.go_file = seconds, go_file

    def columns(self):
        return ["sleep_luma"]

    def prepare(self, sample):
        if self.go_file and _SCORED == [True]:
            _SCORED.append(False)
            open(f"{self.go_file}.ready-{os.getpid()}", "w").close()
            while not os.path.exists(self.go_file):
                time.sleep(0.01)
        return float(sample["image"].getpixel((0, 0))[0])

    def load(self, device):
        pass

    def score_batch(self, inputs):
        if not _SCORED:
            _SCORED.append(True)
        time.sleep(self.seconds)
        return [{"sleep_luma": x} for x in inputs]


# -- moto, counting ----------------------------------------------------------------------------------
class CountingS3:
    """moto's S3 server on a free loopback port, every request recorded (time, method, key, query)."""

    def __init__(self):
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
        from werkzeug.serving import make_server
        self.requests: List[Tuple[float, str, str, str]] = []
        seen = self.requests

        def counting(app):
            def wrapped(environ, start_response):
                seen.append((time.time(), environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                             environ.get("QUERY_STRING", "")))
                return app(environ, start_response)
            return wrapped

        class Server(ThreadedMotoServer):
            def _server_entry(self):
                app = counting(DomainDispatcherApplication(create_backend_app))
                self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
                self._server_ready_event.set()
                self._server.serve_forever()

        import logging
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = Server(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self):
        import boto3
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_ENDPOINT_URL": self.endpoint,
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
        return self

    def __exit__(self, *exc):
        self.server.stop()


COORDINATION = ("claims/", "workers/", "done/", ".finish.json", ".lock.json", "run.json", "shards.json", "run.yaml")


def classify(requests, prefix: str) -> Dict[str, int]:
    """Requests under the run folder `prefix` by kind: list (listings), record (a worker record
    write after its first), coordination (the rest of COORDINATION), data."""
    counts = {"list": 0, "worker writes": 0, "coordination": 0, "data": 0}
    for _, method, path, query in requests:
        key = path.lstrip("/").split("/", 1)[1] if "/" in path.lstrip("/") else ""
        if not key and ("list-type" in query or "prefix=" in query):
            if f"prefix={prefix}" in query.replace("%2F", "/"):
                counts["list"] += 1
            continue
        if not key.startswith(prefix + "/"):
            continue
        rel = key[len(prefix) + 1:]
        if rel.startswith("workers/") and method == "PUT":
            counts["worker writes"] += 1
        elif rel.startswith(COORDINATION):
            counts["coordination"] += 1
        else:
            counts["data"] += 1
    return counts


# -- one case ----------------------------------------------------------------------------------------------
def run_case(shards: List[str], out: str, n: int, args, env: Dict[str, str], folder: str) -> dict:
    """n workers on `out`; the seconds from go to the run's end, and the workers' lifetimes."""
    go = os.path.join(folder, f"go-{n}-{abs(hash(out)) % 10_000}")
    cmd = [sys.executable, "-m", "wdsfilter", "score", *shards, "--out", out, "--scorer", SCORER,
           "--scorer-opt", f"sleep.seconds={args.seconds}", "--scorer-opt", f"sleep.go_file={go}",
           "--device", "cpu", "--batch-size", str(args.batch), "--workers", "0", "--no-progress", "-q", "--join"]
    full = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **env)
    born = time.time()
    procs = [subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(n)]
    deadline = time.monotonic() + 600
    while len([f for f in os.listdir(folder) if f.startswith(os.path.basename(go) + ".ready-")]) < n:
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError("a worker ended before the go: " + " | ".join(p.communicate()[0][-800:] for p in procs))
        time.sleep(0.01)
    started = time.time()
    open(go, "w").close()
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a worker failed: " + " | ".join(outputs))
    return {"go": started, "outputs": outputs, "lived": n * (time.time() - born)}


def finish_time(read) -> float:
    return float(json.loads(read(".finish.json"))["finished"])


def last_marker(out: str, requests, prefix: str) -> float:
    """When the last marker was written: its file's time, or its PUT's at the server."""
    if not out.startswith("s3://"):
        folder = os.path.join(out, "done")
        return max(os.stat(os.path.join(folder, f)).st_mtime for f in os.listdir(folder))
    return max(t for t, method, path, _ in requests if method == "PUT" and f"/{prefix}/done/" in path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 shards (the ratio's start-up share grows)")
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--samples", type=int, default=64, help="samples per shard")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=0.25, help="per batch (the stand-in for GPU time)")
    args = ap.parse_args()
    if args.quick:
        args.shards = 16
    import boto3
    from scorekit import make_shards
    folder = tempfile.mkdtemp(prefix="bench-workers-")
    shards, _ = make_shards(os.path.join(folder, "shards"), [args.samples] * args.shards)
    samples = args.shards * args.samples
    work = args.shards * -(-args.samples // args.batch) * args.seconds
    print(f"bench_workers: {args.shards} shards x {args.samples} samples, batch {args.batch}, {args.seconds}s per "
          f"batch: {work:.0f}s of scorer time; load average {os.getloadavg()[0]:.1f}")
    with CountingS3() as s3:
        client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="bench",
                              aws_secret_access_key="bench")
        for store in ("local", "s3"):
            rates = {}
            for n in (1, 4):
                if store == "local":
                    out = os.path.join(folder, f"out-{n}")
                    read = (lambda rel, out=out: open(os.path.join(out, rel), "rb").read())
                    env = {}
                else:
                    out, prefix = f"s3://bench/run-{n}", f"run-{n}"
                    read = (lambda rel, prefix=prefix: client.get_object(Bucket="bench",
                                                                         Key=f"{prefix}/{rel}")["Body"].read())
                    env = s3.env
                before = len(s3.requests)
                case = run_case(shards, out, n, args, env, folder)
                scoring = last_marker(out, s3.requests[before:], f"run-{n}") - case["go"]
                whole = finish_time(read) - case["go"]
                rates[n] = (samples / scoring, samples / whole)
                print(f"  {store}, {n} worker(s): {samples} samples scored in {scoring:.2f}s from go to the last "
                      f"marker = {rates[n][0]:.1f} samples/s; the run's end written at {whole:.2f}s "
                      f"({rates[n][1]:.1f} samples/s)")
                if store == "s3":
                    report_requests(s3.requests[before:], prefix, args.shards, n, case["lived"])
            print(f"ratio 4 workers / 1 worker samples/s = {rates[4][0] / rates[1][0]:.2f} ({store} run folder, "
                  f"scoring; goal >= 3.5); {rates[4][1] / rates[1][1]:.2f} to the run's end (summary, report)")
    return 0


def report_requests(requests, prefix: str, shards: int, n: int, lived: float) -> None:
    """The run's requests by kind; `lived`: the seconds its workers lived, all together."""
    from wdsfilter.runfolder.lease import STALE_SECONDS
    counts = classify(requests, prefix)
    intervals = lived / (STALE_SECONDS / 4)
    per_shard = (counts["coordination"] + counts["list"]) / shards
    print(f"    requests: {counts['coordination']} on claims, markers and records + {counts['list']} listings = "
          f"{per_shard:.2f} per shard (goal <= 6); {counts['worker writes']} worker-record writes (create, round "
          f"reports, release, heartbeats) by {n} worker(s) that lived {intervals:.2f} heartbeat intervals "
          f"({STALE_SECONDS / 4:g}s) all together; {counts['data']} data requests (score files, ledgers, summary, "
          f"report) apart")


if __name__ == "__main__":
    sys.exit(main())
