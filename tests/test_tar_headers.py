"""The tar readers' quick parse of a plain file header (storage/tars.py `_plain_file_header`) gives
what tarfile's own parse (with ShardTarInfo's prefix rule) gives, on the headers real writers make
(GNU tar in its five formats, Python's tarfile in three, webdataset's TarWriter) and on thousands of
damaged copies of them; where the quick parse declines, the ordinary one decides (and raises)."""
import io
import os
import random
import shutil
import subprocess
import tarfile

import pytest

from wdsfilter.storage import tars
from wdsfilter.storage.tars import ShardTarInfo

GNU_TAR = shutil.which("tar")
ATTRIBUTES = ("name", "mode", "uid", "gid", "size", "mtime", "chksum", "type", "linkname", "uname", "gname",
              "devmajor", "devminor", "offset", "offset_data", "pax_headers", "sparse")
LONG = "d" * 60 + "/" + "e" * 70 + "/sample.with.dots.000001"  # over 100 characters: a prefix or a long name


def _files(folder):
    """Members as shards hold them: short, dotted and long names, one of them not UTF-8, a folder."""
    os.makedirs(os.path.join(folder, LONG.rsplit("/", 1)[0]))
    names = ["000000.jpg", "000000.txt", "a.b.c.json", LONG + ".txt"]
    for i, name in enumerate(names):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(bytes(range(256)) * (i + 1))
    with open(os.path.join(folder.encode(), b"caf\xe9.txt"), "wb") as f:
        f.write(b"latin-1 name")
    return names


def _blocks(tar_bytes: bytes) -> list:
    """Every 512-byte block of the archive that tarfile reads as a header (extended headers too)."""
    out = []
    for start in range(0, len(tar_bytes) - 511, 512):
        block = tar_bytes[start:start + 512]
        try:
            tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            continue
        out.append(block)
    return out


def _real_headers(tmp_path) -> list:
    folder = str(tmp_path / "files")
    names = _files(folder)
    archives = []
    if GNU_TAR is not None:
        for fmt in ("gnu", "oldgnu", "ustar", "posix", "v7"):
            out = tmp_path / f"{fmt}.tar"
            made = subprocess.run([GNU_TAR, f"--format={fmt}", "-cf", str(out), "-C", folder, "."], capture_output=True)
            if made.returncode == 0:  # (v7 refuses names over 100 characters: made without them)
                archives.append(out.read_bytes())
            else:
                subprocess.run([GNU_TAR, f"--format={fmt}", "-cf", str(out), "-C", folder, *names[:3]], check=True)
                archives.append(out.read_bytes())
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for name in names if fmt != tarfile.USTAR_FORMAT else names[:3]:
                tar.add(os.path.join(folder, name), arcname=name)
        archives.append(buf.getvalue())
    import webdataset as wds
    buf = io.BytesIO()
    with wds.TarWriter(buf) as sink:
        for i in range(3):
            sink.write({"__key__": f"s.{i:06d}", "jpg": b"\xff\xd8" * 50, "txt": "a caption", "json": {"i": i}})
    archives.append(buf.getvalue())
    return [block for archive in archives for block in _blocks(archive)]


def _parsed(buf: bytes, quick: bool, errors: str = "surrogateescape"):
    """ShardTarInfo.frombuf of `buf` (quick: as it is; else with the quick parse turned off):
    its attributes, or the type of the exception it raised."""
    saved = tars._plain_file_header
    if not quick:
        tars._plain_file_header = lambda *args: None
    try:
        info = ShardTarInfo.frombuf(buf, "utf-8", errors)
    except Exception as e:  # noqa: BLE001 - the two parses must fail alike
        return type(e)
    finally:
        tars._plain_file_header = saved
    return {a: getattr(info, a, None) for a in ATTRIBUTES}


def _damaged(block: bytes, rng: random.Random) -> bytes:
    """A copy of the header with a few bytes of one field changed; its checksum made right half the time."""
    alphabet = b"0123456789 \x00\x80\xff/-_oxabc\xe9\x1c"
    out = bytearray(block)
    start, end = rng.choice([(0, 100), (100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156),
                             (156, 157), (157, 257), (257, 265), (265, 297), (297, 329), (329, 345), (345, 500),
                             (500, 512)])
    for _ in range(rng.randint(1, 3)):
        out[rng.randrange(start, end)] = rng.choice(alphabet)
    if rng.random() < 0.5:
        out[148:156] = b" " * 8
        out[148:155] = b"%06o\x00" % sum(out) if sum(out) < 8 ** 6 else out[148:155]
    return bytes(out)


def test_plain_file_headers_of_real_writers_take_the_quick_parse_with_the_same_result(tmp_path):
    headers = _real_headers(tmp_path)
    quick_taken = 0
    for block in headers:
        taken = tars._plain_file_header(ShardTarInfo, block, "utf-8", "surrogateescape") is not None
        quick_taken += taken
        assert _parsed(block, quick=True) == _parsed(block, quick=False)
        if block[156:157] in (b"0", b"\x00") and block[257:265] in (b"ustar\x0000", b"ustar  \x00"):
            assert taken, block[:100]  # a plain file in a ustar or GNU header: the quick way
    assert quick_taken >= 20  # (the test would prove nothing if the quick way were never taken)


@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_damaged_headers_are_parsed_or_refused_as_tarfile_does(tmp_path, errors):
    rng = random.Random(7)
    headers = _real_headers(tmp_path)
    quick_taken = differ = 0
    for _ in range(6000):
        block = _damaged(rng.choice(headers), rng)
        quick_taken += tars._plain_file_header(ShardTarInfo, block, "utf-8", errors) is not None
        if _parsed(block, quick=True, errors=errors) != _parsed(block, quick=False, errors=errors):
            differ += 1
            assert False, block  # noqa: B011 - shown with the header that differs
    assert differ == 0 and quick_taken >= 500
