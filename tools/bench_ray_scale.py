"""Benchmark: a data set much larger than Ray's object store, scored on a Ray cluster of several
nodes with bounded memory (issue 33 item 2's seed scenario).

    python tools/bench_ray_scale.py [--gb 1.1] [--small-gb 0.28] [--store-mb 100] [--workers 2]
                                    [--actors 2] [--json out.json]
    python tools/bench_ray_scale.py --quick   # 0.06 GB and 0.2 GB: the tool's own check

It starts a Ray cluster on this machine (ray.cluster_utils: a head node and --workers worker
nodes, every node's object store capped at --store-mb) and runs `wdsfilter score --engine ray
--ray-address ...` as its own process (the driver) over shards of real photos (768-1024 px JPEGs
with captions, tools/bench_decode.make_jpegs) with CLIP's real preparation (decode, ViT-B-32's
transform to 3x224x224 uint8 pixels and its tokenizer: 150 KB per row through the object store)
and a model that returns zeros (tools/bench_dispatch.NoopClip): what is measured is the data
moving through Ray, not a model on this machine's 2 cores. The run folder is on the driver.

Two runs, each on a fresh cluster, side by side: the small data set and the large one. Printed
for each, sampled every 0.2 s from /proc and from the raylets:

  peak RSS     of the driver, of every raylet, GCS and Ray worker process (each process's own
               peak, VmHWM; a worker's includes the object store pages it mapped), and the peak
               of the sum of their PSS (shared pages divided among the processes that map them,
               so the sum is the memory really used); the driver's RSS when half the shards
               were written and when all were (before the run's end: summary, report)
  spilled      bytes Ray spilled to disk and restored (the raylets' totals), and the most that
               lay in the nodes' spill folders at one moment
  waiting for plasma memory
               the most tasks a raylet held back for object store memory at one moment
               (num_waiting_for_plasma_memory of its debug state, dumped every second)
  longest gap  between two shards finished by the driver: a stalled run shows here

and last the ratio lines: `ratio data / one node's object store = R` (the scenario: >= 10) and
`ratio peak memory large / small = R` (the peak PSS sums; goal <= 1.25: the memory does not grow
with the data set).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PER_SHARD = 256
MB = 2**20


# -- the data set -------------------------------------------------------------------------------------
def make_data(folder: str, gigabytes: float) -> dict:
    """Shards of PER_SHARD photos with captions until they hold `gigabytes`; {shards, bytes, samples}."""
    from tools.bench_dispatch import clip_shards
    from tools.bench_decode import make_jpegs
    per_sample = sum(map(len, make_jpegs(16))) / 16
    shards = max(2, round(gigabytes * 2**30 / (per_sample * PER_SHARD)))
    urls = clip_shards(folder, shards, PER_SHARD)
    return {"folder": folder, "shards": len(urls), "bytes": sum(os.path.getsize(u) for u in urls),
            "samples": len(urls) * PER_SHARD}


# -- the cluster -----------------------------------------------------------------------------------------
class Cluster:
    """ray.cluster_utils.Cluster on this machine: a head node of one CPU (the driver's) and
    `workers` nodes of two, every object store `store` bytes, every node its own temporary folder."""

    def __init__(self, root: str, workers: int, store: int):
        from ray.cluster_utils import Cluster as RayCluster
        self.root = root
        os.environ["RAY_TMPDIR"] = root  # where cluster_utils writes the address file (not /tmp/ray)
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        os.makedirs(os.path.join(root, "ray"), exist_ok=True)
        env = {"PYTHONPATH": ROOT, "RAY_USAGE_STATS_ENABLED": "0"}
        self.temps = [self._temp("head")]
        self.cluster = RayCluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, object_store_memory=store, include_dashboard=False, temp_dir=self.temps[0], env_vars=env,
            _system_config={"debug_dump_period_milliseconds": 1000}))
        for i in range(workers):
            self.temps.append(self._temp(f"w{i}"))
            self.cluster.add_node(num_cpus=2, object_store_memory=store, temp_dir=self.temps[-1], env_vars=env)
        self.cluster.wait_for_nodes()

    def _temp(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def address(self) -> str:
        return self.cluster.address

    def spilled(self) -> Dict[str, int]:
        """The raylets' totals: bytes spilled and restored (Ray's internal memory-info call)."""
        try:
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address
            stats = get_memory_info_reply(get_state_from_address(self.address)).store_stats
            return {"spilled": int(stats.spilled_bytes_total), "restored": int(stats.restored_bytes_total)}
        except Exception as e:  # noqa: BLE001 - a private API: say so rather than fail the bench
            return {"error": str(e)}

    def spill_bytes(self) -> int:
        """Bytes in the nodes' spill folders now."""
        total = 0
        for temp in self.temps:
            for path in glob.glob(os.path.join(temp, "session_*", "ray_spilled_objects*", "**"), recursive=True):
                try:
                    total += os.path.getsize(path) if os.path.isfile(path) else 0
                except OSError:
                    pass
        return total

    def waiting_for_plasma(self) -> int:
        """The most tasks one raylet holds back for object store memory now (its debug state)."""
        most = 0
        for temp in self.temps:
            for path in glob.glob(os.path.join(temp, "session_*", "logs", "debug_state.txt")):
                try:
                    with open(path) as f:
                        found = re.findall(r"num_waiting_for_plasma_memory: (\d+)", f.read())
                except OSError:
                    continue
                most = max([most, *map(int, found)])
        return most

    def close(self) -> None:
        self.cluster.shutdown()


# -- watching the processes ---------------------------------------------------------------------------------
def _status(pid: int) -> Dict[str, int]:
    """VmHWM (the process's own peak RSS) and its PSS now (shared pages, the object store's
    included, divided among the processes that map them: these add up)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) * 1024
    return out


def _role(pid: int, driver: Optional[int]) -> str:
    if pid == driver:
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    first = words[0]
    name = os.path.basename(first.split()[0]) if first.strip() else ""
    if name in ("raylet", "gcs_server"):  # before the workers: a raylet's arguments name default_worker.py
        return {"gcs_server": "gcs"}.get(name, name)
    script = os.path.basename(words[1]) if len(words) > 1 and words[1].endswith(".py") else ""
    if first.startswith("ray::") or script == "default_worker.py":
        return "ray worker"
    return script[:-3] if script else "other"  # Ray's agents and monitors


class Watch:
    """Every 0.2 s: each process under this one (the cluster's and the driver's) and its peak RSS,
    the sum of their PSS, the spill folders, the raylets' waiting tasks, the finished shards."""

    def __init__(self, cluster: Cluster, out: str):
        import psutil
        self.psutil, self.cluster, self.out = psutil, cluster, out
        self.driver: Optional[int] = None
        self.peaks: Dict[int, tuple] = {}  # pid -> (role, VmHWM)
        self.total = self.spill = self.waiting = 0
        self.done_times: List[float] = []
        self.driver_rss: List[tuple] = []  # (shards done, the driver's RSS)
        self.titles: Dict[int, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        me = self.psutil.Process()
        done = 0
        while not self.stop.wait(0.2):
            total = 0
            for p in me.children(recursive=True):
                try:
                    s = _status(p.pid)
                except (OSError, StopIteration):
                    continue
                total += s.get("Pss", 0)
                role, before = self.peaks.get(p.pid, (None, 0))
                role = role or _role(p.pid, self.driver)
                self.peaks[p.pid] = (role, max(s.get("VmHWM", 0), before))
                if role == "ray worker" and s.get("VmHWM", 0) > before:  # what it ran as its peak grew
                    try:
                        self.titles[p.pid] = p.cmdline()[0]  # ray::MapWorker(...), ray::IDLE, ...
                    except (self.psutil.Error, IndexError):
                        pass
                elif role == "driver":
                    self.driver_rss.append((done, s.get("VmRSS", 0)))
            self.total = max(self.total, total)
            self.spill = max(self.spill, self.cluster.spill_bytes())
            self.waiting = max(self.waiting, self.cluster.waiting_for_plasma())
            now = len(glob.glob(os.path.join(self.out, "done", "*.json")))
            self.done_times += [time.monotonic()] * (now - done)
            done = now

    def finish(self) -> dict:
        self.stop.set()
        self.thread.join()
        by_role: Dict[str, List[int]] = {}
        for role, peak in self.peaks.values():
            by_role.setdefault(role, []).append(peak)
        gaps = [b - a for a, b in zip(self.done_times, self.done_times[1:])]
        workers = [(peak, pid) for pid, (role, peak) in self.peaks.items() if role == "ray worker"]
        largest = self.titles.get(max(workers)[1], "?") if workers else "?"
        shards = len(self.done_times)
        # the driver's RSS once half the shards were done, and when the last one was (before the
        # end of the run: summary, statistics, report)
        half = [rss for done, rss in self.driver_rss if done >= shards / 2]
        last = [rss for done, rss in self.driver_rss if done >= shards]
        return {"peak_rss": {r: max(v) for r, v in by_role.items()}, "processes": {r: len(v) for r, v in by_role.items()},
                "largest_worker": largest, "driver_rss_half": half[0] if half else 0,
                "driver_rss_all_done": last[0] if last else 0,
                "peak_rss_sum": self.total, "spill_peak_on_disk": self.spill, "waiting_for_plasma_max": self.waiting,
                "longest_gap_s": max(gaps, default=0.0)}


# -- one run ----------------------------------------------------------------------------------------------
def run(data: dict, args, root: str) -> dict:
    cluster = Cluster(os.path.join(root, "cluster"), args.workers, args.store_mb * MB)
    out = os.path.join(root, "run")
    watch = Watch(cluster, out)
    try:
        command = [sys.executable, "-m", "wdsfilter", "score", data["folder"], "--out", out, "--engine", "ray",
                   "--ray-address", cluster.address, "--ray-actors", str(args.actors), "--batch-size", "64",
                   "--scorer", "tools.bench_dispatch:NoopClip", "--scorer-opt", "clip.model=ViT-B-32",
                   "--scorer-opt", "clip.pretrained=random", "--caption-key", "txt", "-q"]
        start = time.monotonic()
        driver = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        watch.driver = driver.pid
        said, _ = driver.communicate()
        seconds = time.monotonic() - start
    finally:
        measured = watch.finish()
        measured.update(cluster.spilled())
        cluster.close()
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    shutil.rmtree(root, ignore_errors=True)
    return dict(measured, exit=driver.returncode, seconds=seconds, rows=summary.get("rows"),
                shards_failed=len(summary.get("shards_failed", [])), said=said.strip().splitlines()[-3:])


PREPARED = 3 * 224 * 224 + 77 * 8  # bytes of one row's prepared inputs (pixels, token ids)


def show(name: str, data: dict, m: dict, store: int, node_store: int) -> None:
    print(f"{name}: {data['shards']} shards, {data['bytes'] / MB:,.0f} MB ({data['bytes'] / node_store:.1f} x one "
          f"node's object store of {node_store / MB:,.0f} MB, {data['bytes'] / store:.1f} x the cluster's), "
          f"{data['samples']:,} samples, {data['samples'] * PREPARED / MB:,.0f} MB of prepared inputs through Ray")
    print(f"  exit {m['exit']}, {m['rows']:,} rows, {m['shards_failed']} shard(s) failed, {m['seconds']:.0f} s "
          f"({m['rows'] / m['seconds']:.0f} samples/s)")
    peaks = ", ".join(f"{r} {v / MB:,.0f} MB" for r, v in sorted(m["peak_rss"].items()))
    print(f"  peak RSS (the largest process of each kind): {peaks}; peak PSS of all at once "
          f"{m['peak_rss_sum'] / MB:,.0f} MB "
          f"({', '.join(f'{n} {r}' for r, n in sorted(m['processes'].items()))} process(es))")
    print(f"  the largest Ray worker: {m['largest_worker']}; the driver's RSS with half the shards done "
          f"{m['driver_rss_half'] / MB:,.0f} MB, with all done {m['driver_rss_all_done'] / MB:,.0f} MB")
    if "error" in m:
        print(f"  spilled: unknown ({m['error']}); peak in the spill folders {m['spill_peak_on_disk'] / MB:,.0f} MB")
    else:
        print(f"  spilled {m['spilled'] / MB:,.0f} MB, restored {m['restored'] / MB:,.0f} MB; "
              f"peak in the spill folders {m['spill_peak_on_disk'] / MB:,.0f} MB")
    print(f"  tasks waiting for plasma memory (most at once, one raylet): {m['waiting_for_plasma_max']}; "
          f"longest gap between two finished shards {m['longest_gap_s']:.1f} s")
    if m["exit"] != 0:
        print("  the run said: " + " | ".join(m["said"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.1, help="the large data set [1.1]")
    parser.add_argument("--small-gb", type=float, default=0.28, help="the small data set [0.28]")
    parser.add_argument("--store-mb", type=int, default=100, help="every node's object store [100]")
    parser.add_argument("--workers", type=int, default=2, help="worker nodes beside the head [2]")
    parser.add_argument("--actors", type=int, default=2, help="model actors [2]")
    parser.add_argument("--quick", action="store_true", help="0.06 and 0.2 GB")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.small_gb, args.gb = 0.06, 0.2
    results = {}
    base = tempfile.mkdtemp(prefix="brs", dir="/tmp")  # Ray's socket paths must stay short
    store = args.store_mb * MB * (args.workers + 1)
    try:
        for name, gb in (("small", args.small_gb), ("large", args.gb)):
            data = make_data(os.path.join(base, f"data-{name}"), gb)
            m = run(data, args, os.path.join(base, name))
            shutil.rmtree(data["folder"], ignore_errors=True)
            show(name, data, m, store, args.store_mb * MB)
            results[name] = {"data": data, **m}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    small, large = results["small"], results["large"]
    print(f"ratio data / one node's object store = {large['data']['bytes'] / (args.store_mb * MB):.1f} "
          f"(the scenario: >= 10)")
    print(f"ratio peak memory large / small = {large['peak_rss_sum'] / small['peak_rss_sum']:.2f} "
          f"(goal <= 1.25: memory does not grow with the data set)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if small["exit"] == large["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
