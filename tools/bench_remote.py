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

    python tools/bench_remote.py [--shards 4] [--copies 400] [--runs 3] [--memory-shards 2,8]

Goal (issue 22): ratio wdsfilter / best client read >= 0.9; memory flat in the number of shards.
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
    from wdsfilter.shards import open_shard
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--copies", type=int, default=400, help="copies of the sample members per shard")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--memory-shards", default="2,8")
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
