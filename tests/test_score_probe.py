"""The probe that sizes the plan is bounded in samples and in time."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from tools.trace_modules import LumaScorer  # noqa: E402
from wdsfilter.config import StageConfig  # noqa: E402
from wdsfilter.score.prepare import collect_probe  # noqa: E402

SHARDS = [os.path.join(ROOT, "sample_shards", f"images-00000{i}.tar") for i in range(2)]


def test_the_probe_stops_at_its_sample_count_its_scan_limit_and_its_time_limit():
    stage = StageConfig(caption_key="txt;json:description", emit_rejects=True)
    found, per_sample, seen = collect_probe(SHARDS, stage, [LumaScorer()], want=5, scan=1000)
    assert len(found) == 5 and seen >= 5 and per_sample > 0
    assert all(set(x) == {"luma"} for x in found)
    found, _, seen = collect_probe(SHARDS, stage, [LumaScorer()], want=1000, scan=7)
    assert seen == 7 and len(found) <= 7
    found, _, seen = collect_probe(SHARDS, stage, [LumaScorer()], want=1000, scan=1000, max_seconds=1e-9)
    assert seen == 1  # the first sample read is past the time limit: the probe stops there


def test_the_probe_runs_no_full_garbage_collection():
    # A full gc.collect() takes about a second once torch and a model are loaded; the probe used
    # to run several per scorer. Automatic collection is off here, so every full one is the code's.
    import gc
    from wdsfilter.score.modelrunner import ModelRunner
    stage = StageConfig(caption_key="txt;json:description", emit_rejects=True)
    found, _, _ = collect_probe(SHARDS, stage, [LumaScorer()], want=4, scan=100)
    runner = ModelRunner([LumaScorer()], "cpu")
    runner.load()
    full = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(info)
    gc.disable()
    gc.callbacks.append(count)
    try:
        report = runner.probe(found)
    finally:
        gc.callbacks.remove(count)
        gc.enable()
    assert report["peaks"]["luma"] and report["errors"] == {}
    assert full == []
