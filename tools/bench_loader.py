"""Benchmark: `wdsfilter.loader` against OpenCLIP's training pipeline (open_clip_train.data's
get_wds_dataset), one epoch each over the same shards with the same model transform and tokenizer.

Shards are the committed sample_shards/images-*.tar replicated under fresh keys, with a sizes.json
beside them (both loaders size their epoch from the sample count). Both sides use open_clip's
training transform for ViT-B-32 (`open_clip.image_transform(224, is_train=True)`: a random resized
crop, so wdsfilter's per-sample seeding is in the timing) and its tokenizer, a shuffle buffer of
5000 (initial 1000, open_clip's sizes) and batches of --batch-size. Each run is a fresh child process
that imports torch, open_clip, webdataset and wdsfilter first (not timed), then builds the loader
and iterates one epoch: samples/s over the epoch from the build, and the seconds to the first batch.
Runs alternate between the sides, in both modes (DataLoader workers and --workers 0); medians.

    python tools/bench_loader.py [--shards 8] [--copies 16] [--workers 2] [--runs 3]
    python tools/bench_loader.py --before /path/to/older/checkout   # that wdsfilter beside, same runs

Goal (issue 36): ratio wdsfilter / open_clip samples/s = R >= 1.05 with workers and with 0 workers,
and a first batch no later than open_clip's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SHUFFLE = 5000  # open_clip_train.data._SAMPLE_SHUFFLE_SIZE (its initial, 1000, is wdsfilter's too)


def make_shards(folder: str, shards: int, copies: int) -> int:
    from tools.benchkit import replicate, sample_members
    urls = replicate(folder, sample_members(["images-*.tar"]), shards, copies)
    per_shard = len(sample_members(["images-*.tar"])) // 3 * copies  # jpg|png|webp + txt + json per sample
    with open(os.path.join(folder, "sizes.json"), "w") as f:
        json.dump({os.path.basename(u): per_shard for u in urls}, f)
    return per_shard * len(urls)


def _open_clip_loader(urls, samples, transform, tokenizer, batch_size, workers):
    import functools

    import open_clip_train.data
    import webdataset as wds
    # open_clip_train 3.3's grouping fails on webdataset 1.x's end-of-shard marker ({}: KeyError 'fname',
    # webdataset issue 384); upstream open_clip's fix passes eof_value=None, as here.
    open_clip_train.data.tar_file_expander = functools.partial(wds.tariterators.tar_file_expander, eof_value=None)
    from open_clip_train.data import get_wds_dataset
    args = SimpleNamespace(train_data="::".join(urls), val_data=None, dataset_resampled=False,
                           train_num_samples=samples, train_data_upsampling_factors=None, seed=0,
                           batch_size=batch_size, world_size=1, workers=workers)
    return get_wds_dataset(args, transform, is_train=True, tokenizer=tokenizer).dataloader


def _wdsfilter_loader(urls, samples, transform, tokenizer, batch_size, workers, **options):
    import wdsfilter
    return wdsfilter.loader(urls, caption_key="txt", image_key="jpg;png;webp", transform=transform,
                            tokenizer=tokenizer, batch_size=batch_size, num_workers=workers, shuffle=SHUFFLE,
                            epoch_samples=samples, **options)


def _before_loader(*args):
    # Checkouts before issue 36 took the shuffle buffer's fill (1000 samples) for starvation (500).
    return _wdsfilter_loader(*args, starvation_samples=SHUFFLE)


def run_child(side: str, folder: str, samples: int, batch_size: int, workers: int) -> dict:
    """One epoch in this (fresh) process; imports first, untimed."""
    import open_clip
    import torch  # noqa: F401
    import webdataset  # noqa: F401
    import wdsfilter.dataloader  # noqa: F401
    import open_clip_train.data  # noqa: F401
    urls = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".tar"))
    transform = open_clip.image_transform(224, is_train=True)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    build = {"open_clip": _open_clip_loader, "wdsfilter": _wdsfilter_loader, "before": _before_loader}[side]
    start = time.perf_counter()
    loader = build(urls, samples, transform, tokenizer, batch_size, workers)
    first = None
    given = 0
    for images, texts in loader:
        if first is None:
            first = time.perf_counter() - start
        given += len(images)
        assert images.shape[1:] == (3, 224, 224) and texts.shape[1:] == (77,)
    seconds = time.perf_counter() - start
    return {"samples": given, "seconds": seconds, "first": first, "rate": given / seconds}


def child(side: str, folder: str, samples: int, batch_size: int, workers: int, root: str) -> dict:
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, __file__, "--child", side, folder, str(samples), str(batch_size),
                          str(workers)], env=env, cwd=root, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and its DataLoader workers
    if out.returncode:
        raise SystemExit(f"{side} (workers {workers}, {root}) failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # imports included
    return got


def _median(runs: list, field: str) -> float:
    return statistics.median(r[field] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--copies", type=int, default=16, help="copies of the sample shards' 96 samples per shard")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the first mode (the second: 0)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", default=None, help="an older wdsfilter checkout, timed beside this one in the same runs")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        side, folder, samples, batch, workers = args.child
        print(json.dumps(run_child(side, folder, int(samples), int(batch), int(workers))))
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        samples = make_shards(folder, args.shards, args.copies)
        sides = [("open_clip", ROOT), ("wdsfilter", ROOT)] + ([("before", args.before)] if args.before else [])
        for workers in (args.workers, 0):
            runs: dict = {name: [] for name, _ in sides}
            for _ in range(args.runs):
                for name, root in sides:
                    runs[name].append(child(name, folder, samples, args.batch_size, workers, root))
            print(f"workers {workers}: {samples} samples in {args.shards} shards, batch {args.batch_size}, "
                  f"medians of {args.runs} alternating runs")
            for name, got in runs.items():
                rates = ", ".join(f"{r['rate']:.0f}" for r in got)
                print(f"  {name:9}: {_median(got, 'rate'):.0f} samples/s ({rates}), first batch "
                      f"{_median(got, 'first'):.3f} s, CPU {_median(got, 'cpu'):.1f} s, {got[0]['samples']} samples given")
            r = _median(runs["wdsfilter"], "rate") / _median(runs["open_clip"], "rate")
            first = _median(runs["wdsfilter"], "first") / _median(runs["open_clip"], "first")
            print(f"workers {workers}: ratio wdsfilter / open_clip samples/s = {r:.2f} (goal >= 1.05)")
            cpu = _median(runs["open_clip"], "cpu") / _median(runs["wdsfilter"], "cpu")
            print(f"workers {workers}: ratio open_clip / wdsfilter CPU seconds = {cpu:.2f} (the same imports on "
                  f"both sides; under load a steadier figure than samples/s)")
            print(f"workers {workers}: ratio wdsfilter / open_clip first-batch seconds = {first:.2f} (goal <= 1.0)")
            if args.before:
                b = _median(runs["before"], "rate") / _median(runs["open_clip"], "rate")
                print(f"workers {workers}: ratio before / open_clip samples/s = {b:.2f}")
            sys.stdout.flush()
        print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
