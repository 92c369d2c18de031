"""Reading only some samples of a local tar by their offsets (wdsfilter/storage/tarsubset.py, used by
`wdsfilter score --retry-failed`): the subset is a tar of exactly their members, long names and
pax headers included, and the other members' data is never read."""
import gzip
import io
import os
import tarfile

import pytest

from wdsfilter.stream.config import StageConfig
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.storage.tarsubset import ReadOnly, subset_stream

BLOB = 300_000


class Counting(io.FileIO):
    """A file that counts the bytes read from it."""
    read_bytes = 0

    def read(self, n=-1):
        data = super().read(n)
        Counting.read_bytes += len(data)
        return data

    def readinto(self, b):
        n = super().readinto(b)
        Counting.read_bytes += n or 0
        return n


def make_tar(path, fmt, n=8, long_every=3):
    members = {}
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(n):
            key = (f"dir/{'x' * 120}/s{i:03d}" if i % long_every == 0 else f"s{i:03d}")
            for ext, data in (("txt", f"caption {i}".encode()), ("bin", os.urandom(BLOB))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                if fmt == tarfile.PAX_FORMAT and i % 2:
                    info.pax_headers = {"comment": "é" * 10}
                tar.addfile(info, io.BytesIO(data))
                members[info.name] = data
    return members


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_subset_is_a_tar_of_exactly_the_wanted_members_and_the_rest_is_not_read(tmp_path, fmt):
    path = str(tmp_path / "shard.tar")
    members = make_tar(path, fmt)
    wanted = {f"dir/{'x' * 120}/s000", "s004", "s007"}
    Counting.read_bytes = 0
    stream = subset_stream(Counting(path, "rb"), frozenset(wanted), "first-dot")
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        got = {info.name: tar.extractfile(info).read() for info in tar}
    stream.close()
    assert got == {name: data for name, data in members.items() if name.split(".")[0] in wanted}
    # the wanted members' data, and headers: not the other five samples' 300 KB each
    assert Counting.read_bytes < 3 * BLOB + 200_000 < os.path.getsize(path) / 2


def test_a_shard_that_cannot_be_walked_is_read_whole(tmp_path):
    path = str(tmp_path / "shard.tar")
    make_tar(path, tarfile.GNU_FORMAT, n=3)
    gz = str(tmp_path / "shard.tar.gz")
    with open(path, "rb") as f, gzip.open(gz, "wb") as g:
        g.write(f.read())
    f = open(gz, "rb")
    assert subset_stream(f, frozenset({"s001"}), "first-dot") is f and f.tell() == 0
    f.close()
    cut = str(tmp_path / "cut.tar")
    with open(path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read()[:BLOB])  # cut inside the first sample's blob
    f = open(cut, "rb")
    assert subset_stream(f, frozenset({"s001"}), "first-dot") is f
    f.close()


def test_the_pipeline_reads_only_the_marked_samples(tmp_path):
    from shardkit import image_bytes, write_shard
    url = write_shard(str(tmp_path / "s.tar"), [m for i in range(6) for m in
                                                 ((f"k{i}.jpg", image_bytes()), (f"k{i}.txt", f"caption {i}"))])
    other = write_shard(str(tmp_path / "t.tar"), [("k9.jpg", image_bytes()), ("k9.txt", "caption 9")])
    keys = [s["__key__"] for s in sample_pipeline([url, other], StageConfig(),
                                                  shard_stages=[ReadOnly({url: ["k1", "k4"]})])]
    assert keys == ["k1", "k4", "k9"]  # the other shard is read whole


def test_a_wanted_key_that_comes_back_later_is_read_whole(tmp_path):
    # side by side in a subset, its two samples would be grouped as one
    from shardkit import write_shard
    path = write_shard(str(tmp_path / "s.tar"), [("a.txt", "1"), ("b.txt", "2"), ("a.txt", "3")])
    f = open(path, "rb")
    assert subset_stream(f, frozenset({"a"}), "first-dot") is f
    f.close()
    f = open(path, "rb")
    assert subset_stream(f, frozenset({"b"}), "first-dot") is not f  # b does not come back
    f.close()
