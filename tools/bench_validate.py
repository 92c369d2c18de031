"""Benchmark: `wdsfilter validate` throughput beside a raw sequential read of the same files, and
its peak memory with few and with many shards.

Shards are made by replicating the members of sample_shards/images-*.tar with fresh keys (as
tools/bench_stages.py does) into a temporary folder, so every file is in the page cache for every
contender. The sample images are small (about 5 KB per sample): per-sample costs dominate; with
--upscale N every image is enlarged N times per side to see larger files. Two raw reads are timed, both one process, one pass, every byte:
  file  plain reads of each shard file in 1 MiB blocks (the disk/page-cache ceiling);
  tar   Python's tarfile streaming over each shard, reading every member's bytes (what any tar
        reader must do before it can look at a sample).
Runs alternate (raw file, raw tar, validate) so all see the same cache and machine load; the best
of --runs is kept. validate runs as `wdsfilter validate` does (default --jobs: one process per core).

Peak memory: `validate` runs in a fresh subprocess on --memory-shards shard counts (same shard
size); the peak RSS of that process and the largest of its worker processes are read from
getrusage (RUSAGE_SELF, RUSAGE_CHILDREN) when it ends.

    python tools/bench_validate.py [--shards 8] [--copies 24] [--runs 3] [--jobs N]
                                   [--memory-shards 4,40] [--memory-copies 3] [--upscale 1]

Goal (issue 3): validate at least 0.5x the raw read on this 2-core machine for image shards, and
peak memory flat as the shard count grows.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools.benchkit import OWN_PEAK_KB, replicate  # noqa: E402



def sample_members(upscale: int = 1) -> List[tuple]:
    """The members of sample_shards/images-*.tar; with upscale > 1 each image is enlarged that many
    times per side and re-encoded in its format (bigger files, same samples), to see how the
    ratio depends on bytes per sample."""
    import glob
    import io

    from PIL import Image

    members = []
    for path in sorted(glob.glob(os.path.join(ROOT, "sample_shards", "images-*.tar"))):
        with tarfile.open(path) as tar:
            for info in tar:
                if not info.isreg():
                    continue
                data = tar.extractfile(info).read()
                ext = info.name.rsplit(".", 1)[-1]
                if upscale > 1 and ext in ("jpg", "png", "webp"):
                    with Image.open(io.BytesIO(data)) as img:
                        big = img.resize((img.width * upscale, img.height * upscale), Image.BICUBIC)
                        buf = io.BytesIO()
                        big.save(buf, {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[ext])
                        data = buf.getvalue()
                members.append((info.name, data))
    if not members:
        raise SystemExit("no sample_shards/images-*.tar: run tools/make_sample_shards.py first")
    return members


def make_shards(folder: str, shards: int, copies: int, members: List[tuple]) -> List[str]:
    """`copies` copies of the members per shard, with fresh keys (as the other benchmarks do)."""
    return replicate(folder, members, shards, copies)


def raw_file_read(urls: List[str]) -> int:
    n = 0
    for url in urls:
        with open(url, "rb", buffering=0) as f:
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                n += len(block)
    return n


def raw_tar_read(urls: List[str]) -> int:
    n = 0
    for url in urls:
        with open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                if info.isreg():
                    n += len(tar.extractfile(info).read())
    return n


def run_validate(urls: List[str], jobs: Optional[int]):
    from wdsfilter.validate import validate
    return validate(urls, jobs=jobs)


_MEMORY_PROBE = OWN_PEAK_KB + """
import json, resource, sys
from wdsfilter.validate import validate
report = validate(sys.argv[1], jobs=None if sys.argv[2] == "0" else int(sys.argv[2]))
kb = lambda who: resource.getrusage(who).ru_maxrss  # KiB on Linux
print(json.dumps({"shards": len(report.shards), "samples": report.samples, "passed": report.passed,
                  "parent_mb": own_peak_kb() / 1024, "worker_mb": kb(resource.RUSAGE_CHILDREN) / 1024}))
"""


def peak_memory(folder: str, jobs: Optional[int]) -> Dict:
    """Peak RSS (MB) of a fresh `validate` process on the folder, and of its largest worker."""
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, folder, str(jobs or 0)], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(shards: int = 8, copies: int = 24, runs: int = 3, jobs: Optional[int] = None,
          memory_shards=(4, 40), memory_copies: int = 3, upscale: int = 1, out=print) -> Dict:
    """Runs everything and returns the numbers it printed."""
    from wdsfilter.validate.options import default_jobs

    jobs_used = jobs or default_jobs()
    result: Dict = {"jobs": jobs_used, "cpus": default_jobs()}
    members = sample_members(upscale)
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        urls = make_shards(os.path.join(tmp, "throughput"), shards, copies, members)
        size = sum(os.path.getsize(u) for u in urls)
        best = {"file": float("inf"), "tar": float("inf"), "validate": float("inf")}
        raw_file_read(urls), raw_tar_read(urls[:1]), run_validate(urls[:1], jobs)  # warm cache and imports
        samples = 0
        for _ in range(runs):
            for name in best:
                t = time.perf_counter()
                if name == "file":
                    assert raw_file_read(urls) == size
                elif name == "tar":
                    raw_tar_read(urls)
                else:
                    report = run_validate(urls, jobs)
                    samples = report.samples
                    if not report.passed or report.kept != samples:
                        raise SystemExit(f"the benchmark shards do not validate clean: {report.counts}")
                best[name] = min(best[name], time.perf_counter() - t)
        mb = size / 1e6
        result.update(shards=shards, samples=samples, mb=round(mb, 2), runs=runs, upscale=upscale)
        out(f"{shards} image shards, {samples} samples, {mb:.1f} MB ({size / max(samples, 1) / 1e3:.1f} KB per "
            f"sample; page cache), best of {runs} runs; validate --jobs {jobs_used} on {result['cpus']} CPU(s)")
        for name, label in (("file", "raw read (file blocks, 1 process)"), ("tar", "raw read (tarfile members, 1 process)"),
                            ("validate", f"validate (--jobs {jobs_used})")):
            t = best[name]
            result[name] = {"seconds": significant(t), "mb_s": significant(mb / t), "samples_s": significant(samples / t)}
            out(f"  {label:<40} {t:8.3f}s {mb / t:9.1f} MB/s {samples / t:10.0f} samples/s")
        result["ratio_file"] = significant(best["file"] / best["validate"])
        result["ratio_tar"] = significant(best["tar"] / best["validate"])
        out(f"  ratio validate/raw: {result['ratio_file']:.3f}x of file blocks, {result['ratio_tar']:.3f}x of tarfile "
            f"members (goal >= 0.5x)")

        memory = []
        for n in memory_shards:
            folder = os.path.join(tmp, f"memory-{n}")
            make_shards(folder, n, memory_copies, members)
            memory.append(dict(peak_memory(folder, jobs), mb=round(sum(
                os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e6, 1)))
        result["memory"] = memory
        out("  peak memory (fresh process each):")
        for m in memory:
            worker = f"largest worker {m['worker_mb']:6.1f} MB" if m["worker_mb"] else "no worker (one shard)"
            out(f"    {m['shards']:>4} shards, {m['samples']:>6} samples, {m['mb']:>6.1f} MB: "
                f"validate process {m['parent_mb']:6.1f} MB, {worker}")
    return result


def main(argv=None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8, help="shards for the throughput runs")
    ap.add_argument("--copies", type=int, default=24, help="copies of the sample members per shard (64 samples each)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="validate --jobs [default: one per core]")
    ap.add_argument("--memory-shards", default="4,40", help="shard counts compared for peak memory")
    ap.add_argument("--memory-copies", type=int, default=3, help="copies per shard in the memory runs")
    ap.add_argument("--upscale", type=int, default=1, help="enlarge every image this many times per side")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON at the end too")
    args = ap.parse_args(argv)
    result = bench(args.shards, args.copies, args.runs, args.jobs,
                   tuple(int(n) for n in args.memory_shards.split(",")), args.memory_copies, args.upscale)
    if args.json:
        print(json.dumps(result))
    return result


def significant(x: float) -> float:
    """x to 4 significant digits: a ratio or speed measured on a busy machine can be tiny, and
    rounding to decimal places made it 0.0."""
    return float(f"{x:.4g}")


if __name__ == "__main__":
    main()
