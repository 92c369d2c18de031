"""Remote shards against real servers on 127.0.0.1: moto's S3 API server and our fault-injecting web
server (remotekit). Each test compares with the local read of the same bytes: the same members, the
same validate findings, the same score rows."""
import glob
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, FailingProxy, SECRET, s3_server, three_shards, upload  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.core.errors import ConfigError, UnsafeInputError  # noqa: E402
from wdsfilter.storage.remote import ObjectChanged, RemoteOptions, parse_storage_options  # noqa: E402
from wdsfilter.storage.remote_read import open_remote  # noqa: E402
from wdsfilter.storage.shards import expand_urls, open_shard  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

SCORER = "scorekit:BrightnessScorer"
FAST = dict(remote_backoff_seconds=0.01, remote_block_bytes=16 << 10, remote_readahead=2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def s3(local):
    with s3_server() as (endpoint, client):
        urls = upload(client, local[0], "laion/part")
        yield endpoint, client, urls


def _members(stream):
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read() if m.isfile() else None) for m in tar]


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# -- listing --------------------------------------------------------------------------------------
def test_s3_prefixes_globs_and_braces_list_like_a_folder(s3):
    _, _, urls = s3
    assert expand_urls(f"s3://{BUCKET}/laion/") == urls
    assert expand_urls(f"s3://{BUCKET}/laion") == urls  # a prefix without the slash
    assert expand_urls(f"s3://{BUCKET}/laion/part/shard-000[01].tar") == urls[:2]
    assert expand_urls(f"s3://{BUCKET}/laion/part/shard-{{0000..0002}}.tar") == urls
    assert expand_urls(f"s3://{BUCKET}/laion/**/*.tar") == urls


def test_an_empty_prefix_or_a_missing_bucket_is_exit_2_before_any_work(s3, tmp_path):
    with pytest.raises(ConfigError, match="the prefix is empty"):
        expand_urls(f"s3://{BUCKET}/nothing-here/")
    with pytest.raises(ConfigError, match="the bucket 'no-such-bucket' does not exist"):
        expand_urls("s3://no-such-bucket/x/")
    with pytest.raises(ConfigError, match="matches nothing"):
        expand_urls(f"s3://{BUCKET}/laion/part/*.tgz")
    for command in (["validate"], ["score", "--scorer", SCORER, "--out", str(tmp_path / "o"), "--device", "cpu"]):
        result = _cli(command[0], "s3://no-such-bucket/x/", *command[1:])
        assert result.exit_code == 2, result.output
        assert "no-such-bucket" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_no_remote_forbids_network_reads(s3, local):
    with pytest.raises(UnsafeInputError, match="no-remote"):
        expand_urls(f"s3://{BUCKET}/laion/", allow_remote=False)
    result = _cli("validate", "--no-remote", f"s3://{BUCKET}/laion/")
    assert result.exit_code == 2 and "--no-remote" in result.output


# -- reading --------------------------------------------------------------------------------------
def test_s3_members_are_byte_exact_in_small_blocks(s3, local):
    _, _, urls = s3
    options = RemoteOptions(block_bytes=4096, readahead=3)
    for url, path in zip(urls, local[1]):
        with open(path, "rb") as f:
            expected = _members(f)
        stream = open_shard(url, remote=options)
        assert _members(stream) == expected
        assert stream.retries == 0 and stream.size == os.path.getsize(path)


def test_validate_on_s3_finds_what_it_finds_on_disk(s3, local):
    _, _, urls = s3
    remote = validate(f"s3://{BUCKET}/laion/", jobs=2, config=FAST)
    on_disk = validate(local[0], jobs=2)

    def comparable(report):
        found = [(os.path.basename(f.shard), f.kind, f.member, f.key, f.message) for f in report.findings]
        shards = [{k: v for k, v in r.stats().items() if k not in ("shard", "seconds")} for r in report.shards]
        return found, shards, report.counts, report.exit_code
    assert comparable(remote) == comparable(on_disk)
    assert remote.counts and {"corrupt_image", "missing_caption"} <= set(remote.counts)
    assert [r.shard for r in remote.shards] == urls


def test_a_missing_object_is_a_finding_naming_the_credentials(s3):
    url = f"s3://{BUCKET}/laion/part/shard-0009.tar"
    report = validate([url], jobs=1)
    [finding] = report.shards[0].findings
    assert finding.kind == "remote_object_missing" and url in finding.message
    assert "the environment (AWS_ACCESS_KEY_ID)" in finding.message and report.exit_code == 1


def test_score_on_s3_gives_the_rows_of_the_local_read(s3, local, tmp_path):
    from wdsfilter.score import score
    from wdsfilter.runfolder.tables import read_rows
    _, _, urls = s3
    rows = {}
    for name, shards, workers in (("local", local[0], 0), ("remote", f"s3://{BUCKET}/laion/", 0),
                                  ("remote-workers", f"s3://{BUCKET}/laion/", 2)):
        out = str(tmp_path / name)
        summary = score(shards, out=out, scorers=[SCORER], device="cpu", workers=workers, progress=False,
                        batch_size=4, format="jsonl", **FAST)
        assert summary.shards_failed == [] and summary.shards_scored == 3
        rows[name] = {os.path.basename(p): [{k: v for k, v in row.items() if k != "shard"} for row in read_rows(p)]
                      for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}
        assert {row["shard"] for p in glob.glob(os.path.join(out, "scores", "*.jsonl")) for row in read_rows(p)} == \
            set(urls if name != "local" else local[1])
    assert len(rows["local"]) == 3 and rows["remote"] == rows["local"] == rows["remote-workers"]


# -- faults: our own web server ---------------------------------------------------------------------
OPTS = RemoteOptions(block_bytes=8192, readahead=2, backoff_seconds=0.01, idle_seconds=2)


@pytest.mark.parametrize("fault", [("reset", 20_000), ("short", 30_001), ("status", 503), ("status", 500),
                                   ("stall", 12_345)], ids=["reset", "short", "503", "500", "stall"])
def test_a_failed_read_resumes_at_the_byte_it_reached(web, local, fault):
    data = open(local[1][0], "rb").read()
    name = f"{fault[0]}-{fault[1]}.tar"
    url = web.put(name, data)
    web.fail(name, fault)
    told = []
    stream = open_remote(url, OPTS, told.append)
    got = stream.read()
    assert got == data and stream.retries == 1 and len(told) == 1
    first, again = web.gets(name)  # one GET to the end, then one from the byte reached
    assert first == "bytes=0-"
    resumed = int(again[len("bytes="):-1])
    if fault[0] in ("short", "stall"):  # every byte sent before the fault arrived
        assert resumed == fault[1]
    elif fault[0] == "reset":  # a reset may discard what was still in flight, never more
        assert 0 <= resumed <= fault[1]
    else:
        assert resumed == 0
    assert url in told[0] and "retry 1 of 16 (1 in a row, at most 7)" in told[0] and f"at byte {resumed:,}" in told[0]


def test_429_waits_as_long_as_retry_after_asks(web, local):
    data = open(local[1][1], "rb").read()
    url = web.put("busy.tar", data)
    web.fail("busy.tar", ("status", 429, "1"))
    told = []
    started = time.monotonic()
    stream = open_remote(url, OPTS, told.append)
    assert stream.read() == data
    assert time.monotonic() - started >= 1.0  # the backoff alone would be 10 ms
    assert "429" in told[0] and "in 1.00s" in told[0]


def test_an_object_replaced_between_two_reads_is_never_spliced(web, local):
    """The first GET breaks off at byte 20000; before the second, the object is replaced by one of
    the same size: the second read is refused (If-Match), the shard fails, nothing is spliced."""
    data = open(local[1][0], "rb").read()
    url = web.put("moving.tar", data)
    web.fail("moving.tar", ("short", 20_000), ("replace", data[:20_000] + b"\0" * (len(data) - 20_000)))
    stream = open_remote(url, OPTS)
    first = stream.read(8192)
    with pytest.raises(ObjectChanged, match="changed while it was read .*at byte 20,000"):
        stream.read()
    assert first == data[:8192] and web.gets("moving.tar") == ["bytes=0-", "bytes=20000-"]


def test_retries_are_bounded(web, local):
    url = web.put("down.tar", open(local[1][0], "rb").read())
    web.fail("down.tar", *[("status", 503)] * 20)
    with pytest.raises(OSError, match=r"gave up after 8 failed reads in a row \(remote_attempts\) at byte 0 .*last error: .*503"):
        open_remote(url, OPTS).read()


def test_validate_names_a_shard_that_exhausts_its_retries_and_checks_the_others(web, local):
    urls = [web.put(f"v{i}.tar", open(p, "rb").read()) for i, p in enumerate(local[1])]
    web.fail("v1.tar", ("reset", 9000), *[("status", 503)] * 10)
    web.fail("v2.tar", ("reset", 9000))
    report = validate(urls, jobs=1, config=dict(FAST, remote_block_bytes=8192, remote_attempts=4))
    good, failed, retried = report.shards
    assert failed.counts == {"remote_read_failed": 1}
    [finding] = failed.findings
    assert urls[1] in finding.message and "gave up after 4 failed reads" in finding.message and "503" in finding.message
    on_disk = validate([local[1][0], local[1][2]], jobs=1)
    assert good.counts == on_disk.shards[0].counts and retried.counts == on_disk.shards[1].counts
    assert retried.remote_retries == 1 and retried.stats()["remote_retries"] == 1
    assert report.to_dict()["shards"][2]["remote_retries"] == 1


def test_validate_names_forbidden_objects(web, local):
    url = web.put("secret.tar", b"x")
    web.fail("secret.tar", ("status", 403))  # the HEAD is answered, the GET refused
    report = validate([f"{web.url}/nope.tar"], jobs=1)
    assert report.shards[0].counts == {"remote_object_missing": 1}
    url = web.put("denied.tar", open(local[1][0], "rb").read())
    web.fail("denied.tar", ("status", 403))
    report = validate([url], jobs=1, config=FAST)
    assert report.shards[0].counts == {"remote_read_failed": 1}
    assert "403" in report.shards[0].findings[0].message


def test_score_fails_a_shard_that_exhausts_its_retries_alone_and_resume_completes_it(web, local, tmp_path):
    urls = [web.put(f"s{i}.tar", open(p, "rb").read()) for i, p in enumerate(local[1])]
    web.fail("s0.tar", ("reset", 3000))  # recovered: counted
    web.fail("s1.tar", *[("status", 503)] * 1000)  # every read of it fails: remote_attempts=3 exhausted
    out = str(tmp_path / "out")
    args = ["score", *urls, "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0",
            "--no-progress", "--format", "jsonl"]
    config = tmp_path / "stage.json"
    config.write_text(json.dumps(dict(FAST, remote_block_bytes=8192, remote_attempts=3)))
    result = _cli(*args, "--config", str(config))
    assert result.exit_code == 3, result.output
    assert urls[1] in result.output and "Traceback" not in result.output
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert [f["url"] for f in summary["shards_failed"]] == [urls[1]]
    assert summary["stage_counts"]["notes"]["remote_retries"] >= 2  # s1: 2 retries, then it failed
    assert sorted(os.listdir(os.path.join(out, "done"))) == ["s0.json", "s2.json"]
    web.faults["s1.tar"].clear()  # the store is back
    again = _cli(*args, "--config", str(config), "--resume")
    assert again.exit_code == 0, again.output
    assert sorted(os.listdir(os.path.join(out, "done"))) == ["s0.json", "s1.json", "s2.json"]


# -- configuration and secrets ----------------------------------------------------------------------
def test_storage_options_parse_as_json_or_text_and_nest():
    assert parse_storage_options(["anon=true", "endpoint_url=http://127.0.0.1:9000", "client_kwargs.region_name=eu",
                                  "max_concurrency=4"]) == {
        "anon": True, "endpoint_url": "http://127.0.0.1:9000", "client_kwargs": {"region_name": "eu"},
        "max_concurrency": 4}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])


def test_no_secret_reaches_any_output(s3, local, tmp_path):
    """The secret given as a storage option (and in the environment) is in no file the commands
    write, in no line they print, and in no error message."""
    endpoint, _, _ = s3
    out, stats, report = tmp_path / "out", tmp_path / "stats", tmp_path / "report.json"
    secret_opts = ["--storage-option", f"secret={SECRET}", "--storage-option", "key=wdsftestkey",
                   "--storage-option", f"endpoint_url={endpoint}"]
    outputs = [
        _cli("validate", f"s3://{BUCKET}/laion/", *secret_opts, "--format", "json", "--output", str(report),
             "--stats-dir", str(stats)),
        _cli("score", f"s3://{BUCKET}/laion/", *secret_opts, "--scorer", SCORER, "--out", str(out), "--device",
             "cpu", "--workers", "0", "--no-progress"),
        _cli("validate", f"s3://{BUCKET}/laion/part/shard-0007.tar", *secret_opts),  # missing: an error message
        _cli("validate", "s3://no-such-bucket/", *secret_opts),
    ]
    assert [r.exit_code for r in outputs] == [1, 0, 1, 2], [r.output for r in outputs]
    assert "storage_options" not in json.load(open(out / "run.json"))["stage"]  # how shards are read, not what
    for r in outputs:
        assert SECRET not in r.output
    written = [p for p in glob.glob(str(tmp_path / "**"), recursive=True) if os.path.isfile(p)]
    assert len(written) > 5
    for path in written:
        assert SECRET.encode() not in open(path, "rb").read(), path


def test_without_the_extra_a_remote_url_is_one_line_naming_the_install(local):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["s3fs"] = None  # an install without wdsfilter[remote]
        from click.testing import CliRunner
        from wdsfilter.cli import main
        r = CliRunner().invoke(main, ["validate", "s3://{BUCKET}/laion/"])
        print(r.exit_code)
        print(r.output)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "2", proc.stdout + proc.stderr
    assert "pip install 'wdsfilter[remote]'" in lines[1] and len(lines) == 2


def test_a_remote_shard_whose_count_differs_from_sizes_json_is_a_finding(s3, local):
    _, client, _ = s3
    for path in local[1][:2]:
        client.upload_file(path, BUCKET, f"sized/{os.path.basename(path)}")
    client.put_object(Bucket=BUCKET, Key="sized/sizes.json",
                      Body=json.dumps({"shard-0000.tar": 12, "shard-0001.tar": 10}).encode())
    report = validate(f"s3://{BUCKET}/sized/", jobs=1)
    first, second = report.shards
    assert "remote_size_mismatch" not in first.counts
    [finding] = [f for f in second.findings if f.kind == "remote_size_mismatch"]
    assert "records 10 sample(s), the object holds 9" in finding.message


def test_score_and_filter_write_shards_from_s3_sources_byte_exact(s3, local, tmp_path):
    """score --write-shards and filter --write-shards read their kept members from the bucket: the
    same bytes as from the local shards."""
    outs = {}
    for name, source in (("local", local[0]), ("remote", f"s3://{BUCKET}/laion/")):
        out, kept, again = (str(tmp_path / f"{name}-{x}") for x in ("out", "kept", "again"))
        r = _cli("score", source, "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0",
                 "--no-progress", "--min", "brightness=0.3", "--write-shards", kept)
        assert r.exit_code == 0, r.output
        r = _cli("filter", out, "--min", "brightness=0.4", "--write-shards", again, "--samples-per-shard", "5",
                 "--no-report", "--allow-remote")  # a source the folder names: read only when allowed here
        assert r.exit_code == 0, r.output
        outs[name] = {}
        for folder in (kept, again):
            for path in sorted(glob.glob(os.path.join(folder, "*.tar"))):
                with open(path, "rb") as f:
                    outs[name][(os.path.basename(folder).split("-")[-1], os.path.basename(path))] = _members(f)
    assert len(outs["local"]) >= 4 and outs["remote"] == outs["local"]


def test_sort_shard_reads_a_remote_shard(s3, local, tmp_path):
    _, _, urls = s3
    r = _cli("sort-shard", urls[0], str(tmp_path / "sorted.tar"))
    assert r.exit_code == 0, r.output
    r2 = _cli("sort-shard", local[1][0], str(tmp_path / "sorted-local.tar"))
    assert r2.exit_code == 0
    assert open(tmp_path / "sorted.tar", "rb").read() == open(tmp_path / "sorted-local.tar", "rb").read()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # its temporary is gone
    r = _cli("sort-shard", f"s3://{BUCKET}/laion/nope.tar", str(tmp_path / "x.tar"))
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "x.tar").exists()


def test_the_loader_reads_s3_shards(s3, local):
    import wdsfilter
    loaders = [wdsfilter.loader(source, batch_size=4, num_workers=workers, output="dict", **FAST)
               for source, workers in ((local[0], 0), (f"s3://{BUCKET}/laion/", 0), (f"s3://{BUCKET}/laion/", 2))]
    seen = []
    for loader in loaders:  # workers open their own shards: the order across workers may differ
        seen.append(sorted((s["__key__"], s["caption"], s["image"].tobytes()) for batch in loader for s in batch))
    assert len(seen[0]) == 26 and seen[0] == seen[1] == seen[2]


# -- outputs in object stores -----------------------------------------------------------------------
def test_validate_writes_its_report_and_stats_to_s3(s3, local, tmp_path):
    _, client, _ = s3
    report_url, stats_url = f"s3://{BUCKET}/reports/laion.json", f"s3://{BUCKET}/stats/laion"
    r = _cli("validate", f"s3://{BUCKET}/laion/", "--format", "json", "--output", report_url,
             "--stats-dir", stats_url, "-q")
    assert r.exit_code == 1, r.output  # the corrupt image is a finding
    local_report = tmp_path / "local.json"
    _cli("validate", local[0], "--format", "json", "--output", str(local_report), "-q")
    remote = json.loads(client.get_object(Bucket=BUCKET, Key="reports/laion.json")["Body"].read())
    assert remote["counts"] == json.load(open(local_report))["counts"] and remote["summary"]["shards"] == 3
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="stats/")["Contents"])
    assert keys == [f"stats/laion/shard-000{i}_stats.json" for i in range(3)] + ["stats/laion/sizes.json"]
    sizes = json.loads(client.get_object(Bucket=BUCKET, Key="stats/laion/sizes.json")["Body"].read())
    assert sizes == {"shard-0000.tar": 12, "shard-0001.tar": 9, "shard-0002.tar": 7}
    # an output bucket that does not exist: exit 2 before any shard is read
    r = _cli("validate", f"s3://{BUCKET}/laion/", "--output", "s3://no-such-bucket/r.json")
    assert r.exit_code == 2 and "the bucket 'no-such-bucket' does not exist" in r.output


def test_an_object_whose_upload_fails_is_not_left_at_its_name(s3):
    """A multipart upload whose part keeps failing is aborted: no object at the name, and no
    upload left open (whose parts a bucket would keep paying for)."""
    from wdsfilter.storage.remote import RemoteOutputError, write_object
    endpoint, client, _ = s3
    data = os.urandom(12 << 20)  # past the 5 MiB block: a multipart upload
    options = {"default_block_size": 5 << 20, "config_kwargs": {"retries": {"max_attempts": 1}}}
    with FailingProxy(endpoint, "partNumber=1") as proxy:
        with pytest.raises((RemoteOutputError, OSError)):
            write_object(f"s3://{BUCKET}/out/big.bin", data, dict(options, endpoint_url=proxy.url))
        assert proxy.failed >= 1
    assert "Contents" not in client.list_objects_v2(Bucket=BUCKET, Prefix="out/")
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    write_object(f"s3://{BUCKET}/out/big.bin", data, options)  # the same write, straight to the server
    assert client.get_object(Bucket=BUCKET, Key="out/big.bin")["Body"].read() == data


def test_filter_report_goes_to_s3_and_shards_in_a_bucket_need_the_run_folder_there(s3, local, tmp_path):
    _, client, _ = s3
    out = str(tmp_path / "out")
    r = _cli("score", local[0], "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", "0", "--no-progress")
    assert r.exit_code == 0, r.output
    r = _cli("filter", out, "--min", "brightness=0.3", "--report", f"s3://{BUCKET}/reports/filter.html")
    assert r.exit_code == 0, r.output
    html = client.get_object(Bucket=BUCKET, Key="reports/filter.html")["Body"].read()
    assert html.startswith(b"<!DOCTYPE html>") or b"<html" in html[:200]
    # a local --out with --write-shards in a bucket: its markers could not follow the uploaded shards
    r = _cli("score", local[0], "--scorer", SCORER, "--out", str(tmp_path / "o2"), "--device", "cpu",
             "--write-shards", f"s3://{BUCKET}/kept/")
    assert r.exit_code == 2 and "needs --out in a bucket too" in r.output, r.output
    assert not os.path.exists("s3:") and not (tmp_path / "o2").exists()


def test_the_ranged_block_reader_of_gs_and_hf_resumes_too(web, local):
    """gs:// and hf:// shards are read in ranged blocks (fsspec's cat_file), readahead in flight:
    the same reader run here over HTTP, the only one of those protocols served on loopback."""
    data = open(local[1][0], "rb").read()
    url = web.put("blocks.tar", data)
    web.fail("blocks.tar", ("reset", 20_000), ("status", 503))
    stream = open_remote(url, OPTS)
    stream.kind = "other"  # what open_remote picks for gs:// and hf://
    assert stream.read() == data and stream.retries == 2
    gets = web.gets("blocks.tar")
    assert all(g.startswith("bytes=") and not g.endswith("-") for g in gets)  # closed ranges of 8 KiB
    assert gets.count("bytes=16384-24575") >= 2  # the block that broke, asked again


def test_a_run_on_s3_killed_with_sigkill_resumes_to_the_rows_of_the_local_read(s3, local, tmp_path):
    """kill -9 of a `wdsfilter score` reading from the bucket (its decode worker too), then
    --resume: every shard scored once, the rows those of the local shards."""
    import signal
    import subprocess as sp
    tests = os.path.dirname(os.path.abspath(__file__))
    out = str(tmp_path / "killed")
    args = [sys.executable, "-m", "wdsfilter", "score", f"s3://{BUCKET}/laion/", "--out", out, "--scorer", SCORER,
            "--scorer-opt", "bright.delay=0.25", "--device", "cpu", "--batch-size", "4", "--workers", "1",
            "--no-progress", "--format", "jsonl"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = sp.Popen(args, env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not glob.glob(os.path.join(out, "done", "*.json")):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no shard finished in 120s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = len(glob.glob(os.path.join(out, "done", "*.json")))
    assert proc.returncode == -signal.SIGKILL and 1 <= done_at_kill < 3
    resumed = sp.run(args + ["--resume"], env=env, stdout=sp.PIPE, stderr=sp.STDOUT, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resume: {done_at_kill} of 3 shard(s) already done" in resumed.stdout
    from wdsfilter.score import score
    from wdsfilter.runfolder.tables import read_rows
    score(local[0], out=str(tmp_path / "local"), scorers=[SCORER], device="cpu", workers=0, progress=False,
          batch_size=4, format="jsonl")

    def rows(folder):
        return {os.path.basename(p): [{k: v for k, v in r.items() if k != "shard"} for r in read_rows(p)]
                for p in sorted(glob.glob(os.path.join(folder, "scores", "*.jsonl")))}
    assert rows(out) == rows(str(tmp_path / "local"))
