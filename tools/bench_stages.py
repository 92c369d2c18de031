"""Benchmark: wdsfilter's stages against plain webdataset stages doing the same decoding.

Both read the same shards (made by replicating sample_shards/images-*.tar with fresh keys),
decode every image to an RGB PIL image and take its caption from .txt, in one process. Runs
alternate so that both see the same page cache and machine load; the best of N runs is kept.

    python tools/bench_stages.py [--shards 8] [--copies 12] [--runs 3]

Goal (issue 2): wdsfilter at most 1.05x plain webdataset.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.benchkit import replicate, sample_members  # noqa: E402


def make_shards(folder: str, shards: int, copies: int) -> list:
    """Replicate the committed image shards `copies` times per output shard with unique keys."""
    return replicate(folder, sample_members(["images-*.tar"]), shards, copies)


def run_webdataset(urls) -> int:
    import webdataset as wds
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil").to_tuple("jpg;png;webp", "txt")
    return sum(1 for _ in ds)


def run_wdsfilter(urls) -> int:
    from wdsfilter import StageConfig
    from wdsfilter.stream.pipeline import sample_pipeline
    cfg = StageConfig(caption_key="txt", image_key="jpg;png;webp")
    return sum(1 for _ in sample_pipeline(urls, cfg))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        urls = make_shards(folder, args.shards, args.copies)
        mb = sum(os.path.getsize(u) for u in urls) / 1e6
        best = {"webdataset": float("inf"), "wdsfilter": float("inf")}
        counts = {}
        run_webdataset(urls[:1])  # warm imports and page cache for both
        run_wdsfilter(urls[:1])
        for _ in range(args.runs):
            for name, fn in (("webdataset", run_webdataset), ("wdsfilter", run_wdsfilter)):
                t = time.perf_counter()
                counts[name] = fn(urls)
                best[name] = min(best[name], time.perf_counter() - t)
        if counts["webdataset"] != counts["wdsfilter"]:
            sys.exit(f"sample counts differ: {counts}")
        n = counts["wdsfilter"]
        for name in best:
            print(f"{name:>10}: {n} samples, {mb:.1f} MB in {best[name]:.3f}s "
                  f"= {n / best[name]:.0f} samples/s (best of {args.runs})")
        ratio = best["wdsfilter"] / best["webdataset"]
        print(f"ratio wdsfilter/webdataset time: {ratio:.3f}x (goal <= 1.05x)")


if __name__ == "__main__":
    main()
