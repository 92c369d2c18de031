"""Benchmark: decode + resize of 768-1024 px JPEGs for a 224 px CLIP, per CPU core.

    python tools/bench_decode.py [--quick] [--size 224] [--images 48] [--runs 5] [--reducing-gap 1.25]

Images: scikit-image's photos (its wheel) resized to a long side of 768-1024 px in several aspect
ratios and saved as JPEG quality 90 (made in memory, fixed seed). One process, one torch thread,
CPU time (time.process_time, so other load on the machine counts less); the methods alternate
within each run and the best run of each is kept. Side by side:

  plain PIL      Image.open + convert("RGB") + open_clip's Resize + CenterCrop (PIL bicubic):
                 the decode and resize every open_clip DataLoader does
  today          the same plus ToTensor + Normalize: wdsfilter's prepare before this change
  wdsfilter      images.decode_image with the CLIP scorer's decode floor (JPEG reduced-scale
                 decoding) + fastdecode.ImageTransform (torch's uint8 antialiased resize): uint8
  wdsfilter, full decode   the same with reducing_gap=None (pixels within 1/255 of open_clip's)

It prints each method's ms per image and per-core images/s, the pixel difference of the wdsfilter
paths to open_clip's preprocess (mean and max, in 1/255 units), and ends with
`ratio wdsfilter / plain PIL decode+resize per core = R` (goal >= 2).
"""
from __future__ import annotations

import argparse
import io
import os
import random
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "hubble_deep_field.jpg",
          "retina.jpg", "rocket.jpg")
ASPECTS = (1.0, 4 / 3, 3 / 2, 16 / 9, 3 / 4)


def make_jpegs(count: int, seed: int = 0) -> list:
    """`count` JPEG byte strings, long side 768-1024 px, made from scikit-image's photos."""
    import skimage
    from PIL import Image
    folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    photos = [Image.open(os.path.join(folder, name)).convert("RGB") for name in PHOTOS]
    rng = random.Random(seed)
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        long_side, aspect = rng.randint(768, 1024), rng.choice(ASPECTS)
        w, h = (long_side, round(long_side / aspect)) if aspect >= 1 else (round(long_side * aspect), long_side)
        buf = io.BytesIO()
        photo.resize((w, h), Image.BICUBIC).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def methods(size: int, reducing_gap):
    """name -> function(jpeg bytes) -> model input (PIL image, float tensor or uint8 tensor)."""
    from dataclasses import asdict

    from open_clip.transform import PreprocessCfg, image_transform_v2
    from PIL import Image

    from wdsfilter.media.images import FULL_SIZE, decode_image
    from wdsfilter.score.fastdecode import ImageTransform

    cfg = asdict(PreprocessCfg(size=size))
    reference = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
    resize, crop = reference.transforms[0], reference.transforms[1]
    fast, full = ImageTransform(cfg, reducing_gap), ImageTransform(cfg, None)

    def plain(data):
        return crop(resize(Image.open(io.BytesIO(data)).convert("RGB")))

    def today(data):
        return reference(decode_image(data, None))

    def ours(transform):
        floor = transform.decode_floor()

        def run(data):
            image = decode_image(data, None, floor=floor)
            return transform(image, image.info.get(FULL_SIZE))
        return run

    return {"plain PIL": plain, "today": today, "wdsfilter": ours(fast), "wdsfilter, full decode": ours(full)}, \
        reference, fast


def difference(jpegs, run, reference, transform) -> tuple:
    """(mean, max) absolute pixel difference to open_clip's preprocess, in 1/255 units."""
    import torch
    from wdsfilter.media.images import decode_image
    std = torch.tensor(transform.std).view(3, 1, 1)
    means, worst = [], 0.0
    for data in jpegs:
        ref = reference(decode_image(data, None))
        ours = transform.normalize(run(data)[None])[0]
        err = (ours - ref).abs() * std * 255
        means.append(float(err.mean()))
        worst = max(worst, float(err.max()))
    return sum(means) / len(means), worst


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224, help="model input side (224 for ViT-B/32)")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reducing-gap", type=float, default=None,
                    help="the CLIP scorer's reducing_gap (default: its default)")
    ap.add_argument("--quick", action="store_true", help="16 images, 3 runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.runs = 16, 3
    import torch
    from wdsfilter.score.fastdecode import REDUCING_GAP
    torch.set_num_threads(1)  # per core, as in a DataLoader worker
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    gap = REDUCING_GAP if args.reducing_gap is None else args.reducing_gap
    jpegs = make_jpegs(args.images)
    funcs, reference, fast = methods(args.size, gap)
    for run in funcs.values():  # warm-up: imports, kernels, caches
        run(jpegs[0])
    best = {name: float("inf") for name in funcs}
    for _ in range(args.runs):
        for name, run in funcs.items():
            start = time.process_time()
            for data in jpegs:
                run(data)
            best[name] = min(best[name], (time.process_time() - start) / len(jpegs))
    print(f"bench_decode: {len(jpegs)} JPEGs, long side 768-1024 px, for a {args.size} px model; one core "
          f"(CPU time), best of {args.runs}; reducing_gap {gap}")
    for name, seconds in best.items():
        print(f"  {name:24s} {seconds * 1e3:7.2f} ms/image  {1 / seconds:7.1f} images/s per core")
    diffs = {}
    for name in ("wdsfilter", "wdsfilter, full decode"):
        mean, worst = difference(jpegs, funcs[name], reference, fast)
        diffs[name] = {"mean": mean, "max": worst}
        print(f"  {name}: pixels differ from open_clip's preprocess by {mean:.3f}/255 on average, "
              f"at most {worst:.0f}/255")
    today = best["today"] / best["wdsfilter"]
    print(f"  ratio wdsfilter / today's prepare per core = {today:.2f}")
    ratio = best["plain PIL"] / best["wdsfilter"]
    print(f"ratio wdsfilter / plain PIL decode+resize per core = {ratio:.2f} (goal >= 2)")
    return {"seconds": best, "difference": diffs, "ratio": ratio, "ratio_today": today, "reducing_gap": gap}


if __name__ == "__main__":
    main()
