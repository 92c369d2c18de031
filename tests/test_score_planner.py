"""The memory planner: its rules on exact numbers, the measurements on a simulated GPU and on the
real host, and the refusals/clamps of settings that cannot fit."""
import dataclasses
import math
import os
import re

import pytest

from devicekit import SimulatedDevice
from scorekit import ArenaScorer, BrightnessScorer, make_shards
from wdsfilter import ConfigError
from wdsfilter.score import ScoreConfig, score
from wdsfilter.core.units import parse_size
from wdsfilter.score.memory import HostMemory
from wdsfilter.score.modelrunner import LoadReport
from wdsfilter.score.planner import WORKER_BASE_BYTES, make_plan
from wdsfilter.score.probe import ProbeReport

MiB, GiB = 2**20, 2**30


def cuda_report(free=24 * GiB, footprint=2 * GiB, overhead=600 * MiB, device="cuda:0"):
    return LoadReport(device=device, kind="cuda", total=24 * GiB, free_before=free, footprint=footprint,
                      footprints={"clip": footprint}, overhead=overhead, overhead_estimated=True,
                      rss=3 * GiB, descriptions=["clip"])


def probe(fixed=100 * MiB, per=50 * MiB, prepared=600_000):
    return ProbeReport(samples=16, scanned=16, sizes={"clip": (1, 16)}, peaks={"clip": [fixed + per, fixed + 16 * per]},
                       seconds_per_sample=0.001, threads=2, prepared_bytes=prepared, prepare_seconds=0.004)


HOST = {"total": 128 * GiB, "available": 100 * GiB, "cpus": 16}


def plan(cfg_options=None, reports=None, probe_report=None, host=HOST, n_shards=100):
    cfg = ScoreConfig(out="unused", **(cfg_options or {}))
    return make_plan(cfg, reports or [cuda_report()], probe_report or probe(), host, n_shards)


def test_activation_is_the_line_through_the_two_probe_points():
    assert probe(fixed=123 * MiB, per=7 * MiB).activation() == (123 * MiB, 7 * MiB)
    two = ProbeReport(samples=8, sizes={"a": (1, 8), "b": (1, 8)}, peaks={"a": [10, 80], "b": [500, 507]})
    assert two.activation() == (499, 10)  # the largest fixed part and the largest slope


def test_auto_batch_is_the_largest_multiple_of_8_that_fits():
    p = plan({"max_batch": 100_000, "replicas": 1})
    (dp,) = p.devices
    usable = 24 * GiB - int(24 * GiB * 0.10)
    assert dp.budget == usable
    need = lambda b: 2 * GiB + 100 * MiB + 50 * MiB * b  # noqa: E731
    assert need(dp.batch_size) <= usable < need(dp.batch_size + 8) and dp.batch_size % 8 == 0
    assert dp.need == need(dp.batch_size)
    capped = plan({"max_batch": 64, "replicas": 1}).devices[0]
    assert capped.batch_size == 64
    assert any("capped at max_batch=64" in why for _, _, why in plan({"max_batch": 64}).lines)


def test_max_memory_and_headroom_bound_the_budget():
    dp = plan({"max_memory": "8GiB", "headroom": 0.25, "replicas": 1, "max_batch": 100_000}).devices[0]
    assert dp.budget == 8 * GiB - 2 * GiB
    assert 2 * GiB + 100 * MiB + 50 * MiB * dp.batch_size <= 6 * GiB


def test_a_second_replica_when_each_scorer_keeps_a_batch_of_32():
    small = probe(fixed=10 * MiB, per=1 * MiB)
    both = 2 * (2 * GiB + 10 * MiB + 256 * MiB) + 600 * MiB  # two replicas at batch 256, one extra process
    roomy = plan({"max_batch": 256}, reports=[cuda_report(free=int(both / 0.9) + MiB)], probe_report=small)
    assert roomy.devices[0].replicas == 2 and roomy.devices[0].batch_size == 256
    # Less memory: two processes still fit with a smaller batch each (>= 32), rather than one at 256.
    smaller = plan({"max_batch": 256}, reports=[cuda_report(free=int(both / 0.9) - MiB)], probe_report=small)
    assert smaller.devices[0].replicas == 2 and 32 <= smaller.devices[0].batch_size < 256
    at_32 = 2 * (2 * GiB + 10 * MiB + 32 * MiB) + 600 * MiB
    tight = plan({"max_batch": 256}, reports=[cuda_report(free=int(at_32 / 0.9) - MiB)], probe_report=small)
    (d,) = tight.devices
    assert d.replicas == 1 and d.batch_size == 256  # alone it still gets the whole max_batch
    assert "a process more would leave clip a batch under 32" in tight.describe()
    # The cores bound it too: 2 GPU processes x 4 cores > 6 cores.
    few_cores = plan({"max_batch": 256}, reports=[cuda_report(free=int(both / 0.9) + MiB)], probe_report=small,
                     host=dict(HOST, cpus=6))
    assert few_cores.devices[0].replicas == 1 and "6 cores" in few_cores.describe()


def test_forty_processes_of_a_2gb_model_on_one_gpu_are_refused_with_the_numbers():
    with pytest.raises(ConfigError) as err:
        plan({"replicas": 40})
    msg = str(err.value)
    assert "replicas=40 on cuda:0: 40 x (2.0 GiB model + 100.0 MiB + 50.0 MiB x 1 samples)" in msg
    assert "39 x 600.0 MiB per extra process (estimated)" in msg and "> 21.6 GiB usable" in msg
    assert "--fit clamp" in msg
    clamped = plan({"replicas": 40, "fit": "clamp"})
    dp = clamped.devices[0]
    usable = 24 * GiB - int(24 * GiB * 0.10)
    need = lambda r, b: r * (2 * GiB + 100 * MiB + 50 * MiB * b) + (r - 1) * 600 * MiB  # noqa: E731
    assert need(dp.replicas, 1) <= usable < need(dp.replicas + 1, 1)
    assert need(dp.replicas, dp.batch_size) <= usable
    assert any(f"clamped to {dp.replicas}" in w for w in clamped.warnings)


def test_a_batch_size_that_cannot_fit_is_refused_or_clamped():
    with pytest.raises(ConfigError, match=r"batch_size=1000 on cuda:0: 1 x \(2.0 GiB model .*> 21.6 GiB usable"):
        plan({"batch_size": 1000, "replicas": 1})
    clamped = plan({"batch_size": 1000, "replicas": 1, "fit": "clamp"})
    b = clamped.devices[0].batch_size
    assert 2 * GiB + 100 * MiB + 50 * MiB * b <= 24 * GiB - int(24 * GiB * 0.1) and b < 1000
    assert plan({"batch_size": 100, "replicas": 1}).devices[0].batch_size == 100


def test_a_model_larger_than_the_gpu_is_refused_even_with_clamp():
    with pytest.raises(ConfigError, match=r"one sample on cuda:0 needs 1 x \(30.0 GiB model"):
        plan({"fit": "clamp"}, reports=[cuda_report(footprint=30 * GiB)])


def test_decode_workers_follow_cores_shards_and_host_ram():
    p = plan({"replicas": 1})
    assert p.workers == 16 - 1 - 1  # cores minus the model process minus the dispatcher
    assert plan({"replicas": 1}, n_shards=3).workers == 3
    tight = {"total": 8 * GiB, "available": 2 * GiB, "cpus": 16}
    t = plan({"replicas": 1, "headroom": 0.0}, host=tight)
    per_worker = WORKER_BASE_BYTES + t.prefetch * t.chunk * 600_000
    queued = 2 * t.devices[0].batch_size * 600_000
    assert t.workers == (2 * GiB - queued) // per_worker < 14
    with pytest.raises(ConfigError, match=r"workers=40: 40 x .* > .* of host RAM left"):
        plan({"replicas": 1, "workers": 40, "headroom": 0.0}, host=tight)


def cpu_report():
    return LoadReport(device="cpu", kind="host", total=128 * GiB, free_before=100 * GiB, footprint=100 * MiB,
                      footprints={"clip": 30 * MiB, "ocr": 70 * MiB}, overhead=400 * MiB, overhead_estimated=False,
                      rss=1 * GiB, descriptions=["clip", "ocr"])


def test_on_the_cpu_a_scorer_that_is_faster_one_at_a_time_gets_batch_1():
    """Measured in the probe on the same samples: the OCR detector on 2 CPU cores ran 13 ms/sample
    one at a time and 33 ms/sample in one batch of 16; CLIP gains from batching."""
    p = probe()
    p.timings = {"clip": [0.004, 0.001], "ocr": [0.013, 0.033]}
    p.sizes = {"clip": (1, 16), "ocr": (1, 16)}
    p.seconds_per_sample, p.threads, p.prepare_seconds = 0.034, 1, 0.002
    t = plan({}, reports=[cpu_report()], probe_report=p, host={"total": 8 * GiB, "available": 6 * GiB, "cpus": 2})
    (d,) = t.devices
    assert d.batch_size == 32 and d.scorer_batch == {"clip": 32, "ocr": 1}
    text = t.describe()
    assert "ocr batch on cpu  1  (probe: the same 16 samples took 13.00 ms/sample one at a time, 33.00 in one batch" in text
    # The model's cost per sample at those batch sizes splits the cores: 34 - (33 - 13) = 14 ms.
    assert "decode 2.0 ms vs model 14.0 core-ms per sample" in text
    # A batch size set by the user is left alone.
    assert plan({"batch_size": 8}, reports=[cpu_report()], probe_report=p).devices[0].scorer_batch == \
        {"clip": 8, "ocr": 8}


def test_on_the_cpu_the_model_threads_count_the_cores_decode_keeps_busy_not_its_workers():
    """Measured on the sample shards (2 cores): OCR cost 465 core-ms a sample against 3.6 ms of
    decode, so its one decode worker idles 99% of the time and the model gets both cores; where
    decode costs as much as the model, its worker's core stays the decode worker's."""
    host = {"total": 8 * GiB, "available": 6 * GiB, "cpus": 2}
    p = probe()
    p.seconds_per_sample, p.threads, p.prepare_seconds = 0.465, 1, 0.0036
    t = plan({}, reports=[cpu_report()], probe_report=p, host=host)
    assert t.workers == 1 and t.devices[0].threads == 2
    assert "2 cores minus the 0.02 core(s) its 1 decode worker(s) keep busy" in t.describe()
    p.seconds_per_sample, p.prepare_seconds = 0.004, 0.004
    t = plan({}, reports=[cpu_report()], probe_report=p, host=host)
    assert t.workers == 1 and t.devices[0].threads == 1
    assert "2 cores minus 1 decode worker(s)" in t.describe()


def test_planner_measures_model_and_activations_on_a_simulated_gpu(tmp_path):
    urls, images = make_shards(tmp_path / "shards", [12, 12])
    SimulatedDevice.create("plan0", total=1000 * MiB)
    scorer = BrightnessScorer(sim="plan0", model_bytes=300 * MiB, bytes_per_sample=5 * MiB)
    lines = []
    dry = score(urls, out=str(tmp_path / "dry"), scorers=[scorer], devices=["sim:plan0"], max_batch=4096,
                dry_run=True, progress=False, echo=lines.append)
    text = "\n".join(lines)
    assert re.search(r"model on sim:plan0 +300.0 MiB +\(measured", text)
    assert re.search(r"activations +5.0 MiB/sample \+ 0 B +\(peak memory", text)
    usable = 1000 * MiB - int(1000 * MiB * 0.10)
    expected = (usable - 300 * MiB) // (5 * MiB)
    expected -= expected % 8
    assert dry.plan["devices"][0]["batch_size"] == expected
    assert not os.path.exists(tmp_path / "dry" / "scores")  # a dry run writes nothing
    assert "dry run: nothing was scored" in dry.format_text()
    # The planned batch really fits: the run scores everything without halving.
    real = score(urls, out=str(tmp_path / "real"), scorers=[scorer], devices=["sim:plan0"], max_batch=4096,
                 progress=False, workers=0)
    assert real.scored == len(images)
    (b,) = real.batch_sizes()
    assert b["planned"] == b["final"] == expected and b["halvings"] == 0


def test_memory_outside_pytorchs_allocator_is_measured_on_the_device(tmp_path):
    """onnxruntime (rapidocr on a GPU) allocates outside PyTorch: memory_allocated sees nothing, so
    the model and its arena are measured as the device's used memory (mem_get_info), and what the
    first batch leaves behind is counted with the model."""
    urls, images = make_shards(tmp_path / "shards", [12, 12])
    SimulatedDevice.create("arena0", total=1000 * MiB)
    scorer = ArenaScorer(sim="arena0", model_bytes=300 * MiB, bytes_per_sample=5 * MiB)
    lines = []
    dry = score(urls, out=str(tmp_path / "dry"), scorers=[scorer], devices=["sim:arena0"], max_batch=4096,
                dry_run=True, progress=False, echo=lines.append)
    text = "\n".join(lines)
    assert re.search(r"model on sim:arena0 +300.0 MiB +\(measured", text)
    assert re.search(r"warm-up memory +5.0 MiB +\(left on the device by the first batch \(arena 5.0 MiB", text)
    assert re.search(r"activations +5.0 MiB/sample \+ 0 B", text)
    usable = 1000 * MiB - int(1000 * MiB * 0.10)
    expected = (usable - 305 * MiB) // (5 * MiB)
    expected -= expected % 8
    assert dry.plan["devices"][0]["batch_size"] == expected
    assert SimulatedDevice.get("arena0").occupied == 0  # unloaded: weights and arena given back
    real = score(urls, out=str(tmp_path / "real"), scorers=[scorer], devices=["sim:arena0"], max_batch=4096,
                 progress=False, workers=0)
    assert real.scored == len(images)
    (b,) = real.batch_sizes()
    assert b["planned"] == b["final"] == expected and b["halvings"] == 0


def test_host_memory_is_measured_for_real():
    import psutil
    host = HostMemory()
    assert abs(host.total() - psutil.virtual_memory().total) < 1 * MiB
    assert abs(host.free() - psutil.virtual_memory().available) < 256 * MiB
    host.reset_peak()
    base = host.allocated()
    block = bytearray(200 * MiB)
    block[::4096] = b"\1" * len(block[::4096])  # touch every page so it is resident
    assert host.peak() - base >= 190 * MiB
    del block
    host.empty_cache()
    host.reset_peak()
    assert host.peak() - host.allocated() < 50 * MiB


def test_host_ram_bounds_workers_in_a_real_cpu_run(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [4, 4])
    with pytest.raises(ConfigError, match=r"workers=2: 2 x .* of host RAM left"):
        score(urls, out=str(tmp_path / "o"), scorers=[BrightnessScorer()], device="cpu", workers=2,
              max_memory=HostMemory().allocated() + 300 * MiB, progress=False)


@pytest.mark.parametrize("text,size", [("8GB", 8 * 10**9), ("8GiB", 8 * GiB), ("8G", 8 * GiB),
                                       ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000), (1024, 1024)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_bad_sizes_raise():
    for bad in ("lots", "-1GB", "8 parsecs"):
        with pytest.raises(ConfigError):
            parse_size(bad)
    assert math.isclose(parse_size("0.5KiB"), 512)


# -- per-scorer plans, frames, processes per GPU ---------------------------------------------------
def sim_report(free=80 * GiB, footprints=None, device="sim:g80"):
    footprints = footprints or {"clip": 300 * MiB, "ocr": 200 * MiB}
    return LoadReport(device=device, kind="simulated", total=80 * GiB, free_before=free,
                      footprint=sum(footprints.values()), footprints=footprints, overhead=600 * MiB,
                      overhead_estimated=True, rss=3 * GiB, descriptions=list(footprints))


def clip_ocr_probe(frames=1, samples=16):
    """CLIP (50 MiB + 2 MiB per frame) and OCR at large frames (200 MiB + 1 GiB per frame), measured
    on probe samples of `frames` frames each (1: images; 3: 3-frame videos)."""
    f, n = frames, samples
    return ProbeReport(samples=n, scanned=n, sizes={"clip": (1, n), "ocr": (1, n)}, frames={"clip": [f, n * f], "ocr": [f, n * f]},
                       peaks={"clip": [50 * MiB + 2 * MiB * f, 50 * MiB + 2 * MiB * n * f],
                              "ocr": [200 * MiB + GiB * f, 200 * MiB + GiB * n * f]},
                       seconds_per_sample=0.01, threads=2, prepared_bytes=3 * 2**20, prepare_seconds=0.01)


def test_clip_and_ocr_each_get_their_own_batch_size_and_two_processes_share_the_gpu():
    p = plan({}, reports=[sim_report()], probe_report=clip_ocr_probe())
    (d,) = p.devices
    assert d.scorer_batch["clip"] == 512  # max_batch: CLIP no longer runs at OCR's batch
    assert 1 <= d.scorer_batch["ocr"] < d.scorer_batch["clip"]
    assert d.batch_size == 512  # samples per dispatched batch: the largest scorer batch
    assert d.replicas == 2  # OCR keeps >= 32 frames per process with two processes
    usable = 80 * GiB - int(80 * GiB * 0.10)
    F = 500 * MiB
    work = max(50 * MiB + 2 * MiB * 512, 200 * MiB + GiB * d.scorer_batch["ocr"])
    assert d.need == 2 * (F + work) + 600 * MiB <= usable
    work_more = max(50 * MiB + 2 * MiB * 512, 200 * MiB + GiB * (d.scorer_batch["ocr"] + 8))
    assert 2 * (F + work_more) + 600 * MiB > usable  # OCR's batch is the largest multiple of 8 that fits
    text = p.describe()
    assert re.search(r"sim:g80 clip batch +512 samples", text) and "clip activations" in text and "ocr activations" in text
    # Memory for one process only: OCR would keep fewer than 32 frames with two.
    small = plan({}, reports=[sim_report(free=40 * GiB)], probe_report=clip_ocr_probe())
    (s,) = small.devices
    assert s.replicas == 1 and s.scorer_batch["clip"] == 512 and 32 <= s.scorer_batch["ocr"] < 40
    assert "a process more would leave ocr a batch under 32" in small.describe()
    # The model in the main process (one simulated device, LocalPool) cannot get a second process.
    local = plan({}, reports=[dataclasses.replace(sim_report(), in_process=True)], probe_report=clip_ocr_probe())
    assert local.devices[0].replicas == 1


def test_video_frames_are_counted_as_frames_in_the_plan():
    images, videos = clip_ocr_probe(frames=1), clip_ocr_probe(frames=3)
    # Per-frame memory is the same whether the probe saw images or 3-frame videos ...
    assert videos.scorer_activations() == images.scorer_activations()
    assert videos.scorer_activations()["ocr"] == (200 * MiB, GiB)
    a = plan({}, reports=[sim_report()], probe_report=images).devices[0]
    b = plan({}, reports=[sim_report()], probe_report=videos).devices[0]
    # ... so the batches, in frames, are too: a 3-frame video takes 3 of them in the back-off.
    assert a.scorer_batch == b.scorer_batch
    text = plan({}, reports=[sim_report()], probe_report=videos).describe()
    assert re.search(r"ocr activations +1.0 GiB/frame \+ 200.0 MiB", text) and "3.00 frames per sample" in text
    assert re.search(r"sim:g80 ocr batch +\d+ frames", text)
    # A batch size set by the user is in samples: 8 three-frame videos are 24 frames.
    user = plan({"batch_size": 8, "replicas": 1}, reports=[sim_report()], probe_report=videos).devices[0]
    assert user.scorer_batch == {"clip": 24, "ocr": 24}
    # A video sample with k frames costs k x the frame's bytes: refused where 8 images would fit.
    tight = sim_report(free=int((500 * MiB + 200 * MiB + 20 * GiB) / 0.9))
    assert plan({"batch_size": 8, "replicas": 1}, reports=[tight], probe_report=images).devices[0].batch_size == 8
    with pytest.raises(ConfigError, match=r"batch_size=8 on sim:g80: .*ocr 200.0 MiB \+ 1.0 GiB x 24 frames"):
        plan({"batch_size": 8, "replicas": 1}, reports=[tight], probe_report=videos)


def test_the_queued_samples_bound_the_dispatched_batch():
    """Prepared 3-frame 720p videos are ~8 MiB: queues of 512 of them per process would take more
    than a quarter of a small host; the dispatched batch is cut, the scorer batches stay."""
    p = clip_ocr_probe()
    p.prepared_bytes = 8 * MiB
    host = {"total": 16 * GiB, "available": 10 * GiB, "cpus": 16}
    t = plan({}, reports=[sim_report()], probe_report=p, host=host)
    (d,) = t.devices
    budget = int(10 * GiB * 0.9)
    assert 2 * d.replicas * d.batch_size * 8 * MiB <= budget // 4 and d.batch_size < 512
    assert d.scorer_batch["clip"] == 512
    assert "sim:g80 dispatch" in t.describe()


def test_two_model_processes_on_a_simulated_gpu_with_room_and_one_on_a_gpu_without(tmp_path, monkeypatch):
    """The engine applies the plan: a second process on the GPU where it fits (no per-process
    overhead), none where one more process's overhead alone exceeds the device. 16 cores, so the
    cores allow 2 x 2 GPU processes; every sample is scored exactly once across the 3 processes."""
    import collections

    from wdsfilter.score.engines import local as engine
    from wdsfilter.score.memory import host_status
    urls, images = make_shards(tmp_path / "shards", [10, 10])
    SimulatedDevice.create("room", total=1000 * MiB)
    SimulatedDevice.create("cramped", total=1000 * MiB, overhead=2000 * MiB)
    monkeypatch.setattr(engine, "host_status", lambda: dict(host_status(), cpus=16))
    log = tmp_path / "log"
    summary = score(urls, out=str(tmp_path / "o"), scorers=[BrightnessScorer(log=str(log))],
                    devices=["sim:room", "sim:cramped"], workers=0, progress=False)
    replicas = {d["device"]: d["replicas"] for d in summary.plan["devices"]}
    assert replicas == {"sim:room": 2, "sim:cramped": 1}
    assert "a process more would leave bright a batch under" in summary.plan_text
    assert sorted(w["device"] for w in summary.workers) == ["sim:cramped", "sim:room", "sim:room"]
    assert summary.scored == len(images)
    from wdsfilter.runfolder.tables import read_rows
    folder = tmp_path / "o" / "scores"
    rows = [r for f in sorted(os.listdir(folder)) for r in read_rows(str(folder / f))]
    assert collections.Counter(r["key"] for r in rows) == collections.Counter(images.keys())
    assert {r["status"] for r in rows} == {"scored"}
    with open(log) as f:  # every sample reached a model (the probe's samples are logged there too)
        assert set(line.strip() for line in f) == set(images)
