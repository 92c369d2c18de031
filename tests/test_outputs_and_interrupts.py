"""Issue 20, finding 11: outputs that cannot be written are usage errors found before any work
(a probe file, not os.access, which says yes to root in /proc); validate --jobs stops queued
shards on Ctrl-C; re-reads of a pipe: shard for written shards go through the idle guard; a
SIGTERM leaves no shard command running."""
import os

import pytest

from filterkit import REPO, gnu_tar_shards, run_cli

PROC = os.path.isdir("/proc/self")


def one_line(stderr):
    return len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


@pytest.mark.skipif(not PROC, reason="needs /proc")
def test_outputs_in_proc_are_usage_errors_before_any_work(tmp_path):
    shard = gnu_tar_shards(str(tmp_path), [3])[0]
    r = run_cli("validate", shard, "--output", "/proc/nope")
    assert r.returncode == 2 and one_line(r.stderr) and "/proc" in r.stderr, r.stderr
    r = run_cli("validate", shard, "--output", "/proc/self/status")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    out = tmp_path / "out"
    kits = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), REPO]))  # the test scorer
    r = run_cli("score", shard, "--scorer", "scorekit:BrightnessScorer", "--out", str(out),
                "--write-shards", "/proc/wds", "--device", "cpu", env=kits)
    assert r.returncode == 2 and one_line(r.stderr) and "--write-shards" in r.stderr, r.stderr
    assert not os.path.exists(out / "scores")  # nothing scored
    r = run_cli("sort-shard", shard, "/proc/nope.tar")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert not [f for f in os.listdir(tmp_path) if "probe" in f]  # the probe file is removed


def test_a_shard_read_again_for_written_shards_goes_through_the_idle_guard(tmp_path):
    """score's filtered copy (shardcopy.write_filtered) and filter --write-shards read a pipe:
    shard a second time: that read had no idle guard, so a hung command hung the run for ever.
    Here the command's input becomes a FIFO nobody writes to once the shard is scored."""
    import psutil

    from filterkit import score_folder
    from wdsfilter.filtering import filter_scores
    from wdsfilter.storage.shardcopy import write_filtered
    shard = gnu_tar_shards(str(tmp_path), [4])[0]
    url = f"pipe:cat {shard}"
    out = score_folder([url], tmp_path / "scores", allow_pipe=True)
    os.remove(shard)
    os.mkfifo(shard)  # cat now waits for a writer that never comes
    with pytest.raises(OSError, match="sent nothing for 1s"):
        write_filtered(url, ["s0_00000"], str(tmp_path / "copy.tar"), allow_pipe=True, idle_seconds=1)
    with pytest.raises(OSError, match="sent nothing for 1s"):
        filter_scores(out, write_shards=str(tmp_path / "k"), report=None, allow_pipe=True, stream_idle_seconds=1)
    assert not [p for p in psutil.process_iter(["cmdline"]) if shard in " ".join(p.info["cmdline"] or [])]


def test_validate_jobs_starts_no_queued_shard_after_ctrl_c(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while two workers check the
    first shards: the pool went on to check every queued shard before exiting."""
    import signal
    import subprocess
    import sys
    import time

    from filterkit import REPO
    shard = gnu_tar_shards(str(tmp_path), [2])[0]
    urls = []
    for i in range(30):
        source = shard
        if i < 2:  # the first two wait for a writer: both workers are busy until Ctrl-C
            source = str(tmp_path / f"fifo-{i}")
            os.mkfifo(source)
        urls.append(f"pipe:touch {tmp_path}/started-{i}; cat {source}")
    proc = subprocess.Popen([sys.executable, "-m", "wdsfilter", "validate", "--allow-pipe", "--jobs", "2", *urls],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while not all(os.path.exists(tmp_path / f"started-{i}") for i in range(2)):  # the event: both busy
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    started = len([f for f in os.listdir(tmp_path) if f.startswith("started-")])
    assert proc.returncode == 130, proc.stderr.read()
    assert started <= 5, started  # the two running and at most the pool's few already handed out; was 30


def test_sigterm_while_a_shard_command_runs_leaves_no_command_running(tmp_path):
    """SIGTERM while a pipe: command (gsutil cat, for a gs:// shard) is being read: closing the
    stream waited for the command to end (webdataset's timeout: hours), and a command killed
    with its reader kept running. The command here is a shell and its child that never sends."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from filterkit import REPO
    tag = f"{tmp_path}/never-sent.tar"
    os.mkfifo(tag)  # nobody writes: the command waits for ever, as a stuck download does
    proc = subprocess.Popen([sys.executable, "-m", "wdsfilter", "validate", "--allow-pipe",
                             f"pipe:cat {tag} | cat; echo {tag}"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)

    def running():
        found = []
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.pid != proc.pid and tag in " ".join(p.info["cmdline"] or []) \
                    and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        return found
    try:
        while not any((p.info["cmdline"] or [""])[0] == "cat" for p in running()):  # the event: it runs
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        for p in running():
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode()
    assert proc.returncode == 143 and "terminated" in stderr, stderr
    assert running() == []


def test_sigterm_to_validate_jobs_stops_the_workers_commands_too(tmp_path):
    """SIGTERM reaches the parent only: its workers, each reading a shard whose command never
    sends, kept the run from exiting (the interpreter waits for them) and their commands alive."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from filterkit import REPO
    fifos = [f"{tmp_path}/never-{i}.tar" for i in range(2)]
    for f in fifos:
        os.mkfifo(f)
    proc = subprocess.Popen([sys.executable, "-m", "wdsfilter", "validate", "--allow-pipe", "--jobs", "2",
                             *[f"pipe:cat {f}" for f in fifos]], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)

    def cats():
        return [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
                and (p.info["cmdline"] or [""])[0] == "cat" and str(tmp_path) in " ".join(p.info["cmdline"])]
    try:
        while len(cats()) < 2:  # the event: both workers' commands run
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        for p in cats():
            p.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, proc.stderr.read()
    assert cats() == []


def test_validate_jobs_kills_a_worker_the_interrupt_did_not_stop(tmp_path, monkeypatch):
    """A worker that does not stop on Ctrl-C (here it ignores SIGINT, as one the interrupt reached
    where it could not act on it) is killed with its shard's command a bounded time after the
    interrupt: before, the interpreter's exit waited for it without end (a hang seen once in CI)."""
    import signal
    import time

    import psutil

    from wdsfilter import StageConfig
    from wdsfilter.validate import runner
    from wdsfilter.validate.options import ValidateOptions
    shard = gnu_tar_shards(str(tmp_path), [2])[0]
    fifo = str(tmp_path / "never.tar")
    os.mkfifo(fifo)
    options = ValidateOptions(stage=StageConfig(allow_pipe=True, check_first_shard=False), jobs=2)
    monkeypatch.setattr(runner, "STRAGGLER_SECONDS", 2.0)
    before = {p.pid for p in psutil.Process().children()}  # this process's others (earlier tests')
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the forked workers inherit it
    try:
        checks = runner.run_checks([shard, f"pipe:cat {fifo}"], options)
        first, _ = next(checks)  # the plain shard is done; the other worker waits on its command
    finally:
        signal.signal(signal.SIGINT, previous)
    assert first == 0
    workers = [p for p in psutil.Process().children() if p.pid not in before]  # the pool's

    def commands():
        found = []
        for worker in workers:
            try:
                found += [p for p in worker.children(recursive=True) if p.name() == "cat"]
            except psutil.Error:  # a worker or command that just exited
                pass
        return found
    while not commands():  # the event: the worker's command runs
        time.sleep(0.01)
    commands = commands()
    with pytest.raises(KeyboardInterrupt):
        checks.throw(KeyboardInterrupt)  # Ctrl-C in the parent, while it waits for results
    gone, alive = psutil.wait_procs(workers + commands, timeout=60)
    assert alive == [], alive
