"""The validator's fast tar reader against reading.iter_tar (the stages' reader, on Python's
tarfile): the same members on every kind of ordinary archive, Unusual on the rest, and shards
that end early (which tarfile passes over in silence) reported as truncated_tar."""
import bz2
import glob
import gzip
import io
import lzma
import os
import tarfile

import pytest

from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter.stream.reading import iter_tar
from wdsfilter.validate import ValidateOptions, validate
from wdsfilter.validate import shard_check, tar_reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_TARS = sorted(glob.glob(os.path.join(REPO, "sample_shards", "**", "*.tar"), recursive=True))


def read_all(reader, path):
    with open(path, "rb", buffering=1 << 20) as f:
        return [(m["fname"], m["data"], m.get("__skip__")) if isinstance(m, dict) else (m.members, m.error)
                for m in reader(f, path)]


def archive(path, fmt, compress=None):
    """Members that exercise each format: long names and paths, non-ASCII names, a directory,
    links, empty and odd-sized files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        def add(name, data=b"", kind=tarfile.REGTYPE, link=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("d", kind=tarfile.DIRTYPE)
        add("d/000000.jpg", image_bytes())
        add("d/000000.txt", b"short")
        add("d/" + "x" * 120 + ".jpg", image_bytes())  # GNU long name / pax path
        add("/".join(["folder"] * 20) + "/000001.txt", b"a caption in a deep folder")  # ustar prefix
        add("d/caf\u00e9-000002.txt", "caf\u00e9".encode())
        add("d/000003.txt", b"")
        add("d/000003.jpg", os.urandom(513))
        add("d/link.jpg", kind=tarfile.SYMTYPE, link="000000.jpg")
        add("d/hard.jpg", kind=tarfile.LNKTYPE, link="d/000000.jpg")
    data = buf.getvalue()
    data = {None: lambda d: d, "gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[compress](data)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("path", SAMPLE_TARS, ids=os.path.basename)
def test_same_members_as_iter_tar_on_the_sample_shards(path):
    try:
        fast = read_all(tar_reader.iter_members, path)
    except tar_reader.Unusual:
        assert "truncated" in path  # the only sample shard that needs tarfile's treatment
        return
    assert fast == read_all(iter_tar, path)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
@pytest.mark.parametrize("compress", [None, "gz"])
def test_same_members_as_iter_tar_in_every_format(tmp_path, fmt, compress):
    path = archive(tmp_path / f"fmt-000000.tar{'.gz' if compress else ''}", fmt, compress)
    fast = read_all(tar_reader.iter_members, path)
    assert fast == read_all(iter_tar, path)
    names = [n for n, _, skip in fast[:-1] if skip is None]
    assert "d/" + "x" * 120 + ".jpg" in names and "d/caf\u00e9-000002.txt" in names and "d/link.jpg" not in names
    # Links are named as what they are, with no bytes (issue 8 item 16), by both readers.
    specials = {n: skip[1] for n, _, skip in fast[:-1] if skip is not None}
    assert "symbolic link to '000000.jpg'" in specials["d/link.jpg"] and "hard link" in specials["d/hard.jpg"]
    assert fast[-1] == (7, None)


def test_ustar_prefix_names(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("/".join(["folder"] * 20) + "/000001.txt", "000002.txt"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    (tmp_path / "u-000000.tar").write_bytes(buf.getvalue())
    path = str(tmp_path / "u-000000.tar")
    assert read_all(tar_reader.iter_members, path) == read_all(iter_tar, path)
    assert read_all(tar_reader.iter_members, path)[0][0].startswith("folder/folder/")


@pytest.mark.parametrize("compress", ["bz2", "xz"])
def test_other_compressions_read_by_both_readers(tmp_path, compress):
    path = archive(tmp_path / f"c-000000.tar.{compress}", tarfile.PAX_FORMAT, compress)
    assert read_all(tar_reader.iter_members, path) == read_all(iter_tar, path)
    result = shard_check.check_shard(path, ValidateOptions(jobs=1))
    assert result.members == 7 and result.error is None


def test_check_shard_results_are_the_same_with_either_reader():
    """Every sample shard, fast path or not: the same result as through the stages' reader."""
    opts = ValidateOptions(jobs=1)
    for path in SAMPLE_TARS:
        fast = shard_check.check_shard(path, opts)
        slow = shard_check._ShardCheck(path, opts, iter_tar).run()
        for r in (fast, slow):
            r.seconds = 0
            r.census = {k: (c.samples, c.exts, c.json_fields) for k, c in r.census.items()}
        assert fast == slow, path


def _ends_early(tmp_path, name, damage):
    url = write_shard(tmp_path / "ok-000000.tar", image_text_members(6))
    data = bytearray(open(url, "rb").read())
    with tarfile.open(url) as tar:
        offset = tar.getmember("000003.jpg").offset
    damage(data, offset)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return str(path), offset


@pytest.mark.parametrize("name, damage, words, samples", [
    ("hole-000000.tar", lambda d, o: d.__setitem__(slice(o, o + 1024), bytes(1024)), "follow from byte", 3),
    ("badhdr-000000.tar", lambda d, o: d.__setitem__(o + 10, d[o + 10] ^ 0xFF), "is corrupt (bad checksum)", 3),
    ("concat-000000.tar", lambda d, o: d.extend(d[:o]), "follow from byte", 6),  # a second tar appended
])
def test_shards_that_end_early_are_truncated(tmp_path, name, damage, words, samples):
    """tarfile stops at a zeroed block or a corrupt header as if the shard ended there; the stages'
    reader (reading.iter_tar) and the validator both report it."""
    path, offset = _ends_early(tmp_path, name, damage)
    with open(path, "rb") as f:
        items = list(iter_tar(f, path))
    assert len(items) == 2 * samples + 1 and items[-1].error  # members before the break, then the error
    report = validate(path, jobs=1)
    (finding,) = report.findings
    last = f"{samples - 1:06d}"
    assert finding.kind == "truncated_tar" and finding.member == last + ".txt" and finding.key == last
    assert words in finding.message and "byte " in finding.message
    if samples == 3:
        assert f"byte {offset}" in finding.message
    assert f"{samples} sample(s) ({2 * samples} members) are readable before the break, the last one perhaps " \
           f"incomplete" in finding.message
    assert report.shards[0].samples == report.shards[0].kept == samples and report.exit_code == 1


def test_end_of_archive_padding_is_not_data(tmp_path):
    url = write_shard(tmp_path / "pad-000000.tar", image_text_members(2))
    with open(url, "ab") as f:
        f.write(bytes(64 * 1024))  # more zero padding than the record size
    assert validate(url, jobs=1).passed


def test_shard_cut_at_a_member_boundary(tmp_path):
    """Cut between two members: tarfile notices (no end-of-archive block); the last sample read may
    have lost members, and the finding says so."""
    path, offset = _ends_early(tmp_path, "cut-000000.tar", lambda d, o: d.__delitem__(slice(o, None)))
    with pytest.raises(tar_reader.Unusual):
        read_all(tar_reader.iter_members, path)
    report = validate(path, jobs=1)
    (finding,) = report.findings
    assert finding.kind == "truncated_tar" and finding.member == "000002.txt"
    assert "3 sample(s) (6 members) are readable before the break, the last one perhaps incomplete" in finding.message


def test_block_byte_sum_is_exact():
    import random
    rng = random.Random(5)
    for block in [bytes(512), b"\xff" * 512, b"\x80" * 512] + [rng.randbytes(512) for _ in range(200)]:
        assert tar_reader._byte_sum(block) == sum(block)


def test_malformed_pax_header_goes_through_tarfile(tmp_path):
    """A pax record that does not parse: the shard is read as the stages read it (tarfile ignores
    the record), and validate does not raise."""
    path = archive(tmp_path / "pax-000000.tar", tarfile.PAX_FORMAT)
    data = bytearray(open(path, "rb").read())
    record = data.index(b" path=")  # the long name's pax record: "NNN path=..."
    data[record - 3:record] = b"x9z"
    (tmp_path / "pax-000000.tar").write_bytes(bytes(data))
    with pytest.raises(tar_reader.Unusual):
        read_all(tar_reader.iter_members, path)
    report = validate(path, jobs=1)
    files = [m for m in read_all(iter_tar, path)[:-1] if m[2] is None or m[2][0] != "special_member"]
    assert report.shards[0].members == len(files) == 7


def test_damaged_archives_never_raise_and_agree_with_tarfile_when_read_clean(tmp_path):
    """Bytes flipped anywhere (headers, pax records, data, end blocks): check_shard never raises,
    and when the fast reader reads a shard without finding a break, tarfile reads the same members."""
    import random

    rng = random.Random(9)
    clean = open(archive(tmp_path / "base-000000.tar", tarfile.PAX_FORMAT), "rb").read()
    opts = ValidateOptions(jobs=1)
    agreed = broken = 0
    for i in range(200):
        data = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f"m{i}-000000.tar"
        path.write_bytes(bytes(data))
        shard_check.check_shard(str(path), opts)  # must not raise
        try:
            fast = read_all(tar_reader.iter_members, str(path))
        except tar_reader.Unusual:
            continue
        if fast[-1][1] is None:
            assert fast == read_all(iter_tar, str(path))
            agreed += 1
        else:
            broken += 1
    assert agreed > 10 and broken > 10, (agreed, broken)
