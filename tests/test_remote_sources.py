"""Remote sources of the shard writers (issue 22 item 1): a filtered shard copies its kept members
from a shard on a web server or in a bucket by streaming it (twice: an index, then the copy) with
the remote reader's bounded read-ahead: no temporary copy of the source, and memory that does not
grow with the shard's size. Our fault-injecting web server (remotekit.FaultServer) serves them."""
import os
import threading
import time
import tracemalloc

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from faultkit import big_shards  # noqa: E402
from wdsfilter.storage.remote import ObjectChanged, RemoteOptions  # noqa: E402
from wdsfilter.storage.shardcopy import member_ranges, write_filtered  # noqa: E402

OPTS = RemoteOptions(block_bytes=256 << 10, readahead=2, backoff_seconds=0.01, idle_seconds=1)


def kept_keys(path):
    keys = sorted({key for _, _, key in member_ranges(path, "first-dot")[1]})
    return keys[::2]  # every other sample


def test_a_filtered_shard_streams_its_remote_source_without_a_temporary_copy(web, tmp_path):
    [path] = big_shards(str(tmp_path / "src"), 1, samples=8, blob=100_000)
    url = web.put("big.tar", open(path, "rb").read())
    web.fail("big.tar", ("stall", 300_000))  # the first read stalls there until the idle guard retries it
    out = tmp_path / "out"
    out.mkdir()
    keep = kept_keys(path)
    result = {}
    writer = threading.Thread(target=lambda: result.update(write_filtered(url, keep, str(out / "big.tar"),
                                                                           remote=OPTS)))
    writer.start()
    try:
        deadline = time.monotonic() + 60
        while not web.gets("big.tar"):  # the event: the source's first GET has reached the server
            assert time.monotonic() < deadline and writer.is_alive()
            time.sleep(0.01)
        # The read is under way (and held at byte 300,000): a copy to a temporary would be there.
        assert os.listdir(out) == []
    finally:
        writer.join(60)
    assert not writer.is_alive() and result["samples"] == len(keep)
    write_filtered(path, keep, str(tmp_path / "local.tar"))
    assert (out / "big.tar").read_bytes() == (tmp_path / "local.tar").read_bytes()
    assert os.listdir(out) == ["big.tar"]
    assert web.gets("big.tar")[0] == "bytes=0-" and len(web.gets("big.tar")) >= 3  # index, resumed, copy


def test_memory_does_not_grow_with_the_remote_source_size(web, tmp_path):
    peaks = {}
    for samples in (64, 128):  # 16 MB and 32 MB of incompressible members
        [path] = big_shards(str(tmp_path / f"src{samples}"), 1, samples=samples, blob=250_000)
        url = web.put(f"s{samples}.tar", open(path, "rb").read())
        tracemalloc.start()
        try:
            write_filtered(url, kept_keys(path), str(tmp_path / f"out{samples}.tar"), remote=OPTS)
            peaks[samples] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert os.path.getsize(path) > samples * 250_000
    # Bounded by construction (the read-ahead, the HTTP client's buffers and one member), whatever
    # the shard's size: twice the shard, the same peak; a fraction of the smaller shard.
    assert peaks[128] < 1.25 * peaks[64] and peaks[128] < 8 << 20, peaks


def test_a_source_replaced_while_it_is_streamed_writes_nothing(web, tmp_path):
    [path] = big_shards(str(tmp_path / "src"), 1, samples=4, blob=50_000)
    data = open(path, "rb").read()
    url = web.put("moving.tar", data)
    # The read breaks off; before it resumes the object is replaced by one of the same size.
    web.fail("moving.tar", ("short", 20_000), ("replace", data[:1024] + b"\0" * (len(data) - 1024)))
    with pytest.raises(ObjectChanged, match="changed"):
        write_filtered(url, kept_keys(path), str(tmp_path / "out.tar"), remote=OPTS)
    assert os.listdir(tmp_path) == ["src"]


def test_sort_shard_copies_a_remote_plain_tar_by_ranged_reads_not_a_temporary_copy(web, tmp_path):
    from shardkit import image_bytes, write_shard
    from wdsfilter.sortshard import sort_shard
    keys = [f"k{i:03d}" for i in range(12)]  # every caption first, then every image: scattered keys
    members = [(f"{k}.txt", f"caption {k}") for k in keys] + \
              [(f"{k}.jpg", image_bytes(color=(20 * i, 60, 90))) for i, k in enumerate(keys)]
    path = write_shard(str(tmp_path / "scattered.tar"), members)
    url = web.put("scattered.tar", open(path, "rb").read())
    out = tmp_path / "out"
    out.mkdir()
    result = sort_shard(url, str(out / "sorted.tar"))
    sort_shard(path, str(tmp_path / "local.tar"))
    assert result.moved > 0 and (out / "sorted.tar").read_bytes() == (tmp_path / "local.tar").read_bytes()
    assert os.listdir(out) == ["sorted.tar"]
    # One read to index it, then the copy: a GET at each jump of the key order (a caption, then
    # its image far ahead, then back), read from the server, not from a local copy.
    starts = [int(r[len("bytes="):].split("-")[0]) for r in web.gets("scattered.tar")]
    assert starts[0] == 0 and len(starts) > len(keys) and len(set(starts)) > len(keys)


def test_unique_keys_on_a_streamed_source_renames_as_on_a_local_one(web, tmp_path):
    """filter --write-shards --unique-keys reads each member's header where the copy is: on a
    streamed remote source (read forward only) it writes what it writes from the same local shard."""
    import json
    import tarfile

    from scorekit import BrightnessScorer, make_shards
    from wdsfilter.filtering import filter_scores
    from wdsfilter.score import score
    urls, _ = make_shards(tmp_path / "src", [6, 5])
    remote = [web.put(os.path.basename(u), open(u, "rb").read()) for u in urls]

    def members(folder):
        got = []
        for name in sorted(f for f in os.listdir(folder) if f.endswith(".tar")):
            with tarfile.open(os.path.join(folder, name)) as tar:
                for m in tar.getmembers():
                    data = tar.extractfile(m).read()
                    if m.name.endswith(".json"):
                        meta = json.loads(data)
                        data = (meta.pop("source_shard").rsplit("/", 1)[-1], meta)
                    got.append((m.name, data))
        return got

    outs = {}
    for name, sources in (("local", urls), ("remote", remote)):
        run = str(tmp_path / f"run-{name}")
        score(sources, out=run, scorers=[BrightnessScorer()], device="cpu", workers=0, progress=False)
        outs[name] = str(tmp_path / f"shards-{name}")
        filter_scores(run, min_scores={"brightness": 0.3}, write_shards=outs[name], samples_per_shard=4, report=None,
                      unique_keys=True, allow_remote=True)
    local, streamed = members(outs["local"]), members(outs["remote"])
    assert local and streamed == local
    keys = sorted({n.split(".")[0] for n, _ in local})
    assert keys == [f"{i:09d}" for i in range(len(keys))]  # renamed: one new key per kept sample
