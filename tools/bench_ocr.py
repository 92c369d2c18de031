"""Benchmark: the OCR scorer on images and on video frames.

    python tools/bench_ocr.py [--backend rapidocr|easyocr] [--device cpu] [--copies 4] [--frames 3]
                              [--batch 8] [--threads 0] [--keyframes] [--memory] [--json out.json]
                              [--min-side 736] [--min-text-score 0.5|none]

Reads sample_shards/ocr-images-000000.tar (16 PNGs, 320x240) and videos-000000.tar (8 mp4 clips,
320x240, 2 s) through the real sample pipeline, repeated --copies times, and runs the scorer the
way the engine does: prepare() per sample (CPU side), then score_batch() on batches of --batch
samples that share a batch_key. In one process, so the shares add up:

  decode        prepare(): video demux + decode + RGB conversion (image: array + resize)
  detection     the detector's preprocessing (resize, normalise) and network forward
  post          score maps -> polygons (the backend's post-processing), reading the boxes with the
                recogniser (min_text_score; in seconds_by_stage as "read") and the polygon union

and frames/s end to end. It also times both area methods (shapely, raster) on the polygons the
detector found, and with --memory measures the detector's peak memory per input pixel. With easyocr
it also times the preprocessing both ways on the same frames (compare_preprocessing): easyocr's on
the host against the host's share of torch_preprocess (the uint8 upload), which runs on CUDA, and
turning score maps into boxes with easyocr's getDetBoxes against craft_boxes.det_boxes.
--min-side and --min-text-score set the scorer's small-frame enlarging (0: off) and box reading
(none: every detected box counts, not read); by default the scorer's own defaults are timed.
easyocr without downloaded
weights: --random-weights builds a random CRAFT checkpoint (speed only, scores meaningless).

tools/bench_score.py calls main(argv), which returns the results as a dict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHARDS = {"images": ("ocr-images-000000.tar", "png"), "videos": ("videos-000000.tar", "mp4")}


def load_samples(kind: str, copies: int) -> list:
    import wdsfilter
    name, key = SHARDS[kind]
    path = os.path.join(ROOT, "sample_shards", name)
    if not os.path.isfile(path):
        sys.exit(f"no {path}: run tools/make_sample_shards.py first")
    samples = list(wdsfilter.sample_pipeline([path], wdsfilter.StageConfig(caption_key="txt", image_key=key)))
    return samples * copies


def min_text_score(text: str):
    """--min-text-score: a confidence, "none" (boxes not read) or "default" (the scorer's own)."""
    return text.lower() if text.lower() in ("none", "default") else float(text)


def text_score_option(value) -> dict:
    """OcrScorer keyword for a --min-text-score value."""
    return {} if value == "default" else {"min_text_score": None if value == "none" else value}


def make_scorer(args, tmp: str):
    from wdsfilter.score.scorers.ocr import OcrScorer
    options = {}
    if args.min_side is not None:
        options["min_side"] = args.min_side
    if args.backend == "rapidocr" and args.threads:
        options["threads"] = args.threads
    model_dir = args.model_dir
    note = ""
    if args.backend == "easyocr":
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        probe = OcrScorer(backend="easyocr", model_dir=model_dir)
        if not os.path.isfile(probe.weights_path()) and args.random_weights:
            import torch
            from easyocr.craft import CRAFT
            model_dir = os.path.join(tmp, "craft")
            os.makedirs(model_dir)
            torch.manual_seed(0)
            torch.save(CRAFT().state_dict(), os.path.join(model_dir, "craft_mlt_25k.pth"))
            options["verify_checksum"] = False
            note = " (random CRAFT weights: speed only)"
    scorer = OcrScorer(backend=args.backend, frames=args.frames, keyframes=args.keyframes, max_side=args.max_side,
                       area_method=args.area_method, model_dir=model_dir, download=not args.no_download,
                       backend_options=options, **text_score_option(args.min_text_score))
    scorer.load(args.device)
    return scorer, note


def batches(scorer, prepared: list, size: int):
    """Batches of up to `size` inputs sharing a batch_key, as the engine forms them."""
    groups = {}
    for x in prepared:
        groups.setdefault(scorer.batch_key(x), []).append(x)
    for group in groups.values():
        for i in range(0, len(group), size):
            yield group[i:i + size]


def run(scorer, samples: list, batch: int) -> dict:
    scorer.timings(reset=True)
    t0 = time.perf_counter()
    prepared = [scorer.prepare(s) for s in samples]
    decode = time.perf_counter() - t0
    t1 = time.perf_counter()
    rows = []
    for b in batches(scorer, prepared, batch):
        rows += scorer.score_batch(b)
    score = time.perf_counter() - t1
    t = scorer.timings(reset=True)
    frames = sum(len(x.frames) for x in prepared)
    total = decode + score
    detection = t["preprocess"] + t["forward"]
    post = t["postprocess"] + t.get("read", 0.0) + t["area"]
    return {"samples": len(samples), "frames": frames, "seconds": total, "frames_per_s": frames / total,
            "share": {"decode": decode / total, "detection": detection / total, "post": post / total,
                      "other": max(0.0, 1 - (decode + detection + post) / total)},
            "seconds_by_stage": {"decode": decode, **t}, "prepared": prepared, "rows": rows}


def compare_area_methods(scorer, prepared: list, repeat: int = 20) -> dict:
    """Time each area method on the polygons the detector found (detected once, timed alone)."""
    import numpy as np
    from wdsfilter.score.geometry import AREA_METHODS, area_ratio
    frames = [(f, len(f[0]), f.shape[0]) for x in prepared for f in x.frames]
    polys = []
    for x in prepared:
        polys += scorer.detector.detect(x.frames)
    out = {}
    values = {}
    for method in AREA_METHODS:
        t = time.perf_counter()
        for _ in range(repeat):
            values[method] = [area_ratio(p, w, h, method) for p, (_, w, h) in zip(polys, frames)]
        out[method] = {"us_per_frame": (time.perf_counter() - t) / repeat / len(polys) * 1e6}
    out["max_abs_diff"] = float(np.max(np.abs(np.subtract(values["shapely"], values["raster"])))) if polys else 0.0
    out["polygons_per_frame"] = sum(len(p) for p in polys) / max(len(polys), 1)
    return out


def compare_preprocessing(scorer, frame_arrays: list, batch: int, repeat: int = 3) -> dict:
    """easyocr only: the detector's preprocessing per frame, both ways side by side on the same
    batches (frames of one size, `batch` at a time, as score_batch hands them over):

      easyocr   easyocr's own (cv2 resize, float32 normalise, np.stack, permute) on the host, and
                on CUDA the float32 batch's copy to the device (synchronised): what ran before
      upload    torch_preprocess's host share: the uint8 batch into the staging buffer (pinned on
                CUDA, then an asynchronous copy; on a CPU a plain copy)
      torch     torch_preprocess itself on the detector's device (synchronised on CUDA): on a
                CUDA device the GPU's work, on a CPU the same work on the host cores

    On a CPU machine only `easyocr` vs `upload` says something about a GPU run: the host's work
    per frame before and after (the device's share, and the copies, need a GPU)."""
    import numpy as np
    import torch
    from wdsfilter.score.ocr_backends.easyocr_backend import torch_preprocess
    from wdsfilter.score.staging import Staging

    det = scorer.detector
    param = next(det._model.parameters())
    cuda = param.device.type == "cuda"
    staging = Staging.for_device(param.device)

    def sync():
        if cuda:
            torch.cuda.synchronize(param.device)

    def easyocr_way(frames):
        import cv2
        from easyocr.imgproc import normalizeMeanVariance, resize_aspect_ratio
        mag = det._magnification(*frames.shape[1:3])
        x = torch.from_numpy(np.stack([normalizeMeanVariance(resize_aspect_ratio(
            f, det.canvas_size, interpolation=cv2.INTER_LINEAR, mag_ratio=mag)[0]) for f in frames])).permute(0, 3, 1, 2)
        if cuda:
            x.to(param.device, param.dtype)
            sync()

    groups = {}
    for frames_ in frame_arrays:  # (N, H, W, 3) per sample
        groups.setdefault(frames_.shape[1:], []).append(frames_)
    batches_ = [np.concatenate(g[i:i + batch]) for g in groups.values() for i in range(0, len(g), batch)]
    seconds = {"easyocr": 0.0, "upload": 0.0, "torch": 0.0}
    frames = 0
    for _ in range(repeat):
        for frames_ in batches_:
            t0 = time.perf_counter()
            easyocr_way(frames_)
            t1 = time.perf_counter()
            pixels = staging.to_device([torch.from_numpy(frames_)], param.device)
            t2 = time.perf_counter()
            sync()  # the upload's DMA is not the host's time: wait for it outside both timers
            t3 = time.perf_counter()
            _, height, width = det._resize(*frames_.shape[1:3])
            with torch.inference_mode():
                torch_preprocess(pixels, height, width, param.dtype)
            sync()
            t4 = time.perf_counter()
            seconds["easyocr"] += t1 - t0
            seconds["upload"] += t2 - t1
            seconds["torch"] += t4 - t3
            frames += len(frames_)
    staging.release()
    out = {k + "_ms_per_frame": v / frames * 1e3 for k, v in seconds.items()}
    out["host_ratio"] = seconds["easyocr"] / max(seconds["upload"], 1e-12)
    out["device"] = str(param.device)
    return out


def compare_box_extraction(components=(0, 10, 30, 100), height=368, width=654, repeat=5) -> list:
    """easyocr's getDetBoxes against craft_boxes.det_boxes (the backend's), per frame, side by side
    on score maps of the size a 1280x720 frame gives at short side 736, with `components` text
    blobs: easyocr's cost grows as components x map pixels, det_boxes' as the components' windows."""
    import cv2
    import numpy as np
    from easyocr.craft_utils import getDetBoxes
    from wdsfilter.score.ocr_backends.craft_boxes import det_boxes
    rng = np.random.default_rng(0)
    out = []
    for n in components:
        text = np.zeros((height, width), np.float32)
        for _ in range(n):
            y, x = int(rng.integers(10, height - 10)), int(rng.integers(10, width - 30))
            text[y - 4:y + 4, x:x + 20] = 0.9
        text = cv2.GaussianBlur(text, (5, 5), 2)
        link = np.zeros_like(text)
        seconds = {}
        for name, fn in (("easyocr", lambda: getDetBoxes(text, link, 0.7, 0.4, 0.4)[0]),
                         ("ours", lambda: det_boxes(text, link, 0.7, 0.4, 0.4))):
            t = time.perf_counter()
            for _ in range(repeat):
                boxes = fn()
            seconds[name] = (time.perf_counter() - t) / repeat
            seconds[name + "_boxes"] = boxes
        same = len(seconds["easyocr_boxes"]) == len(seconds["ours_boxes"]) and all(
            np.array_equal(a, b) for a, b in zip(seconds["easyocr_boxes"], seconds["ours_boxes"]))
        out.append({"components": n, "boxes": len(seconds["ours_boxes"]), "same_boxes": same,
                    "easyocr_ms": seconds["easyocr"] * 1e3, "ours_ms": seconds["ours"] * 1e3,
                    "ratio": seconds["easyocr"] / max(seconds["ours"], 1e-12)})
    return out


def _peak_rss_during(fn):
    """Peak resident memory growth while fn runs: a thread samples RSS every 0.5 ms (the CPU
    allocators hand memory back between layers, so an end-of-call reading misses the peak)."""
    import ctypes
    import gc
    import psutil
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return peak[0] - base


def measure_memory(scorer, device: str, sizes=((736, 1280, 1), (384, 640, 2))) -> list:
    """Peak memory per detector input pixel (host RAM on cpu; torch's allocator peak on cuda,
    which does not see onnxruntime's CUDA arena: use the planner's measurement there)."""
    import numpy as np
    det = scorer.detector
    rng = np.random.default_rng(0)
    det.detect(rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8))  # warm up outside the measurement
    out = []
    for h, w, n in sizes:
        frames = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        if device.startswith("cuda"):
            import torch
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            det.detect(frames)
            grown = torch.cuda.max_memory_allocated(device) - before
        else:
            grown = _peak_rss_during(lambda: det.detect(frames))
        net = det._net_size(h, w) if hasattr(det, "_net_size") else det._resized_size(h, w)
        pixels = net[0] * net[1] * n
        out.append({"frames": n, "frame": f"{w}x{h}", "input": f"{net[1]}x{net[0]}", "peak_bytes": int(grown),
                    "bytes_per_input_pixel": grown / pixels})
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="rapidocr", choices=("rapidocr", "easyocr"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--copies", type=int, default=4, help="repeat the sample shards this many times")
    ap.add_argument("--frames", type=int, default=3, help="frames sampled per video")
    ap.add_argument("--keyframes", action="store_true")
    ap.add_argument("--batch", type=int, default=8, help="samples per score_batch call")
    ap.add_argument("--max-side", type=int, default=1280)
    ap.add_argument("--area-method", default="shapely", choices=("shapely", "raster"))
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for the detector (0: library default)")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--no-download", action="store_true")
    ap.add_argument("--random-weights", action="store_true", help="easyocr: random CRAFT if no weights")
    ap.add_argument("--memory", action="store_true", help="measure peak memory per input pixel")
    ap.add_argument("--min-side", type=int, default=None,
                    help="detector: enlarge frames whose short side is under this (0: never; default: the backend's)")
    ap.add_argument("--min-text-score", type=min_text_score, default="default",
                    help="read boxes, keep those read with this confidence (none: every box counts, unread; "
                         "default: the scorer's)")
    ap.add_argument("--only", choices=("images", "videos"), default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)

    results = {"backend": args.backend, "device": args.device, "frames_per_video": args.frames,
               "keyframes": args.keyframes, "batch": args.batch}
    with tempfile.TemporaryDirectory() as tmp:
        scorer, note = make_scorer(args, tmp)
        results["scorer"] = scorer.describe() + note
        print(results["scorer"])
        kinds = [args.only] if args.only else ["images", "videos"]
        for kind in kinds:
            samples = load_samples(kind, args.copies)
            run(scorer, samples[: min(len(samples), args.batch)], args.batch)  # warm-up (session, caches)
            r = run(scorer, samples, args.batch)
            prepared = r.pop("prepared")
            areas = compare_area_methods(scorer, prepared[:16])
            rows = r.pop("rows")
            r["area_methods"] = areas
            if args.backend == "easyocr":
                import cv2
                import numpy as np
                r["preprocessing"] = compare_preprocessing(scorer, [x.frames for x in prepared], args.batch)
                # Also at 1280x720, the frames of the first GPU run (enlarged to 1308x736 there).
                r["preprocessing_1280x720"] = compare_preprocessing(
                    scorer, [np.stack([cv2.resize(f, (1280, 720)) for f in x.frames]) for x in prepared], args.batch)
            r["mean_ocr_area"] = sum(x["ocr_area"] for x in rows) / len(rows)
            results[kind] = r
            s = r["share"]
            print(f"{kind:>7}: {r['samples']} samples, {r['frames']} frames in {r['seconds']:.2f}s = "
                  f"{r['frames_per_s']:.1f} frames/s | decode {s['decode']:.1%}, detection {s['detection']:.1%}, "
                  f"post-processing {s['post']:.1%}, other {s['other']:.1%}")
            stages = ", ".join(f"{k} {v:.3f}s" for k, v in r["seconds_by_stage"].items())
            print(f"         by stage: {stages}")
            print(f"         area union: shapely {areas['shapely']['us_per_frame']:.0f} us/frame, raster "
                  f"{areas['raster']['us_per_frame']:.0f} us/frame, max |difference| {areas['max_abs_diff']:.4f}, "
                  f"{areas['polygons_per_frame']:.1f} polygons/frame")
            for label, key in (("these frames", "preprocessing"), ("at 1280x720", "preprocessing_1280x720")):
                if key in r:
                    p = r[key]
                    print(f"         preprocessing per frame, {label}: easyocr's (host) {p['easyocr_ms_per_frame']:.2f} "
                          f"ms, uint8 upload (host) {p['upload_ms_per_frame']:.2f} ms = {p['host_ratio']:.0f}x less "
                          f"host time; torch_preprocess on {p['device']} {p['torch_ms_per_frame']:.2f} ms")
        if args.backend == "easyocr":
            results["box_extraction"] = compare_box_extraction()
            for b in results["box_extraction"]:
                print(f"  boxes from 368x654 score maps, {b['components']} text blobs ({b['boxes']} boxes, the same: "
                      f"{b['same_boxes']}): easyocr's getDetBoxes {b['easyocr_ms']:.1f} ms, det_boxes "
                      f"{b['ours_ms']:.1f} ms per frame = {b['ratio']:.1f}x")
        if args.memory:
            results["memory"] = measure_memory(scorer, args.device)
            for m in results["memory"]:
                print(f" memory: {m['frames']} x {m['frame']} (network input {m['input']}): peak "
                      f"{m['peak_bytes'] / 2**20:.0f} MiB = {m['bytes_per_input_pixel']:.0f} bytes per input pixel")
        scorer.unload()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
