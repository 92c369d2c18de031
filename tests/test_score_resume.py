"""Resume: a real `wdsfilter score` process killed with SIGKILL mid-run, then resumed, gives the
same outputs as an uninterrupted run, with no sample lost or duplicated."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from scorekit import BrightnessScorer, make_shards
from wdsfilter.score import score
from wdsfilter.runfolder.tables import read_rows

TESTS = os.path.dirname(os.path.abspath(__file__))


def score_cli(args, **popen):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "wdsfilter", "score", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def tables(out):
    """{score file name: its rows}, and every key seen exactly once over all files."""
    result, seen = {}, set()
    for path in sorted(glob.glob(os.path.join(out, "scores", "*"))):
        rows = read_rows(path)
        for r in rows:
            assert r["key"] not in seen, f"{r['key']} has two rows"
            seen.add(r["key"])
        result[os.path.basename(path)] = rows
    return result, seen


def same_rows(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for ra, rb in zip(a[name], b[name]):
            assert {k: v for k, v in ra.items() if k != "brightness"} == {k: v for k, v in rb.items() if k != "brightness"}
            assert (ra["brightness"] is None) == (rb["brightness"] is None)
            if ra["brightness"] is not None:
                assert ra["brightness"] == pytest.approx(rb["brightness"], abs=1e-6)


def leftovers(*folders):
    return [f for d in folders for f in os.listdir(d) if ".tmp-" in f]


def test_a_run_killed_with_sigkill_resumes_to_the_same_outputs(tmp_path):
    urls, images = make_shards(tmp_path / "shards", [8] * 6, bad={1: (3,)}, refused={4: (0, 5)})
    killed, filtered_k = str(tmp_path / "killed"), str(tmp_path / "filtered-killed")
    common = ["--scorer", "scorekit:BrightnessScorer", "--scorer-opt", "bright.fail_word=refuse-me",
              "--device", "cpu", "--batch-size", "4", "--workers", "1", "--min", "brightness=0.4",
              "--no-progress"]
    proc = score_cli([str(tmp_path / "shards"), "--out", killed, "--write-shards", filtered_k,
                      "--scorer-opt", "bright.delay=0.25", *common], start_new_session=True)
    deadline = time.monotonic() + 120
    while not glob.glob(os.path.join(killed, "done", "*.json")):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no shard finished in 120s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI, its decode worker, everything: no cleanup runs
    proc.wait()
    done_at_kill = len(glob.glob(os.path.join(killed, "done", "*.json")))
    assert proc.returncode == -signal.SIGKILL and 1 <= done_at_kill < 6

    resumed = score_cli([str(tmp_path / "shards"), "--out", killed, "--write-shards", filtered_k,
                         "--scorer-opt", "bright.delay=0.25", "--resume", *common])
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert f"resume: {done_at_kill} of 6 shard(s) already done, {6 - done_at_kill} to score" in output

    straight, filtered_s = str(tmp_path / "straight"), str(tmp_path / "filtered-straight")
    score(urls, out=straight, write_shards=filtered_s, scorers=[BrightnessScorer(fail_word="refuse-me")],
          device="cpu", batch_size=4, workers=1, min_scores={"brightness": 0.4}, progress=False)

    a, keys_a = tables(killed)
    b, keys_b = tables(straight)
    assert keys_a == keys_b == set(images)  # no sample lost, none duplicated (tables() checks)
    same_rows(a, b)
    for name in os.listdir(filtered_s):
        assert open(os.path.join(filtered_k, name), "rb").read() == open(os.path.join(filtered_s, name), "rb").read()
    assert sorted(os.listdir(filtered_k)) == sorted(os.listdir(filtered_s))
    assert not leftovers(os.path.join(killed, "scores"), os.path.join(killed, "done"), filtered_k, killed)
    import json
    sa, sb = (json.load(open(os.path.join(d, "summary.json"))) for d in (killed, straight))
    assert sa["status"] == sb["status"] and sa["kept"] == sb["kept"] and sa["rows"] == len(images)
    assert sa["shards_resumed"] == done_at_kill and sa["shards_scored"] == 6 - done_at_kill

    # Resuming with other settings is refused; resuming a finished run only summarises it.
    other = score_cli([str(tmp_path / "shards"), "--out", killed, "--resume", *common[:-3], "--min", "brightness=0.5",
                       "--write-shards", filtered_k, "--scorer-opt", "bright.delay=0.25", "--no-progress"])
    output, _ = other.communicate(timeout=300)
    assert other.returncode == 2 and "was written with other settings (thresholds" in output
    again = score_cli([str(tmp_path / "shards"), "--out", killed, "--write-shards", filtered_k,
                       "--scorer-opt", "bright.delay=0.25", "--resume", *common])
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "all 6 shard(s) are already scored" in output, output


def test_resume_redoes_shards_whose_outputs_are_incomplete(tmp_path):
    urls, images = make_shards(tmp_path / "shards", [5, 5, 5])
    out = str(tmp_path / "out")
    opts = dict(scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False)
    score(urls, out=out, **opts)
    first, _ = tables(out)
    os.remove(os.path.join(out, "scores", "shard-0001.parquet"))  # marker left, file gone
    open(os.path.join(out, "scores", ".shard-0002.parquet.tmp-99999"), "w").write("half a file")
    summary = score(urls, out=out, resume=True, **opts)
    assert summary.shards_resumed == 2 and summary.shards_scored == 1
    again, keys = tables(out)
    assert keys == set(images)
    same_rows(first, again)
    assert not leftovers(os.path.join(out, "scores"))
    summary = score(urls, out=out, overwrite=True, **opts)
    assert summary.shards_scored == 3 and summary.rows == len(images)


def test_a_killed_runs_copy_of_a_pipe_shard_is_removed_by_the_next_run(tmp_path):
    from wdsfilter.storage.shardcopy import local_copy
    urls, _ = make_shards(tmp_path / "shards", [3])
    out, kept = str(tmp_path / "out"), tmp_path / "kept"
    opts = dict(scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False, write_shards=str(kept))
    score(urls, out=out, **opts)
    copy = local_copy(f"pipe:cat {urls[0]}", True, False, str(kept))  # what a run killed mid-copy leaves
    assert open(copy, "rb").read() == open(urls[0], "rb").read()
    score(urls, out=out, resume=True, **opts)
    assert not os.path.exists(copy) and sorted(os.listdir(kept)) == ["shard-0000.tar", "shard-0000_stats.json",
                                                                             "sizes.json"]


def test_resume_scores_again_a_shard_that_changed_since_it_was_scored(tmp_path):
    """A shard re-created under the same name (re-downloaded, re-written) is not the shard its
    marker vouches for: --resume scores it again instead of keeping the old rows."""
    urls, images = make_shards(tmp_path / "shards", [5, 5, 5])
    out = str(tmp_path / "out")
    opts = dict(scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False)
    score(urls, out=out, **opts)
    other, other_images = make_shards(tmp_path / "other", [5, 7, 5])
    os.replace(other[1], urls[1])  # same name, other samples
    summary = score(urls, out=out, resume=True, **opts)
    assert summary.shards_resumed == 2 and summary.shards_scored == 1
    _, keys = tables(out)
    assert summary.rows == 17 and {k for k in keys if k.startswith("s1_")} == {k for k in other_images if k.startswith("s1_")}
    again = score(urls, out=out, resume=True, **opts)  # unchanged since: nothing to redo
    assert again.shards_resumed == 3 and again.shards_scored == 0


@pytest.mark.parametrize("damage", ["truncate", "replace"])
def test_resume_scores_again_a_shard_whose_score_file_is_damaged(tmp_path, damage):
    """A score file cut short (or replaced) under a marker is not trusted: --resume scores its
    shard again, instead of failing on it (or summarising wrong rows) at every later run."""
    urls, images = make_shards(tmp_path / "shards", [5, 5, 5])
    out = str(tmp_path / "out")
    opts = dict(scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False)
    score(urls, out=out, **opts)
    first, _ = tables(out)
    path = os.path.join(out, "scores", "shard-0001.parquet")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:100] if damage == "truncate" else data + b"\0" * 10)
    summary = score(urls, out=out, resume=True, **opts)
    assert summary.shards_resumed == 2 and summary.shards_scored == 1 and summary.rows == 15
    again, keys = tables(out)
    assert keys == set(images)
    same_rows(first, again)


def children(pid):
    """Pids of the live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_and_wait_for_a_marker(args, out):
    proc = score_cli(args)
    deadline = time.monotonic() + 120
    while not glob.glob(os.path.join(out, "done", "*.json")):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no shard finished in 120s"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_stopped_by_a_signal_leaves_no_model_worker_behind_and_resumes(tmp_path, sig):
    """SIGTERM (a scheduler's preemption, `timeout`) to the CLI alone: it stops as on Ctrl-C, with
    its cleanup (exit 143, model worker processes stopped, no temporary left, nothing unfinished
    marked done); it used to die at once, leaving its model workers waiting for ever. After
    SIGKILL nothing can clean up: the model workers notice their main process is gone and exit."""
    urls, images = make_shards(tmp_path / "shards", [6] * 4)
    out, filtered = str(tmp_path / "out"), str(tmp_path / "filtered")
    args = [str(tmp_path / "shards"), "--out", out, "--write-shards", filtered, "--scorer", "scorekit:BrightnessScorer",
            "--device", "cpu", "--replicas", "2", "--workers", "1", "--batch-size", "2", "--no-progress"]
    proc = start_and_wait_for_a_marker([*args, "--scorer-opt", "bright.delay=0.3"], out)
    workers = [p for p in children(proc.pid) if "spawn_main" in open(f"/proc/{p}/cmdline").read()]
    assert len(workers) == 2
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, output
        assert "terminated (SIGTERM)" in output and "Traceback" not in output
        assert not leftovers(os.path.join(out, "scores"), os.path.join(out, "done"), filtered, out)
    else:
        assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60  # a hang guard: they exit within a second or two
    while any(alive(p) for p in workers):
        assert time.monotonic() < deadline, f"model workers {workers} outlived the run"
        time.sleep(0.1)
    done = len(glob.glob(os.path.join(out, "done", "*.json")))
    assert 1 <= done < 4
    resumed = score_cli([*args, "--scorer-opt", "bright.delay=0.3", "--resume"])
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    _, keys = tables(out)
    assert keys == set(images)
