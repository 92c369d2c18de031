"""GPU acceptance checks for `wdsfilter score` (../shared/GPU_CHECKLIST.md) in one command.

    python tools/gpu_check.py                    # a CUDA machine: about 20 minutes, real sizes
    python tools/gpu_check.py --dry-run-cpu      # every step's logic on the CPU, tiny sizes (tests)
    python tools/gpu_check.py --only 1,3,7 --json table.json
    python tools/gpu_check.py --quick --deadline 450 --keep /tmp/gc   # inside a 15-minute GPU lease
                                                                      # (tools/gpu_lease.sh)

Steps 5 and 6 live in tools/gpu_check_faults.py. Step 6 on CUDA runs `ray start --head` and, at
the end, `ray stop` (which stops every Ray on the machine: use a machine of its own); its dry mode
starts and shuts down a Ray of its own in this process.

Each step runs `python -m wdsfilter score` in a subprocess (so the processes that hold GPU memory
can be told apart: the main process, its forked DataLoader workers, the spawned model workers),
samples `nvidia-smi` every second while it runs, and reads the run's summary.json and score
files. It prints one row per step: what was measured, the pass line, PASS/FAIL (SKIP where the
machine cannot run it, e.g. step 1's "nothing on GPU 0" with one GPU).

Steps run in the order --only gives (most telling first); with --deadline a step whose estimated
time no longer fits is not started and gets a SKIP row saying so. The table is written to --json
after every step, so a lease that ends mid-run still leaves the rows already measured.

Data: shards of 1280x720 JPEGs (--dry-run-cpu: 64x48) with captions, every fourth with rendered
text, made here with PIL and webdataset's TarWriter, then replicated with fresh keys. Models:
open_clip architectures with random weights (--pretrained random: no model hub), the tiny local
CLIP (tools/make_tiny_clip.py) for score equality, and a randomly initialised CRAFT saved as
easyocr's craft_mlt_25k.pth for OCR; --dry-run-cpu uses a tiny random open_clip ViT saved as a
local-dir: folder.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from wdsfilter.score.memory import CUDA_CONTEXT_BYTES  # noqa: E402 - torch-free

REAL = {"width": 1280, "height": 720, "unique": 512, "shards": 8, "copies": 4, "big_model": "ViT-L-14",
        "fast_model": "ViT-B-32", "oom_batch": 12288, "throughput_copies": 12, "throughput_shards": 16, "timeout": 600,
        "sticky_unique": 64, "sticky_batch": 32, "ray_shards": 8, "ray_batch": 128, "oom_fraction": 0.1}
DRY = {"width": 64, "height": 48, "unique": 24, "shards": 2, "copies": 1, "big_model": None, "fast_model": None,
       "oom_batch": 64, "throughput_copies": 1, "timeout": 1800,  # a hang guard only: under load 40 a
       # dry Ray run took over 300 s on 2 cores (its outcome must not depend on the load)
       "sticky_unique": 2, "sticky_batch": 2, "ray_shards": 8, "ray_batch": 8, "oom_fraction": 1.0}
# The real sizes scaled to a 15-minute lease: 4,096 samples for steps 1-3, 16,384 for throughput.
# Throughput reads 16 shards: a shard is read by one decode worker, so fewer shards than cores leave
# cores idle (the first H100 run read 4 shards with 4 workers: 1,452 samples/s for B/32).
QUICK = dict(REAL, unique=128, shards=4, copies=8, throughput_copies=8, timeout=150)
# Seconds each step took at QUICK sizes on the first H100 run (6: an estimate; it has not run), for --deadline.
ESTIMATE = {1: 45, 2: 125, 3: 50, 4: 270, 5: 80, 6: 120, 7: 55, 8: 150}  # 8: an estimate (never run)


@dataclass
class Row:
    step: str
    measured: str
    pass_line: str
    ok: Optional[bool]  # None: skipped (the machine cannot run it)

    def verdict(self) -> str:
        return "SKIP" if self.ok is None else ("PASS" if self.ok else "FAIL")


# -- data and models -------------------------------------------------------------------------
def make_shards(folder: str, size: dict) -> List[str]:
    """JPEGs with captions (every fourth with rendered text), replicated into shards."""
    from PIL import Image, ImageDraw
    from tools.benchkit import replicate
    rng = random.Random(0)
    members = []
    colours = ["red", "green", "blue", "yellow", "purple", "orange"]
    for i in range(size["unique"]):
        colour = rng.choice(colours)
        image = Image.new("RGB", (size["width"], size["height"]), rng.choice(colours))
        draw = ImageDraw.Draw(image)
        w, h = size["width"], size["height"]
        draw.ellipse([w // 4, h // 4, w // 2, h * 3 // 4], fill=colour)
        if i % 4 == 0:
            draw.text((w // 10, h // 10), "SALE 50% OFF TODAY ONLY", fill="white")
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=85)
        members += [(f"s{i:05d}.jpg", buf.getvalue()), (f"s{i:05d}.txt", f"a {colour} circle".encode())]
    return replicate(folder, members, size["shards"], size["copies"])


def tiny_random_clip(folder: str) -> str:
    """A tiny open_clip ViT with random weights in local-dir: layout (dry runs)."""
    import open_clip
    from safetensors.torch import save_file
    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
           "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "open_clip_config.json"), "w") as f:
        json.dump({"model_cfg": cfg, "preprocess_cfg": {}}, f)
    model = open_clip.CLIP(**cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(folder, "open_clip_model.safetensors"))
    return "local-dir:" + folder


# -- watching a run ----------------------------------------------------------------------------
class Sampler(threading.Thread):
    """Every second: GPU memory per PID and GPU utilisation (nvidia-smi), and the CPU% of the
    watched main process and its children (psutil)."""

    def __init__(self, pid: int, gpu: bool):
        super().__init__(daemon=True)
        import psutil
        self.proc, self.gpu = psutil.Process(pid), gpu
        self.memory: Dict[int, int] = {}      # pid -> most MiB seen
        self.last: Dict[int, int] = {}        # pid -> MiB at the last sample that listed it
        self.util: List[float] = []
        self.main_cpu: List[float] = []
        self.spawned: set = set()             # model workers (multiprocessing spawn)
        self.forked: set = set()              # DataLoader workers and others
        self._halt = threading.Event()

    def run(self):
        import psutil
        try:
            self.proc.cpu_percent(None)
        except psutil.Error:
            return
        while not self._halt.wait(1.0):
            try:
                self.main_cpu.append(self.proc.cpu_percent(None))
                for child in self.proc.children(recursive=True):
                    cmd = " ".join(child.cmdline())
                    (self.spawned if "multiprocessing.spawn" in cmd or "spawn_main" in cmd else self.forked).add(child.pid)
            except psutil.Error:
                pass
            if self.gpu:
                for line in _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"):
                    pid, mib = (int(x) for x in line.split(",")[:2])
                    self.memory[pid] = max(self.memory.get(pid, 0), mib)
                    self.last[pid] = mib
                self.util += [float(x) for x in _smi("--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")]

    def stop(self):
        self._halt.set()
        self.join(timeout=5)


def _smi(*args) -> List[str]:
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def run_score(urls, out: str, args: List[str], gpu: bool, timeout: float, overwrite: bool = True,
              env: Optional[dict] = None, during=None) -> dict:
    """`python -m wdsfilter score` in a subprocess, watched; its summary, stderr, exit code, samples.
    `during(proc)` runs in a thread while it does (step 6 kills a Ray actor from there)."""
    cmd = [sys.executable, "-m", "wdsfilter", "score", *urls, "--out", out, "--no-progress",
           *(["--overwrite"] if overwrite else []), *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    if during is not None:
        threading.Thread(target=during, args=(proc,), daemon=True).start()
    sampler = Sampler(proc.pid, gpu)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    sampler.stop()
    _keep_log(out, cmd, proc.returncode, stdout, stderr)
    summary = {}
    if os.path.isfile(os.path.join(out, "summary.json")):
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    return {"rc": proc.returncode, "stdout": stdout, "stderr": stderr, "summary": summary, "sampler": sampler,
            "seconds": time.perf_counter() - start, "main_pid": proc.pid}


def _keep_log(out: str, cmd: List[str], rc: int, stdout: str, stderr: str) -> None:
    """Each run's command line, exit code and output, beside its output folder (OUT.log, appended:
    a resumed run follows the first), for reading a failed step afterwards."""
    os.makedirs(os.path.dirname(out.rstrip("/")), exist_ok=True)
    with open(out.rstrip("/") + ".log", "a") as f:
        f.write(f"$ {' '.join(cmd)}\n# rc {rc}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")


def _scores(out: str) -> Dict[str, float]:
    import pyarrow.parquet as pq
    scores = {}
    for name in sorted(os.listdir(os.path.join(out, "scores"))):
        table = pq.read_table(os.path.join(out, "scores", name)).to_pydict()
        for url, key, value in zip(table["shard"], table["key"], table.get("clip_score", [])):
            if value is not None:
                scores[f"{os.path.basename(str(url))}/{key}"] = value
    return scores


def _batches(summary: dict, scorer: str = "clip") -> List[dict]:
    """Planned and final batch and back-off events of `scorer`, per model worker."""
    return [{"worker": w.get("worker"), "planned": b["planned_batch_size"], "final": b["final_batch_size"],
             "events": b["events"]} for w in summary.get("workers", [])
            for name, b in (w.get("backoff") or {}).items() if name == scorer]


# -- the steps ---------------------------------------------------------------------------------
def clip_alone(ctx) -> dict:
    """The big CLIP model alone on the step-1 shards: step 1 watches it, step 2a compares it with the
    plan (the same run, made once)."""
    if "clip-alone" not in ctx.runs:
        ctx.runs["clip-alone"] = run_score(ctx.urls, ctx.out("plan-a"), ctx.clip_args(ctx.big), ctx.gpu,
                                           ctx.size["timeout"])
    return ctx.runs["clip-alone"]


def step_placement(ctx) -> List[Row]:
    r = clip_alone(ctx)
    s = r["sampler"]
    holders = set(s.memory)
    wrong = holders & ({r["main_pid"]} | s.forked)
    reinit = "Cannot re-initialize CUDA" in r["stderr"]
    measured = (f"rc {r['rc']}; GPU memory held by pids {sorted(holders) or '-'}; model workers {sorted(s.spawned)}; "
                f"main/loader pids holding memory: {sorted(wrong) or 'none'}; re-init error: {reinit}")
    ok = r["rc"] == 0 and not wrong and not reinit and (holders <= s.spawned if ctx.gpu else True)
    return [Row("1 placement", measured, "only model-worker PIDs hold GPU memory; no CUDA re-init error", ok)]


def ocr_args(ctx, fp16: bool = False) -> List[str]:
    """easyocr with the random CRAFT (no download, our own checkpoint: no checksum); frames at
    their own size in the dry run (64x48 enlarged to 736 would make the CPU run slow)."""
    options = {"verify_checksum": False}
    if fp16:
        options["fp16"] = True
    if not ctx.gpu:
        options["min_side"] = 0
    return ["--ocr-backend", "easyocr", "--ocr-model-dir", ctx.craft, "--no-ocr-download",
            "--scorer-opt", "ocr.backend_options=" + json.dumps(options)]


def step_plan(ctx) -> List[Row]:
    rows = []
    clip_only = [a for a in ctx.clip_args(ctx.big) if a not in ("--scorer", "clip")]
    for label, urls, args in (("a clip", ctx.urls, clip_only + ["--scorer", "clip"]),
                              ("b clip+ocr", ctx.urls[:1], clip_only + ["--scorer", "clip", "--scorer", "ocr"]
                               + ocr_args(ctx))):
        dry = run_score(urls, ctx.out(f"plan-dry-{label[0]}"), args + ["--dry-run"], ctx.gpu, ctx.size["timeout"])
        real = clip_alone(ctx) if label[0] == "a" else run_score(urls, ctx.out(f"plan-{label[0]}"), args, ctx.gpu,
                                                                 ctx.size["timeout"])
        # A dry run prints its plan and writes no summary; the real run's summary holds the same
        # planner's plan, which is what its workers were configured with.
        plan = real["summary"].get("plan", {})
        # Per process: the plan's need is the replicas' models and working memory plus the CUDA
        # context of every process but the first (whose context was in use when free memory was
        # read); nvidia-smi counts each process's own context, so each gets one here.
        context = CUDA_CONTEXT_BYTES if ctx.gpu else 0
        need = {d["device"]: (d["need"] + context) / max(1, d["replicas"]) for d in plan.get("devices", [])}
        peaks = {pid: mib * 2**20 for pid, mib in real["sampler"].memory.items()}
        worst = max((p / max(need.values()) for p in peaks.values()), default=0.0) if need else 0.0
        batches = _batches(real["summary"])
        same = bool(batches) and all(b["planned"] == b["final"] and not b["events"] for b in batches)
        ocr = _batches(real["summary"], "ocr")
        own = not ocr or any(b["planned"] != o["planned"] for b in batches for o in ocr) or label[0] == "a"
        measured = (f"rc {dry['rc']}/{real['rc']}; peak/plan per worker {worst:.2f} (plan {_mib(need)}, peaks "
                    f"{_mib(peaks)})" if ctx.gpu else
                    f"rc {dry['rc']}/{real['rc']}; plan need {sorted(need.values())} (no GPU: peaks not sampled)")
        measured += f"; clip batch planned/final {[(b['planned'], b['final']) for b in batches]}"
        if ocr:
            measured += f"; ocr batch planned/final {[(o['planned'], o['final']) for o in ocr]}"
        ok = dry["rc"] == 0 and real["rc"] == 0 and same and (worst <= 1.10 if ctx.gpu else True)
        rows.append(Row(f"2{label[0]} plan vs reality ({label[2:]})", measured,
                        "peak <= plan + 10%; planned batch == final; clip batch its own", ok and (own or not ctx.gpu)))
    return rows


def _mib(sizes: Dict) -> str:
    return ", ".join(f"{v / 2**20:.0f} MiB" for v in sizes.values()) or "-"


def step_oom(ctx) -> List[Row]:
    # The planner reads the card's free memory (cudaMemGetInfo) and clamps the batch to what fits
    # it, so on an 80 GB card a batch of 12,288 may simply fit. CappedClip lets its model worker use
    # only a share of the card (PyTorch's own per-process cap, set after loading): the planned batch
    # then meets a real OutOfMemoryError from PyTorch's allocator, as when another job takes memory.
    model = ["--scorer", "tools.gpu_check_faults:CappedClip", "--scorer-opt", f"clip.model={ctx.big}",
             "--scorer-opt", f"clip.memory_fraction={ctx.size['oom_fraction']}", "--caption-key", "txt",
             "--device", ctx.device]
    if not ctx.big.startswith("local-dir:"):
        model += ["--scorer-opt", "clip.pretrained=random"]
    args = model + ["--batch-size", str(ctx.size["oom_batch"]), "--fit", "clamp"]
    r = run_score(ctx.urls, ctx.out("oom"), args, ctx.gpu, ctx.size["timeout"])
    batches = _batches(r["summary"])
    events = [e for b in batches for e in b["events"]]
    rows = r["summary"].get("rows", 0)
    scored = r["summary"].get("status", {}).get("scored", 0)
    escaped = "autocast" in r["stderr"] and "Traceback" in r["stderr"]
    s = r["sampler"]
    held = {pid: (s.memory[pid], s.last[pid]) for pid in s.memory}
    measured = (f"rc {r['rc']}; {len(events)} out-of-memory event(s); batch {[(b['planned'], b['final']) for b in batches]}"
                f"; {scored}/{rows} scored; GPU MiB per pid peak/last seen {held or '-'}")
    # The memory a failed batch reserved is released (empty_cache) before the halved batch runs under
    # the same cap: were it kept, the smaller batches would fail too and inputs would be lost.
    ok = r["rc"] == 0 and scored == rows > 0 and not escaped and (
        bool(events) and all(b["final"] <= b["planned"] // 2 for b in batches) if ctx.gpu else True)
    return [Row("3 out-of-memory back-off", measured, ">= 1 OOM event, every input scored, batch halved, no error "
                "escaping autocast (the halved batches fit under the same cap: the reserve was released)", ok)]


def step_throughput(ctx) -> List[Row]:
    rows = []
    for model in ([ctx.fast, ctx.big] if ctx.gpu else [ctx.fast]):
        r = run_score(ctx.big_urls, ctx.out("throughput"), ctx.clip_args(model), ctx.gpu, ctx.size["timeout"])
        summary = r["summary"]
        e2e = summary.get("samples_this_run", 0) / max(summary.get("scoring_seconds", 0) or 1e-9, 1e-9)
        decode, model_only = _decode_and_model_rates(ctx, model, summary)
        util = r["sampler"].util
        cpu = r["sampler"].main_cpu
        measured = (f"{model}: end to end {e2e:.0f}/s, model only {model_only:.0f}/s, decode only {decode:.0f}/s; "
                    f"GPU util mean {sum(util) / len(util) if util else 0:.0f}%; main CPU mean "
                    f"{sum(cpu) / len(cpu) if cpu else 0:.0f}%")
        ctx.e2e[model] = e2e
        ok = r["rc"] == 0 and e2e >= 0.8 * min(decode, model_only)
        if ctx.gpu:
            ok = ok and (sum(cpu) / max(1, len(cpu)) < 50)
            if model == ctx.fast:
                ok = ok and e2e >= 5000
        rows.append(Row(f"4 throughput {model if ctx.gpu else 'tiny'}", measured,
                        "e2e >= 0.8 x min(model, decode); B/32 >= 5000/s; main < 50% CPU", ok))
    rates = {}
    for fp16 in ((False, True) if ctx.gpu else (False,)):
        r = run_score(ctx.urls[:1], ctx.out(f"ocr-fp16-{fp16}"), ["--scorer", "ocr", "--caption-key", "txt",
                      "--device", ctx.device] + ocr_args(ctx, fp16), ctx.gpu, ctx.size["timeout"])
        summary = r["summary"]
        rates[fp16] = (r["rc"], summary.get("samples_this_run", 0) / max(summary.get("scoring_seconds", 0) or 1e-9, 1e-9),
                       [(o["planned"], o["final"]) for o in _batches(summary, "ocr")])
    measured = "; ".join(f"fp16 {'on' if k else 'off'}: rc {rc}, {rate:.0f} frames/s, batch {b}"
                         for k, (rc, rate, b) in rates.items())
    rows.append(Row("4 throughput ocr (easyocr)", measured, "both run (frames/s recorded)",
                    all(rc == 0 and rate > 0 for rc, rate, _ in rates.values())))
    return rows


def _decode_and_model_rates(ctx, model: str, summary: dict):
    """Decode-only and model-only samples/s at the run's plan (tools/bench_score.py's methods)."""
    import torch
    from tools.bench_score import decode_only, model_only, prepared_inputs
    from wdsfilter import StageConfig
    from wdsfilter.score.scorers.clip import ClipScorer
    plan = summary.get("plan") or {}
    if not plan.get("devices"):
        return 0.0, 0.0
    stage = StageConfig(caption_key="txt")
    factory = (lambda: ClipScorer(model, "random" if not model.startswith("local-dir:") else None))
    n, seconds = decode_only(ctx.big_urls, stage, factory, plan, timed_from_first=True)
    decode = n / max(seconds, 1e-9)
    # Model only: a few hundred prepared samples, reused so that every batch is a full one.
    few = prepared_inputs(ctx.urls[:1], stage, factory, limit=512)
    batch = plan["devices"][0]["batch_size"]
    inputs = (few * (1 + max(4 * batch, 2048) // max(1, len(few))))[:max(4 * batch, 2048)]
    scorer = factory()
    device = plan["devices"][0]["device"]
    scorer.load(device)
    model_only(scorer, inputs[:batch], batch)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    model_only(scorer, inputs, batch)
    rate = len(inputs) / (time.perf_counter() - start)
    scorer.unload()
    return decode, rate


def step_equality(ctx) -> List[Row]:
    device = "cuda:0" if ctx.gpu else "cpu"
    args = ["--scorer", "clip", "--model", ctx.tiny, "--caption-key", "txt;json:description"]
    shards = [os.path.join(ROOT, "sample_shards", n) for n in ("images-000000.tar", "images-000001.tar")]
    a = run_score(shards, ctx.out("eq-cpu"), args + ["--device", "cpu"], ctx.gpu, ctx.size["timeout"])
    b = run_score(shards, ctx.out("eq-dev"), args + ["--device", device] + ([] if ctx.gpu else ["--precision", "bf16"]),
                  ctx.gpu, ctx.size["timeout"])
    cpu, dev = _scores(ctx.out("eq-cpu")), _scores(ctx.out("eq-dev"))
    diff = max((abs(cpu[k] - dev[k]) for k in cpu if k in dev), default=float("inf"))
    limit = 2e-3 if ctx.gpu else 2e-2  # the CPU dry run compares bf16 autocast with fp32
    ok = a["rc"] == 0 and b["rc"] == 0 and set(cpu) == set(dev) and len(cpu) > 0 and diff <= limit
    return [Row("7 score equality", f"{len(cpu)} samples; max |{device} - cpu| = {diff:.2e}",
                f"every clip_score within {limit:g} of the CPU value", ok)]


def step_gpu_decode(ctx) -> List[Row]:
    """B/32 on the throughput shards with the JPEGs decoded by the decode workers (--decode-device
    cpu) and in batches on the GPU (--decode-device cuda): images/s of each, the main process's CPU,
    and the scores of the two runs against each other (the GPU decodes at full size, the workers at
    a reduced DCT scale: docs/clip.md). On the CPU (dry run) a GPU decode cannot run: the step checks
    that asking for it is refused in one line (exit 2) and that the CPU path scores."""
    model = ctx.fast
    runs = {}
    for where in ("cpu", "cuda") if ctx.gpu else ("cpu",):
        runs[where] = run_score(ctx.big_urls, ctx.out(f"decode-{where}"), ctx.clip_args(model) +
                                ["--decode-device", where], ctx.gpu, ctx.size["timeout"])
    if not ctx.gpu:
        refused = run_score(ctx.urls[:1], ctx.out("decode-refused"), ctx.clip_args(model) + ["--decode-device", "cuda"],
                            ctx.gpu, ctx.size["timeout"])
        one_line = [line for line in refused["stderr"].splitlines() if line.strip()]
        ok = refused["rc"] == 2 and len(one_line) == 1 and "decode" in one_line[0] and runs["cpu"]["rc"] == 0
        return [Row("8 gpu decode", f"--decode-device cuda on a CPU: rc {refused['rc']}, {one_line[-1:]}; cpu path rc "
                    f"{runs['cpu']['rc']}", "refused in one line (exit 2); the CPU path scores", ok)]
    rates, cpu = {}, {}
    for where, r in runs.items():
        summary = r["summary"]
        rates[where] = summary.get("samples_this_run", 0) / max(summary.get("scoring_seconds", 0) or 1e-9, 1e-9)
        cpu[where] = sum(r["sampler"].main_cpu) / max(1, len(r["sampler"].main_cpu))
    a, b = _scores(ctx.out("decode-cpu")), _scores(ctx.out("decode-cuda"))
    diff = max((abs(a[k] - b[k]) for k in a if k in b), default=float("inf"))
    ok = all(r["rc"] == 0 for r in runs.values()) and set(a) == set(b) and len(a) > 0 and diff <= 0.01
    measured = (f"{model}: decode workers {rates['cpu']:.0f}/s, GPU decode {rates['cuda']:.0f}/s "
                f"({rates['cuda'] / max(rates['cpu'], 1e-9):.2f}x); main CPU {cpu['cpu']:.0f}% / {cpu['cuda']:.0f}%; "
                f"{len(a)} samples, max |score difference| {diff:.2e}")
    return [Row("8 gpu decode", measured, "both score every sample; scores within 0.01; images/s recorded", ok)]


def step_sticky(ctx) -> List[Row]:
    from tools.gpu_check_faults import step_sticky as run
    return run(ctx)


def step_ray(ctx) -> List[Row]:
    from tools.gpu_check_faults import step_ray as run
    return run(ctx)


STEPS = {1: step_placement, 2: step_plan, 3: step_oom, 4: step_throughput, 5: step_sticky, 6: step_ray,
         7: step_equality, 8: step_gpu_decode}


@dataclass
class Context:
    root: str
    gpu: bool
    size: dict
    urls: List[str] = field(default_factory=list)
    big_urls: List[str] = field(default_factory=list)
    big: str = ""
    fast: str = ""
    tiny: str = ""
    craft: str = ""  # folder of the random CRAFT checkpoint (easyocr's craft_mlt_25k.pth)
    runs: Dict[str, dict] = field(default_factory=dict)  # runs shared by steps (steps 1 and 2a)
    e2e: Dict[str, float] = field(default_factory=dict)  # step 4's end-to-end samples/s per model (step 6)

    @property
    def device(self) -> str:
        return "cuda:0" if self.gpu else "cpu"

    def out(self, name: str) -> str:
        return os.path.join(self.root, "out", name)

    def clip_args(self, model: str) -> List[str]:
        args = ["--scorer", "clip", "--model", model, "--caption-key", "txt"]
        if not model.startswith("local-dir:"):
            args += ["--pretrained", "random"]
        return args + ["--device", self.device]


def print_table(rows: List[Row], echo=print) -> None:
    width = max(len(r.step) for r in rows)
    echo(f"{'step':{width}s}  {'result':6s}  measured  |  pass line")
    for r in rows:
        echo(f"{r.step:{width}s}  {r.verdict():6s}  {r.measured}  |  {r.pass_line}")


def main(argv=None) -> List[Row]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run-cpu", action="store_true", help="every step's logic on the CPU, tiny sizes")
    ap.add_argument("--quick", action="store_true", help="the real sizes scaled to a 15-minute GPU lease")
    ap.add_argument("--only", default=None, help="steps to run, in this order, e.g. 7,1,3")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds: start no step whose estimate would end past this (it gets a SKIP row)")
    ap.add_argument("--tiny-clip", default=None, help="folder of the tiny local CLIP (default: build it)")
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the table here (after every step)")
    args = ap.parse_args(argv)
    begun = time.perf_counter()
    import torch
    gpu = not args.dry_run_cpu
    if gpu and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; run with --dry-run-cpu to check the steps' logic on the CPU")
    root = args.keep or tempfile.mkdtemp(prefix="gpu-check-")
    size = DRY if args.dry_run_cpu else (QUICK if args.quick else REAL)
    try:
        ctx = Context(root, gpu, size)
        ctx.urls = make_shards(os.path.join(root, "shards"), size)
        ctx.big_urls = make_shards(os.path.join(root, "big"), dict(size, copies=size["throughput_copies"],
                                                                  shards=size.get("throughput_shards", size["shards"])))
        dry_model = tiny_random_clip(os.path.join(root, "tiny-random")) if args.dry_run_cpu else None
        ctx.big, ctx.fast = size["big_model"] or dry_model, size["fast_model"] or dry_model
        ctx.tiny = "local-dir:" + (args.tiny_clip or _tiny_clip(root)) if (gpu or args.tiny_clip) else dry_model
        ctx.craft = random_craft(os.path.join(root, "craft"))
        steps = [int(s) for s in args.only.split(",")] if args.only else sorted(STEPS)
        rows: List[Row] = []
        for n in steps:
            spent = time.perf_counter() - begun
            if args.deadline is not None and spent + ESTIMATE[n] > args.deadline:
                rows.append(Row(f"{n} {STEPS[n].__name__[5:]}", f"not run: {spent:.0f} s spent, about {ESTIMATE[n]} s "
                                f"needed, deadline {args.deadline:.0f} s", "-", None))
                print(f"gpu_check: step {n} not started (deadline)", flush=True)
                continue
            start = time.perf_counter()
            print(f"gpu_check: step {n} starts at {start - begun:.0f} s", flush=True)
            try:
                new = STEPS[n](ctx)
            except Exception as e:  # one broken step must not lose the others' rows
                import traceback
                traceback.print_exc()
                new = [Row(f"{n} {STEPS[n].__name__[5:]}", f"the step raised {type(e).__name__}: {e}", "-", False)]
            for row in new:
                row.measured += f" ({time.perf_counter() - start:.0f} s)"
                print(f"gpu_check: {row.step}: {row.verdict()}: {row.measured}", flush=True)
            rows += new
            _write_json(args.json, rows)
        if gpu:
            print(f"GPU: {torch.cuda.get_device_name(0)}; driver {(_smi('--query-gpu=driver_version', '--format=csv,noheader') or ['?'])[0]}"
                  f"; torch {torch.__version__}")
        print_table(rows)
        _write_json(args.json, rows)
        return rows
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _write_json(path: Optional[str], rows: List[Row]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=2)


def random_craft(folder: str) -> str:
    """A randomly initialised CRAFT from easyocr's own class, saved under the file name easyocr's
    loader expects (no download; the scorer is told not to check the release checksum)."""
    import torch
    from easyocr.craft import CRAFT
    os.makedirs(folder, exist_ok=True)
    torch.save(CRAFT().state_dict(), os.path.join(folder, "craft_mlt_25k.pth"))
    return folder


def _tiny_clip(root: str) -> str:
    from tools import make_tiny_clip
    folder = os.path.join(root, "tiny-clip")
    make_tiny_clip.build(folder, make_tiny_clip.find_shards(make_tiny_clip.DEFAULT_SHARDS), quiet=True)
    return folder


if __name__ == "__main__":
    main()
