"""No shard is ever spliced from two versions of a web object (docs/remote.md, "Never two versions
spliced"), whatever the server gives to name a version: a strong ETag with If-Match honoured or
ignored, a weak ETag, only a Last-Modified date (old enough to prove a version, or too recent), or
nothing at all. The object is replaced at the same size between a dropped connection and the
resumed read; what is read is one whole version, or the shard fails (remote_version.py)."""
import json
import os
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remotekit import three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.storage.remote import ObjectChanged, RemoteOptions  # noqa: E402
from wdsfilter.storage.remote_read import open_remote  # noqa: E402

OPTS = RemoteOptions(block_bytes=8192, readahead=2, backoff_seconds=0.01, idle_seconds=5)
BREAK = 20_000
HOUR = 3600
# name -> (FaultServer.put keywords, does the first answer prove a version). A Last-Modified proves
# one only when it is at least a second older than the answer's Date (an hour in the future here
# stands for "written this second": a replacement in the same second keeps it).
SERVERS = {
    "if-match honoured": (dict(), True),
    "etag, if-match ignored": (dict(preconditions=False), True),
    "weak etag only": (dict(etag="weak", preconditions=False), False),
    "old last-modified only": (dict(etag=None, modified=time.time() - HOUR, preconditions=False), True),
    "recent last-modified only": (dict(etag=None, modified=time.time() + HOUR, preconditions=False), False),
    "no validator": (dict(etag=None), False),
}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


def versions(data: bytes, prefix_kept: bool):
    """(v1, v2): v2 the same size, its captions upper-cased, from byte BREAK on or everywhere."""
    if prefix_kept:
        return data, data[:BREAK] + data[BREAK:].replace(b"sample ", b"SAMPLE ")
    return data, data.replace(b"sample ", b"SAMPLE ")


def _put(web, name, data, server):
    return web.put(name, data, **SERVERS[server][0])


def _replace(v2, server):
    """The replacement as the server would date it: a new Last-Modified, except where the first
    one was written this second (a replacement within it keeps the date)."""
    return ("replace", v2, "same date") if server == "recent last-modified only" else ("replace", v2)


@pytest.mark.parametrize("prefix_kept", [False, True], ids=["all changed", "prefix kept"])
@pytest.mark.parametrize("server", list(SERVERS))
def test_a_read_resumed_after_a_break_is_one_version_or_fails(web, local, server, prefix_kept):
    v1, v2 = versions(open(local[1][0], "rb").read(), prefix_kept)
    assert len(v1) == len(v2) and v1[BREAK:] != v2[BREAK:] and (v1[:BREAK] == v2[:BREAK]) == prefix_kept
    url = _put(web, "x.tar", v1, server)
    web.fail("x.tar", ("short", BREAK), _replace(v2, server))
    stream = open_remote(url, OPTS)
    try:
        got = stream.read()
    except ObjectChanged as e:
        got = e
    proven = SERVERS[server][1]
    if proven or server == "weak etag only" or not prefix_kept:
        # a validator that changed, or the bytes read again from 0 differ: the shard fails
        assert isinstance(got, ObjectChanged), (server, got if not isinstance(got, bytes) else len(got))
        assert "changed while it was read" in str(got) and url in str(got)
    else:
        # nothing proves a version: read again from byte 0, the same first bytes, then the rest: v2 whole
        assert got == v2
        assert web.gets("x.tar") == ["bytes=0-", "bytes=0-"]
    assert stream.proven == proven


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_break_without_a_replacement_is_read_whole(web, local, server):
    data = open(local[1][1], "rb").read()
    url = _put(web, "y.tar", data, server)
    web.fail("y.tar", ("reset", 15_000), ("short", 30_001))
    stream = open_remote(url, OPTS)
    assert stream.read() == data and stream.retries == 2
    gets = web.gets("y.tar")
    if SERVERS[server][1]:  # resumed at the byte reached (a reset may lose what was in flight)
        assert gets[0] == "bytes=0-" and gets[-1] == "bytes=30001-"
    else:  # never mid-object: from byte 0 each time
        assert gets == ["bytes=0-"] * 3


def test_a_version_changed_between_the_two_reads_of_a_filtered_copy_fails_it(web, tmp_path):
    """score/filter --write-shards read a remote source twice (an index, then the copy at its
    offsets). From a server with no validator, a same-size object whose members moved between the
    reads would have the index's offsets copied out of the other version: both reads are hashed."""
    from shardkit import write_shard
    from wdsfilter.storage.shardcopy import write_filtered
    members = [(f"k{i}.txt", f"caption {i:02d}") for i in range(8)]
    v1 = open(write_shard(str(tmp_path / "a.tar"), members), "rb").read()
    v2 = open(write_shard(str(tmp_path / "b.tar"), members[::-1]), "rb").read()
    assert len(v1) == len(v2) and v1 != v2
    url = web.put("moved.tar", v1, etag=None)
    web.fail("moved.tar", ("ok",), ("replace", v2))  # the first read sees v1, the second v2
    with pytest.raises(ObjectChanged, match="changed between its two reads"):
        write_filtered(url, {"k1", "k2"}, str(tmp_path / "out.tar"), remote=OPTS)
    assert not (tmp_path / "out.tar").exists()
    url = web.put("still.tar", v1, etag=None)  # not replaced: the copy is written
    write_filtered(url, {"k1", "k2"}, str(tmp_path / "out.tar"), remote=OPTS)
    import tarfile
    assert [m.name for m in tarfile.open(tmp_path / "out.tar")] == ["k1.txt", "k2.txt"]


def _rows(folder):
    from wdsfilter.runfolder.tables import read_rows
    out = {}
    for name in sorted(os.listdir(os.path.join(folder, "scores"))):
        out[name] = [{k: v for k, v in r.items() if k != "shard"}
                     for r in read_rows(os.path.join(folder, "scores", name))]
    return out


def test_score_over_every_kind_of_server_never_splices(web, local, tmp_path):
    """One shard per server kind, broken mid-read and replaced by a same-size version changed on both
    sides of the break: each fails into the ledger (exit 3), never scored from a splice; on the
    servers with no validator, a version that kept the bytes before the break is read whole (its
    rows those of that version). --resume then scores the replaced objects: one version each."""
    from scorekit import make_shards
    data = open(local[1][0], "rb").read()
    # the first shard, unbroken and large enough that the reads before scoring (the key check, the
    # probe's samples) are all of it: the faults are met while scoring
    [first] = make_shards(str(tmp_path / "big"), [40])[0]
    names, urls, expect = {}, [_put(web, "first.tar", open(first, "rb").read(), "no validator")], {"first.tar": "first"}
    for i, server in enumerate(SERVERS):
        name = f"a{i}.tar"
        v1, v2 = versions(data, prefix_kept=False)
        urls.append(_put(web, name, v1, server))
        web.fail(name, ("short", BREAK), _replace(v2, server))
        names[name], expect[name] = server, "fails"
        if not SERVERS[server][1] and server != "weak etag only":
            name = f"b{i}.tar"
            v1, v2 = versions(data, prefix_kept=True)
            urls.append(_put(web, name, v1, server))
            web.fail(name, ("short", BREAK), _replace(v2, server))
            names[name], expect[name] = server, "v2 kept prefix"
    scored = {}  # the rows of each version, scored from local files
    for label, version in (("first", open(first, "rb").read()), ("v2", versions(data, False)[1]),
                           ("v2 kept prefix", versions(data, True)[1])):
        folder = tmp_path / label.replace(" ", "_")
        folder.mkdir()
        (folder / "shard.tar").write_bytes(version)
        out = str(tmp_path / f"out-{folder.name}")
        r = CliRunner().invoke(main, ["score", str(folder), "--scorer", "scorekit:ByteLengthScorer", "--out", out,
                                      "--device", "cpu", "--workers", "0", "--no-progress", "--format", "jsonl"])
        assert r.exit_code == 0, r.output
        scored[label] = _rows(out)["shard.jsonl"]
    out = str(tmp_path / "out")
    config = tmp_path / "stage.json"
    config.write_text(json.dumps({"remote_backoff_seconds": 0.01, "remote_block_bytes": 8192,
                                  "remote_readahead": 2}))
    args = ["score", *urls, "--scorer", "scorekit:ByteLengthScorer", "--out", out, "--device", "cpu",
            "--workers", "0", "--no-progress", "--format", "jsonl", "--config", str(config)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 3, r.output
    failed = sorted(n for n, e in expect.items() if e == "fails")
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert sorted(f["url"].rsplit("/", 1)[1] for f in summary["shards_failed"]) == failed
    import pyarrow.parquet as pq
    ledger = pq.read_table(os.path.join(out, "failures.parquet")).to_pylist()
    shard_rows = {e["shard"].rsplit("/", 1)[1]: e for e in ledger if e["index"] == -1}
    assert sorted(shard_rows) == failed
    assert all("changed while it was read" in e["message"] for e in shard_rows.values())
    rows = _rows(out)
    assert sorted(rows) == sorted(n.replace(".tar", ".jsonl") for n, e in expect.items() if e != "fails")
    for name, got in rows.items():
        assert got == scored[expect[name.replace(".jsonl", ".tar")]], name
    web.faults.clear()
    again = CliRunner().invoke(main, args + ["--resume"])
    assert again.exit_code == 0, again.output
    rows = _rows(out)
    for name in failed:  # the replaced object, read whole
        assert rows[name.replace(".tar", ".jsonl")] == scored["v2"], name
