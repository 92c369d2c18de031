"""A run stalled past its lease (SIGSTOP) whose folder another run then took over (--overwrite) and
finished writes nothing more there when it continues: the folder stays the second run's, byte for
byte, on a local disk, on S3 (moto's server) and on GCS (fake-gcs-server), and the first run exits
3 naming the run that took over. The fence's parts one by one: a deleted lock is lost, not free; a
marker that names another run vouches for nothing; an upload or delete is conditional on the
object's version."""
import json
import os
import signal
import socket
import subprocess as sp
import sys
import time

import pytest
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main

TESTS = os.path.dirname(os.path.abspath(__file__))
SCORER = "scorekit:BrightnessScorer"
LEASE_SECONDS = 3  # the stalled run's lease; the run that takes over keeps the default


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("shards")), [8, 8, 8])[0]


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    from remotekit import s3_server
    with s3_server() as (_, client):
        yield client


@pytest.fixture(scope="module")
def gcs():
    pytest.importorskip("gcsfs")
    from gcskit import gcs_server
    with gcs_server() as (_, fs):
        yield fs


class Local:
    def __init__(self, root):
        self.out = str(root / "out")

    def snapshot(self) -> dict:
        files = {}
        for folder, _, names in os.walk(self.out):
            for name in names:
                path = os.path.join(folder, name)
                files[os.path.relpath(path, self.out)] = open(path, "rb").read()
        return files


class S3:
    def __init__(self, client, name):
        from remotekit import BUCKET
        self.client, self.bucket, self.prefix = client, BUCKET, f"fenced/{name}"
        self.out = f"s3://{BUCKET}/{self.prefix}"

    def snapshot(self) -> dict:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + "/").get("Contents", [])
        return {o["Key"]: self.client.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read() for o in listed}


class GS:
    def __init__(self, fs, name):
        from gcskit import BUCKET
        self.fs, self.prefix = fs, f"{BUCKET}/fenced/{name}"
        self.out = f"gs://{self.prefix}"

    def snapshot(self) -> dict:
        self.fs.invalidate_cache()
        return {k: self.fs.cat_file(k) for k in self.fs.find(self.prefix + "/")}


@pytest.fixture(params=["local", "s3", "gs"])
def store(request, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # staging copies: this test's
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    if request.param == "local":
        return Local(tmp_path)
    if request.param == "s3":
        return S3(request.getfixturevalue("s3"), request.node.name.replace("[", "-").rstrip("]"))
    return GS(request.getfixturevalue("gcs"), request.node.name.replace("[", "-").rstrip("]"))


def _score_args(shards, out, *extra):
    return ["score", *shards, "--out", out, "--scorer", SCORER, "--device", "cpu", "--batch-size", "4",
            "--workers", "0", "--no-progress", "--format", "jsonl", *extra]


def _lease(store) -> dict:
    """The folder's lease record as it stands ({} while there is none)."""
    data = store.snapshot().get(".lock.json" if isinstance(store, Local) else f"{store.prefix}/.lock.json")
    return json.loads(data) if data else {}


def _wait(condition, what: str, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        time.sleep(0.05)


@pytest.mark.slow  # each case: a scoring subprocess stopped past its lease, and a second run
def test_a_run_stalled_past_its_lease_writes_nothing_into_the_folder_another_run_took_over(store, shards, tmp_path,
                                                                                          caplog):
    hold = str(tmp_path / "hold")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", WDSFILTER_LEASE_SECONDS=str(LEASE_SECONDS), WDSFILTER_SYNC_SECONDS="0.2")
    args = _score_args(shards, store.out, "--scorer-opt", f"bright.hold_file={hold}", "--scorer-opt", "bright.hold_key=s2_")
    stalled = sp.Popen([sys.executable, "-m", "wdsfilter", *args], env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True,
                       start_new_session=True)
    try:
        # held before the third shard, once the first run owns the folder and wrote into it
        _wait(lambda: os.path.exists(hold + ".waiting") and _lease(store).get("pid") == stalled.pid,
              "the first run held in its scorer", stalled)
        _wait(lambda: any("run.json" in k for k in store.snapshot()), "the first run's run.json", stalled)
        os.killpg(stalled.pid, signal.SIGSTOP)  # a long GC, a suspended laptop: every process of the run
        first = _lease(store)
        assert first["stale_seconds"] == LEASE_SECONDS and "released" not in first
        deadline = time.monotonic() + 60  # its heartbeat grows older than its lease: the event a takeover needs
        while time.time() - _lease(store)["heartbeat"] <= LEASE_SECONDS:
            assert time.monotonic() < deadline, "the stopped run's heartbeat kept moving"
            time.sleep(0.1)
        taken = CliRunner().invoke(main, _score_args(shards, store.out, "--overwrite"), catch_exceptions=False)
        assert taken.exit_code == 0, taken.output
        assert f"took over the lock of a run that is gone (pid {stalled.pid} on" in caplog.text
        theirs = store.snapshot()
        record = _lease(store)
        assert record["pid"] == os.getpid() and record["released"]
        open(hold, "w").close()  # the stalled run's scorer may go on ...
        os.killpg(stalled.pid, signal.SIGCONT)  # ... and the run with it
        output = stalled.communicate(timeout=180)[0]
    finally:
        if stalled.poll() is None:
            os.killpg(stalled.pid, signal.SIGKILL)
            stalled.wait()
    assert stalled.returncode == 3, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert f"pid {os.getpid()} on {socket.gethostname()}, started {record['started']}" in errors[0], output
    assert "took it over while this run was stalled" in errors[0] and "wrote nothing more" in errors[0]
    assert store.snapshot() == theirs  # the folder is the second run's alone, byte for byte
    assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith("wdsfilter-out-")]  # nobody's staging: gone


# -- the fence's parts ---------------------------------------------------------------------------------
def test_a_deleted_lock_is_lost_not_free_and_stops_the_next_write(tmp_path, s3):
    """A lock deleted under its holder (by hand, by a run that cleared the folder) means the
    folder is no longer the holder's: its next write (local: read at each write) and its next
    renewal (a bucket) say so, and nothing is written."""
    from remotekit import BUCKET
    from wdsfilter.storage.atomic import write_json
    from wdsfilter.runfolder.lease import Lease, LeaseLostError
    out = str(tmp_path / "out")
    with Lease(out) as lease:
        lease.guard([out])
        write_json(os.path.join(out, "a.json"), {})
        os.remove(os.path.join(out, ".lock.json"))
        with pytest.raises(LeaseLostError, match="was deleted"):
            write_json(os.path.join(out, "b.json"), {})
    assert sorted(os.listdir(out)) == [".lock", "a.json"]  # nothing written, no lock made again
    lease = Lease(f"s3://{BUCKET}/deleted").acquire()
    s3.delete_object(Bucket=BUCKET, Key="deleted/.lock.json")
    with pytest.raises(LeaseLostError, match="was deleted"):
        lease.renew()
    lease.release()
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="deleted/")


def test_a_marker_naming_another_run_vouches_for_nothing(shards, tmp_path):
    """A marker is done only for the run the folder holds (run.json's run_id): one written by a
    run that lost the folder (a stalled run's late marker) counts for neither `filter` nor
    --resume, which scores its shard again."""
    from wdsfilter.runfolder import ScoreRun
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, _score_args(shards, out), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    run_id = json.load(open(os.path.join(out, "run.json")))["run_id"]
    marker_path = os.path.join(out, "done", "shard-0001.json")
    marker = json.load(open(marker_path))
    assert marker["run_id"] == run_id
    json.dump(dict(marker, run_id="0123456789abcdef"), open(marker_path, "w"))  # another run's
    run = ScoreRun.open(out)
    assert [s.name for s in run.shards] == ["shard-0000", "shard-0002"] and run.unfinished == [shards[1]]
    r = CliRunner().invoke(main, _score_args(shards, out, "--resume"), catch_exceptions=False)
    assert r.exit_code == 0 and "resume: 2 of 3 shard(s) already done, 1 to score" in r.output, r.output
    assert json.load(open(marker_path))["run_id"] == run_id == json.load(open(os.path.join(out, "run.json")))["run_id"]


@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_an_upload_or_delete_over_another_writers_object_is_refused(kind, tmp_path, request):
    """Each upload and delete of a bucket's run folder is conditional on the version this writer
    last saw there (S3 If-None-Match / If-Match, GCS ifGenerationMatch): an object another writer
    created, replaced or deleted meanwhile is neither overwritten nor deleted (the run fails,
    naming it), while an object that already holds this file's bytes (an upload whose answer was
    lost) is taken as this writer's."""
    from wdsfilter.storage.remote import RemoteOutputError
    from wdsfilter.runfolder.remote_out import RemoteFolder
    if kind == "s3":
        from remotekit import BUCKET
        client = request.getfixturevalue("s3")

        def put(key, data):
            client.put_object(Bucket=BUCKET, Key=key, Body=data)

        def get(key):
            return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        url = f"s3://{BUCKET}/refused"
    else:
        from gcskit import BUCKET
        fs = request.getfixturevalue("gcs")

        def put(key, data):
            fs.pipe_file(f"{BUCKET}/{key}", data)

        def get(key):
            fs.invalidate_cache()
            return fs.cat_file(f"{BUCKET}/{key}")
        url = f"gs://{BUCKET}/refused"
    def folder(name, files):
        staging = tmp_path / name
        os.makedirs(staging / "done")
        for rel, data in files.items():
            (staging / rel).write_bytes(data)
        mirror = RemoteFolder(f"{url}/{name}", staging=str(staging))
        mirror.sync()
        return mirror, staging
    mirror, staging = folder("replaced", {"a.json": b"mine 1"})
    put("refused/replaced/a.json", b"theirs")  # another writer replaced it
    (staging / "a.json").write_bytes(b"mine 2")
    with pytest.raises(RemoteOutputError, match="replaced/a.json was refused: another writer"):
        mirror.sync()
    assert get("refused/replaced/a.json") == b"theirs"
    if kind == "s3":  # fake-gcs-server ignores ifGenerationMatch on a DELETE (GCS honours it; it is sent)
        mirror, staging = folder("deleted", {"b.json": b"mine"})
        put("refused/deleted/b.json", b"theirs too")
        os.remove(staging / "b.json")
        with pytest.raises(RemoteOutputError, match="deleting .*deleted/b.json was refused: another writer"):
            mirror.sync()
        assert get("refused/deleted/b.json") == b"theirs too"
    mirror, staging = folder("answer-lost", {})
    (staging / "done" / "c.json").write_bytes(b"the same bytes")
    put("refused/answer-lost/done/c.json", b"the same bytes")  # as an upload whose answer never came back leaves it
    mirror.sync()
    (staging / "done" / "c.json").write_bytes(b"changed")
    mirror.sync()  # replaced: its version was taken from the object that held this file's bytes
    assert get("refused/answer-lost/done/c.json") == b"changed"


def _write_in_worker(fence, path):
    """A worker process's write (as a Ray task writes a shard): its Fence installed, then a write."""
    from wdsfilter.storage.atomic import write_json
    from wdsfilter.runfolder.lease import LeaseLostError
    fence.install()
    try:
        write_json(path, {})
        return "written"
    except LeaseLostError as e:
        return str(e)


def test_a_write_from_another_process_is_fenced_by_the_record(tmp_path):
    """A process that holds no heartbeat of its own (a Ray worker, given the run state) reads the
    record before each write into a local folder: while the run holds it the write lands, once
    another run does it is refused, naming that run."""
    import multiprocessing
    from wdsfilter.runfolder.lease import Lease
    out = str(tmp_path / "out")
    lease = Lease(out).acquire()
    fence = lease.guard([out])
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_write_in_worker, (fence, os.path.join(out, "a.json"))) == "written"
        record = os.path.join(out, ".lock.json")
        taker = dict(json.load(open(record)), token="another", pid=4242, host="elsewhere", started="then")
        json.dump(taker, open(record, "w"))  # another run holds it now
        said = pool.apply(_write_in_worker, (fence, os.path.join(out, "b.json")))
    assert "held by another run (pid 4242 on elsewhere, started then)" in said
    assert sorted(os.listdir(out)) == [".lock", ".lock.json", "a.json"]
    lease.release()
    assert json.load(open(record))["token"] == "another"  # not this run's to release


def test_filter_writes_into_a_score_folder_only_under_its_lease(shards, tmp_path):
    """`filter RUN --save` writes thresholds.json and filter_report.html into the score folder: while
    a score run holds the folder it is refused (exit 2, naming that run) and writes nothing; once
    the folder is free it writes them under its own lease, which it releases."""
    from wdsfilter.runfolder.lease import Lease
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, _score_args(shards, out), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    before = set(os.listdir(out))
    with Lease(out, command="score"):  # a score run (--resume, another scorer) holds the folder now
        r = CliRunner().invoke(main, ["filter", out, "--min", "brightness=0.5", "--save"])
        assert r.exit_code == 2, r.output
        assert "in use by another wdsfilter score run" in r.output, r.output
        assert set(os.listdir(out)) == before  # no thresholds.json, no filter_report.html
    r = CliRunner().invoke(main, ["filter", out, "--min", "brightness=0.5", "--save"])
    assert r.exit_code == 0, r.output
    assert {"thresholds.json", "filter_report.html"} <= set(os.listdir(out))
    record = json.load(open(os.path.join(out, ".lock.json")))
    assert record["command"] == "filter" and record["released"]
    # a dry run writes nothing there and takes no lease
    with Lease(out, command="score"):
        r = CliRunner().invoke(main, ["filter", out, "--min", "brightness=0.5", "--dry-run"])
        assert r.exit_code == 0, r.output
