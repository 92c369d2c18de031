"""Benchmark: how many decode cores can one dispatcher (the scoring run's main process) feed?

    python tools/bench_dispatch.py [--quick] [--kind all|clip|ocr] [--shards 4] [--per-shard 256]
                                   [--batch-size 256] [--workers 1] [--json out.json]
    python tools/bench_dispatch.py --quick   # 2 x 128 CLIP and 2 x 8 OCR samples, one run

It runs the real local engine (engines/local.LocalEngine: DataLoader decode workers, Dispatcher, a
ProcessPool with one model worker process) with a no-op model: scorers that prepare exactly as the real ones
do (their prepare() is the real CLIP and OCR prepare) and whose score_batch returns zeros, so the
model side costs nothing and what is left is moving samples. Inputs:

  clip   768-1024 px JPEGs (tools/bench_decode.py's photos) with a caption each; prepared to a
         3x224x224 uint8 image and 77 token ids (ViT-B-32's transform and tokenizer, no weights)
  ocr    1280x720 H.264 videos, 3 frames sampled from each: a (3, 720, 1280, 3) uint8 array

Two numbers per kind, both in CPU time of one process (time.process_time, so other load on the
machine and waiting for the other side count as little as possible):

  dispatcher   samples per CPU second of the main process in the engine's scoring loop, from the
               first chunk the DataLoader hands over to the last row (the first chunk's samples
               are not counted): receiving chunks, rows, batching, sending batches to the model
               workers, completing rows, writing the score files. Every thread of the main
               process counts (queue feeder threads, the file-descriptor sharer). The score
               file's imports (pyarrow) are done before, as a long run pays them once.
  decode       samples per CPU second of one decode worker on the same shards: the same pipeline
               (read, decode, the scorer's prepare, Chunk) in one process with one torch thread,
               as a DataLoader worker runs it

and the ratio dispatcher / decode: how many decode cores one dispatcher keeps busy. The last line
is `ratio dispatcher / decode per core = R` with the lowest ratio of the kinds run (goal >= 64:
a 2-socket, 8-GPU host).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from wdsfilter.score.scorers.clip import ClipScorer  # noqa: E402
from wdsfilter.score.scorers.ocr import OcrScorer  # noqa: E402

WORDS = ("a photo of the small red house next to an old tree on a quiet street in the early morning light with "
         "two people walking a dog past a parked blue car while birds sit on the roof").split()


class NoopClip(ClipScorer):
    """CLIP's prepare (real decode, transform, tokenizer); a model that returns zeros."""

    def fetch(self) -> None:
        pass

    def load(self, device: str) -> None:
        self.device = device

    def unload(self) -> None:
        pass

    def score_batch(self, inputs) -> List[dict]:
        return [{"clip_score": 0.0, "clip_score_frames": [0.0], "clip_frames": 1,
                 "clip_truncated": bool(x["truncated"])} for x in inputs]


class NoopOcr(OcrScorer):
    """OCR's prepare (real video decode of the sampled frames); a detector that finds nothing."""

    def fetch(self) -> None:
        pass

    def load(self, device: str) -> None:
        pass

    def unload(self) -> None:
        pass

    def score_batch(self, inputs) -> List[dict]:
        return [self._row([0.0] * len(x.frames)) for x in inputs]


# -- inputs ------------------------------------------------------------------------------------
def _write(url: str, members) -> str:
    os.makedirs(os.path.dirname(url), exist_ok=True)
    with tarfile.open(url, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return url


def clip_shards(folder: str, shards: int, per_shard: int, distinct: int = 16) -> List[str]:
    from tools.bench_decode import make_jpegs
    jpegs = make_jpegs(distinct)
    urls = []
    for s in range(shards):
        members = []
        for i in range(per_shard):
            n = s * per_shard + i
            caption = " ".join(WORDS[(n + k) % len(WORDS)] for k in range(12 + n % 40))
            members += [(f"s{s}i{i:06d}.jpg", jpegs[n % distinct]), (f"s{s}i{i:06d}.txt", caption.encode())]
        urls.append(_write(os.path.join(folder, f"clip-{s:06d}.tar"), members))
    return urls


def make_video(width: int = 1280, height: int = 720, frames: int = 24, fps: int = 8, seed: int = 0) -> bytes:
    """An H.264 mp4 of moving gradients and noise (so frames are not trivially small)."""
    import av
    import numpy as np
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "28", "preset": "ultrafast"}
        y, x = np.mgrid[0:height, 0:width]
        for f in range(frames):
            img = np.stack([(x + 8 * f) % 256, (y + 4 * f) % 256, (x + y) // 8 % 256], axis=-1).astype(np.uint8)
            img[::16, ::16] = rng.integers(0, 256, img[::16, ::16].shape, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def ocr_shards(folder: str, shards: int, per_shard: int, distinct: int = 2) -> List[str]:
    videos = [make_video(seed=i) for i in range(distinct)]
    urls = []
    for s in range(shards):
        members = []
        for i in range(per_shard):
            n = s * per_shard + i
            members += [(f"s{s}v{i:06d}.mp4", videos[n % distinct]), (f"s{s}v{i:06d}.txt", b"a video")]
        urls.append(_write(os.path.join(folder, f"ocr-{s:06d}.tar"), members))
    return urls


KINDS = {
    "clip": (lambda stage: NoopClip("ViT-B-32", "random", config=stage), {"caption_key": "txt"}, clip_shards),
    "ocr": (lambda stage: NoopOcr(frames=3, config=stage), {"caption_key": "txt", "image_key": "mp4"}, ocr_shards),
}


# -- the two measurements ------------------------------------------------------------------------
def _items_in(chunk) -> int:
    data = getattr(chunk, "data", chunk)
    return sum(1 for item in data if "inputs" in item) if isinstance(data, list) else 0


class _TimedLoader:
    """The engine's DataLoader, with the main process's CPU time taken at the first chunk."""

    def __init__(self, loader):
        self.loader, self.start, self.first = loader, None, 0

    def __iter__(self):
        for chunk in self.loader:
            if self.start is None:
                self.start, self.first = time.process_time(), _items_in(chunk)
            yield chunk


def _warm(folder: str, scorer) -> None:
    """Write one score file first: its imports (pyarrow) are paid once per run, not per sample."""
    from wdsfilter.runfolder.tables import write_table
    row = {"key": "k", "shard": "s", "index": 0, "status": "scored", "reason": None, "message": None, "kept": True}
    row.update({c: [0.0] if c.endswith("_frames") else 0.0 for c in scorer.columns()})
    write_table([row], scorer.columns(), os.path.join(folder, "warm.parquet"), "parquet")


def dispatcher_rate(urls, scorer, stage, out: str, batch_size: int, workers: int) -> dict:
    from wdsfilter.score.engines import local as engine_module
    from wdsfilter.score.config import ScoreConfig
    from wdsfilter.score.engines.local import LocalEngine
    from wdsfilter.score.modelworker import ProcessPool

    class TimedEngine(LocalEngine):
        def _loader(self, plan, todo, sink, *args, **kwargs):
            self.timed = _TimedLoader(super()._loader(plan, todo, sink, *args, **kwargs))
            return self.timed

        def _score(self, pool, plan, todo, *args, **kwargs):
            dispatcher, tally = super()._score(pool, plan, todo, *args, **kwargs)
            self.cpu = time.process_time() - self.timed.start
            self.rows = dispatcher.rows_done - self.timed.first
            self.wall = dispatcher.seconds
            return dispatcher, tally

    _warm(os.path.dirname(out), scorer)
    cfg = ScoreConfig(out=out, scorers=(scorer,), devices=("cpu",), batch_size=batch_size, workers=workers,
                      prefetch=2, progress=False, probe_samples=2, probe_scan=8, stage=stage)
    engine = TimedEngine(urls, cfg)
    # One model worker process (a lone "cpu" device would score in the main process: LocalPool).
    make_pool, engine_module.make_pool = engine_module.make_pool, lambda devices, scorers, **_: ProcessPool(devices, scorers)
    try:
        summary = engine.execute()
    finally:
        engine_module.make_pool = make_pool
    if summary.shards_failed:
        raise SystemExit(f"bench run failed: {summary.shards_failed}")
    return {"rows": engine.rows, "cpu": engine.cpu, "per_s": engine.rows / max(engine.cpu, 1e-9),
            "wall_per_s": summary.samples_this_run / max(engine.wall, 1e-9),
            "us_per_sample": 1e6 * engine.cpu / max(engine.rows, 1)}


def decode_rate(urls, scorer, stage_cfg, chunk: int) -> dict:
    import torch
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.transport import Chunk, Prepare
    from wdsfilter.core.tally import Tally
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        pipeline = sample_pipeline(list(urls), stage_cfg, Tally(), extra=[Prepare([scorer])])
        pipeline.append(Chunk(chunk))
        start = time.process_time()
        n = sum(_items_in(c) for c in pipeline)
        cpu = time.process_time() - start
    finally:
        torch.set_num_threads(threads)
    return {"rows": n, "cpu": cpu, "per_s": n / max(cpu, 1e-9), "us_per_sample": 1e6 * cpu / max(n, 1)}


# -- main ----------------------------------------------------------------------------------------------
def run_kind(kind: str, args, folder: str) -> dict:
    from wdsfilter.stream.config import StageConfig
    make_scorer, options, make_shards = KINDS[kind]
    stage = StageConfig(**options)
    scorer = make_scorer(stage)
    per_shard = args.per_shard if kind == "clip" else args.ocr_per_shard
    urls = make_shards(os.path.join(folder, kind), args.shards, per_shard)
    from wdsfilter.score.config import ScoreConfig
    stage_cfg = ScoreConfig(out=os.path.join(folder, f"cfg-{kind}"), scorers=(scorer,),
                            stage=stage).scoring_stage_config([scorer])  # as the engine's decode workers
    decode = decode_rate(urls, scorer, stage_cfg, min(args.batch_size, 64))
    best = None
    for r in range(args.runs):
        out = os.path.join(folder, f"out-{kind}-{r}")
        d = dispatcher_rate(urls, scorer, stage, out, args.batch_size, args.workers)
        shutil.rmtree(out, ignore_errors=True)
        if best is None or d["per_s"] > best["per_s"]:
            best = d
    ratio = best["per_s"] / decode["per_s"]
    print(f"{kind}: {len(urls)} shards x {per_shard} samples, batch {args.batch_size}, {args.workers} decode "
          f"worker(s), 1 model worker process (no-op)")
    print(f"  dispatcher  {best['per_s']:10.0f} samples/s per core ({best['us_per_sample']:.1f} us of main-process "
          f"CPU per sample over {best['rows']} samples; {best['wall_per_s']:.0f} samples/s wall)")
    print(f"  decode      {decode['per_s']:10.0f} samples/s per core ({decode['us_per_sample']:.0f} us per sample)")
    print(f"  {kind} ratio dispatcher / decode per core = {ratio:.1f}")
    return {"dispatcher": best, "decode": decode, "ratio": ratio}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small inputs, one run: well under a minute")
    p.add_argument("--kind", choices=["all", *KINDS], default="all")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--per-shard", type=int, default=512, help="CLIP samples per shard")
    p.add_argument("--ocr-per-shard", type=int, default=48, help="OCR (video) samples per shard")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=1, help="decode workers of the engine run")
    p.add_argument("--runs", type=int, default=2, help="engine runs per kind; the best is kept")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.per_shard, args.ocr_per_shard, args.runs = 2, 128, 8, 1
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    folder = tempfile.mkdtemp(prefix="bench-dispatch-")
    try:
        results = {kind: run_kind(kind, args, folder) for kind in kinds}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratio = min(r["ratio"] for r in results.values())
    out = {"kinds": results, "ratio": ratio}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"ratio dispatcher / decode per core = {ratio:.1f}")
    return out


if __name__ == "__main__":
    main()
