"""`wdsfilter sort-shard` costs what the input stores: a sparse member is written as stored (not
its expanded size), and memory holds names and offsets only, never headers (issue 20, finding 7)."""
import io
import os
import shutil
import subprocess
import tarfile

import pytest

from filterkit import peak_rss_mb, run_cli
from shardkit import image_bytes

GNU_TAR = shutil.which("tar")


@pytest.mark.skipif(GNU_TAR is None, reason="needs GNU tar")
def test_a_sparse_member_of_8_gib_is_written_as_stored(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "s1.txt").write_text("a caption")
    (src / "s0.jpg").write_bytes(image_bytes())
    (src / "s0.txt").write_text("another")
    with open(src / "s1.bin", "wb") as f:  # 8 GiB of which one block is data
        f.seek((8 << 30) - 5)
        f.write(b"tail!")
    shard = str(tmp_path / "sparse.tar")
    subprocess.run([GNU_TAR, "--format=gnu", "--sparse", "-C", str(src), "-cf", shard,
                    "s1.txt", "s0.jpg", "s1.bin", "s0.txt"], check=True)
    assert os.path.getsize(shard) < 64 << 10
    out = str(tmp_path / "sorted.tar")
    r = run_cli("sort-shard", shard, out, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) < 64 << 10  # was 8 GiB of zeros
    with tarfile.open(out) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["s0.jpg", "s0.txt", "s1.bin", "s1.txt"]
        big = tar.getmember("s1.bin")
        assert big.issparse() and big.size == 8 << 30
        assert tar.extractfile("s0.jpg").read() == (src / "s0.jpg").read_bytes()
    listing = subprocess.run([GNU_TAR, "-tvf", out], capture_output=True, text=True, check=True).stdout
    assert str(8 << 30) in listing and "s1.bin" in listing


def pax_shard(path, n):
    """n single-member samples in reverse order (every member moves), each member with a
    1,000,000-byte pax comment, gzip-compressed to a few KB per member."""
    with tarfile.open(path, "w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
        for i in reversed(range(n)):
            data = f"sample {i}".encode()
            info = tarfile.TarInfo(f"{i:05d}.txt")
            info.size = len(data)
            info.pax_headers = {"comment": "x" * 1_000_000}
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.skipif(GNU_TAR is None, reason="needs GNU tar")
def test_memory_holds_names_and_offsets_not_pax_headers(tmp_path):
    """Peak RSS flat in the member count: 100 members with a 1,000,000-byte pax comment each cost
    what 5 do. Every TarInfo was kept with its pax headers (1,500 such members: 1.46 GB)."""
    peaks = {}
    for n in (5, 100):
        shard = pax_shard(tmp_path / f"pax{n}.tar.gz", n)
        out = str(tmp_path / f"sorted{n}.tar.gz")
        r, peaks[n] = peak_rss_mb("sort-shard", shard, out)
        assert r.returncode == 0, r.stderr
        names = subprocess.run([GNU_TAR, "-tzf", out], capture_output=True, text=True, check=True).stdout.split()
        assert names == [f"{i:05d}.txt" for i in range(n)]
    with tarfile.open(out) as tar:  # headers copied as stored
        assert next(iter(tar)).pax_headers["comment"] == "x" * 1_000_000
    assert peaks[100] - peaks[5] < 40, peaks  # 95 MB more of pax headers were held


def test_sort_shard_takes_a_folder_or_several_shards_into_a_folder(tmp_path):
    """issue 35 item 16: `sort-shard IN... OUTDIR` sorts every shard of a folder (or several files,
    a glob) into OUTDIR under its own name; one that fails is named and the others are written."""
    from click.testing import CliRunner

    from shardkit import image_bytes, write_shard
    from wdsfilter.cli import main
    src = tmp_path / "in"
    src.mkdir()
    for n in range(2):  # members of one key far apart: what `tar -cf x.tar *.txt *.jpg` writes
        members = [(f"{k}.txt", f"caption {k}") for k in range(n * 10, n * 10 + 10)]
        members += [(f"{k}.jpg", image_bytes()) for k in range(n * 10, n * 10 + 10)]
        write_shard(str(src / f"part-{n:06d}.tar"), members)
    r = CliRunner().invoke(main, ["sort-shard", str(src), str(tmp_path / "sorted")])
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path / "sorted")) == ["part-000000.tar", "part-000001.tar"]
    assert r.output.count("wdsfilter sort-shard: wrote") == 2
    import webdataset as wds
    samples = list(wds.WebDataset(str(tmp_path / "sorted" / "part-000001.tar"), shardshuffle=False))
    assert len(samples) == 10 and all({"txt", "jpg"} <= set(s) for s in samples)
    (src / "junk.tar").write_bytes(b"not a tar at all" * 100)
    r = CliRunner().invoke(main, ["sort-shard", str(src / "part-000000.tar"), str(src / "junk.tar"),
                                  str(tmp_path / "again")])
    assert r.exit_code == 3 and "1 of 2 shard(s) were not sorted" in r.output and "junk.tar" in r.output
    assert os.listdir(tmp_path / "again") == ["part-000000.tar"]
