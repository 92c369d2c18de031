"""A scoring run folder in a bucket (`score --out s3://...`) against moto's S3 server on 127.0.0.1
(remotekit): the same rows, `filter` and loader results as a local --out; kill -9 and --resume;
uploads whole or not at all; the lock object (refused while its owner lives, taken over when stale)."""
import glob
import json
import os
import signal
import subprocess as sp
import sys
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, FailingProxy, SECRET, s3_server, three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402

SCORER = "scorekit:BrightnessScorer"
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def s3(local):
    with s3_server() as (endpoint, client):
        yield endpoint, client


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Copies of remote run folders (remote_out.pulled) and staging folders in this test's tmp."""
    monkeypatch.setenv("WDSFILTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    return tmp_path


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def _get(client, key) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _score(shards, out, *extra):
    return _cli("score", shards, "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0",
                "--no-progress", "--batch-size", "4", "--format", "jsonl", *extra)


def _rows(texts):
    return {name: [json.loads(line) for line in text.splitlines() if line.strip()] for name, text in texts.items()}


def test_a_run_folder_in_a_bucket_gives_the_rows_filter_and_loader_of_a_local_one(s3, local, tmp_path):
    import wdsfilter
    _, client = s3
    here, there = str(tmp_path / "here"), f"s3://{BUCKET}/runs/same/"
    assert _score(local[0], here).exit_code == 0
    r = _score(local[0], there)
    assert r.exit_code == 0, r.output
    assert f"summary: s3://{BUCKET}/runs/same/summary.json" in r.output
    keys = _keys(client, "runs/same/")
    for name in ("run.json", "shards.json", "summary.json", "run.yaml", "report.html", "histograms.png",
                 "failures.parquet", "done/shard-0000.json", "scores/shard-0002.jsonl", "failures/shard-0001.parquet"):
        assert f"runs/same/{name}" in keys, keys
    assert json.loads(_get(client, "runs/same/.lock.json"))["released"]  # released at the end, never deleted
    assert not glob.glob(str(tmp_path / "tmp" / "wdsfilter-out-*"))  # the staging copy, removed once uploaded
    remote_rows = _rows({os.path.basename(k): _get(client, k).decode() for k in keys if "/scores/" in k})
    local_rows = _rows({os.path.basename(p): open(p).read() for p in glob.glob(os.path.join(here, "scores", "*"))})
    assert len(local_rows) == 3 and remote_rows == local_rows
    for k in keys:  # the bucket's objects name the bucket, never the staging folder
        assert b"wdsfilter-out-" not in _get(client, k), k
    assert json.loads(_get(client, "runs/same/run.yaml").decode().split("\n", 1)[1])["out"] == there.rstrip("/")
    # filter reads the bucket's folder through the one reader: the same counts; its report and
    # thresholds go into the bucket
    a = _cli("filter", here, "--min", "brightness=0.5", "--save")
    b = _cli("filter", there, "--min", "brightness=0.5", "--save")
    assert a.exit_code == b.exit_code == 0, b.output
    assert a.output.replace(here, "X").splitlines()[:4] == b.output.replace(there, "X").splitlines()[:4]
    assert {"runs/same/thresholds.json"} <= set(_keys(client, "runs/same/"))
    # the loader's score filter on the bucket's folder keeps the samples of the local one
    common = dict(batch_size=4, output="dict", min_scores={"brightness": 0.5})
    kept = [sorted(s["__key__"] for batch in wdsfilter.loader(local[1], scores=folder, **common) for s in batch)
            for folder in (here, there)]
    assert kept[0] and kept[0] == kept[1]


def test_resume_on_a_bucket_after_kill_9_completes_with_the_same_rows(s3, local, tmp_path):
    """kill -9 of a run writing to the bucket, then --resume there: the finished shards are not
    scored again, the dead run's lock (same host, dead pid) is taken over at once, and the rows
    are those of a local run."""
    _, client = s3
    out = f"s3://{BUCKET}/runs/killed"
    args = [sys.executable, "-m", "wdsfilter", "score", local[0], "--out", out, "--scorer", SCORER,
            "--scorer-opt", "bright.delay=0.5", "--device", "cpu", "--batch-size", "4", "--workers", "0",
            "--no-progress", "--format", "jsonl"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", WDSFILTER_SYNC_SECONDS="0.2")
    proc = sp.Popen(args, env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _keys(client, "runs/killed/done/"):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no marker reached the bucket in 120s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _keys(client, "runs/killed/done/")
    assert 1 <= len(done) < 3 and "runs/killed/.lock.json" in _keys(client, "runs/killed/")
    for marker in done:  # a marker in the bucket always follows the files it vouches for
        for rel in json.loads(_get(client, marker))["sizes"]:
            assert f"runs/killed/{rel}" in _keys(client, "runs/killed/"), rel
    resumed = sp.run(args + ["--resume"], env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resume: {len(done)} of 3 shard(s) already done" in resumed.stdout
    assert "took over the lock" in resumed.stdout
    here = str(tmp_path / "here")
    assert _score(local[0], here).exit_code == 0
    keys = _keys(client, "runs/killed/scores/")
    assert _rows({os.path.basename(k): _get(client, k).decode() for k in keys}) == \
        _rows({os.path.basename(p): open(p).read() for p in glob.glob(os.path.join(here, "scores", "*"))})


def test_a_failed_upload_leaves_no_object_at_its_final_name(s3, tmp_path):
    """put_file: a multipart upload whose part fails is aborted (no object, no open upload). A
    streaming `with fs.open(..., "wb")` would not do: s3fs commits what it holds when an exception
    leaves the block, which is why nothing here writes through one."""
    from wdsfilter.storage.remote import RemoteOutputError
    from wdsfilter.runfolder.remote_out import RemoteFolder
    import s3fs
    endpoint, client = s3
    staging = tmp_path / "staging"
    os.makedirs(staging / "scores")
    data = os.urandom(12 << 20)
    (staging / "scores" / "big.parquet").write_bytes(data)
    options = {"config_kwargs": {"retries": {"max_attempts": 1}}}
    with FailingProxy(endpoint, "partNumber=2") as proxy:
        folder = RemoteFolder(f"s3://{BUCKET}/runs/upload", dict(options, endpoint_url=proxy.url), str(staging))
        with pytest.raises(RemoteOutputError, match="uploading .*big.parquet failed"):
            folder.part_bytes = 5 << 20  # 3 parts: a multipart upload
            folder.upload("scores/big.parquet", (len(data), 0))
        assert proxy.failed >= 1
    assert _keys(client, "runs/upload/") == [] and not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    fs = s3fs.S3FileSystem()
    with pytest.raises(RuntimeError):
        with fs.open(f"{BUCKET}/runs/upload/streamed.bin", "wb") as f:
            f.write(b"half")
            raise RuntimeError("a failure inside the block")
    assert _keys(client, "runs/upload/") == ["runs/upload/streamed.bin"]  # the hazard put_file avoids


def test_the_lock_object_refuses_while_its_owner_lives_and_is_taken_over_when_stale(s3, local):
    _, client = s3
    now = time.time()
    live = {"host": "elsewhere", "pid": 4242, "run": "x", "started": "then", "command": "score", "heartbeat": now}
    client.put_object(Bucket=BUCKET, Key="runs/locked/.lock.json", Body=json.dumps(live).encode())
    r = _score(local[0], f"s3://{BUCKET}/runs/locked")
    assert r.exit_code == 2 and "in use by another wdsfilter score run (pid 4242 on elsewhere" in r.output, r.output
    assert _keys(client, "runs/locked/") == ["runs/locked/.lock.json"]  # nothing written, nothing taken
    client.put_object(Bucket=BUCKET, Key="runs/locked/.lock.json",
                      Body=json.dumps(dict(live, heartbeat=now - 3600)).encode())
    r = _score(local[0], f"s3://{BUCKET}/runs/locked")
    assert r.exit_code == 0, r.output
    keys = _keys(client, "runs/locked/")
    assert json.loads(_get(client, "runs/locked/.lock.json"))["released"] and "runs/locked/done/shard-0002.json" in keys
    # --overwrite with one shard: the earlier run's objects of the others are deleted
    r = _score(local[1][0], f"s3://{BUCKET}/runs/locked", "--overwrite")
    assert r.exit_code == 0, r.output
    assert [k for k in _keys(client, "runs/locked/") if "/done/" in k or "/scores/" in k] == \
        ["runs/locked/done/shard-0000.json", "runs/locked/scores/shard-0000.jsonl"]
    # two runs: the second refuses while the first holds the lock
    from wdsfilter.runfolder.lease import Lease, LeaseHeldError
    first = Lease(f"s3://{BUCKET}/runs/two").acquire()
    with pytest.raises(LeaseHeldError, match="in use"):
        Lease(f"s3://{BUCKET}/runs/two").acquire()
    first.release()
    Lease(f"s3://{BUCKET}/runs/two").acquire().release()


def test_the_lock_heartbeat_and_a_takeover_race_are_conditional_puts(s3):
    """The owner's heartbeat moves the lock's time; of two runs taking over one stale lock, the
    second's put (If-Match: the stale ETag) fails; an owner whose lock was taken neither renews
    nor touches the new owner's lock, and its renewal names the run that took it."""
    from wdsfilter.runfolder.lease import Conflict, Lease, LeaseLostError
    _, client = s3
    url, key = f"s3://{BUCKET}/runs/beat", "runs/beat/.lock.json"
    owner = Lease(url).acquire()
    before = json.loads(_get(client, key))["heartbeat"]
    while json.loads(_get(client, key))["heartbeat"] == before:  # the clock moves on
        owner.renew()
    stale = dict(json.loads(_get(client, key)), heartbeat=time.time() - 3600, host="elsewhere")
    client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(stale).encode())  # the owner vanished
    a, b = Lease(url), Lease(url)
    _, stale_etag = b.record.read()  # b read the stale lock before a took it over
    a.acquire()
    assert a.took_over["host"] == "elsewhere"
    with pytest.raises(Conflict):
        b.record.replace(b"{}", stale_etag)
    with pytest.raises(LeaseLostError, match=f"pid {os.getpid()} on .* took it over"):
        owner.renew()  # the vanished owner comes back: its renewal is refused, and it knows ...
    owner.release()  # ... and it does not release a's lock
    assert json.loads(_get(client, key))["token"] == a.token and "released" not in json.loads(_get(client, key))
    a.release()
    assert _keys(client, "runs/beat/") == [key] and json.loads(_get(client, key))["released"]


def test_a_run_whose_lock_was_taken_over_uploads_nothing_more(s3):
    """A run stalled past the stale time loses its folder to the run that took its lock over: its
    next renewal says so, and neither a later sync nor the last one at the end uploads anything
    into the folder that is now the other run's."""
    from wdsfilter.runfolder.bucket import RemoteRunFolder
    from wdsfilter.runfolder.lease import Lease, LeaseLostError
    _, client = s3
    url, key = f"s3://{BUCKET}/runs/lost", "runs/lost/.lock.json"
    stalled = RemoteRunFolder(url, interval=3600)  # the mirror's rounds are driven by hand
    with open(os.path.join(stalled.local, "first.json"), "w") as f:
        f.write("{}")
    stalled.sync()
    assert "runs/lost/first.json" in _keys(client, "runs/lost/")
    stale = dict(json.loads(_get(client, key)), heartbeat=time.time() - 3600)
    client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(stale).encode())  # stalled for an hour
    other = Lease(url).acquire()
    with pytest.raises(LeaseLostError):
        stalled.lock.renew()
    with open(os.path.join(stalled.local, "second.json"), "w") as f:
        f.write("{}")
    with pytest.raises(LeaseLostError, match="wrote nothing more"):
        stalled.sync()
    stalled.release()  # the last sync is refused too; the other run's lock stays
    assert "runs/lost/second.json" not in _keys(client, "runs/lost/")
    assert json.loads(_get(client, key))["token"] == other.token
    other.release()


def test_configuration_errors_are_exit_2_before_any_work(s3, local):
    _, client = s3
    r = _score(local[0], "s3://no-such-bucket/run")
    assert r.exit_code == 2 and "the bucket 'no-such-bucket' does not exist" in r.output
    r = _cli("filter", f"s3://{BUCKET}/runs/nothing-here", "--min", "brightness=0.5")
    assert r.exit_code == 2 and "does not exist" in r.output
    r = _cli("dedup", f"s3://{BUCKET}/runs/nothing-here")
    assert r.exit_code == 2 and "holds no scoring run" in r.output, r.output
    assert _keys(client, "runs/nothing-here") == []


def test_an_out_whose_lock_object_cannot_be_written_is_exit_2_before_any_work(s3, local, tmp_path):
    """A store that refuses the first write (here every PUT of the lock object fails): exit 2 at
    once, naming the folder; nothing written in the bucket, no staging folder left."""
    endpoint, client = s3
    with FailingProxy(endpoint, ".lock.json") as proxy:
        r = _score(local[0], f"s3://{BUCKET}/runs/unwritable", "--storage-option", f"endpoint_url={proxy.url}",
                   "--storage-option", "config_kwargs.retries.max_attempts=1")
        assert proxy.failed >= 1
    assert r.exit_code == 2 and f"--out s3://{BUCKET}/runs/unwritable" in r.output, r.output
    assert "cannot be written" in r.output and "shard(s) to score" not in r.output
    assert _keys(client, "runs/unwritable") == [] and not os.listdir(tmp_path / "tmp")


def test_uploads_that_keep_failing_fail_the_run_and_no_marker_goes_ahead_of_its_files(s3, local, tmp_path):
    """Every upload of a score file fails (HTTP 500): the run exits 3, the bucket holds no marker
    (they follow their score files), and the staging folder is kept for a --resume."""
    endpoint, client = s3
    with FailingProxy(endpoint, "/scores/") as proxy:
        r = _score(local[0], f"s3://{BUCKET}/runs/failing", "--storage-option", f"endpoint_url={proxy.url}",
                   "--storage-option", "config_kwargs.retries.max_attempts=1")
        assert proxy.failed >= 1
    assert r.exit_code == 3 and "uploading" in r.output and "scores/shard-0000.jsonl failed" in r.output, r.output
    keys = _keys(client, "runs/failing/")
    assert not [k for k in keys if "/done/" in k or "/scores/" in k] and "runs/failing/run.json" in keys
    [staging] = glob.glob(str(tmp_path / "tmp" / "wdsfilter-out-*"))
    assert sorted(os.listdir(os.path.join(staging, "done"))) == [f"shard-000{i}.json" for i in range(3)]
    r = _score(local[0], f"s3://{BUCKET}/runs/failing", "--resume")  # the store works again
    assert r.exit_code == 0, r.output
    assert len([k for k in _keys(client, "runs/failing/done/")]) == 3


def test_filter_storage_options_reach_the_bucket_and_no_secret_is_written(s3, local, tmp_path, monkeypatch):
    """filter --storage-option: the endpoint and credentials given only as options (none in the
    environment); the distinctive secret is in no output, object or cached file."""
    endpoint, client = s3
    assert _score(local[0], f"s3://{BUCKET}/runs/opts").exit_code == 0
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()
    opts = ["--storage-option", f"endpoint_url={endpoint}", "--storage-option", "key=wdsftestkey",
            "--storage-option", f"secret={SECRET}"]
    r = _cli("filter", f"s3://{BUCKET}/runs/opts", "--min", "brightness=0.5", *opts,
             "--report", f"s3://{BUCKET}/reports/opts.html")
    assert r.exit_code == 0, r.output
    assert SECRET not in r.output
    s = _score(local[0], f"s3://{BUCKET}/runs/opts2", *opts)  # the run folder, its lock and mirror: options too
    assert s.exit_code == 0 and SECRET not in s.output, s.output
    import wdsfilter
    options = {"endpoint_url": endpoint, "key": "wdsftestkey", "secret": SECRET}
    kept = [s["__key__"] for batch in wdsfilter.loader(local[1], scores=f"s3://{BUCKET}/runs/opts2", batch_size=4,
                                                       output="dict", min_scores={"brightness": 0.5},
                                                       storage_options=options) for s in batch]
    assert kept
    assert "reports/opts.html" in _keys(client, "reports/")
    for key in _keys(client, ""):
        assert SECRET.encode() not in _get(client, key), key
    written = [p for p in glob.glob(str(tmp_path / "**"), recursive=True) if os.path.isfile(p)]
    assert any("remote-runs" in p for p in written)
    for path in written:
        assert SECRET.encode() not in open(path, "rb").read(), path
    import fsspec.config
    assert "s3" not in fsspec.config.conf  # the options lived for the command only


def test_filtered_shards_in_a_bucket_are_the_bytes_of_local_ones(s3, local, tmp_path):
    """score --write-shards and filter --write-shards into a bucket: the same shards, byte for
    byte, as written to a local folder; a resumed score run finds them whole."""
    _, client = s3
    here = str(tmp_path / "here")
    assert _score(local[0], here, "--min", "brightness=0.5", "--write-shards", str(tmp_path / "kept")).exit_code == 0
    r = _score(local[0], f"s3://{BUCKET}/runs/ws", "--min", "brightness=0.5", "--write-shards", f"s3://{BUCKET}/kept/ws")
    assert r.exit_code == 0, r.output
    local_files = {os.path.basename(p): open(p, "rb").read() for p in glob.glob(str(tmp_path / "kept" / "*"))}
    remote_files = {k.rsplit("/", 1)[1]: _get(client, k) for k in _keys(client, "kept/ws/")}
    assert set(local_files) >= {"shard-0000.tar", "sizes.json"} and remote_files == local_files
    marker = json.loads(_get(client, "runs/ws/done/shard-0000.json"))
    assert marker["filtered_shard"] == f"s3://{BUCKET}/kept/ws/shard-0000.tar"
    assert not any(b"wdsfilter-out-" in _get(client, k) for k in _keys(client, "runs/ws/"))
    r = _score(local[0], f"s3://{BUCKET}/runs/ws", "--min", "brightness=0.5", "--write-shards",
               f"s3://{BUCKET}/kept/ws", "--resume")
    assert r.exit_code == 0 and "3 shard(s) were already done" in r.output, r.output
    # filter --write-shards from the bucket's run folder into the bucket
    a = _cli("filter", here, "--min", "brightness=0.6", "--write-shards", str(tmp_path / "refiltered"),
             "--no-report")
    b = _cli("filter", f"s3://{BUCKET}/runs/ws", "--min", "brightness=0.6", "--write-shards",
             f"s3://{BUCKET}/refiltered", "--no-report")
    assert a.exit_code == b.exit_code == 0, b.output
    local_files = {os.path.basename(p): open(p, "rb").read() for p in glob.glob(str(tmp_path / "refiltered" / "*"))}
    remote_files = {k.rsplit("/", 1)[1]: _get(client, k) for k in _keys(client, "refiltered/")}
    assert local_files and {k: v for k, v in remote_files.items() if k not in ("filter_run.json", ".lock.json")} == \
        {k: v for k, v in local_files.items() if k != "filter_run.json"}
    assert json.loads(remote_files[".lock.json"])["released"]


def test_dedup_on_a_bucket_folder_marks_what_it_marks_locally_and_filter_drops_the_same(s3, tmp_path):
    """`wdsfilter dedup s3://...` (issue 25 item 7): the folder pulled under its lock object, deduped,
    its dedup/ uploaded whole; the marks are the local run's, and `filter --dedup` on the bucket
    keeps what it keeps locally."""
    from dedupkit import build
    _, client = s3
    shards, _ = build(tmp_path / "shards", bases=("coffee", "rocket"), variants=("copy", "jpeg_q30"),
                      alikes=["brick"])
    here, there = str(tmp_path / "here"), f"s3://{BUCKET}/runs/dedup"
    for out in (here, there):
        r = _cli("score", *shards, "--scorer", "hash", "--image-key", "jpg;png", "--out", out, "--device", "cpu",
                 "--workers", "0", "--no-progress", "--format", "jsonl")
        assert r.exit_code == 0, r.output
    a, b = _cli("dedup", here), _cli("dedup", there)
    assert a.exit_code == b.exit_code == 0, b.output
    assert a.output.replace(here, "X") == b.output.replace(there, "X")  # the same counts, the bucket named
    keys = _keys(client, "runs/dedup/dedup/")
    assert "runs/dedup/dedup/summary.json" in keys and json.loads(_get(client, "runs/dedup/.lock.json"))["released"]
    import pyarrow.parquet as pq
    marked = []
    for name in sorted(n for n in os.listdir(os.path.join(here, "dedup")) if n.endswith(".parquet")):
        local = pq.read_table(os.path.join(here, "dedup", name)).to_pylist()
        assert pq.read_table(pa_buffer(_get(client, f"runs/dedup/dedup/{name}"))).to_pylist() == local
        marked += local
    assert marked and any(not r["survivor"] for r in marked)  # the planted copies were found
    for k in keys:
        assert b"wdsfilter-out-" not in _get(client, k), k  # names the bucket, never the staging copy
    f_here, f_there = _cli("filter", here, "--dedup", "--dry-run"), _cli("filter", there, "--dedup", "--dry-run")
    assert f_here.exit_code == f_there.exit_code == 0, f_there.output
    assert f_here.output.replace(here, "X") == f_there.output.replace(there, "X")
    assert "duplicate" in f_there.output


def pa_buffer(data: bytes):
    import pyarrow as pa
    return pa.BufferReader(data)


def test_resume_on_a_bucket_pulls_only_the_run_state_and_gives_a_local_resumes_rows(s3, local, tmp_path):
    """--resume on a bucket's run folder: before scoring, only run.json, shards.json, run.yaml,
    the markers and the failure ledgers come down; the finished shards' filtered shards (and the
    old summary, report and histograms) never do; their score files are read once, at the end,
    for the statistics; none of their objects is written again. Rows, filtered shards and summary
    are those of a local resume."""
    from faultkit import S3FaultProxy
    endpoint, client = s3
    here, url, kept = str(tmp_path / "here"), f"s3://{BUCKET}/runs/lazy", f"s3://{BUCKET}/kept/lazy"
    args = ("--min", "brightness=0.5")
    assert _score(local[0], here, *args, "--write-shards", str(tmp_path / "kept")).exit_code == 0
    assert _score(local[0], url, *args, "--write-shards", kept).exit_code == 0
    # shard-0001 left unfinished in both folders: its marker gone
    os.remove(os.path.join(here, "done", "shard-0001.json"))
    client.delete_object(Bucket=BUCKET, Key="runs/lazy/done/shard-0001.json")
    folder = {k: client.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in _keys(client, "runs/lazy/")}
    shards = {k: client.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in _keys(client, "kept/lazy/")}
    with S3FaultProxy(endpoint) as proxy:
        r = _score(local[0], url, *args, "--write-shards", kept, "--resume", "--storage-option",
                   f"endpoint_url={proxy.url}")
        assert r.exit_code == 0 and "2 of 3 shard(s) already done" in r.output, r.output
        got = {p[len(BUCKET) + 1:]: n for p, n in proxy.body_bytes.items() if p.startswith(BUCKET + "/")}
        written = {p[len(BUCKET) + 1:] for m, p, _ in proxy.requests if m in ("PUT", "POST") and p.startswith(BUCKET + "/")}
    assert _cli("score", local[0], "--scorer", SCORER, "--out", here, "--device", "cpu", "--workers", "0",
                "--no-progress", "--batch-size", "4", "--format", "jsonl", *args, "--write-shards",
                str(tmp_path / "kept"), "--resume").exit_code == 0
    finished = ("shard-0000", "shard-0002")
    assert not [k for k in got if k.startswith("kept/lazy/") and k.endswith(".tar")]  # no filtered shard came down
    assert not {"runs/lazy/report.html", "runs/lazy/histograms.png", "runs/lazy/summary.json"} & set(got)
    assert {f"runs/lazy/scores/{n}.jsonl" for n in finished} <= set(got)  # read for the statistics, at the end
    down, whole = sum(got.values()), sum(folder.values()) + sum(shards.values())
    assert down < whole / 2, (down, whole)
    for n in finished:  # the finished shards' objects are the bucket's, untouched
        assert not {f"runs/lazy/scores/{n}.jsonl", f"runs/lazy/done/{n}.json", f"kept/lazy/{n}.tar"} & written
    assert {"runs/lazy/scores/shard-0001.jsonl", "runs/lazy/done/shard-0001.json", "kept/lazy/shard-0001.tar"} <= written
    # the same rows, filtered shards and summary as the local resume
    remote_rows = _rows({k.rsplit("/", 1)[1]: _get(client, k).decode() for k in _keys(client, "runs/lazy/scores/")})
    local_rows = _rows({os.path.basename(p): open(p).read() for p in glob.glob(os.path.join(here, "scores", "*"))})
    assert len(local_rows) == 3 and remote_rows == local_rows
    assert {k.rsplit("/", 1)[1]: _get(client, k) for k in _keys(client, "kept/lazy/")} == \
        {os.path.basename(p): open(p, "rb").read() for p in glob.glob(str(tmp_path / "kept" / "*"))}
    summaries = [json.loads(_get(client, "runs/lazy/summary.json")), json.load(open(os.path.join(here, "summary.json")))]
    for s in summaries:
        for k in ("out", "files", "seconds", "scoring_seconds", "started", "finished", "host", "workers", "devices",
                  "plan", "plan_text", "samples_per_second", "probe", "scorers"):
            s.pop(k, None)
    assert summaries[0] == summaries[1]


def test_shards_resharded_into_a_bucket_are_the_bytes_of_local_ones(s3, local, tmp_path):
    """score --write-shards s3://... --samples-per-shard N: resharded at the end of the run into the
    bucket, the bytes of a local run's (filter_run.json names the run folder, here a bucket's);
    a --resume with nothing left to score writes the same objects."""
    _, client = s3
    args = ["--min", "brightness=0.5", "--samples-per-shard", "3", "--prefix", "kept"]
    assert _score(local[0], str(tmp_path / "here"), *args, "--write-shards", str(tmp_path / "kept")).exit_code == 0
    url, kept = f"s3://{BUCKET}/runs/rs", f"s3://{BUCKET}/kept/rs"
    r = _score(local[0], url, *args, "--write-shards", kept)
    assert r.exit_code == 0, r.output
    local_files = {os.path.basename(p): open(p, "rb").read() for p in glob.glob(str(tmp_path / "kept" / "*"))}
    remote_files = {k.rsplit("/", 1)[1]: _get(client, k) for k in _keys(client, "kept/rs/")}
    assert "kept-000000.tar" in local_files and not any(n.startswith("shard-") for n in local_files)
    assert {k: v for k, v in remote_files.items() if k != "filter_run.json"} == \
        {k: v for k, v in local_files.items() if k != "filter_run.json"}
    assert json.loads(remote_files["filter_run.json"])["identity"]["scores"] == url
    r = _score(local[0], url, *args, "--write-shards", kept, "--resume")
    assert r.exit_code == 0 and "3 shard(s) were already done" in r.output, r.output
    assert {k.rsplit("/", 1)[1]: _get(client, k) for k in _keys(client, "kept/rs/")} == remote_files
