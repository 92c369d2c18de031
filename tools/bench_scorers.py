"""Cost of each scorer per 1,000 samples on this machine's CPU: the numbers of docs/scorers.md.

    python tools/bench_scorers.py [--copies 4] [--runs 3] [--threads 2] [--only caption,size,...]

One process, on the committed sample shards (images of 128-320 px, 2-second clips) replicated
`--copies` times: for each scorer, prepare() on every sample (what its decode workers do) and
score_batch() in batches of 32 frames (what its model worker does), timed apart, best of --runs.
The image decode itself (the decode stage, shared by every scorer that reads pixels; caption and
size need none) is a row of its own, as is the CLIP model the aesthetic head rides on (ViT-B-32,
random weights: a real CLIP's cost without a download). Videos: 3 frames per clip. OCR: rapidocr
on the OCR sample images (320x240 PNGs with text) and the clips.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.benchkit import replicate, sample_members  # noqa: E402

BATCH = 32


def samples(urls, decode: bool, image_key: str) -> list:
    from wdsfilter import StageConfig
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.core.tally import Tally
    stage = StageConfig(caption_key="txt;json:description", image_key=image_key, decode_pixels=decode,
                        keep_image_bytes=decode)  # the hash scorer's sha256 is of the bytes
    return [s for s in sample_pipeline(urls, stage, Tally()) if "__marker__" not in s]


def timed(fn, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cost(scorer, items, runs: int):
    """(prepare seconds, score seconds) for `items`, best of `runs` each."""
    prepared = [scorer.prepare(s) for s in items]
    prepared = [getattr(p, "input", p) for p in prepared]  # a Noted input scores as its input
    prep = timed(lambda: [scorer.prepare(s) for s in items], runs)
    frames = max(1, round(sum(scorer.frame_count(p) for p in prepared) / len(prepared)))
    step = max(1, BATCH // frames)
    score = timed(lambda: [scorer.score_batch(prepared[i:i + step]) for i in range(0, len(prepared), step)], runs)
    return prep, score


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    ap.add_argument("--only", default=None, help="these rows only, e.g. caption,size (default: all)")
    args = ap.parse_args(argv)

    import tempfile

    import torch
    torch.set_num_threads(args.threads)
    from wdsfilter.media.images import decode_image
    from wdsfilter.score.scorers.aesthetic import AestheticScorer
    from wdsfilter.score.scorers.blur import BlurScorer
    from wdsfilter.score.scorers.caption import CaptionScorer
    from wdsfilter.score.scorers.nsfw import NsfwScorer
    from wdsfilter.score.scorers.size import SizeScorer

    tmp = tempfile.mkdtemp(prefix="bench-scorers-")
    images = replicate(os.path.join(tmp, "i"), sample_members(["images-*.tar", "json-captions-*.tar"]), 1, args.copies)
    videos = replicate(os.path.join(tmp, "v"), sample_members(["videos-*.tar"]), 1, args.copies)
    raw = samples(images, False, "jpg;png;jpeg;webp")
    decoded = samples(images, True, "jpg;png;jpeg;webp")
    clips = samples(videos, True, "mp4")
    load = os.getloadavg()[0]
    print(f"bench_scorers: {len(decoded)} images, {len(clips)} clips (3 frames), {args.threads} thread(s), "
          f"best of {args.runs}, load average {load:.1f}; seconds per 1,000 samples (prepare + score_batch)")
    results = {}

    def wanted(name):
        return args.only is None or name in args.only.split(",")

    def row(name, media, prep, score, n):
        per = 1000.0 / n
        results[f"{name} {media}"] = {"prepare": prep * per, "score": score * per}
        print(f"  {name:10s} {media:7s} {prep * per:9.3f} + {score * per:9.3f} = {(prep + score) * per:9.3f} s")

    data = [s["image"] for s in raw]
    if wanted("decode"):
        row("decode", "images", timed(lambda: [decode_image(d, 64_000_000) for d in data], args.runs), 0.0, len(data))
    if wanted("caption"):
        row("caption", "images", *cost(CaptionScorer(), raw, args.runs), len(raw))
    if wanted("size"):
        row("size", "images", *cost(SizeScorer(), raw, args.runs), len(raw))
        row("size", "videos", *cost(SizeScorer(), clips, args.runs), len(clips))
    if wanted("blur"):
        row("blur", "images", *cost(BlurScorer(), decoded, args.runs), len(decoded))
        row("blur", "videos", *cost(BlurScorer(), clips, args.runs), len(clips))
    if wanted("nsfw"):
        nsfw = NsfwScorer()
        nsfw.load("cpu")
        nsfw.set_threads(args.threads)
        row("nsfw", "images", *cost(nsfw, decoded, args.runs), len(decoded))
        row("nsfw", "videos", *cost(nsfw, clips, args.runs), len(clips))
    if wanted("hash"):
        from wdsfilter.score.scorers.hash import HashScorer  # the [dedup] extra
        row("hash", "images", *cost(HashScorer(), decoded, args.runs), len(decoded))
    if wanted("ocr"):
        from wdsfilter.score.scorers.ocr import OcrScorer
        ocr = OcrScorer()
        ocr.load("cpu")
        ocr.set_threads(args.threads)
        text = samples(replicate(os.path.join(tmp, "o"), sample_members(["ocr-images-*.tar"]), 1, args.copies), True,
                       "png")
        row("ocr", "images", *cost(ocr, text, args.runs), len(text))
        row("ocr", "videos", *cost(ocr, clips, args.runs), len(clips))
    if wanted("aesthetic"):
        aesthetic = AestheticScorer("vit_b_32")
        aesthetic.resolved = "vit_b_32"
        aesthetic.load("cpu")
        embeddings = [torch.nn.functional.normalize(torch.randn(1, 512), dim=-1) for _ in decoded]
        head = timed(lambda: [aesthetic.score_batch(embeddings[i:i + BATCH])
                              for i in range(0, len(embeddings), BATCH)], args.runs)
        row("aesthetic", "images", 0.0, head, len(embeddings))
    if wanted("clip"):
        from wdsfilter.score.scorers.clip import ClipScorer
        clip = ClipScorer("ViT-B-32", "random")
        clip.load("cpu")
        row("clip B-32", "images", *cost(clip, decoded[:96], 1), min(96, len(decoded)))
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
