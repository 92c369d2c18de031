"""Filtered shards as users' tools read them: the same bytes from every run (a run resumed after a
kill writes what an uninterrupted run writes), compressed shards included."""
import gzip
import os
import subprocess
import time

from shardkit import image_text_members, write_shard
from wdsfilter.shardcopy import write_filtered


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
