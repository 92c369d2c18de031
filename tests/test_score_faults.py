"""Faults during `wdsfilter score` on real shards and real processes: a shard whose pipe: command
or download fails (issue 8 item 6), sticky device errors and cuBLAS/cuDNN allocation failures
(item 7), two runs on one --out (item 12) and a full disk (item 13). Each ends with a non-zero
exit, no marker for what was not fully done, and a --resume that completes the run."""
import json
import os

import pytest
from click.testing import CliRunner

from faultkit import big_shards, broken_download, small_tmpfs, temporaries
from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.score import score

SCORER = "scorekit:BrightnessScorer"


def cli(*args):
    return CliRunner().invoke(main, ["score", *args, "--device", "cpu", "--workers", "0", "--no-progress",
                                     "--no-histograms", "--batch-size", "4"])


def done_names(out):
    folder = os.path.join(out, "done")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.fixture
def shards(tmp_path):
    return make_shards(tmp_path / "shards", [6, 5])[0]


# -- item 6: a shard not read to its end ------------------------------------------------------------
@pytest.mark.parametrize("command", ["cat {shard}; test ! -e {flag}",  # the whole tar, then an error
                                     # part of it, then an error
                                     "if test -e {flag}; then head -c 3000 {shard}; exit 1; else cat {shard}; fi",
                                     # 141 (killed by SIGPIPE), which webdataset lets pass: after part of the
                                     # tar, and after all of it
                                     "if test -e {flag}; then head -c 3000 {shard}; exit 141; else cat {shard}; fi",
                                     "cat {shard}; if test -e {flag}; then exit 141; fi"])
def test_a_failing_pipe_command_fails_its_shard_and_resume_retries_it(shards, tmp_path, command):
    flag = tmp_path / "broken"
    flag.touch()
    url = "pipe:" + command.format(shard=shards[0], flag=flag)
    out = str(tmp_path / "out")
    result = cli(url, shards[1], "--allow-pipe", "--scorer", SCORER, "--out", out)
    assert result.exit_code == 3, result.output
    assert "1 shard(s) failed" in result.output and "--resume" in result.output
    assert f"shard FAILED (no marker; --resume retries it): {url}: not read to its end" in result.output
    assert done_names(out) == ["shard-0001.json"]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert [f["url"] for f in summary["shards_failed"]] == [url]
    assert summary["rows"] == 5 and summary["status"] == {"scored": 5}  # only the shard read to its end
    assert os.listdir(os.path.join(out, "scores")) == ["shard-0001.parquet"]

    flag.unlink()  # the command works now
    again = cli(url, shards[1], "--allow-pipe", "--scorer", SCORER, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert len(done_names(out)) == 2 and "shard-0001.json" in done_names(out)
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == {"scored": 11}


def test_a_pipe_shard_that_is_cut_when_read_again_for_its_filtered_copy_fails(shards, tmp_path):
    """A pipe: shard is read twice: to score it, then for its filtered copy. A command that sends
    part of it the second time (exit 0) left a filtered shard without some kept samples, marked
    done; now the copy is checked and the shard fails (no marker, no filtered shard)."""
    runs = tmp_path / "runs"
    url = (f"pipe:if test -s {runs}; then head -c 5120 {shards[1]}; else cat {shards[1]}; fi; echo run >> {runs}")
    out, filtered = str(tmp_path / "out"), str(tmp_path / "filtered")
    # The probe reads 2 samples of the first shard: the pipe shard is read whole once, to score it.
    summary = score([shards[0], url], out=out, scorers=[SCORER], device="cpu", workers=0, progress=False,
                    allow_pipe=True, batch_size=4, probe_samples=2, write_shards=filtered)
    assert len(runs.read_text().split()) == 2  # read to score it, then for the copy
    assert [f["url"] for f in summary.shards_failed] == [url]
    assert "holds 2 of its 5 kept sample(s)" in summary.shards_failed[0]["reason"]
    assert done_names(out) == ["shard-0000.json"]
    assert sorted(f for f in os.listdir(filtered) if f.endswith(".tar")) == ["shard-0000.tar"]
    assert not temporaries(out, filtered)


def test_a_shard_cut_short_stays_listed_after_resume(shards, tmp_path):
    """A truncated shard is scored up to its break and done; the summary of every later --resume
    still lists it (summary.json shards_cut, the terminal's first line): it used to list only the
    cut shards of its own run, so the resumed run reported the dataset clean."""
    cut = str(tmp_path / "cut.tar")
    open(cut, "wb").write(open(shards[0], "rb").read()[:7000])
    flag = tmp_path / "broken"
    flag.touch()
    url = f"pipe:cat {shards[1]}; test ! -e {flag}"
    out = str(tmp_path / "out")
    first = cli(cut, url, "--allow-pipe", "--scorer", SCORER, "--out", out)
    assert first.exit_code == 3 and "1 shard(s) FAILED; 1 shard(s) CUT SHORT" in first.output, first.output
    flag.unlink()
    again = cli(cut, url, "--allow-pipe", "--scorer", SCORER, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert "(1 shard(s) were already done); 1 shard(s) CUT SHORT" in again.output
    assert "shard CUT SHORT (the samples before the break were scored" in again.output
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert [f["url"] for f in summary["shards_cut"]] == [cut] and summary["shards_failed"] == []


def test_a_pipe_command_that_hangs_is_killed_and_fails_its_shard(shards, tmp_path):
    """A command that sends part of a shard and then hangs used to hang the run for ever (a read
    blocked in the kernel: no watchdog sees it). After stream_idle_seconds with nothing to read,
    the command and what it started are killed: the shard fails (no marker), the rest is scored,
    (without the guard this run takes 90s and marks the shard done, cut short)
    and validate names it too."""
    from wdsfilter.validate import validate
    pidfile = tmp_path / "sleeper.pid"
    url = f"pipe:head -c 5000 {shards[1]}; sleep 90 & echo $! > {pidfile}; wait"
    out = str(tmp_path / "out")
    summary = score([shards[0], url], out=out, scorers=[SCORER], device="cpu", workers=0, progress=False,
                    allow_pipe=True, batch_size=4, stream_idle_seconds=2)
    assert [f["url"] for f in summary.shards_failed] == [url]
    assert "sent nothing for 2s (stream_idle_seconds) and was killed" in summary.shards_failed[0]["reason"]
    assert done_names(out) == ["shard-0000.json"] and summary.rows == 6
    sleeper = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{sleeper}") or open(f"/proc/{sleeper}/stat").read().split()[2] == "Z"
    report = validate([url], config={"allow_pipe": True, "stream_idle_seconds": 2})
    failed = [f for f in report.shards[0].findings if f.kind == "shard_command_failed"]
    assert failed and "stalled: it sent nothing for 2s" in failed[0].message and not report.passed


def test_a_stalled_command_fails_its_shard_whatever_its_exit_status(shards):
    """A stall is a failure even where the kill left exit status 0 (a shell whose `wait` returned
    when its child was killed, before its own kill): the reason then depended on timing."""
    from wdsfilter.storage.shards import close_shard, open_shard
    stream = open_shard(f"pipe:cat {shards[0]}", allow_pipe=True, idle_seconds=60)
    while stream.read(1 << 16):
        pass
    stream.stalled = "it sent nothing for 60s (stream_idle_seconds) and was killed"  # as IdleGuard marks it
    with pytest.raises(OSError, match="sent nothing for 60s"):
        close_shard(stream)
    assert stream.status == 0


def _fast_retries(tmp_path) -> str:
    """Stage options that give a failing remote read up quickly (2 tries, 10 ms apart)."""
    path = tmp_path / "fast-retries.json"
    path.write_text(json.dumps({"remote_attempts": 2, "remote_backoff_seconds": 0.01}))
    return str(path)


def test_a_download_that_breaks_off_fails_its_shard(shards, tmp_path):
    out = str(tmp_path / "out")
    fast = _fast_retries(tmp_path)
    with broken_download(shards[0], send_fraction=0.6) as (url, control):
        result = cli(url, shards[1], "--allow-remote", "--scorer", SCORER, "--out", out, "--config", fast)
        assert result.exit_code == 3, result.output
        assert f"{url}: not read to its end" in result.output
        assert done_names(out) == ["shard-0001.json"]
        control["fraction"] = 1.0  # served whole, the same URL completes on --resume
        again = cli(url, shards[1], "--allow-remote", "--scorer", SCORER, "--out", out, "--resume", "--config", fast)
    assert again.exit_code == 0, again.output
    assert done_names(out) == ["shard-0000.json", "shard-0001.json"]
    assert json.load(open(os.path.join(out, "summary.json")))["rows"] == 11


def test_a_download_cut_short_without_an_error_fails_its_shard(shards, tmp_path):
    """A server that sends no length and closes early: curl exits 0 and the tar just stops. A local
    file cut short reads the same again (scored up to the break, done); a stream cut short may be
    a transfer that broke off, so it is not done: it used to get a marker (exit 0) and --resume never
    fetched it again."""
    out = str(tmp_path / "out")
    with broken_download(shards[0], send_fraction=0.5, announce_length=False) as (url, control):
        piped = f"pipe:curl -s {url}"
        result = cli(url, piped, shards[1], "--allow-remote", "--allow-pipe", "--scorer", SCORER, "--out", out)
        assert result.exit_code == 3, result.output
        assert f"{url}: not read to its end" in result.output and f"{piped}: not read to its end" in result.output
        assert "may have been cut in transfer" in result.output
        assert done_names(out) == ["shard-0001.json"]
        control["fraction"] = 1.0
        again = cli(url, piped, shards[1], "--allow-remote", "--allow-pipe", "--scorer", SCORER, "--out", out,
                    "--resume")
    assert again.exit_code == 0, again.output
    assert len(done_names(out)) == 3
    assert json.load(open(os.path.join(out, "summary.json")))["rows"] == 6 + 6 + 5


def test_a_failing_pipe_shard_fails_on_the_api_too_with_decode_workers(shards, tmp_path):
    url = f"pipe:cat {shards[0]}; exit 1"
    summary = score([url, shards[1]], out=str(tmp_path / "out"), scorers=[SCORER], device="cpu", workers=1,
                    progress=False, allow_pipe=True, batch_size=4)
    assert [f["url"] for f in summary.shards_failed] == [url]
    assert summary.shards_scored == 1 and summary.rows == 5
    assert done_names(str(tmp_path / "out")) == ["shard-0001.json"]


# -- item 7: sticky device errors and library allocation failures -----------------------------------
STICKY = "faultkit:StickyScorer"


@pytest.mark.parametrize("kind", ["illegal", "cublas", "timeout"])
def test_a_sticky_device_error_stops_the_run_and_resume_redoes_the_unfinished_shards(tmp_path, kind):
    urls = make_shards(tmp_path / "shards", [8, 8, 8])[0]
    trip, out = tmp_path / "trip", str(tmp_path / "out")
    trip.touch()
    opts = ["--scorer", STICKY, "--scorer-opt", f"bright.trip_file={trip}", "--scorer-opt", "bright.trip_key=s2_",
            "--scorer-opt", f"bright.kind={kind}", "--out", out]
    result = cli(*urls, *opts)
    assert result.exit_code == 3, result.output
    assert "failed with a sticky error" in result.output and "--resume" in result.output
    assert "Traceback" not in result.output
    # The shards finished before the fault are done; the one it hit has no marker and no score file.
    assert done_names(out) == ["shard-0000.json", "shard-0001.json"]
    assert sorted(os.listdir(os.path.join(out, "scores"))) == ["shard-0000.parquet", "shard-0001.parquet"]

    trip.unlink()  # a healthy device
    again = cli(*urls, *opts, "--resume")
    assert again.exit_code == 0, again.output
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["status"] == {"scored": 24} and summary["shards_resumed"] == 2


def test_a_sticky_error_in_a_model_worker_process_is_fatal_for_the_run(tmp_path):
    from faultkit import StickyScorer
    from wdsfilter.score.faults import DeviceFailedError
    urls = make_shards(tmp_path / "shards", [8, 8, 8])[0]
    trip, out = tmp_path / "trip", str(tmp_path / "out")
    trip.touch()
    scorer = StickyScorer(trip_file=str(trip), trip_key="s2_", kind="bus")
    with pytest.raises(DeviceFailedError, match="device cpu failed with a sticky error .*fallen off the bus"):
        score(urls, out=out, scorers=[scorer], devices=["cpu", "cpu"], workers=1, progress=False, batch_size=4)
    assert "shard-0002.json" not in done_names(out)
    trip.unlink()
    again = score(urls, out=out, scorers=[scorer], devices=["cpu", "cpu"], workers=1, progress=False,
                  batch_size=4, resume=True)
    assert again.status == {"scored": 24} and again.shards_failed == []


@pytest.mark.parametrize("kind", ["cublas", "cudnn", "workspace"])
def test_cublas_and_cudnn_allocation_failures_halve_the_batch_like_out_of_memory(tmp_path, kind):
    from faultkit import AllocFailScorer
    urls = make_shards(tmp_path / "shards", [9])[0]
    summary = score(urls, out=str(tmp_path / "out"), scorers=[AllocFailScorer(alloc_above=2, kind=kind)],
                    device="cpu", workers=0, progress=False, batch_size=8)
    assert summary.status == {"scored": 9}  # no sample lost to the failures
    (b,) = summary.batch_sizes()
    assert b["planned"] == 8 and b["final"] == 2 and b["causes"] == ["cuda_oom"]


def test_the_fault_classes_of_real_cuda_messages():
    from faultkit import ALLOC_MESSAGES, STICKY_MESSAGES
    from wdsfilter.score.faults import sticky_device_error
    from wdsfilter.score.memory import is_oom
    for text in STICKY_MESSAGES.values():
        assert sticky_device_error(RuntimeError(text)) and not is_oom(RuntimeError(text)), text
    for text in ALLOC_MESSAGES.values():
        assert is_oom(RuntimeError(text)) and not sticky_device_error(RuntimeError(text)), text
    for text in ("CUDA out of memory. Tried to allocate 2.00 GiB", "shape mismatch: [4, 3] vs [4, 5]",
                 "Expected all tensors to be on the same device"):
        assert not sticky_device_error(RuntimeError(text)), text
    assert not sticky_device_error(ValueError("CUDA error: an illegal memory access was encountered"))


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_a_scorer_that_cannot_load_fails_the_run_in_one_line(tmp_path, replicas):
    """In the main process it was an "internal error ... a bug in wdsfilter"; in a model worker
    process the worker's whole traceback was the error message. Now one line naming the scorer's
    error, exit 3, nothing marked done; --debug shows the worker's traceback."""
    urls = make_shards(tmp_path / "shards", [4])[0]
    out = str(tmp_path / "out")
    proc = _start_score(urls, out, "--replicas", replicas, scorer="faultkit:LoadFailScorer")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, output
    error = [line for line in output.splitlines() if "error:" in line]
    assert len(error) == 1 and "RuntimeError: the weights file is corrupt" in error[0], output
    assert "a bug in wdsfilter" not in output and "Traceback" not in output and "second line" not in output
    assert done_names(out) == []
    if replicas == "2":
        debug = _start_score(urls, out, "--replicas", "2", "--debug", "--overwrite", scorer="faultkit:LoadFailScorer")
        output, _ = debug.communicate(timeout=300)
        assert debug.returncode == 3 and "the model worker's traceback" in output and "in load" in output


def test_a_decode_worker_killed_mid_shard_fails_the_run_in_one_line_and_resume_completes_it(tmp_path):
    """A DataLoader decode worker killed mid-shard (os._exit(137), as the OOM killer does): exit 3
    with one line naming it (it read "internal error ... a bug in wdsfilter"), no marker for the
    shard it was reading, and --resume completes the run."""
    urls, images = make_shards(tmp_path / "shards", [8, 8, 8])
    trip, out = tmp_path / "trip", str(tmp_path / "out")
    trip.touch()
    opts = ["--workers", "1", "--scorer-opt", "bright.kill_key=s2_00005", "--scorer-opt", f"bright.trip_file={trip}"]
    proc = _start_score(urls, out, *opts, scorer="faultkit:DecodeExitScorer")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, output
    error = [line for line in output.splitlines() if "error:" in line]
    assert len(error) == 1 and "a decode worker died" in error[0] and "--resume" in error[0], output
    assert "a bug in wdsfilter" not in output
    assert "shard-0002.json" not in done_names(out)
    trip.unlink()
    again = _start_score(urls, out, *opts, "--resume", scorer="faultkit:DecodeExitScorer")
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0, output
    assert done_names(out) == ["shard-0000.json", "shard-0001.json", "shard-0002.json"]
    assert json.load(open(os.path.join(out, "summary.json")))["rows"] == 24


# -- item 12: one run per --out -----------------------------------------------------------------------
def _start_score(urls, out, *extra, scorer=SCORER):
    """`wdsfilter score` in its own process (the test scorers importable there too)."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "wdsfilter", "score", *urls, "--out", out, "--scorer", scorer, "--device", "cpu",
           "--workers", "0", "--no-progress", "--batch-size", "2", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_lock(proc, out, timeout=120):
    import time
    lock = os.path.join(out, ".lock.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(lock) and f'"pid": {proc.pid}' in open(lock).read():
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise AssertionError("the first run never took the lock")


def test_a_second_run_on_the_same_out_refuses_while_the_first_lives_and_takes_over_after_a_kill(tmp_path):
    import signal
    urls = make_shards(tmp_path / "shards", [6, 6])[0]
    out = str(tmp_path / "out")
    # Slow (2 s per batch) while the flag file exists; the third run has the same settings (--resume
    # compares them) but runs at full speed once the flag is gone.
    slow = tmp_path / "slow"
    slow.write_text("")
    delay = ["--scorer-opt", "bright.delay=2", "--scorer-opt", f"bright.delay_file={slow}"]
    first = _start_score(urls, out, *delay)
    try:
        _wait_for_lock(first, out)
        second = _start_score(urls, out, "--resume")
        text = second.communicate(timeout=300)[0]
        assert second.returncode == 2, text
        assert f"is in use by another wdsfilter score run (pid {first.pid}" in text and "Traceback" not in text
        assert first.poll() is None  # the refused run touched nothing of the first one's
        first.send_signal(signal.SIGKILL)  # a killed run holds no lock
        first.wait(timeout=30)
        slow.unlink()
        third = _start_score(urls, out, "--resume", *delay)
        text = third.communicate(timeout=600)[0]
        assert third.returncode == 0, text
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert done_names(out) == ["shard-0000.json", "shard-0001.json"]
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == {"scored": 12}
    # The lock is free again once a run ended.
    from wdsfilter.runfolder.lease import Lease
    with Lease(out):
        pass


def _children(pid):
    kids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def test_the_lock_is_free_as_soon_as_a_killed_run_is_gone_though_its_decode_workers_live(tmp_path):
    # A forked decode worker shares the run's locked file; flock holds until every descriptor of
    # it is closed, so after kill -9 the orphaned workers kept the lock for seconds and a --resume
    # at once was refused ("in use by another wdsfilter score run (pid <the dead one>)").
    import signal
    import time
    from wdsfilter.runfolder.lease import Lease
    urls = make_shards(tmp_path / "shards", [6, 6])[0]
    out = str(tmp_path / "out")
    first = _start_score(urls, out, "--workers", "1", "--scorer-opt", "bright.delay=2")
    kids = []
    try:
        _wait_for_lock(first, out)
        deadline = time.monotonic() + 120
        while not kids and time.monotonic() < deadline:  # the decode worker, forked when scoring starts
            assert first.poll() is None, first.stdout.read()
            kids = [k for k in _children(first.pid)
                    if open(f"/proc/{k}/cmdline", "rb").read() == open(f"/proc/{first.pid}/cmdline", "rb").read()]
            time.sleep(0.1)
        assert kids, "no decode worker was forked"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        alive = [k for k in kids if os.path.exists(f"/proc/{k}")]
        Lease(out).acquire().release()  # at once: the orphans hold no lock
        assert alive, "the decode worker ended before the check; the test proved nothing"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for k in kids:  # the orphaned decode workers of the killed run
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_lock_refuses_a_second_holder_in_the_same_process_and_frees_on_release(tmp_path):
    from wdsfilter.runfolder.lease import Lease, LeaseHeldError
    out = str(tmp_path / "out")
    with Lease(out):
        with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()}"):
            Lease(out).acquire()
        with pytest.raises(LeaseHeldError):
            score(make_shards(tmp_path / "shards", [2])[0], out=out, scorers=[SCORER], device="cpu", progress=False)
    Lease(out).acquire().release()


# -- item 13: a full disk ---------------------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB filesystem (tmpfs; needs root, as in CI containers), grown by `grow(size)`."""
    with small_tmpfs(tmp_path / "small") as (mnt, grow):
        yield mnt, grow


def test_a_full_disk_while_writing_filtered_shards_stops_the_run_and_resume_completes_it(small_fs, tmp_path):
    mnt, grow = small_fs
    urls = big_shards(tmp_path / "shards", 4)  # ~730 KB each: two filtered shards fit in 2 MiB, not three
    out, kept = str(tmp_path / "out"), str(mnt / "kept")
    result = cli(*urls, "--scorer", SCORER, "--out", out, "--write-shards", kept)
    assert result.exit_code == 3, result.output
    assert "no space left on the device" in result.output and "--resume" in result.output
    assert "Traceback" not in result.output
    assert done_names(out) == ["big-0000.json", "big-0001.json"]  # only what was written whole
    assert temporaries(out, kept) == []
    assert sorted(f for f in os.listdir(kept) if f.endswith(".tar")) == ["big-0000.tar", "big-0001.tar"]

    grow("8m")  # space freed
    again = cli(*urls, "--scorer", SCORER, "--out", out, "--write-shards", kept, "--resume")
    assert again.exit_code == 0, again.output
    assert done_names(out) == [f"big-{s:04d}.json" for s in range(4)]
    for url in urls:  # every filtered shard is whole: all samples kept, byte for byte
        assert open(os.path.join(kept, os.path.basename(url)), "rb").read()[:-10240].rstrip(b"\0") == \
            open(url, "rb").read()[:-10240].rstrip(b"\0")
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == {"scored": 24}


def test_a_full_disk_under_the_output_folder_stops_the_run_without_half_files(small_fs, tmp_path):
    mnt, grow = small_fs
    urls = make_shards(tmp_path / "shards", [4] * 6)[0]
    out = str(mnt / "out")
    with open(mnt / "filler", "wb") as f:  # leave a few pages: run.json and a score file or two
        f.write(b"\1" * (2 * 2**20 - 40 * 1024))
    result = cli(*urls, "--scorer", SCORER, "--out", out)
    assert result.exit_code == 3, result.output
    assert "no space left on the device" in result.output and "Traceback" not in result.output
    assert temporaries(out) == []
    done = done_names(out)
    assert len(done) < 6
    os.remove(mnt / "filler")
    again = cli(*urls, "--scorer", SCORER, "--out", out, "--resume")
    assert again.exit_code == 0, again.output
    assert len(done_names(out)) == 6
    assert json.load(open(os.path.join(out, "summary.json")))["status"] == {"scored": 24}
