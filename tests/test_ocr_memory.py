"""The seed's EasyOCR memory problem, with the real model (issue 38 item 3): a copy of the model in
every worker process exhausted RAM. `--device cpu --replicas N` now starts one model process,
measures it, and starts only as many more as --max-memory holds (the whole process tree measured
by tools/measure_ocr_memory.TreeSampler, not estimated); the back-off halves on the CPU path,
on host pressure with the real CRAFT and on a real allocation failure of torch's CPU allocator."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("easyocr")
pytest.importorskip("easyocr_en_models")

from filterkit import REPO, gnu_tar_shards  # noqa: E402
from tools.measure_ocr_memory import run  # noqa: E402
from wdsfilter.score.planner import WORKER_BASE_BYTES  # noqa: E402
from wdsfilter.core.units import parse_size  # noqa: E402

pytestmark = pytest.mark.slow  # model processes with the real CRAFT
MiB = 2**20
# Frames at their own size (tiny JPEGs), boxes not read: this is about processes and memory.
SMALL = ["--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null",
         "--workers", "1"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return gnu_tar_shards(str(tmp_path_factory.mktemp("shards")), [6, 6])


@pytest.fixture(scope="module")
def refused(shards, tmp_path_factory):
    """--replicas 4 --fit refuse under a 2 GiB budget (the main process and one model process with
    torch and CRAFT loaded take most of it): refused after one model process was started and
    measured. Its message holds the planner's numbers, which size the next test's budget."""
    r = run(4, str(tmp_path_factory.mktemp("refused")), shards, max_memory="2GiB", fit="refuse", extra=SMALL)
    return r


def planner_numbers(refused) -> dict:
    """The planner's own numbers from the refusal: a model process's RSS (measured), the working
    memory of a batch of one, and the main process's peak RSS (sampled)."""
    m = re.search(r"3 more x ([\d.]+ [KMG]i?B) \(a process's RSS.*?\+ 4 x ([\d.]+ [KMG]i?B) \(a batch of one\)",
                  refused["stderr"])
    assert m, refused["stderr"]
    main = max(p["rss"] for p in refused["tree"].processes("main"))
    return {"process": parse_size(m.group(1)), "one": parse_size(m.group(2)), "main": main}


def test_by_default_a_replicas_setting_that_cannot_fit_is_refused_before_more_copies_load(refused):
    assert refused["returncode"] == 2, refused["stderr"]
    assert "replicas=4 on the CPU" in refused["stderr"] and "Traceback" not in refused["stderr"]
    assert len(refused["tree"].processes("model process")) <= 1


def test_a_budget_under_four_copies_runs_fewer_model_processes_and_the_tree_stays_under_it(shards, refused,
                                                                                           tmp_path):
    """A budget that holds two model processes and half of a third, by the planner's rule (each
    more process: its RSS and a batch of one; the main process, the first model process and one
    decode worker's base come off the budget first): two run, never four."""
    n = planner_numbers(refused)
    budget = int(n["main"] + WORKER_BASE_BYTES + n["process"] + 1.5 * n["process"] + 2.5 * n["one"])
    r = run(4, str(tmp_path / "out"), shards, max_memory=f"{budget // MiB}MiB", extra=SMALL)
    assert r["returncode"] == 0, r["stderr"]
    devices = r["summary"]["plan"]["devices"]
    assert [d["replicas"] for d in devices] == [2], (devices, n)
    tree = r["tree"]
    assert len(tree.processes("model process")) == 2  # never four started
    assert r["summary"]["status"] == {"scored": 12}
    # The tree's memory: PSS (a page shared by n processes counted once); RSS sums count the
    # forked decode worker's pages shared with the main process twice.
    assert tree.peak_pss <= budget, (tree.peak_pss / MiB, budget / MiB)
    assert "clamped from 4" in r["stdout"] + r["stderr"]


def test_host_pressure_halves_the_real_craft_batch_and_scores_each_frame_once():
    from PIL import Image

    from wdsfilter.score.backoff import Backoff
    from wdsfilter.score.memory import HostMemory
    from wdsfilter.score.scorers.ocr import OcrScorer
    from videokit import text_frame
    scorer = OcrScorer(backend="easyocr", min_text_score=None, backend_options={"min_side": 0})
    scorer.load("cpu")
    inputs = [scorer.prepare({"image": Image.fromarray(text_frame(w))}) for w in ("SALE", "OPEN", "NEWS", "EXIT")]
    alone = [scorer.score_batch([x])[0]["ocr_area"] for x in inputs]
    host = HostMemory()
    backoff = Backoff(scorer, host, batch_size=4, host=host, min_free_host=2 * host.total())
    outcomes = backoff.run(inputs)
    assert [o[0] for o in outcomes] == ["ok"] * 4
    assert [o[1]["ocr_area"] for o in outcomes] == pytest.approx(alone, abs=1e-9)
    assert min(alone) > 0.02  # the real CRAFT finds each word (0.030 to 0.044 measured)
    assert [(e.kind, e.from_size, e.to_size) for e in backoff.events][:2] == [("host_pressure", 4, 2),
                                                                              ("host_pressure", 2, 1)]


ALLOC_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from wdsfilter.score.backoff import Backoff
    from wdsfilter.score.memory import HostMemory

    class Hungry:
        name = "hungry"
        def columns(self):  # declared, as every scorer's are (the back-off checks outputs against them)
            return ["v"]
        def score_batch(self, inputs):  # 600 MiB a sample: a batch of 4 cannot be allocated here
            x = torch.ones(len(inputs) * 600 * 2**20, dtype=torch.uint8)
            return [{"v": int(x[:1].sum()) + i} for i in inputs]

    torch.ones(1)
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = vm + 1600 * 2**20  # two samples fit, four do not
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    backoff = Backoff(Hungry(), HostMemory(), batch_size=4)
    outcomes = backoff.run([0, 1, 2, 3])
    print([o[0] for o in outcomes], [o[1]["v"] for o in outcomes if o[0] == "ok"],
          [(e.kind, e.from_size, e.to_size) for e in backoff.events])
""")


def test_a_real_cpu_allocation_failure_halves_the_batch():
    """torch's CPU allocator raises RuntimeError("... DefaultCPUAllocator: can't allocate memory
    ..."), without "out of memory": before, the back-off took it for a broken scorer and every
    sample of the batch failed."""
    r = subprocess.run([sys.executable, "-c", ALLOC_SCRIPT], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['ok', 'ok', 'ok', 'ok'] [1, 2, 3, 4] [('host_oom', 4, 2)]", r.stdout


def test_is_oom_knows_the_cpu_allocators():
    from wdsfilter.score.memory import is_oom
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 4294967296 bytes. Error code 12"))
    assert not is_oom(RuntimeError("shape mismatch"))
