"""Steps 5 and 6 of tools/gpu_check.py (../shared/GPU_CHECKLIST.md): a sticky device error, and
the Ray engine with an actor killed mid-run. Both judge a run by its output folder: every shard
with a done marker has one row per sample (no duplicates), and a resumed or finished run leaves
every shard so.

StickyClip is the step-5 scorer, a plug-in ("tools.gpu_check_faults:StickyClip", as the CLI loads
any "module:Class"): CLIP scoring until, while `trip_file` exists, the batch after its `after`-th
breaks the device. On CUDA that is a real device-side assert (an out-of-bounds index in a kernel:
the context is unusable afterwards); on a CPU it raises the RuntimeError PyTorch raises for one,
which wdsfilter/score/faults.py classifies by its text, and keeps raising it (sticky). The file, not
an option, switches the fault on, so --resume runs with exactly the same settings.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from typing import Dict, List

from wdsfilter.score.scorers.clip import ClipScorer

ASSERT_TEXT = ("CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
               "assertions. (simulated on the CPU by tools/gpu_check_faults.py)")


class StickyClip(ClipScorer):
    name = "clip"

    def __init__(self, trip_file: str = "", after: int = 3, **kw):
        super().__init__(**kw)
        self.trip_file, self.after = trip_file, int(after)
        self._batches, self._broken = 0, False

    def load(self, device: str) -> None:
        self._device_name = device
        super().load(device)

    def score_batch(self, inputs):
        self._batches += 1
        if self._broken or (self._batches > self.after and self.trip_file and os.path.exists(self.trip_file)):
            self._broken = True
            device_side_assert(self._device_name)
        return super().score_batch(inputs)


class CappedClip(ClipScorer):
    """The step-3 scorer: CLIP whose model worker may use only `memory_fraction` of the GPU
    (torch.cuda.set_per_process_memory_fraction, set once the model is loaded). The planner plans
    from the card's free memory, which the cap does not change, so its batch meets a real
    OutOfMemoryError from PyTorch's allocator. On a CPU it is plain CLIP."""
    name = "clip"

    def __init__(self, memory_fraction: float = 0.1, **kw):
        super().__init__(**kw)
        self.memory_fraction = float(memory_fraction)

    def load(self, device: str) -> None:
        super().load(device)
        if device.startswith("cuda") and self.memory_fraction < 1:
            import torch
            torch.cuda.set_per_process_memory_fraction(self.memory_fraction, torch.device(device))


def device_side_assert(device: str) -> None:
    """A real device-side assert on CUDA (raised at the synchronize); its text on a CPU."""
    import torch
    if device.startswith("cuda"):
        torch.zeros(1, device=device)[torch.tensor([10], device=device)]
        torch.cuda.synchronize(device)
    raise RuntimeError(ASSERT_TEXT)


# -- reading an output folder -----------------------------------------------------------------------
def shard_keys(url: str) -> List[str]:
    with tarfile.open(url) as tar:
        return sorted({m.name.split(".", 1)[0] for m in tar if m.isreg()})


def markers(out: str) -> Dict[str, bytes]:
    folder = os.path.join(out, "done")
    if not os.path.isdir(folder):
        return {}
    return {n[:-5]: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if n.endswith(".json") and not n.startswith(".")}


def rows_per_shard(out: str) -> Dict[str, List[str]]:
    """Output name -> the keys of its score file's rows (duplicates kept)."""
    import pyarrow.parquet as pq
    folder = os.path.join(out, "scores")
    if not os.path.isdir(folder):
        return {}
    return {n[:-len(".parquet")]: [str(k) for k in pq.read_table(os.path.join(folder, n), columns=["key"])["key"]
                                   .to_pylist()] for n in sorted(os.listdir(folder)) if n.endswith(".parquet")}


def check_marked(urls: List[str], out: str) -> List[str]:
    """Problems: a marked shard whose score file is not one row per sample of the shard."""
    names = {os.path.basename(u)[:-len(".tar")]: u for u in urls}
    rows = rows_per_shard(out)
    problems = []
    for name in markers(out):
        got = rows.get(name, [])
        if sorted(got) != shard_keys(names[name]):
            problems.append(f"{name}: {len(got)} row(s), {len(set(got))} distinct, {len(shard_keys(names[name]))} "
                            f"sample(s)")
    return problems


# -- step 5 -----------------------------------------------------------------------------------------
def step_sticky(ctx) -> list:
    from tools.gpu_check import Row, make_shards, run_score
    size = ctx.size
    urls = make_shards(os.path.join(ctx.root, "sticky"), dict(size, shards=8, copies=1, unique=size["sticky_unique"]))
    out, trip = ctx.out("sticky"), os.path.join(ctx.root, "sticky-trip")
    open(trip, "w").close()
    model = ctx.fast
    args = ["--scorer", "tools.gpu_check_faults:StickyClip", "--scorer-opt", f"clip.model={model}",
            "--scorer-opt", f"clip.trip_file={trip}", "--caption-key", "txt", "--device", ctx.device,
            "--batch-size", str(size["sticky_batch"]), "--workers", "1"]
    if not model.startswith("local-dir:"):
        args += ["--scorer-opt", "clip.pretrained=random"]
    first = run_score(urls, out, args, ctx.gpu, size["timeout"])
    before = markers(out)
    bad_first = check_marked(urls, out)
    os.remove(trip)  # a healthy device
    again = run_score(urls, out, [*args, "--resume"], ctx.gpu, size["timeout"], overwrite=False)
    after = markers(out)
    unfinished = len(urls) - len(before)
    expected = sum(len(shard_keys(u)) for u in urls if os.path.basename(u)[:-4] not in before)
    summary = again["summary"]
    sticky = "sticky error" in first["stderr"] and "device-side assert" in first["stderr"]
    kept = all(after.get(n) == b for n, b in before.items())  # the done shards were not written again
    bad = check_marked(urls, out)
    measured = (f"rc {first['rc']} (sticky message: {sticky}); {len(before)} of {len(urls)} shard(s) marked, "
                f"{unfinished} unfinished; marked-but-incomplete: {bad_first or 'none'}; resume rc {again['rc']}: "
                f"{summary.get('shards_resumed')} kept, {summary.get('samples_this_run')} sample(s) rescored "
                f"(expected {expected}); afterwards {len(after)}/{len(urls)} marked, incomplete: {bad or 'none'}")
    ok = (first["rc"] == 3 and sticky and unfinished > 0 and not bad_first and again["rc"] == 0 and kept
          and summary.get("shards_resumed") == len(before) and summary.get("samples_this_run") == expected
          and len(after) == len(urls) and not bad)
    return [Row("5 sticky device error", measured, "exit 3; no marker on an unfinished shard; --resume rescores "
                "exactly them, one row per sample", ok)]



# -- step 6 -----------------------------------------------------------------------------------------
@contextmanager
def ray_cluster(ctx):
    """A Ray cluster for `--ray-address auto`; yields the env of the runs (RAY_ADDRESS pins this
    cluster). CUDA: `ray start --head --num-gpus=1`, `ray stop` at the end (a dedicated machine).
    Dry mode: ray.init here with 4 CPUs, shut down at the end: only this process's Ray stops.
    PYTHONPATH: Ray's workers import this checkout's wdsfilter."""
    from tools.gpu_check import ROOT
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    if ctx.gpu:
        ray_bin = [sys.executable, "-m", "ray.scripts.scripts"]  # Ray's CLI, also where no `ray` script is
        subprocess.run([*ray_bin, "start", "--head", "--num-gpus=1", "--port=6379", "--include-dashboard=false",
                        "--disable-usage-stats"], check=True, capture_output=True, env=dict(os.environ, **env))
        try:
            yield dict(env, RAY_ADDRESS="127.0.0.1:6379")
        finally:
            subprocess.run([*ray_bin, "stop"], capture_output=True)
        return
    import ray
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the raylet, and so every worker, inherits it
    try:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)
    try:
        yield dict(env, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def actor_pids(gpu: bool) -> List[int]:
    """PIDs of the running ScoreActor processes (Ray titles them "ray::MapWorker(...ScoreActor...)").
    Dry mode: among this process's descendants (its own Ray); CUDA: on the machine."""
    import psutil
    procs = psutil.process_iter() if gpu else psutil.Process().children(recursive=True)
    found = []
    for p in procs:
        try:
            if "ScoreActor" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            pass
    return sorted(found)


def kill_one_actor(ctx, out: str, report: dict):
    """For run_score(during=...): once both actors run and a shard is done, kill -9 one actor."""
    def during(proc):
        deadline = time.time() + ctx.size["timeout"]
        while proc.poll() is None and time.time() < deadline:
            pids = actor_pids(ctx.gpu)
            if len(pids) >= 2 and markers(out):
                report.update(pid=pids[0], done_at_kill=len(markers(out)), actors=len(pids))
                os.kill(pids[0], signal.SIGKILL)
                return
            time.sleep(0.05)
    return during


def step_ray(ctx) -> list:
    from tools.gpu_check import Row, make_shards
    size = ctx.size
    model = ctx.fast
    common = ["--engine", "ray", "--ray-address", "auto", "--scorer", "clip", "--model", model, "--caption-key", "txt"]
    if not model.startswith("local-dir:"):
        common += ["--pretrained", "random"]
    urls = make_shards(os.path.join(ctx.root, "ray"), dict(size, shards=size["ray_shards"], copies=2))
    report: dict = {}
    try:
        speed, killed = _ray_runs(ctx, common, urls, report)
    except (OSError, subprocess.CalledProcessError, RuntimeError, ConnectionError) as e:  # Ray did not start
        detail = getattr(e, "stderr", b"") or b""
        return [Row("6 ray on GPU", f"the Ray cluster did not start: {e} {detail.decode(errors='replace')[-300:]}",
                    "the run finishes", False)]
    return _ray_row(ctx, model, urls, report, speed, killed)


def _ray_runs(ctx, common, urls, report):
    from tools.gpu_check import run_score
    size = ctx.size
    with ray_cluster(ctx) as env:
        speed = run_score(ctx.big_urls, ctx.out("ray-speed"), common, ctx.gpu, size["timeout"], env=env)
        shared = ["--ray-actors", "2", "--ray-gpus-per-actor", "0.5" if ctx.gpu else "0", "--batch-size",
                  str(size["ray_batch"])]
        killed = run_score(urls, ctx.out("ray-kill"), common + shared, ctx.gpu, size["timeout"], env=env,
                           during=kill_one_actor(ctx, ctx.out("ray-kill"), report))
    return speed, killed


def _ray_row(ctx, model, urls, report, speed, killed):
    from tools.gpu_check import Row
    total = len(urls)
    s = speed["summary"]
    rate = s.get("samples_this_run", 0) / max(s.get("scoring_seconds", 0) or 1e-9, 1e-9)
    local = ctx.e2e.get(model)
    versus = f"{rate / local:.2f} x step 4's {local:.0f}/s" if local else "step 4 not run"
    bad = check_marked(urls, ctx.out("ray-kill"))
    done = len(markers(ctx.out("ray-kill")))
    mid = bool(report) and report["done_at_kill"] < total
    measured = (f"1 actor: rc {speed['rc']}, {rate:.0f} samples/s ({versus}); 2 actors: killed pid "
                f"{report.get('pid', '-')} with {report.get('done_at_kill', '-')}/{total} shard(s) done; rc "
                f"{killed['rc']}, {done}/{total} marked, not one row per sample: {bad or 'none'}")
    ok = speed["rc"] == 0 and killed["rc"] == 0 and mid and done == total and not bad
    return [Row("6 ray on GPU" if ctx.gpu else "6 ray (CPU actors)", measured, "kill -9 of an actor mid-run; every "
                "shard one row per sample, no duplicates, the run finishes", ok)]
