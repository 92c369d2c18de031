"""tools/gpu_check.py's CPU dry mode: every selected step really runs `wdsfilter score` in a
subprocess on tiny generated shards with a tiny random CLIP, is watched (child processes, CPU%),
and is judged against its pass line; the table names each step with PASS/FAIL."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tools import gpu_check  # noqa: E402


@pytest.mark.slow
def test_dry_run_on_cpu_passes_placement_backoff_and_equality(capsys):
    rows = gpu_check.main(["--dry-run-cpu", "--only", "1,3,7"])
    out = capsys.readouterr().out
    assert [r.step for r in rows] == ["1 placement", "3 out-of-memory back-off", "7 score equality"]
    assert all(r.ok is True for r in rows), out
    table = [line for line in out.splitlines() if not line.startswith("gpu_check:")]  # not the progress lines
    assert "\n".join(table).count("PASS") == 3 and "pass line" in out
    assert "max |cpu - cpu|" in rows[2].measured


def test_table_marks_failures_and_skips(capsys):
    rows = [gpu_check.Row("1 placement", "x", "only model workers", False),
            gpu_check.Row("6 ray on GPU", "no ray", "one row per sample", None),
            gpu_check.Row("7 score equality", "2e-4", "<= 2e-3", True)]
    gpu_check.print_table(rows)
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[2] == "FAIL"
    assert "SKIP" in out[2] and "PASS" in out[3]


def test_no_cuda_without_dry_run_exits_with_advice(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--dry-run-cpu"):
        gpu_check.main([])


@pytest.mark.slow
def test_dry_run_sticky_error_stops_the_run_and_resume_rescores_only_the_unfinished_shards(capsys):
    # A real `wdsfilter score` with the StickyClip plug-in: the batch after its third raises the
    # device-side-assert RuntimeError; then --resume with the fault switched off.
    (row,) = gpu_check.main(["--dry-run-cpu", "--only", "5"])
    out = capsys.readouterr().out
    assert row.step == "5 sticky device error" and row.ok is True, out
    assert row.measured.startswith("rc 3 (sticky message: True)") and "afterwards 8/8 marked" in row.measured


@pytest.mark.slow
def test_dry_run_ray_survives_an_actor_killed_mid_run(capsys):
    # A local Ray (ray.init, 4 CPUs), `wdsfilter score --engine ray --ray-address auto` (RAY_ADDRESS
    # pins it): one run for samples/s, one with 2 actors of which one is sent SIGKILL after the
    # first shard is done; every shard then has one row per sample and a marker.
    (row,) = gpu_check.main(["--dry-run-cpu", "--only", "6"])
    out = capsys.readouterr().out
    assert row.step == "6 ray (CPU actors)" and row.ok is True, out
    assert "killed pid" in row.measured and "rc 0, 8/8 marked" in row.measured
    import ray
    assert not ray.is_initialized()  # the tool shut its Ray down


@pytest.mark.slow
def test_dry_run_plan_rows_and_easyocr_throughput_with_a_random_craft(capsys):
    # Step 2b and step 4's OCR row run easyocr with a CRAFT checkpoint built from easyocr's class
    # (no download, no checksum), as they do on a GPU lease.
    rows = gpu_check.main(["--dry-run-cpu", "--only", "2"])
    out = capsys.readouterr().out
    assert [r.step for r in rows] == ["2a plan vs reality (clip)", "2b plan vs reality (clip+ocr)"]
    assert all(r.ok is True for r in rows), out
    assert "ocr batch planned/final" in rows[1].measured


def test_a_step_that_would_end_past_the_deadline_is_skipped_not_started(capsys):
    rows = gpu_check.main(["--dry-run-cpu", "--only", "7,5", "--deadline", "1"])
    out = capsys.readouterr().out
    assert [r.verdict() for r in rows] == ["SKIP", "SKIP"], out
    assert [r.step for r in rows] == ["7 equality", "5 sticky"]
    assert all("not run" in r.measured and "deadline 1 s" in r.measured for r in rows)
    assert "score" not in out.replace("score equality", "")  # no run started


@pytest.mark.slow  # two scoring runs
def test_dry_run_gpu_decode_step_refuses_a_gpu_decode_on_a_cpu(capsys):
    (row,) = gpu_check.main(["--dry-run-cpu", "--only", "8"])
    assert row.ok, row
    assert row.step == "8 gpu decode" and "rc 2" in row.measured and "cpu path rc 0" in row.measured
