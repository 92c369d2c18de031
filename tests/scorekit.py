"""Real, simple scorers and shard builders for the scoring-engine tests (no tests in this module).

BrightnessScorer computes the mean luminance of each image with torch on its model device. It
can also behave like a model on a simulated GPU: `sim` names a devicekit.SimulatedDevice where load()
allocates `model_bytes` and score_batch() allocates `bytes_per_sample` per sample (raising a real
torch.cuda.OutOfMemoryError when that does not fit), and `oom_above` raises that error for any
batch larger than N. Every scored key is appended to `log` (a file), so tests can check that no
sample was scored twice, across processes too. `hold_file` with `hold_key` K: a batch holding a
sample whose key starts with K creates `<hold_file>.waiting` and waits until `hold_file` exists:
a run held at a known point (make_shards' keys are s<shard>_<index>), an event the test waits on.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
from PIL import Image, ImageStat

from devicekit import SimulatedDevice
from shardkit import image_bytes, write_shard
from wdsfilter.core.errors import DataError
from wdsfilter.score.scorers.base import Scorer

torch.set_num_threads(1)

LUMA = (0.299, 0.587, 0.114)


class BrightnessScorer(Scorer):
    name = "bright"

    def __init__(self, size: int = 8, sim: str = "", sim_total: int = 0, model_bytes: int = 0,
                 bytes_per_sample: int = 0, quadratic_bytes: int = 0, oom_above: int = 0, delay: float = 0.0,
                 log: str = "", fail_word: str = "", memory_error_above: int = 0, huge_word: str = "",
                 error_word: str = "", delay_file: str = "", hold_file: str = "", hold_key: str = ""):
        self.size = size
        self.sim = sim
        self.sim_total = sim_total
        self.model_bytes = model_bytes
        self.bytes_per_sample = bytes_per_sample
        self.quadratic_bytes = quadratic_bytes  # activation memory growing with n^2 (attention-like)
        self.huge_word = huge_word  # captions with it need more memory than the device has
        self.error_word = error_word  # captions with it make score_batch raise a ValueError
        self.oom_above = oom_above
        self.memory_error_above = memory_error_above
        self.delay = delay
        self.delay_file = delay_file  # set: sleep `delay` only while this file exists
        self.log = log
        self.fail_word = fail_word
        self.hold_file, self.hold_key = hold_file, hold_key
        self._weights = None

    def columns(self):
        return ["brightness", "bright_wide"]

    def prepare(self, sample):
        if self.fail_word and self.fail_word in sample["caption"]:
            raise DataError("caption_refused", f"caption contains {self.fail_word!r}")
        img = sample["image"].resize((self.size, self.size), Image.NEAREST)
        pixels = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        return {"pixels": pixels, "key": sample["__key__"], "wide": sample["image"].width > sample["image"].height,
                "huge": bool(self.huge_word) and self.huge_word in sample["caption"],
                "bad": bool(self.error_word) and self.error_word in sample["caption"]}

    def _device(self):
        return SimulatedDevice.get(self.sim, self.sim_total) if self.sim else None

    def load(self, device):
        self.device = device
        self._weights = torch.tensor(LUMA, device=device).view(1, 3, 1, 1)
        if self.sim:
            self._device().alloc(self.model_bytes)

    def unload(self):
        if self.sim and self._weights is not None:
            self._device().release(self.model_bytes)
        self._weights = None

    def _hold(self, inputs) -> None:
        if self.hold_file and any(i["key"].startswith(self.hold_key) for i in inputs) \
                and not os.path.exists(self.hold_file):
            open(self.hold_file + ".waiting", "w").close()
            while not os.path.exists(self.hold_file):
                time.sleep(0.01)

    def score_batch(self, inputs):
        n = len(inputs)
        self._hold(inputs)
        if self.oom_above and n > self.oom_above:
            raise torch.cuda.OutOfMemoryError(f"test: batch of {n} > {self.oom_above}")
        if self.memory_error_above and n > self.memory_error_above:
            raise MemoryError(f"test: batch of {n} > {self.memory_error_above}")
        if any(i["bad"] for i in inputs):
            raise ValueError("test: this input breaks the model")
        dev = self._device()
        need = self.bytes_per_sample * n + self.quadratic_bytes * n * n
        if dev is not None:
            if any(i["huge"] for i in inputs):
                dev.alloc(dev.total() + 1)
            dev.alloc(need)
        try:
            x = torch.stack([i["pixels"] for i in inputs]).to(self.device).float() / 255.0
            luma = (x * self._weights).sum(1).mean((1, 2))
            if self.delay and (not self.delay_file or os.path.exists(self.delay_file)):
                time.sleep(self.delay)
        finally:
            if dev is not None:
                dev.release(need)
        if self.log:
            with open(self.log, "a") as f:
                f.write("".join(f"{i['key']}\n" for i in inputs))
        return [{"brightness": float(v), "bright_wide": bool(i["wide"])} for v, i in zip(luma, inputs)]


class ByteLengthScorer(Scorer):
    """A second scorer for one-pass multi-scorer runs: length of the caption in UTF-8 bytes."""

    name = "caplen"

    def columns(self):
        return ["caption_bytes"]

    def prepare(self, sample):
        if "skip-caplen" in sample["caption"]:
            raise DataError("caplen_skipped", "caption asks to be skipped")
        return torch.tensor([len(sample["caption"].encode())])

    def load(self, device):
        self.device = device

    def score_batch(self, inputs):
        return [{"caption_bytes": int(t.item())} for t in torch.stack(inputs).to(self.device)]


# The tiny stopword lists TextShapeScorer tells languages apart by (a real count, not a model).
STOPWORDS = {"en": {"the", "a", "of", "and", "on", "in", "with", "is", "photo", "at"},
             "de": {"der", "die", "das", "und", "ein", "eine", "mit", "auf", "im", "ist"},
             "fr": {"le", "la", "les", "et", "un", "une", "avec", "sur", "dans", "est"}}


class TextShapeScorer(Scorer):
    """What the `caption` and `size` scorers write (issue 34's column names), computed here in
    prepare() (no model) as DataComp's basic filter defines them, for the recipe tests until the
    real scorers merge: caption_language by counting stopwords (its share of the words as
    caption_language_score; "und" when none matches), caption_words = len(caption.split()),
    caption_chars = len(caption), width and height of the decoded image, min_side and
    aspect_ratio = long side / short side."""

    name = "shape"

    def columns(self):
        return ["caption_language", "caption_language_score", "caption_words", "caption_chars", "width", "height",
                "min_side", "aspect_ratio"]

    def column_types(self):
        return {"caption_language": "string", "caption_language_score": "float64", "caption_words": "int64",
                "caption_chars": "int64", "width": "int64", "height": "int64", "min_side": "int64",
                "aspect_ratio": "float64"}

    def prepare(self, sample):
        caption = sample["caption"]
        words = caption.split()
        hits = {lang: sum(w.lower().strip(".,:;!?") in stop for w in words) for lang, stop in STOPWORDS.items()}
        lang = max(hits, key=hits.get) if any(hits.values()) else "und"
        w, h = sample["image"].size
        return {"caption_language": lang, "caption_language_score": hits.get(lang, 0) / max(len(words), 1),
                "caption_words": len(words), "caption_chars": len(caption), "width": w, "height": h,
                "min_side": min(w, h), "aspect_ratio": max(w, h) / min(w, h)}

    def load(self, device):
        self.device = device

    def score_batch(self, inputs):
        return [dict(i) for i in inputs]


class SmallFloorScorer(BrightnessScorer):
    """BrightnessScorer that asks for small decodes (Scorer.decode_floor): a JPEG reaches it at
    1/8 scale where that keeps 16 px, so its brightness (8x8 NEAREST samples) depends on the DCT
    scale it was decoded at, as a CLIP score does."""

    name = "small"

    def columns(self):
        return ["small_brightness", "small_wide"]

    def decode_floor(self):
        return (16, 16)

    def score_batch(self, inputs):
        return [{"small_brightness": r["brightness"], "small_wide": r["bright_wide"]}
                for r in super().score_batch(inputs)]


class NumpyScorer(BrightnessScorer):
    """What a custom scorer often returns: numpy scalars (np.float32 from .mean()) and arrays."""

    name = "np"

    def columns(self):
        return ["np_luma", "np_frames"]

    def score_batch(self, inputs):
        return [{"np_luma": np.float32(r["brightness"]), "np_frames": np.array([r["brightness"], 0.5])}
                for r in super().score_batch(inputs)]


class ExtremeScorer(BrightnessScorer):
    """Scores as scorers return sentinels: by the sample's index (its key's last digits), in turn
    +sys.float_info.max, -sys.float_info.max, inf, -inf, NaN and the brightness."""

    name = "extreme"
    VALUES = (sys.float_info.max, -sys.float_info.max, math.inf, -math.inf, math.nan, None)

    def columns(self):
        return ["extreme"]

    def score_batch(self, inputs):
        out = []
        for r, i in zip(super().score_batch(inputs), inputs):
            tail = i["key"][-5:]
            v = self.VALUES[int(tail) % len(self.VALUES) if tail.isdigit() else -1]
            out.append({"extreme": r["brightness"] if v is None else v})
        return out


class FlatScorer(BrightnessScorer):
    """Columns of one value, as an OCR run on images without text gives (every ocr_area 0.0):
    `flat` 0.0 everywhere, `flat_int` 3, `flat_gaps` 0.25 or missing (NaN, None) in turn, and
    `no_value` missing everywhere."""

    name = "flat"

    def columns(self):
        return ["flat", "flat_int", "flat_gaps", "no_value"]

    def score_batch(self, inputs):
        gaps = (0.25, math.nan, None)
        return [{"flat": 0.0, "flat_int": 3, "flat_gaps": gaps[int(i["key"][-5:]) % 3], "no_value": math.nan}
                for i in inputs]


class BrokenScorer(BrightnessScorer):
    """Fails on every batch with a non-memory error: a bug, which must stop the run."""

    name = "broken"

    def columns(self):
        return ["broken_value"]

    def score_batch(self, inputs):
        raise ValueError("model weights are garbage")


def expected_brightness(img_bytes: bytes, size: int = 8) -> float:
    """The same luminance computed independently with PIL (ImageStat on the resized image)."""
    img = Image.open(__import__("io").BytesIO(img_bytes)).convert("RGB").resize((size, size), Image.NEAREST)
    means = ImageStat.Stat(img).mean
    return sum(w * m for w, m in zip(LUMA, means)) / 255.0


def colored_members(n, start=0, shard=0, bad=(), refused=(), no_caption=()):
    """Image-text members with a different colour per sample; `bad` indices get corrupt JPEG
    bytes, `refused` captions containing 'refuse-me', `no_caption` no .txt member."""
    members, images = [], {}
    for i in range(start, start + n):
        key = f"s{shard}_{i:05d}"
        if i in bad:
            data = b"\xff\xd8\xff\xe0 definitely not a jpeg"
        else:
            color = ((37 * i + 11 * shard) % 256, (91 * i) % 256, (13 * i + 50) % 256)
            size = (40, 24) if i % 3 else (24, 40)
            data = image_bytes(size=size, color=color)
        images[key] = data
        members.append((f"{key}.jpg", data))
        if i not in no_caption:
            members.append((f"{key}.txt", f"sample {i} of shard {shard}" + (" refuse-me" if i in refused else "")))
    return members, images


def make_shards(folder, counts, **kwargs):
    """Shards named shard-0000.tar... with counts[i] samples; returns (urls, {key: image bytes})."""
    urls, images = [], {}
    os.makedirs(folder, exist_ok=True)
    for s, n in enumerate(counts):
        members, imgs = colored_members(n, shard=s, **{k: v.get(s, ()) if isinstance(v, dict) else v
                                                      for k, v in kwargs.items()})
        urls.append(write_shard(os.path.join(folder, f"shard-{s:04d}.tar"), members))
        images.update(imgs)
    return urls, images


class ArenaScorer(BrightnessScorer):
    """Memory the way onnxruntime holds it on a GPU (rapidocr with onnxruntime-gpu): weights and an
    arena outside PyTorch's allocator, so memory_allocated never sees them and only the device's
    free memory (mem_get_info; here the SimulatedDevice's) does. The arena grows to the largest
    batch so far and never shrinks; growing past the free memory is an out-of-memory error."""

    name = "arena"

    def columns(self):
        return ["arena_luma"]

    def load(self, device):
        self.device = device
        self._weights = torch.tensor(LUMA, device=device).view(1, 3, 1, 1)
        self.arena = 0
        self._device().occupy(self.model_bytes)

    def unload(self):
        if self._weights is not None:
            self._device().occupied -= self.model_bytes + self.arena
        self._weights = None

    def score_batch(self, inputs):
        dev, need = self._device(), self.bytes_per_sample * len(inputs)
        if need > self.arena:
            if need - self.arena > dev.free():
                raise torch.cuda.OutOfMemoryError(f"test arena: {need - self.arena} more bytes, {dev.free()} free")
            dev.occupy(need - self.arena)
            self.arena = need
        x = torch.stack([i["pixels"] for i in inputs]).to(self.device).float() / 255.0
        return [{"arena_luma": float(v)} for v in (x * self._weights).sum(1).mean((1, 2))]


class FrameCounter:
    """A model-free scorer of video-like inputs {"frames": k}: records the frames of each
    score_batch call (what a per-scorer batch in frames must fill). Subclasses add a cost."""

    name = "frames"

    def __init__(self):
        self.calls = []

    def columns(self):
        return ["n_frames"]

    def frame_count(self, x):
        return x["frames"]

    def batch_key(self, x):
        return None

    def load(self, device):
        pass

    def unload(self):
        pass

    def describe(self):
        return self.name

    def score_batch(self, inputs):
        self.calls.append(sum(x["frames"] for x in inputs))
        return [{"n_frames": x["frames"]} for x in inputs]


class AllocConfScorer(BrightnessScorer):
    """Brightness, and at load the CUDA allocator settings its model process starts with (both
    names PyTorch reads), written to `record`."""
    name = "allocconf"

    def __init__(self, record: str = "", **kw):
        super().__init__(**kw)
        self.record = record

    def load(self, device):
        with open(self.record, "w") as f:
            json.dump({n: os.environ.get(n) for n in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}, f)
        super().load(device)


# An audit hook that refuses every network connection and name lookup, installed before anything
# else runs: a machine without network (an air-gapped cluster), as Python code sees it. The code
# after it checks that the hook bites (a connection to loopback is refused) before it counts.
OFFLINE_PRELUDE = """
import socket, sys
def _no_network(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request"):
        raise OSError("network unreachable (test): " + event)
sys.addaudithook(_no_network)
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
    raise SystemExit("the offline hook did not refuse a connection")
except OSError as e:
    assert "network unreachable (test)" in str(e), e
"""


def run_offline(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`code` in a fresh Python process with no network (OFFLINE_PRELUDE first), run from the
    repository root; its output is captured as text."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", OFFLINE_PRELUDE + code], cwd=root, capture_output=True, text=True,
                          timeout=timeout)


class WrongTypeScorer(BrightnessScorer):
    """A user's scorer that returns, for its float column, what a float column cannot hold: an
    array ("array"), no value for it ("missing"), a column it did not declare ("extra") or an
    infinity ("inf"): for the samples whose caption holds `word` ("": every sample)."""

    name = "wrong"

    def __init__(self, mode: str = "array", word: str = "", **kwargs):
        super().__init__(**kwargs)
        self.mode, self.word = mode, word

    def columns(self):
        return ["wrong_score"]

    def column_types(self):
        return {"wrong_score": "float64"}

    def prepare(self, sample):
        return {**super().prepare(sample), "odd": self.word in sample["caption"]}

    def score_batch(self, inputs):
        out = []
        for i, row in zip(inputs, super().score_batch(inputs)):
            value = row["brightness"]
            if not i["odd"]:
                out.append({"wrong_score": value})
            elif self.mode == "array":
                out.append({"wrong_score": np.array([value, value])})
            elif self.mode == "missing":
                out.append({})
            elif self.mode == "extra":
                out.append({"wrong_score": value, "undeclared": value})
            else:
                out.append({"wrong_score": math.inf})
        return out


class EmbeddingScorer(BrightnessScorer):
    """A CLIP-like scorer that hands over image and caption embeddings (as the CLIP scorer does
    with --save-embeddings): a random unit vector per sample index, sample `copy_of[i]`'s vector
    for a planted copy, and NaN or inf for the indices in `nan` and `inf` (a model's fault)."""

    name = "embed"

    def __init__(self, copies: str = "", nan: str = "", inf: str = "", dim: int = 32, **kwargs):
        super().__init__(**kwargs)
        # --scorer-opt values are JSON when they parse: "17" arrives as 17
        self.copies = dict(tuple(int(x) for x in p.split(":")) for p in str(copies).split(",") if p)
        self.nan = {int(x) for x in str(nan).split(",") if x}
        self.inf = {int(x) for x in str(inf).split(",") if x}
        self.dim = dim

    def columns(self):
        return ["clip_score"]

    def _vector(self, i: int) -> np.ndarray:
        v = np.random.default_rng(self.copies.get(i, i)).standard_normal(self.dim)
        v /= np.linalg.norm(v)
        if i in self.nan:
            v[0] = np.nan
        if i in self.inf:
            v[1] = np.inf
        return v

    def score_batch(self, inputs):
        from wdsfilter.runfolder.embeddings import FIELD
        out = []
        for r, x in zip(super().score_batch(inputs), inputs):
            v = self._vector(int(x["key"][-5:]))
            out.append({"clip_score": r["brightness"], FIELD: {"img": v, "txt": v}})
        return out


class LocalFileScorer(BrightnessScorer):
    """BrightnessScorer that says it reads a file of this machine (`path`, Scorer.local_files) and
    cannot read a copy elsewhere (no relocate): refused on a Ray cluster whose nodes lack it."""

    def __init__(self, path: str = "", **options):
        super().__init__(**options)
        self.path = path

    def local_files(self):
        return [self.path] if self.path else []


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The command in-process with some modules poisoned (sys.modules[name] = None: any import of them
# raises), its exit code and which of WATCHED it imported written to a file.
WATCHED = ("open_clip", "pyarrow", "pandas")
DRIVER = """
import json, sys
for name in json.loads(sys.argv[2]):
    sys.modules[name] = None
from wdsfilter.cli import main
code = 0
try:
    main(sys.argv[3:], prog_name="wdsfilter")
except SystemExit as e:
    code = e.code
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "loaded": [m for m in %r if sys.modules.get(m) is not None]}, f)
""" % (WATCHED,)


def run_with_blocked_imports(tmp_path, blocked, *args):
    """(exit code, output, the modules of WATCHED imported) of `wdsfilter ARGS` with `blocked` unimportable."""
    result = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(result), json.dumps(list(blocked)), *args],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=300)
    outcome = json.loads(result.read_text())
    return outcome["code"], proc.stdout + proc.stderr, outcome["loaded"]


def run_without_torch(tmp_path, *args):
    code, output, loaded = run_with_blocked_imports(tmp_path, ("torch",), *args)
    return code, output, "open_clip" in loaded


def assert_one_line_error(output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in output, output
    for needle in needles:
        assert needle in errors[0], output
