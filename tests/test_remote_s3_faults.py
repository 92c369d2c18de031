"""The S3 read path under faults (issue 22 items 4 and 9): moto's S3 server on 127.0.0.1 behind
our fault-injecting proxy (faultkit.S3FaultProxy), whose GETs break off with a connection reset or
a clean close at a chosen byte, answer 503 or 429 with Retry-After, or stall past the idle guard.
Every read resumes where it was: the members are byte-exact, validate and score give what they give
on the same shards on disk, and every retry is ours, counted in `remote_retries` (botocore's own
silent retries, which ignore Retry-After, are off for shard reads)."""
import glob
import os
import tarfile
import time

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from faultkit import S3FaultProxy  # noqa: E402
from remotekit import s3_server, three_shards, upload  # noqa: E402
from wdsfilter.storage.remote import RemoteOptions  # noqa: E402
from wdsfilter.storage.remote_read import open_remote  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

SCORER = "scorekit:BrightnessScorer"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def s3(local):
    """(the proxy, the shards' URLs, the path of each in the proxy's terms)."""
    with s3_server() as (endpoint, client):
        urls = upload(client, local[0], "faulty")
        with S3FaultProxy(endpoint) as proxy:
            yield proxy, urls, [u[len("s3://"):] for u in urls]


def stage(proxy, **kw) -> dict:
    """Stage options that read through the proxy: fast backoff, a short idle guard (the stalls)."""
    return dict({"storage_options": {"endpoint_url": proxy.url}, "remote_backoff_seconds": 0.01,
                 "remote_block_bytes": 16 << 10, "remote_readahead": 2, "stream_idle_seconds": 2}, **kw)


def members(stream):
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read() if m.isfile() else None) for m in tar]


def ranges_after(proxy, path, before: int) -> list:
    """The Range starts of the GETs of `path` sent since the proxy had seen `before` of them."""
    return [int(r[len("bytes="):].split("-")[0]) for r in proxy.gets(path)[before:]]


@pytest.mark.parametrize("fault", [("reset", 20_000), ("short", 30_001), ("status", 503), ("status", 500),
                                   ("stall", 12_345)], ids=["reset", "short", "503", "500", "stall"])
def test_an_s3_read_that_fails_resumes_at_the_byte_it_reached(s3, local, fault):
    proxy, urls, paths = s3
    # The idle guard is short only where a stall needs it: elsewhere a slow machine must not add a retry.
    options = RemoteOptions(storage_options={"endpoint_url": proxy.url}, backoff_seconds=0.01,
                            block_bytes=16 << 10, readahead=2, idle_seconds=2 if fault[0] == "stall" else 120)
    before = len(proxy.gets(paths[0]))
    proxy.fail(paths[0], fault)
    told = []
    stream = open_remote(urls[0], options, told.append)
    with open(local[1][0], "rb") as f:
        assert members(stream) == members(f)
    # Our retry, counted and told (with the status it met), from where the read had reached: never
    # past the fault's byte (a reset may lose what was in flight), never back to 0 after bytes came.
    assert stream.retries >= 1 and len(told) == stream.retries and not proxy.faults[paths[0]]
    assert any(str(fault[1]) in t for t in told) if fault[0] == "status" else True
    first, *again = ranges_after(proxy, paths[0], before)
    assert first == 0 and again and all(r <= (fault[1] if fault[0] != "status" else 0) for r in again)
    if fault[0] in ("short", "stall"):
        assert again[-1] > 0  # what had arrived was kept


def test_429_on_s3_waits_as_long_as_retry_after_asks(s3, local):
    proxy, urls, paths = s3
    proxy.fail(paths[1], ("status", 429, "1"))
    told = []
    options = RemoteOptions(storage_options={"endpoint_url": proxy.url}, backoff_seconds=0.01)
    started = time.monotonic()
    stream = open_remote(urls[1], options, told.append)
    assert stream.read() == open(local[1][1], "rb").read()
    assert time.monotonic() - started >= 1.0  # the backoff alone would be 10 ms
    assert stream.retries == 1 and "429" in told[0] and "in 1.00s" in told[0]


def faults_on_every_shard(proxy, paths):
    proxy.fail(paths[0], ("reset", 9_000), ("status", 503))
    proxy.fail(paths[1], ("status", 429, "0"), ("short", 20_001))
    proxy.fail(paths[2], ("stall", 5_000))


def test_validate_through_faults_finds_what_it_finds_on_disk_and_counts_the_retries(s3, local):
    proxy, urls, paths = s3
    faults_on_every_shard(proxy, paths)
    remote = validate(urls, jobs=2, config=stage(proxy))
    on_disk = validate(local[0], jobs=2)

    def comparable(report):
        found = [(os.path.basename(f.shard), f.kind, f.member, f.key, f.message) for f in report.findings]
        shards = [{k: v for k, v in r.stats().items() if k not in ("shard", "seconds", "remote_retries")}
                  for r in report.shards]
        return found, shards, report.counts, report.exit_code
    assert comparable(remote) == comparable(on_disk)
    assert {"corrupt_image", "missing_caption"} <= set(remote.counts)
    assert [r.remote_retries >= n for r, n in zip(remote.shards, (2, 2, 1))] == [True] * 3
    assert not any(proxy.faults.get(p) for p in paths)  # every fault was met


def test_score_through_faults_gives_the_rows_of_the_local_read_and_counts_the_retries(s3, local, tmp_path):
    from wdsfilter.score import score
    from wdsfilter.runfolder.tables import read_rows
    proxy, urls, paths = s3
    # All on the last shard: the first shards are also read before the run (the key check, the
    # probe), and those reads would meet the faults first.
    proxy.fail(paths[2], ("status", 503), ("reset", 6_000), ("status", 429, "0"), ("short", 12_001),
               ("stall", 18_000))
    rows, summaries = {}, {}
    for name, shards, options in (("local", local[0], {}), ("s3", urls, stage(proxy))):
        out = str(tmp_path / name)
        summaries[name] = score(shards, out=out, scorers=[SCORER], device="cpu", workers=0, progress=False,
                                batch_size=4, format="jsonl", **options)
        rows[name] = {os.path.basename(p): [{k: v for k, v in row.items() if k != "shard"} for row in read_rows(p)]
                      for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}
    assert summaries["s3"].shards_failed == [] and summaries["s3"].shards_scored == 3
    assert len(rows["local"]) == 3 and rows["s3"] == rows["local"]
    assert summaries["s3"].stage_counts["notes"]["remote_retries"] >= 5
    assert not any(proxy.faults.get(p) for p in paths)


def test_retries_of_the_reads_before_scoring_are_counted_in_the_summary(s3, local, tmp_path):
    """The key check (and then the probe) read the first shard before any scoring: a reset there
    is retried like any read, and counted in the summary's remote_retries with the scoring's."""
    from wdsfilter.score import score
    proxy, urls, paths = s3
    before = len(proxy.gets(paths[0]))
    proxy.fail(paths[0], ("reset", 700))  # inside the first sample: the key check's first read meets it
    summary = score(urls, out=str(tmp_path / "out"), scorers=[SCORER], device="cpu", workers=0, progress=False,
                    batch_size=4, format="jsonl", **stage(proxy, stream_idle_seconds=120))
    assert not proxy.faults[paths[0]]
    # the read that met the reset began at byte 0 and was asked again from a byte at most 700
    first, again, *_ = ranges_after(proxy, paths[0], before)
    assert first == 0 and again <= 700
    assert summary.shards_failed == [] and summary.shards_scored == 3
    assert summary.stage_counts["notes"]["remote_retries"] == 1


def test_a_bucket_sizes_json_that_cannot_be_read_is_left_as_it_was_not_merged_with_nothing(s3):
    # sizes.json in a bucket is read, merged and put whole. A read that failed (access denied, a
    # store that does not answer) was taken for "none": the other shards' entries were lost.
    import json

    import fsspec

    from wdsfilter.core.errors import OutputError
    from wdsfilter.storage.shardstats import read_sizes, update_sizes
    proxy, urls, paths = s3
    folder = urls[0].rsplit("/", 1)[0]
    options = {"endpoint_url": proxy.url}
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(f"{folder}/sizes.json", json.dumps({"a.tar": 5, "b.tar": 7}).encode())
    path = paths[0].rsplit("/", 1)[0] + "/sizes.json"
    proxy.fail(path, ("status", 403))
    with pytest.raises(OutputError, match=r"sizes\.json could not be read .*left as it was"):
        update_sizes(folder, {"c.tar": 3}, options)
    assert json.loads(fs.cat_file(f"{folder}/sizes.json")) == {"a.tar": 5, "b.tar": 7}
    proxy.fail(path, ("status", 403))
    assert read_sizes(folder, options) == {}  # a reader skips it, as before
    assert update_sizes(folder, {"c.tar": 3}, options) == {"a.tar": 5, "b.tar": 7, "c.tar": 3}
