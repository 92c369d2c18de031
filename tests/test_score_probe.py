"""The probe that sizes the plan is bounded in samples and in time."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from tools.trace_modules import LumaScorer  # noqa: E402
from wdsfilter.stream.config import StageConfig  # noqa: E402
from wdsfilter.score.probe import collect_probe  # noqa: E402

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


class SlowLuma(LumaScorer):
    """LumaScorer at 250 ms a sample: a slow scorer, as OCR is on the CPU. Counts what it scores.
    Slow enough that the fast one's cut (31 ms a sample at max_seconds=1) is far from a busy
    machine's pauses."""
    name = "slow_luma"

    def __init__(self):
        self.scored = 0

    def columns(self):
        return ["slow_luma"]

    def score_batch(self, inputs):
        import time
        time.sleep(0.25 * len(inputs))
        self.scored += len(inputs)
        return [{"slow_luma": float(x.mean()) / 255.0} for x in inputs]


def test_a_slow_scorers_probe_batch_is_cut_to_the_time_limit_and_a_fast_ones_is_not():
    from wdsfilter.score.modelrunner import ModelRunner
    from wdsfilter.score.probe import ProbeReport
    from wdsfilter.score.probe import input_lines
    stage = StageConfig(caption_key="txt;json:description", emit_rejects=True)
    fast, slow = LumaScorer(), SlowLuma()
    found, _, _ = collect_probe(SHARDS, stage, [fast, slow], want=16, scan=100)
    assert len(found) == 16
    runner = ModelRunner([fast, slow], "cpu")
    runner.load()
    measured = runner.probe(found, max_seconds=1.0)
    # 16 samples batched and then one at a time would take 8 s: the slow one's n is cut to 2.
    assert measured["sizes"] == {"luma": [1, 16], "slow_luma": [1, 2]}
    assert slow.scored == 1 + 1 + 2 + 2  # warm-up, one, the batch of 2, the 2 one at a time
    assert measured["frames"]["slow_luma"] == [1, 2] and len(measured["peaks"]["slow_luma"]) == 2
    assert set(measured["timings"]) == {"luma", "slow_luma"}
    report = ProbeReport.measured(found, 16, 0.01, lambda inputs: measured)
    lines, _ = input_lines([runner.load()], report)
    text = "\n".join(" ".join(line) for line in lines)
    assert "probe batches of 1 and 2 samples" in text and "probe batch of 16 (luma), 2 (slow_luma)" in text
    # Without a limit that bites, every scorer is probed on all it is given.
    assert runner.probe(found[:4], max_seconds=60)["sizes"]["slow_luma"] == [1, 4]


def test_a_small_jobs_probe_is_a_share_of_it():
    """The probe's timed work is at most PROBE_SHARE of the job's model time where the job's size is
    known: a job of 8 samples gets no second probe batch (it was most of an 8-clip job on a CPU); a
    large one is probed on all 16. Ratios of the same measured time, so no clock decides it."""
    from wdsfilter.score.modelrunner import PROBE_SHARE, ModelRunner
    from wdsfilter.score.probe import ProbeReport
    from wdsfilter.score.probe import input_lines
    stage = StageConfig(caption_key="txt;json:description", emit_rejects=True)
    found, _, _ = collect_probe(SHARDS, stage, [LumaScorer()], want=16, scan=100)
    runner = ModelRunner([LumaScorer()], "cpu")
    runner.load()
    assert PROBE_SHARE * 8 < 2 * 2  # 8 samples' share is under two probe samples timed twice
    small = runner.probe(found, max_seconds=600, job_samples=8)
    assert small["sizes"] == {"luma": [1, 1]} and len(small["peaks"]["luma"]) == 1
    assert small["frames"]["luma"] == [1, 1] and len(small["timings"]["luma"]) == 2
    report = ProbeReport.measured(found, 16, 0.01, lambda inputs: small)
    assert set(report.scorer_activations()) == {"luma"}
    lines, _ = input_lines([runner.load()], report)
    assert lines
    assert runner.probe(found, max_seconds=600, job_samples=100_000)["sizes"] == {"luma": [1, 16]}
    assert runner.probe(found, max_seconds=600)["sizes"] == {"luma": [1, 16]}  # size unknown: no share
