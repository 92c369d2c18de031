"""OOM back-off: halve the batch, free the cache, retry the same samples; no sample lost or scored
twice; the batch size finally used is reported. CUDA out-of-memory comes from a simulated GPU
(a real torch.cuda.OutOfMemoryError), host pressure from the real host through psutil."""
import collections

import pytest

from devicekit import SimulatedDevice
from scorekit import BrightnessScorer, FrameCounter, expected_brightness, make_shards
from wdsfilter import StageConfig
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.score import score
from wdsfilter.score.backoff import Backoff
from wdsfilter.score.memory import HostMemory
from wdsfilter.runfolder.tables import read_rows

MiB = 2**20


def prepared(urls, scorer):
    return [(s["__key__"], scorer.prepare(s)) for s in sample_pipeline(urls, StageConfig())]


def logged(path):
    with open(path) as f:
        return collections.Counter(line.strip() for line in f if line.strip())


@pytest.fixture
def shard(tmp_path):
    return make_shards(tmp_path / "shards", [37], refused={0: (20,)})


def test_cuda_oom_halves_until_the_batch_fits_and_scores_each_sample_once(shard, tmp_path):
    urls, images = shard
    dev = SimulatedDevice.create("bo1", total=100 * MiB + 5 * MiB)  # the model and 5 samples
    scorer = BrightnessScorer(sim="bo1", model_bytes=100 * MiB, bytes_per_sample=1 * MiB, log=str(tmp_path / "log"))
    scorer.load("cpu")
    items = prepared(urls, scorer)
    backoff = Backoff(scorer, dev, batch_size=16)
    outcomes = backoff.run([inp for _, inp in items])
    assert [o[0] for o in outcomes] == ["ok"] * len(items)
    for (key, _), outcome in zip(items, outcomes):  # results stay in input order
        assert outcome[1]["brightness"] == pytest.approx(expected_brightness(images[key]), abs=1e-5)
    assert logged(tmp_path / "log") == collections.Counter(k for k, _ in items)  # each exactly once
    assert backoff.batch_size == 4 and backoff.planned == 16
    assert [(e.kind, e.from_size, e.to_size) for e in backoff.events] == [("cuda_oom", 16, 8), ("cuda_oom", 8, 4)]
    assert dev.ooms == 2
    assert backoff.stats()["scored"] == len(items)


def test_a_sample_that_does_not_fit_alone_gets_out_of_memory_and_the_others_are_scored(shard, tmp_path):
    urls, images = shard
    dev = SimulatedDevice.create("bo2", total=64 * MiB)
    scorer = BrightnessScorer(sim="bo2", bytes_per_sample=1 * MiB, huge_word="refuse-me", log=str(tmp_path / "log"))
    scorer.load("cpu")
    items = prepared(urls, scorer)
    outcomes = Backoff(scorer, dev, batch_size=8).run([inp for _, inp in items])
    by_key = {k: o for (k, _), o in zip(items, outcomes)}
    assert by_key["s0_00020"][:2] == ("error", "out_of_memory")
    assert "OutOfMemoryError" in by_key["s0_00020"][2]
    assert all(o[0] == "ok" for k, o in by_key.items() if k != "s0_00020")
    assert logged(tmp_path / "log") == collections.Counter(k for k, _ in items if k != "s0_00020")


def test_host_memory_error_halves_too(shard):
    urls, _ = shard
    scorer = BrightnessScorer(memory_error_above=6)
    scorer.load("cpu")
    backoff = Backoff(scorer, HostMemory(), batch_size=32)
    outcomes = backoff.run([inp for _, inp in prepared(urls, scorer)])
    assert all(o[0] == "ok" for o in outcomes)
    assert backoff.batch_size == 4 and {e.kind for e in backoff.events} == {"host_oom"}


def test_host_memory_pressure_measured_with_psutil_halves_down_to_one(shard, tmp_path):
    urls, _ = shard
    host = HostMemory()
    scorer = BrightnessScorer(log=str(tmp_path / "log"))
    scorer.load("cpu")
    items = prepared(urls, scorer)
    # Ask for more free RAM than the machine has: the real psutil reading is always "pressure".
    backoff = Backoff(scorer, host, batch_size=16, host=host, min_free_host=2 * host.total())
    outcomes = backoff.run([inp for _, inp in items])
    assert all(o[0] == "ok" for o in outcomes)
    assert [(e.kind, e.from_size, e.to_size) for e in backoff.events] == [
        ("host_pressure", 16, 8), ("host_pressure", 8, 4), ("host_pressure", 4, 2), ("host_pressure", 2, 1)]
    assert "free host RAM" in backoff.events[0].detail
    assert logged(tmp_path / "log") == collections.Counter(k for k, _ in items)


def _check_rows(out, images, n_workers=None):
    rows = {}
    import os
    for f in os.listdir(os.path.join(out, "scores")):
        for r in read_rows(os.path.join(out, "scores", f)):
            assert r["key"] not in rows
            rows[r["key"]] = r
    assert set(rows) == set(images)
    for key, r in rows.items():
        assert r["status"] == "scored"
        assert r["brightness"] == pytest.approx(expected_brightness(images[key]), abs=1e-5)


def test_a_run_whose_planned_batch_runs_out_of_memory_backs_off_and_reports_it(tmp_path):
    # Activation memory grows with n^2 (attention-like): the probe's two points extrapolate to a
    # batch that does not fit, as happens with real models; the back-off finds one that does.
    urls, images = make_shards(tmp_path / "shards", [30, 30])
    SimulatedDevice.create("bo3", total=1000 * MiB)
    scorer = BrightnessScorer(sim="bo3", model_bytes=100 * MiB, bytes_per_sample=1 * MiB, quadratic_bytes=1 * MiB)
    summary = score(urls, out=str(tmp_path / "out"), scorers=[scorer], devices=["sim:bo3"], max_batch=4096,
                    workers=0, progress=False)
    (b,) = summary.batch_sizes()
    usable = 1000 * MiB - int(1000 * MiB * 0.10) - 100 * MiB
    assert b["planned"] == (usable // (18 * MiB)) // 8 * 8  # slope through the probe points 1 and 16: 1 + 17
    assert b["final"] == b["planned"] // 2 and b["final"] ** 2 * MiB + b["final"] * MiB <= usable
    assert b["halvings"] == 1 and b["causes"] == ["cuda_oom"]
    assert f"planned {b['planned']}, final {b['final']}, halved 1x (cuda_oom)" in summary.format_text()
    _check_rows(str(tmp_path / "out"), images)
    assert summary.workers[0]["backoff"]["bright"]["scored"] == len(images)


def test_back_off_in_model_worker_processes(tmp_path):
    urls, images = make_shards(tmp_path / "shards", [20, 20])
    for name in ("bo4", "bo5"):
        SimulatedDevice.create(name, total=64 * MiB)
    scorer = BrightnessScorer(sim="", oom_above=3)
    # replicas=1: on a host with many cores the planner would put two processes on each simulated GPU
    summary = score(urls, out=str(tmp_path / "out"), scorers=[scorer], devices=["sim:bo4", "sim:bo5"],
                    batch_size=8, workers=1, replicas=1, progress=False)
    _check_rows(str(tmp_path / "out"), images)
    sizes = summary.batch_sizes()
    assert [(s["device"], s["planned"]) for s in sizes] == [("sim:bo4", 8), ("sim:bo5", 8)]
    for s, w in zip(sizes, summary.workers):  # each process backed off on its own: 8 -> 4 -> 2
        assert s["halvings"] >= 2 and s["causes"] == ["cuda_oom"] and w["backoff"]["bright"]["smallest_batch_size"] == 2
        # A worker that took most of the samples (the other one slow to start on a loaded machine)
        # scores GROW_AFTER sub-batches of 2 without a failure and may end having grown back to 4.
        assert s["final"] == 2 or (s["final"] == 4 and s["grown"] >= 1), s
    assert sum(w["backoff"]["bright"]["scored"] for w in summary.workers) == len(images)


# -- frames, per-scorer back-off, growing back -------------------------------------------------------
class FrameScorer(FrameCounter):
    """score_batch holds `bytes_per_frame` per frame on a simulated GPU (a real
    torch.cuda.OutOfMemoryError when it does not fit); records each call's frames and the keys
    scored (inputs {"key", "frames": k})."""

    def __init__(self, sim, bytes_per_frame):
        super().__init__()
        self.sim, self.bytes_per_frame = sim, bytes_per_frame
        self.scored = collections.Counter()

    def score_batch(self, inputs):
        dev = SimulatedDevice.get(self.sim)
        need = self.bytes_per_frame * sum(x["frames"] for x in inputs)
        dev.alloc(need)
        dev.release(need)
        self.calls.append([x["frames"] for x in inputs])
        self.scored.update(x["key"] for x in inputs)
        return [{"n_frames": x["frames"]} for x in inputs]


def test_sub_batches_are_filled_by_frames_so_a_video_costs_its_frames():
    dev = SimulatedDevice.create("fr0", total=64 * MiB)
    scorer = FrameScorer("fr0", 1 * MiB)
    inputs = [{"key": i, "frames": 3 if i % 2 else 1} for i in range(10)]  # images and 3-frame videos
    backoff = Backoff(scorer, dev, batch_size=6)
    outcomes = backoff.run(inputs)
    assert [o[1]["n_frames"] for o in outcomes] == [x["frames"] for x in inputs]
    assert all(sum(c) <= 6 for c in scorer.calls) and [len(c) for c in scorer.calls] == [3, 2, 2, 2, 1]
    assert scorer.scored == collections.Counter(range(10)) and not backoff.events


def test_the_probe_measures_memory_per_frame():
    from wdsfilter.score.modelrunner import ModelRunner
    from wdsfilter.score.probe import ProbeReport
    SimulatedDevice.create("fr1", total=1024 * MiB)
    runner = ModelRunner([FrameScorer("fr1", 4 * MiB)], "sim:fr1")
    runner.load()
    measured = runner.probe([{"frames": {"key": i, "frames": 3}} for i in range(16)])
    assert measured["frames"] == {"frames": [3, 48]}
    report = ProbeReport(samples=16, sizes=measured["sizes"], peaks=measured["peaks"],
                         frames=measured["frames"])
    assert report.scorer_activations() == {"frames": (0, 4 * MiB)}  # per frame: 3 frames cost 12 MiB
    assert report.frames_per_sample("frames") == 3.0


def test_after_a_run_of_successes_the_batch_grows_back_to_the_plan_without_losing_a_sample():
    dev = SimulatedDevice.create("grow0", total=16 * MiB)
    scorer = FrameScorer("grow0", 1 * MiB)
    backoff = Backoff(scorer, dev, batch_size=16, grow_after=3)
    dev.occupy(12 * MiB)  # another process holds memory for a while: only 4 frames fit
    first = backoff.run([{"key": i, "frames": 1} for i in range(8)])
    assert backoff.batch_size == 4
    assert [(e.kind, e.from_size, e.to_size) for e in backoff.events] == [("cuda_oom", 8, 4)]
    dev.occupied = 0  # it is gone: after 3 sub-batches in a row that fit, the size doubles, up to the plan
    second = backoff.run([{"key": i, "frames": 1} for i in range(8, 80)])
    grows = [(e.from_size, e.to_size) for e in backoff.events if e.kind == "grow"]
    assert grows == [(4, 8), (8, 16)] and backoff.batch_size == 16
    assert all(o[0] == "ok" for o in first + second)
    assert scorer.scored == collections.Counter(range(80))  # every sample once, none lost
    assert backoff.stats()["final_batch_size"] == 16 and backoff.stats()["smallest_batch_size"] == 4


def test_a_grown_size_that_fails_again_waits_twice_as_long_before_the_next_try():
    dev = SimulatedDevice.create("grow1", total=8 * MiB)  # 8 frames fit, never 16
    scorer = FrameScorer("grow1", 1 * MiB)
    backoff = Backoff(scorer, dev, batch_size=16, grow_after=2)
    outcomes = backoff.run([{"key": i, "frames": 1} for i in range(200)])
    assert all(o[0] == "ok" for o in outcomes) and scorer.scored == collections.Counter(range(200))
    kinds = [e.kind for e in backoff.events]
    # 16 fails; 8 fits; after 2, then 4, then 8 ... sub-batches it tries 16 again: a few tries, not one per 2.
    assert kinds[:3] == ["cuda_oom", "grow", "cuda_oom"] and backoff.wait > 2
    assert kinds.count("grow") <= 5 and dev.ooms == kinds.count("cuda_oom")


def test_out_of_memory_halves_only_the_scorer_that_ran_out(shard, tmp_path):
    from wdsfilter.score.modelrunner import ModelRunner
    urls, images = shard
    SimulatedDevice.create("bo6", total=1024 * MiB)
    small, big = BrightnessScorer(sim="bo6", oom_above=4), FrameScorer("bo6", 1 * MiB)
    small.load("cpu")
    runner = ModelRunner([small, big], "sim:bo6")
    runner.memory = runner.host = None
    runner.load()
    runner.configure(batch_size=16, scorer_batch={"bright": 16, "frames": 16})
    items = [(key, {"bright": inp, "frames": {"key": key, "frames": 1}}) for key, inp in prepared(urls, small)]
    results = runner.score(items)
    assert all(not errors and scores["brightness"] is not None and scores["n_frames"] == 1
               for _, scores, errors in results)
    stats = runner.stats()["backoff"]
    assert stats["bright"]["final_batch_size"] == 4 and stats["frames"]["final_batch_size"] == 16
    assert stats["frames"]["events"] == [] and max(len(c) for c in big.calls) == 16


@pytest.mark.parametrize("out", [[{"x": 1.0}], [{"x": 1.0}, 0.5], ({"x": 1.0}, {"x": 2.0})])
def test_a_scorer_that_returns_other_than_one_dict_per_input_is_a_scorer_error(out):
    from wdsfilter.score.backoff import ScorerError

    class Odd:
        name = "odd"

        def score_batch(self, inputs):
            return out

    with pytest.raises(ScorerError, match=r"'odd': score_batch returned (list|tuple) of length \d for 2 inputs; "
                                          r"expected a list of 2 dicts"):
        Backoff(Odd(), HostMemory(), batch_size=2).run([0, 1])


def test_per_input_methods_are_resolved_once_and_the_scorer_default_is_none():
    from scorekit import FrameCounter
    from wdsfilter.score.scorers.base import overridden
    plain, counter = BrightnessScorer(), FrameCounter()
    assert overridden(plain, "frame_count") is None and overridden(plain, "batch_key") is None
    assert overridden(counter, "frame_count") == counter.frame_count
    assert overridden(counter, "batch_key") == counter.batch_key
    assert overridden(object(), "frame_count") is None  # a scorer without the method: one frame per input
    plain.frame_count = lambda x: 3  # set on the instance: used
    assert overridden(plain, "frame_count")(None) == 3
