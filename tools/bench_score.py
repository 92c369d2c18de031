"""Benchmark: is the scoring engine as fast as the slower of its two halves, and where does OCR
spend its time?

    python tools/bench_score.py [--scorer all|clip|ocr] [--model local-dir:models/tiny-clip] [--device cpu]
                                [--shards 4] [--copies 4] [--batch-size auto] [--workers auto] [--runs 2]
                                [--ocr-backend rapidocr] [--frames 3] [--ocr-copies 4] [--json out.json]
                                [--ocr-min-side 736] [--ocr-min-text-score 0.5|none]
    python tools/bench_score.py --quick      # 2 shards x 1 copy, 1 run: under a minute on 2 cores
    python tools/bench_score.py --scorer tmars [--shards 2 --copies 2]   # tmars / (clip+ocr) time
    python tools/bench_score.py --scorer columns [--quick]   # (clip+caption+size+aesthetic) / clip time

For each scorer (clip; ocr on the OCR images and the videos together), in one run, on the same
shards (sample_shards/ replicated with fresh keys), the same model and the same batch size, it
measures side by side:

  decode only   the engine's decode side alone: the DataLoader with the planned workers and
                prefetch running read + decode + the scorer's prepare(), no model
  model only    score_batch() on pre-decoded, pre-prepared inputs held in memory, as many samples
                per call as the engine's (the plan's scorer batch is in frames: a k-frame video
                counts k), with the planned model threads (CPU) on the same device
  end to end    wdsfilter.score.score() on the shards: its scoring loop (decode workers and model
                concurrently; the wall time with start-up, model load and probe is printed too)

and prints the ratio of end to end to the lower of the other two (goal >= 0.8). The plan (batch
size, workers, threads) comes from a dry run of the engine first, so all three use the same one.
Runs alternate and the best of --runs is kept for each.

For CLIP it also runs a plain clip-retrieval-style loop on the same shards, model, batch size,
decode workers and model threads: webdataset's WebLoader with open_clip's preprocess and
tokenizer in the workers, then encode_image / encode_text, normalise, dot; timed from model
creation to the last score, like wdsfilter's wall time (start-up, model load and probe included),
and prints `ratio wdsfilter / plain loop = R` (goal >= 1.0).

For OCR it then prints, for images and for video separately, frames/s and the share of time spent
in video decode, in detection and in post-processing: tools/bench_ocr.py's measurement (one
process, prepare() then score_batch(), so the shares add up), called with --ocr-copies.

Scorers are entries of BENCH_SCORERS: a function returning the scorer, the stage options and the
source shards; add one there to benchmark another scorer.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.bench_ocr import min_text_score, text_score_option  # noqa: E402
from tools.benchkit import replicate, sample_members  # noqa: E402

def _clip(args):
    from wdsfilter.score.scorers.clip import ClipScorer
    model = args.model
    if model is None:
        folder = os.path.join(ROOT, "models", "tiny-clip")
        if not os.path.isfile(os.path.join(folder, "open_clip_model.safetensors")):
            print(f"building the tiny CLIP model into {folder} (tools/make_tiny_clip.py, about a minute)")
            from tools import make_tiny_clip
            make_tiny_clip.build(folder, make_tiny_clip.find_shards(make_tiny_clip.DEFAULT_SHARDS), quiet=True)
        model = "local-dir:" + folder
    return (lambda: ClipScorer(model, args.pretrained)), {"caption_key": "txt;json:description"}, \
        ["images-*.tar", "json-captions-*.tar"]


def _ocr(args):
    from wdsfilter.score.scorers.ocr import OcrScorer
    options = {} if args.ocr_min_side is None else {"min_side": args.ocr_min_side}
    return (lambda: OcrScorer(backend=args.ocr_backend, frames=args.frames, backend_options=options,
                              **text_score_option(args.ocr_min_text_score))), \
        {"caption_key": "txt", "image_key": "png;mp4"}, ["ocr-images-*.tar", "videos-*.tar"]


BENCH_SCORERS = {"clip": _clip, "ocr": _ocr}
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "retina", "immunohistochemistry", "motorcycle")


def text_photo_shards(folder: str, shards: int, per_shard: int, share: float = 0.5) -> list:
    """Shards of scikit-image's photos (its wheel, no download) at 320x240 JPEG, a `share` of them
    with a caption-like text drawn on by PIL: what tmars masks."""
    import io

    import numpy as np
    import skimage.data
    import webdataset as wds
    from PIL import Image, ImageDraw, ImageFont
    os.makedirs(folder, exist_ok=True)
    urls, n = [], 0
    font = ImageFont.load_default(size=30)
    for s in range(shards):
        url = os.path.join(folder, f"photos-{s:06d}.tar")
        with wds.TarWriter(url) as writer:
            for _ in range(per_shard):
                name = PHOTOS[n % len(PHOTOS)]
                a = getattr(skimage.data, name if name != "motorcycle" else "stereo_motorcycle")()
                a = a[0] if isinstance(a, tuple) else a
                a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
                img = Image.fromarray(np.ascontiguousarray(a)).convert("RGB").resize((320, 240))
                if int((n + 1) * share) > int(n * share):  # a `share` of the photos, spread evenly
                    ImageDraw.Draw(img).text((20, 90 + 10 * (n % 5)), f"SALE {n % 90 + 10}% OFF", font=font,
                                             fill=(255, 255, 255), stroke_width=2, stroke_fill=(0, 0, 0))
                buf = io.BytesIO()
                img.save(buf, "JPEG", quality=90)
                writer.write({"__key__": f"p{n:06d}", "jpg": buf.getvalue(), "txt": f"a photo of a {name}"})
                n += 1
        urls.append(url)
    return urls


def tmars_cost(args) -> dict:
    """--scorer tmars: the extra cost of tmars over clip+ocr, on the same shards, model and device,
    measured side by side (runs alternate, best of --runs): the model side alone (ModelRunner.score
    on the same prepared samples, with and without tmars: where tmars adds work) and end to end
    (score() with --scorer ocr --scorer clip, then --scorer tmars). Goal: <= 1.3 when half the
    images hold text."""
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score import build_config, score
    from wdsfilter.score.modelrunner import ModelRunner
    from wdsfilter.score.scorerset import resolve_scorers
    from wdsfilter.score.transport import Prepare
    from wdsfilter.core.tally import Tally
    model = _clip(args)[0]().model
    tmp = tempfile.mkdtemp(prefix="bench-tmars-")
    try:
        urls = text_photo_shards(os.path.join(tmp, "shards"), args.shards, 4 * args.copies)
        common = dict(model=model, pretrained=args.pretrained, device=args.device, batch_size=args.batch_size,
                      workers=args.workers, progress=False, caption_key="txt", ocr_backend=args.ocr_backend)
        cfg = build_config(os.path.join(tmp, "model-only"), ("tmars",), **common)
        scorers = resolve_scorers(cfg)
        stage = cfg.scoring_stage_config(scorers)
        items = [(i, x["inputs"]) for i, x in enumerate(sample_pipeline(urls, stage, Tally(), extra=[Prepare(scorers)]))
                 if "inputs" in x and len(x["inputs"]) == 3]
        runners = {"clip+ocr": ModelRunner(scorers[:2], args.device), "tmars": ModelRunner(scorers, args.device)}
        batch = 8 if args.batch_size == "auto" else int(args.batch_size)
        for runner in runners.values():
            runner.load()
            runner.configure(batch)
        texts = sum(1 for _, s, _ in runners["tmars"].score(items) if s.get("masked_share"))
        best = {}
        for run in range(args.runs):
            for label, scorer_names in (("clip+ocr", ("ocr", "clip")), ("tmars", ("tmars",))):
                t = time.perf_counter()
                for i in range(0, len(items), batch):
                    runners[label].score(items[i:i + batch])
                best[f"model {label}"] = min(best.get(f"model {label}", float("inf")), time.perf_counter() - t)
                summary = score(urls, out=os.path.join(tmp, f"{label}-{run}"), scorers=scorer_names, **common)
                best[f"e2e {label}"] = min(best.get(f"e2e {label}", float("inf")), summary.scoring_seconds)
        ratios = {k: best[f"{k} tmars"] / best[f"{k} clip+ocr"] for k in ("model", "e2e")}
        print(f"bench_score: tmars over clip+ocr, {len(items)} photos ({texts} with text masked), device "
              f"{args.device}, best of {args.runs}")
        for k, what in (("model", "model side (ModelRunner.score, batch %d)" % batch), ("e2e", "end to end (score())")):
            print(f"  {what}: clip+ocr {best[k + ' clip+ocr']:.2f} s, tmars {best[k + ' tmars']:.2f} s, "
                  f"ratio tmars / clip+ocr = {ratios[k]:.3f} (goal <= 1.3)")
        return {"samples": len(items), "with_text": texts, "seconds": best, "ratios": ratios}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --scorer columns: the columns people filter by besides CLIP (docs/scorers.md), in the same pass.
COLUMN_SCORERS = ("clip", "caption", "size", "aesthetic")


def columns_cost(args) -> dict:
    """--scorer columns: the wall time of `--scorer clip --scorer caption --scorer size --scorer
    aesthetic` over `--scorer clip` alone, on the same shards, model and device, side by side (runs
    alternate, best of --runs). Goal: <= 1.15; and clip+caption over clip: <= 1.05. The model: --model/--pretrained, by default
    ViT-B-32 with random weights (a real CLIP's size and cost, no download), whose embedding the
    ViT-B-32 aesthetic head reads (named: its weights are not OpenAI's)."""
    from wdsfilter.score import score
    model, pretrained = args.model or "ViT-B-32", args.pretrained or ("random" if args.model is None else None)
    head = args.aesthetic_head or ("vit_b_32" if args.model is None else "auto")
    tmp = tempfile.mkdtemp(prefix="bench-columns-")
    load = os.getloadavg()
    try:
        urls = make_shards(os.path.join(tmp, "shards"), ["images-*.tar", "json-captions-*.tar"], args.shards,
                           args.copies)
        common = dict(model=model, pretrained=pretrained, device=args.device, batch_size=args.batch_size,
                      workers=args.workers, progress=False, caption_key="txt;json:description")
        runs = {"clip": (("clip",), {}), "caption": (("clip", "caption"), {}),
                "columns": (COLUMN_SCORERS, {"aesthetic": {"head": head}})}
        best, loop, rows = {}, {}, 0
        for run in range(args.runs):
            for label, (names, options) in runs.items():
                start = time.perf_counter()
                summary = score(urls, out=os.path.join(tmp, f"{label}-{run}"), scorers=names,
                                scorer_options=options, **common)
                best[label] = min(best.get(label, float("inf")), time.perf_counter() - start)
                loop[label] = min(loop.get(label, float("inf")), summary.scoring_seconds)
                rows = summary.rows
        ratio, loop_ratio = best["columns"] / best["clip"], loop["columns"] / loop["clip"]
        caption = best["caption"] / best["clip"]
        print(f"bench_score: clip+caption+size+aesthetic over clip alone, {rows} samples in {len(urls)} shards, "
              f"model {model} ({pretrained or 'its weights'}), device {args.device}, best of {args.runs}; "
              f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
        print(f"  wall: clip {best['clip']:.2f} s, clip+caption {best['caption']:.2f} s, "
              f"clip+caption+size+aesthetic {best['columns']:.2f} s")
        print(f"  scoring loop: clip {loop['clip']:.2f} s, clip+caption {loop['caption']:.2f} s, "
              f"clip+caption+size+aesthetic {loop['columns']:.2f} s (ratio {loop_ratio:.3f})")
        print(f"  ratio clip+caption / clip wall time = {caption:.3f} (goal <= 1.05)")
        print(f"  ratio clip+caption+size+aesthetic / clip wall time = {ratio:.3f} (goal <= 1.15)")
        return {"samples": rows, "seconds": best, "scoring_seconds": loop, "ratio": ratio, "loop_ratio": loop_ratio,
                "caption_ratio": caption, "load": [load[0], os.getloadavg()[0]]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_shards(folder: str, patterns, shards: int, copies: int) -> list:
    """Replicate the members of the matching sample shards `copies` times per output shard, with
    fresh keys (the same replication as tools/bench_stages.py)."""
    return replicate(folder, sample_members(patterns), shards, copies)


def decode_only(urls, stage, factory, plan, timed_from_first=False):
    """The engine's decode side alone (same stages, workers, prefetch, chunks): samples prepared.
    timed_from_first: (samples after the first chunk, seconds since it came), so the workers'
    start-up is left out as the engine's scoring_seconds leave it out."""
    import torch.utils.data
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.transport import Chunk, Prepare, keep_as_is, unpack
    from wdsfilter.core.tally import Tally
    pipeline = sample_pipeline(urls, stage, Tally(), extra=[Prepare([factory()])])
    pipeline.append(Chunk(plan["chunk"]))
    workers = plan["workers"]
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers, collate_fn=keep_as_is,
                                         prefetch_factor=plan["prefetch"] if workers else None)
    counts = []
    start = None
    for chunk in loader:
        if start is None:
            start = time.perf_counter()
        counts.append(sum(1 for item in unpack(chunk) if "inputs" in item and item["inputs"]))
    if not timed_from_first:
        return sum(counts)
    return sum(counts[1:]), time.perf_counter() - start if start is not None else 0.0


def prepared_inputs(urls, stage, factory, limit=None) -> list:
    """Prepared inputs of the samples of `urls` (the first `limit` only, if given)."""
    import itertools

    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.transport import Prepare
    from wdsfilter.core.tally import Tally
    scorer = factory()
    items = sample_pipeline(urls, stage, Tally(), extra=[Prepare([scorer])])
    prepared = (item["inputs"][scorer.name] for item in items if "inputs" in item and scorer.name in item["inputs"])
    return list(itertools.islice(prepared, limit))


def model_only(scorer, inputs, batch: int) -> int:
    for i in range(0, len(inputs), batch):
        scorer.score_batch(inputs[i:i + batch])
    return len(inputs)


def plain_loop(urls, model_spec: str, pretrained, batch: int, workers: int, device: str) -> int:
    """A clip-retrieval-style scoring loop (no wdsfilter code): samples scored."""
    import open_clip
    import torch
    import torch.nn.functional as F
    import webdataset as wds
    model, _, preprocess = open_clip.create_model_and_transforms(model_spec, pretrained=pretrained, device=device)
    model.eval()
    tokenizer = open_clip.get_tokenizer(model_spec)
    dataset = (wds.WebDataset(urls, shardshuffle=False, empty_check=False, handler=wds.ignore_and_continue)
               .decode("pil", handler=wds.ignore_and_continue)
               .map(_image_and_caption, handler=wds.ignore_and_continue)
               .map_tuple(preprocess, lambda text: tokenizer(text)[0]))
    loader = wds.WebLoader(dataset, batch_size=batch, num_workers=workers)
    n = 0
    with torch.no_grad():
        for images, tokens in loader:
            image = F.normalize(model.encode_image(images.to(device)), dim=-1)
            text = F.normalize(model.encode_text(tokens.to(device)), dim=-1)
            n += len((image * text).sum(-1).cpu().tolist())
    return n


def _image_and_caption(sample):
    """The bench shards' layout: jpg/png/webp image, caption in txt or json["description"]."""
    image = next(sample[k] for k in ("jpg", "jpeg", "png", "webp") if k in sample)
    caption = sample["txt"] if "txt" in sample else sample["json"]["description"]
    return image, caption


def frames_of(inputs) -> int:
    """Frames in prepared OCR inputs (None for scorers without frames)."""
    frames = [len(x.frames) for x in inputs if hasattr(x, "frames")]
    return sum(frames) if frames else None


def samples_per_call(plan: dict, name: str, frames_per_sample: float) -> int:
    """Samples per score_batch call in the engine: the plan's dispatched batch (samples), cut to the
    scorer's own sub-batch, which is in frames (a k-frame video counts k; one by one where the
    planner found that faster on the CPU). With images and videos mixed, by the average frames."""
    return min(min(d["batch_size"], max(1, int(d["scorer_batch"].get(name, d["batch_size"]) // frames_per_sample)))
               for d in plan["devices"])


def compare(args, name: str) -> dict:
    """decode only / model only / end to end for one scorer; prints and returns the rates."""
    import torch
    from wdsfilter import StageConfig
    from wdsfilter.score import score

    factory, stage_options, patterns = BENCH_SCORERS[name](args)
    stage = StageConfig(**stage_options)
    tmp = tempfile.mkdtemp(prefix="bench-score-")
    try:
        urls = make_shards(os.path.join(tmp, "shards"), patterns, args.shards, args.copies)
        common = dict(scorers=[factory()], stage=stage, device=args.device, batch_size=args.batch_size,
                      workers=args.workers, progress=False)
        dry = score(urls, out=os.path.join(tmp, "dry"), dry_run=True, **common)
        plan = dry.plan
        threads = plan["devices"][0]["threads"]
        device = plan["devices"][0]["device"]
        inputs = prepared_inputs(urls, stage, factory)
        frames = frames_of(inputs)
        batch = samples_per_call(plan, name, frames / len(inputs) if frames and inputs else 1.0)
        model = factory()
        model.load(device)
        if device == "cpu" and threads:
            torch.set_num_threads(threads)
        model_only(model, inputs[:batch], batch)  # warm-up
        best = {"decode": float("inf"), "model": float("inf"), "e2e": float("inf"), "wall": float("inf")}
        counts = {}
        for run in range(args.runs):
            t = time.perf_counter()
            counts["decode"] = decode_only(urls, stage, factory, plan)
            best["decode"] = min(best["decode"], time.perf_counter() - t)
            t = time.perf_counter()
            counts["model"] = model_only(model, inputs, batch)
            best["model"] = min(best["model"], time.perf_counter() - t)
            t = time.perf_counter()
            summary = score(urls, out=os.path.join(tmp, f"e2e-{run}"), **common)
            best["wall"] = min(best["wall"], time.perf_counter() - t)
            best["e2e"] = min(best["e2e"], summary.scoring_seconds)
            counts["e2e"] = summary.scored
            if name == "clip":
                source = model.source
                weights = {"tag": source.pretrained, "file": source.checkpoint}.get(source.weights)
                t = time.perf_counter()
                plain_n = plain_loop(urls, source.spec, weights, batch, plan["workers"], device)
                best["plain"] = min(best.get("plain", float("inf")), time.perf_counter() - t)
        model.unload()
        if len(set(counts.values())) != 1:
            sys.exit(f"sample counts differ: {counts}")
        n = counts["e2e"]
        rates = {k: n / v for k, v in best.items()}
        per_frame = (lambda k: f", {frames / best[k]:.1f} frames/s") if frames else (lambda k: "")
        print(f"bench_score: scorer {name} ({dry.scorers[0] if dry.scorers else ''})")
        print(f"  {n} samples{f' ({frames} frames)' if frames else ''} in {len(urls)} shards; batch {batch}, "
              f"{plan['workers']} decode worker(s), prefetch {plan['prefetch']}, model threads {threads}, "
              f"device {device}; best of {args.runs}")
        print(f"  decode only: {rates['decode']:8.1f} samples/s{per_frame('decode')}  "
              f"(decode workers: read + decode + prepare, no model)")
        print(f"  model only:  {rates['model']:8.1f} samples/s{per_frame('model')}  "
              f"(score_batch on pre-decoded inputs, batch {batch})")
        print(f"  end to end:  {rates['e2e']:8.1f} samples/s{per_frame('e2e')}  (scoring loop; "
              f"{rates['wall']:.1f} samples/s wall with start-up, model load and probe)")
        ratio = rates["e2e"] / min(rates["decode"], rates["model"])
        print(f"  ratio end to end / min(decode, model) = {ratio:.2f} (goal >= 0.8)")
        result = {"samples": n, "frames": frames, "batch": batch, "rates": rates, "ratio": ratio, "plan": plan}
        if "plain" in best:
            rates["plain"] = plain_n / best["plain"]
            print(f"  plain loop:  {rates['plain']:8.1f} samples/s wall ({plain_n} samples; webdataset WebLoader with "
                  f"open_clip preprocess + tokenize in {plan['workers']} workers, encode, normalise, dot)")
            result["ratio_plain"] = rates["wall"] / rates["plain"]
            print(f"  ratio wdsfilter / plain loop = {result['ratio_plain']:.2f} (goal >= 1.0; wall times, "
                  f"start-up included)")
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ocr_breakdown(args, batch: int) -> dict:
    """Frames/s and decode/detection/post-processing shares for images and videos (bench_ocr),
    at the batch size the engine's plan chose for OCR."""
    from tools import bench_ocr
    print(f"bench_score: ocr time shares (tools/bench_ocr.py, {args.ocr_copies} copies, batch {batch}, one process)")
    argv = ["--backend", args.ocr_backend, "--device", args.device, "--copies", str(args.ocr_copies),
            "--frames", str(args.frames), "--batch", str(batch)]
    if args.ocr_threads:
        argv += ["--threads", str(args.ocr_threads)]
    if args.ocr_min_side is not None:
        argv += ["--min-side", str(args.ocr_min_side)]
    argv += ["--min-text-score", str(args.ocr_min_text_score)]
    if args.ocr_backend == "easyocr":
        argv += ["--random-weights"]  # no downloaded weights: time a random CRAFT (said in its output)
    return bench_ocr.main(argv)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scorer", choices=["all", *sorted(BENCH_SCORERS), "tmars", "columns"], default="all",
                    help="tmars: the extra cost of tmars over clip+ocr as a ratio (tmars_cost); columns: of "
                         "clip+caption+size+aesthetic over clip (columns_cost)")
    ap.add_argument("--aesthetic-head", default=None,
                    help="columns: the aesthetic head (default: vit_b_32 for the default random ViT-B-32, else auto)")
    ap.add_argument("--model", default=None, help="clip: model (default: the tiny local model, built if missing)")
    ap.add_argument("--pretrained", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--ocr-backend", default="rapidocr", choices=("rapidocr", "easyocr"))
    ap.add_argument("--frames", type=int, default=3, help="ocr: frames sampled per video")
    ap.add_argument("--ocr-copies", type=int, default=4, help="ocr time shares: repeat the OCR shards this often")
    ap.add_argument("--ocr-threads", type=int, default=0, help="ocr time shares: detector CPU threads (0: default)")
    ap.add_argument("--ocr-min-side", type=int, default=None,
                    help="ocr: enlarge frames whose short side is under this (0: never; default: the backend's)")
    ap.add_argument("--ocr-min-text-score", type=min_text_score, default="default",
                    help="ocr: keep boxes read with this confidence (none: every detected box counts, unread; "
                         "default: the scorer's)")
    ap.add_argument("--quick", action="store_true", help="short settings: 2 shards x 1 copy, 1 run, 1 OCR copy")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.shards, args.copies, args.runs, args.ocr_copies = 2, 1, 1, 1

    if args.scorer == "tmars":
        return tmars_cost(args)
    if args.scorer == "columns":
        return columns_cost(args)
    results = {}
    names = sorted(BENCH_SCORERS) if args.scorer == "all" else [args.scorer]
    for name in names:
        results[name] = compare(args, name)
    if "ocr" in names:
        breakdown = ocr_breakdown(args, results["ocr"]["batch"])
        results["ocr"]["breakdown"] = {k: {m: v for m, v in breakdown[k].items() if m in (
            "samples", "frames", "seconds", "frames_per_s", "share", "seconds_by_stage")}
            for k in ("images", "videos") if k in breakdown}
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return results if args.scorer == "all" else results[args.scorer]


if __name__ == "__main__":
    main()
