"""OOM back-off: halve the batch, free the cache, retry the same samples; no sample lost or scored
twice; the batch size finally used is reported. CUDA out-of-memory comes from a simulated GPU
(a real torch.cuda.OutOfMemoryError), host pressure from the real host through psutil."""
import collections

import pytest

from devicekit import SimulatedDevice
from scorekit import BrightnessScorer, expected_brightness, make_shards
from wdsfilter import StageConfig
from wdsfilter.pipeline import sample_pipeline
from wdsfilter.score import score
from wdsfilter.score.backoff import Backoff
from wdsfilter.score.memory import HostMemory
from wdsfilter.score.outputs import read_rows

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
    summary = score(urls, out=str(tmp_path / "out"), scorers=[scorer], devices=["sim:bo4", "sim:bo5"],
                    batch_size=8, workers=1, progress=False)
    _check_rows(str(tmp_path / "out"), images)
    sizes = summary.batch_sizes()
    assert [(s["device"], s["planned"], s["final"]) for s in sizes] == [("sim:bo4", 8, 2), ("sim:bo5", 8, 2)]
    assert sum(w["backoff"]["bright"]["scored"] for w in summary.workers) == len(images)
