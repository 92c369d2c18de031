"""S3 read through botocore itself (storage/remote_s3.py), against moto's S3 server on 127.0.0.1:
a plain prefix is validated without s3fs's asyncio stack, with the report of the same shards on
disk; forked validate workers use the clients their parent made, never its connections; a
replaced object is never spliced (its ETag pinned on every GET); options only s3fs reads keep s3fs.
The fault paths (resets, short answers, 503/429, stalls) are tests/test_remote_s3_faults.py's,
which read through the same module."""
import multiprocessing
import os
import subprocess
import sys

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from remotekit import BUCKET, s3_server, three_shards, upload  # noqa: E402
from wdsfilter.storage import remote_s3  # noqa: E402
from wdsfilter.storage.remote import ObjectChanged, RemoteOptions  # noqa: E402
from wdsfilter.storage.remote_read import open_remote  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def s3(local):
    with s3_server() as (endpoint, client):
        yield endpoint, client, upload(client, local[0], "direct")


VALIDATE = """
import json, sys, wdsfilter
r = wdsfilter.validate(sys.argv[1], jobs=2)
print(json.dumps({"samples": r.samples, "counts": r.counts, "shards": len(r.shards), "s3fs": "s3fs" in sys.modules,
                  "aiohttp": "aiohttp" in sys.modules}))
"""


def test_a_plain_prefix_is_validated_without_s3fs_and_as_on_disk(s3, local):
    import json
    out = subprocess.run([sys.executable, "-c", VALIDATE, f"s3://{BUCKET}/direct/"], capture_output=True, text=True,
                         timeout=300, env=os.environ)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    on_disk = validate(local[0], jobs=1)
    assert got == {"samples": on_disk.samples, "counts": on_disk.counts, "shards": 3, "s3fs": False,
                   "aiohttp": False}


def _reads_beside_the_parent(url, expected, parent_client_id, results):
    """In a forked child: the parent's client (the same object), its own connections: many HEADs and
    GETs while the parent sends its own on the client they share."""
    try:
        mine = remote_s3.client({}, timeout=60)
        same = id(mine) == parent_client_id
        bucket, key = remote_s3.split(url)
        for _ in range(15):
            assert mine.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(expected)
            assert mine.get_object(Bucket=bucket, Key=key)["Body"].read() == expected
        results.put(("ok", same))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put(("failed", repr(e)))


def test_a_forked_worker_uses_its_parents_client_but_never_its_connections(s3, local):
    _, _, urls = s3
    expected = open(local[1][0], "rb").read()
    bucket, key = remote_s3.split(urls[0])
    parent = remote_s3.client({}, timeout=60)
    assert parent.get_object(Bucket=bucket, Key=key)["Body"].read() == expected  # a connection kept in its pool
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_reads_beside_the_parent, args=(urls[0], expected, id(parent), results))
                for _ in range(2)]
    for child in children:
        child.start()
    for _ in range(15):  # the parent goes on with its pooled connection meanwhile
        assert parent.get_object(Bucket=bucket, Key=key)["Body"].read() == expected
    outcomes = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(60)
    assert outcomes == [("ok", True), ("ok", True)], outcomes


def test_an_s3_object_replaced_between_two_reads_is_never_spliced(s3, local):
    """The first GET is left at byte 8192 (a seek elsewhere sends a new one); before the second GET the
    object is replaced by one of the same size: S3 refuses it (If-Match, HTTP 412), the shard fails."""
    _, client, _ = s3
    data = open(local[1][1], "rb").read()
    client.put_object(Bucket=BUCKET, Key="direct-moving/a.tar", Body=data)
    url = f"s3://{BUCKET}/direct-moving/a.tar"
    assert remote_s3.serves(url, {})
    stream = open_remote(url, RemoteOptions(block_bytes=8192, readahead=1, backoff_seconds=0.01))
    assert stream.read(4096) == data[:4096]
    client.put_object(Bucket=BUCKET, Key="direct-moving/a.tar", Body=b"\0" * len(data))
    stream.seek(len(data) // 2)
    with pytest.raises(ObjectChanged, match="changed while it was read"):
        stream.read()
    stream.close()


def test_options_only_s3fs_reads_keep_s3fs(monkeypatch):
    url = f"s3://{BUCKET}/set/a.tar"
    assert remote_s3.serves(url, {}) and remote_s3.serves(url, {"endpoint_url": "http://x", "key": "k", "secret": "s"})
    assert remote_s3.serves(url, {"client_kwargs": {"region_name": "eu-west-1"}, "anon": True})
    assert not remote_s3.serves(url, {"requester_pays": True})
    assert not remote_s3.serves(url, {"client_kwargs": {"verify": False}})
    assert not remote_s3.serves(f"s3://{BUCKET}/set/a.tar?versionId=3", {})
    assert not remote_s3.serves(f"gs://{BUCKET}/set/a.tar", {})
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", "http://elsewhere")  # fsspec's configuration, which s3fs applies
    assert not remote_s3.serves(url, {})
