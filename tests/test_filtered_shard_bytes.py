"""Filtered shards as users' tools read them: the same bytes from every run (a run resumed after a
kill writes what an uninterrupted run writes), compressed shards included."""
import gzip
import os
import subprocess
import time

from shardkit import image_text_members, write_shard
from wdsfilter.storage.shardcopy import write_filtered


def test_a_gzip_filtered_shard_has_the_same_bytes_in_every_run(tmp_path):
    src = write_shard(str(tmp_path / "src.tar"), image_text_members(6))
    subprocess.run(["gzip", "-k", src], check=True)  # GNU gzip: src.tar.gz
    keep = {"000001", "000004"}
    first, second = tmp_path / "a" / "x-000000.tar.gz", tmp_path / "b" / "x-000000.tar.gz"
    first.parent.mkdir()
    second.parent.mkdir()
    write_filtered(src + ".gz", keep, str(first))
    time.sleep(1.1)  # gzip.open stamped the time of writing (seconds) in the header
    write_filtered(src + ".gz", keep, str(second))
    assert first.read_bytes() == second.read_bytes()
    head = first.read_bytes()[:10]
    # No file name (gzip.open stored the temporary's, `.x-000000.tar.gz.tmp-PID`, which
    # `gunzip -N` restores) and mtime 0, as `gzip -n` writes.
    assert head[3] & 0x08 == 0 and head[4:8] == b"\0\0\0\0"
    names = subprocess.run(["tar", "-tzf", str(first)], check=True, capture_output=True, text=True).stdout.split()
    assert names == ["000001.jpg", "000001.txt", "000004.jpg", "000004.txt"]
    listed = subprocess.run(["gzip", "-lvN", str(first)], check=True, capture_output=True, text=True).stdout
    assert ".tmp-" not in listed
    with gzip.open(first) as f:
        assert len(f.read()) % 10240 == 0
    assert os.listdir(tmp_path / "a") == ["x-000000.tar.gz"]


def _big_member_shard(path, big: int, last: int):
    """A shard whose sample b holds a `big`-byte .bin member, followed by sample c whose .bin
    (the shard's last member) holds `last` bytes; written a chunk at a time."""
    import io
    import tarfile

    class Zeros(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, size in (("a", 10), ("b", big), ("c", last)):
            for ext, n in (("txt", 5), ("bin", size)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = n
                tar.addfile(info, Zeros(n))
    return path


def test_a_kept_member_is_copied_in_chunks_whatever_its_size(tmp_path):
    """score --write-shards (shardcopy.write_filtered) copies a kept member a chunk at a time:
    a 64 MB member kept (and a 16 MB last one) take a few MB of memory, not their size; the copy
    is byte for byte, and a last member cut short is left out whole, never half-copied."""
    import tarfile
    import tracemalloc
    src = _big_member_shard(str(tmp_path / "big.tar"), 64 << 20, 16 << 20)
    tracemalloc.start()
    try:
        counts = write_filtered(src, ["b", "c"], str(tmp_path / "kept.tar"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counts["samples"] == 2 and counts["members"] == 4
    assert peak < 12 << 20, peak
    with tarfile.open(tmp_path / "kept.tar") as tar:
        assert [(m.name, m.size) for m in tar] == [("b.txt", 5), ("b.bin", 64 << 20), ("c.txt", 5), ("c.bin", 16 << 20)]
    # the shard cut inside its last member: that member is left out, no byte of it written
    with open(src, "r+b") as f:
        f.truncate(os.path.getsize(src) - (8 << 20))
    counts = write_filtered(src, ["b"], str(tmp_path / "cut.tar"))
    assert counts["samples"] == 1
    with tarfile.open(tmp_path / "cut.tar") as tar:
        assert [m.name for m in tar] == ["b.txt", "b.bin"]
