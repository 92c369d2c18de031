"""Memory of `wdsfilter score --scorer ocr --ocr-backend easyocr` with 1, 2 and 4 CPU model
processes, the real CRAFT loaded in each (docs/ocr.md, "Memory with several model processes").

    python tools/measure_ocr_memory.py                       # --replicas 1, 2, 4, no memory cap
    python tools/measure_ocr_memory.py --replicas 4 --max-memory 2.5GiB --fit clamp

The seed's problem was EasyOCR's model copied into every worker process until RAM ran out. Each
run here is a real command line; a thread samples its whole process tree every 50 ms (psutil):
the main process, the model processes and the decode workers. Per process it keeps the peak RSS
and the peak PSS (proportional set size: a page shared by n processes counts 1/n in each, so
the PSS of a tree adds up to the memory it really holds; forked decode workers share most of the
main process's pages, and a sum of RSS would count those pages again in each). It prints, per
run: the model processes the plan chose, the model's bytes as the run measured them (summary.json:
the plan's model line), each kind of process's peak RSS and PSS, and the tree's peak total of each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = os.path.join(REPO, "sample_shards", "ocr-images-000000.tar")
MiB = 2**20


class TreeSampler:
    """Peak memory of a process and all its descendants, sampled by a thread until stopped."""

    def __init__(self, pid: int, every: float = 0.05):
        import psutil
        self.root = psutil.Process(pid)
        self.every = every
        self.peak_rss = self.peak_pss = 0           # the tree's total, at its highest sample
        self.by_pid: Dict[int, dict] = {}           # pid -> {"kind", "rss", "pss"} peaks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def kind(self, proc) -> str:
        """main (the command itself), model process (spawned), decode worker (forked from main:
        the same command line, so told by being a child, not by its name) or resource tracker."""
        if proc.pid == self.root.pid:
            return "main"
        try:
            cmd = " ".join(proc.cmdline())
        except Exception:  # noqa: BLE001 - gone
            return "gone"
        if "resource_tracker" in cmd:
            return "resource tracker"
        if "spawn_main" in cmd:
            return "model process"
        return "decode worker"

    def _run(self) -> None:
        import psutil
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for p in procs:
                try:
                    info = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss, pss = rss + info.rss, pss + info.pss
                seen = self.by_pid.setdefault(p.pid, {"kind": self.kind(p), "rss": 0, "pss": 0})
                seen["rss"], seen["pss"] = max(seen["rss"], info.rss), max(seen["pss"], info.pss)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop.wait(self.every)

    def processes(self, kind: str) -> List[dict]:
        return [v for v in self.by_pid.values() if v["kind"] == kind]


def run(replicas: int, out: str, shards: Sequence[str] = (SHARD,), max_memory: Optional[str] = None,
        fit: str = "clamp", extra: Sequence[str] = ()) -> dict:
    """One `wdsfilter score` of the easyocr scorer on the CPU, its tree sampled: its exit code, its
    summary, the peaks."""
    cmd = [sys.executable, "-m", "wdsfilter", "score", *shards, "--image-key", "png;jpg", "--scorer", "ocr",
           "--ocr-backend", "easyocr", "--device", "cpu", "--replicas", str(replicas), "--fit", fit,
           "--out", out, "--overwrite", "--no-progress", "-v", *extra]
    if max_memory:
        cmd += ["--max-memory", max_memory]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreeSampler(proc.pid) as tree:
        stdout, stderr = proc.communicate()
    summary_path = os.path.join(out, "summary.json")
    summary = json.load(open(summary_path)) if proc.returncode == 0 and os.path.exists(summary_path) else {}
    return {"replicas": replicas, "returncode": proc.returncode, "stdout": stdout, "stderr": stderr,
            "summary": summary, "tree": tree}


def planned(summary: dict) -> dict:
    """What the plan chose and measured: the model processes on the CPU and the model's bytes."""
    lines = summary.get("plan", {}).get("lines", [])
    devices = summary.get("plan", {}).get("devices", [])
    model = next((v for what, v, _ in lines if what.startswith("model on")), "?")  # RSS grown by loading
    return {"model_processes": sum(d["replicas"] for d in devices), "model": model}


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="1,2,4")
    p.add_argument("--max-memory", default=None)
    p.add_argument("--fit", default="clamp")
    p.add_argument("--out", default="/tmp/measure_ocr_memory")
    p.add_argument("--min-side", type=int, default=0,
                   help="ocr.backend_options min_side (0: frames at their own 320x240; 736: the default scale)")
    args = p.parse_args(argv)
    extra = ["--scorer-opt", f'ocr.backend_options={{"min_side": {args.min_side}}}']
    results = []
    for n in (int(x) for x in args.replicas.split(",")):
        t0 = time.perf_counter()
        r = run(n, os.path.join(args.out, f"r{n}"), max_memory=args.max_memory, fit=args.fit, extra=extra)
        tree, seconds = r["tree"], time.perf_counter() - t0
        if r["returncode"] != 0:
            print(f"--replicas {n}: exit {r['returncode']}: {r['stderr'].strip().splitlines()[-1:]}")
            continue
        chosen = planned(r["summary"])
        kinds = {}
        for kind in ("main", "model process", "decode worker"):
            procs = tree.processes(kind)
            if procs:
                kinds[kind] = (len(procs), max(x["rss"] for x in procs), max(x["pss"] for x in procs))
        per = ", ".join(f"{k} x{c}: RSS {rss / MiB:.0f} MiB, PSS {pss / MiB:.0f} MiB" for k, (c, rss, pss) in kinds.items())
        print(f"--replicas {n}{' --max-memory ' + args.max_memory if args.max_memory else ''}: "
              f"{chosen['model_processes']} model process(es) planned; model {chosen['model']}; {per}; "
              f"tree peak RSS {tree.peak_rss / MiB:.0f} MiB, PSS {tree.peak_pss / MiB:.0f} MiB; {seconds:.0f} s",
              flush=True)
        results.append({"replicas": n, "planned": chosen, "kinds": kinds, "peak_rss": tree.peak_rss,
                        "peak_pss": tree.peak_pss})
    return results


if __name__ == "__main__":
    main()
