"""Which wdsfilter modules one `wdsfilter score` run enters: before its first row, and on the
per-sample path (what a reader must open to follow one sample from shard URL to score row).

    python tools/trace_modules.py [SHARD ...] [--scorer module:Class]

Runs the real command line (wdsfilter.cli.main score ...) in this process with --workers 0,
--device cpu and --batch-size 16 (BATCH), so decode, dispatch and the model all run here, under
sys.setprofile. Every call into a wdsfilter module is counted. "Before the first row" lists the
modules entered before rows.item_row first ran (module imports included); "per-sample path" lists
the modules whose functions ran at least once per sample (calls >= samples; a comprehension or
generator expression is its function's loop, not a call) in the scoring loop (from
Dispatcher.run_loader to the run's summary, so the first shard's decode counts too), i.e. the
files a sample passes through. The default scorer is LumaScorer below (mean brightness in numpy),
so the trace needs no model download; the default shards are sample_shards/images-00000{0,1}.tar.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from typing import Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from wdsfilter.score.scorers.base import Scorer  # noqa: E402


class LumaScorer(Scorer):
    """Mean luminance of the image, 0..1: a real scorer with no model to download."""
    name = "luma"

    def columns(self) -> List[str]:
        return ["luma"]

    def prepare(self, sample):
        from wdsfilter.core.errors import DataError
        if "image" not in sample:
            raise DataError("missing_image", "no image")
        return np.asarray(sample["image"].convert("L").resize((32, 32)), dtype=np.uint8)

    def load(self, device: str) -> None:
        pass

    def score_batch(self, inputs):
        return [{"luma": float(x.mean()) / 255.0} for x in inputs]


# A comprehension or generator expression runs in a frame of its own, but it is the loop body of
# the function around it, not another entry into the module. Python 3.12 inlines comprehensions
# (PEP 709) and reports no call for them at all, so counting them measured the interpreter.
LOOP_FRAMES = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


# Fixed, not planned: the planner sizes batches by measured speed, and on a loaded machine it can
# pick batches of one or two samples, when what runs once per batch would count as per sample.
BATCH = 16


def _module_of(filename: str, package_dir: str):
    if not filename.startswith(package_dir):
        return None
    rel = os.path.relpath(filename, os.path.dirname(package_dir))
    return rel[:-3].replace(os.sep, ".") if rel.endswith(".py") else None


def trace(argv: List[str]) -> Dict[str, object]:
    import wdsfilter
    from click.testing import CliRunner
    from wdsfilter.cli import main
    package_dir = os.path.dirname(os.path.abspath(wdsfilter.__file__))
    calls: Counter = Counter()
    before_first_row: List[str] = []
    state = {"first_row": False}

    def profile(frame, event, arg):
        if event != "call":
            return
        module = _module_of(frame.f_code.co_filename, package_dir)
        if module is None:
            return
        name = frame.f_code.co_qualname
        if name.endswith(LOOP_FRAMES):  # the loop of the function that holds it, which counted already
            return
        if not state["first_row"]:
            if name in ("item_row", "ShardRows.add"):  # the first row (ShardRows.add before rows.py)
                state["first_row"] = True
            elif module not in before_first_row:
                before_first_row.append(module)
        if name in ("Run.finish", "Engine._finish_summary"):  # the summary reads files, not samples
            state["summary"] = True
        if name == "Dispatcher.run_loader":  # the scoring loop: every sample is read, decoded and scored in it
            state["scoring"] = True
        if state.get("scoring") and not state.get("summary"):
            calls[module] += 1

    sys.setprofile(profile)
    try:
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
    finally:
        sys.setprofile(None)
    return {"calls": calls, "before_first_row": before_first_row, "exit_code": result.exit_code,
            "output": result.output}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards", nargs="*", default=[os.path.join(ROOT, "sample_shards", f"images-00000{i}.tar")
                                                   for i in range(2)])
    ap.add_argument("--scorer", default="tools.trace_modules:LumaScorer")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    with tempfile.TemporaryDirectory() as out:
        run = trace(["score", *args.shards, "--out", out, "--scorer", args.scorer, "--device", "cpu",
                     "--workers", "0", "--batch-size", str(BATCH), "--no-progress", "--no-histograms"])
        if run["exit_code"] != 0:
            print(run["output"])
            raise SystemExit(f"the traced run failed (exit {run['exit_code']})")
        import json
        with open(os.path.join(out, "summary.json")) as f:
            samples = json.load(f)["rows"]
    calls: Counter = run["calls"]
    per_sample = sorted(m for m, n in calls.items() if n >= samples)
    print(f"traced `wdsfilter score` over {len(args.shards)} shard(s), {samples} samples, scorer {args.scorer}")
    print(f"modules entered before the first row: {len(run['before_first_row'])}")
    for m in run["before_first_row"]:
        print(f"    {m}")
    print(f"modules on the per-sample path (>= {samples} calls): {len(per_sample)}")
    for m in per_sample:
        print(f"    {m:<40} {calls[m]:>8} calls")
    print(f"modules entered while scoring: {len(calls)}")
    return {"samples": samples, "before_first_row": run["before_first_row"], "per_sample": per_sample,
            "all": sorted(calls)}


if __name__ == "__main__":
    main()
