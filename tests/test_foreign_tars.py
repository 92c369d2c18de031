"""Shards made by tools nobody here controls, each of which once got a wrong verdict or lost
samples: GNU tar's incremental (-g) and --sparse archives, member names that are not UTF-8, a
git clone that left git-lfs pointer files where the shards should be, and images under an
extension the user names in --image-key. Every shard is written here by the real tool (GNU tar,
Pillow) or, for the pointer files, byte for byte in git-lfs's format."""
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner

from tests.shardkit import image_bytes, write_shard
from wdsfilter.cli import main
from wdsfilter.core.errors import StarvationError
from wdsfilter.stream.reading import iter_tar
from wdsfilter.storage.shardcopy import member_ranges
from wdsfilter.validate import validate

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
GNU_TAR = shutil.which("tar")
needs_tar = pytest.mark.skipif(GNU_TAR is None, reason="GNU tar is not installed")


def _samples(folder, names):
    os.makedirs(folder, exist_ok=True)
    for i, name in enumerate(names):
        with open(os.path.join(folder, name + b".jpg" if isinstance(name, bytes) else name + ".jpg"), "wb") as f:
            f.write(image_bytes(color=(40 * i, 90, 200)))
        with open(os.path.join(folder, name + b".txt" if isinstance(name, bytes) else name + ".txt"), "wb") as f:
            f.write(f"a blue square {i}".encode())
    return folder


def _gnu_keys(shard):
    """Keys as GNU tar lists the shard (the reference reading of its names)."""
    names = subprocess.run([GNU_TAR, "-tf", shard], capture_output=True, check=True).stdout.decode().split()
    return sorted({n.rsplit(".", 1)[0] for n in names if n.endswith((".jpg", ".txt"))})


def _loader_keys(urls, **kwargs):
    import wdsfilter
    ld = wdsfilter.loader(urls, batch_size=4, output="dict", **kwargs)
    return sorted(s["__key__"] for batch in ld for s in batch), ld.stats


def _score(shard, out, *more):
    sys.path.insert(0, ROOT)
    return CliRunner().invoke(main, ["score", str(shard), "--scorer", "tools.trace_modules:LumaScorer", "--device",
                                     "cpu", "--workers", "0", "--no-progress", "--out", str(out), *more])


@needs_tar
def test_gnu_tar_incremental_headers_keep_the_names_gnu_tar_lists(tmp_path):
    # `tar -g` writes old-GNU headers whose atime/ctime fill the bytes tarfile reads as a ustar
    # prefix: names became "<atime>/./s1.txt" and a sample whose members were read at different
    # times split into two halves, each dropped as missing_caption or missing_image.
    src = _samples(tmp_path / "d", ["s0", "s1", "s2"])
    subprocess.run(["touch", "-a", "-d", "2024-01-01 00:00", *[str(p) for p in src.iterdir()]], check=True)
    subprocess.run(["touch", "-a", "-d", "2024-06-01 00:00", str(src / "s1.txt")], check=True)
    shard = str(tmp_path / "incremental.tar")
    subprocess.run([GNU_TAR, "--sort=name", "-g", str(tmp_path / "snar"), "-C", str(src), "-cf", shard, "."],
                   check=True)
    with open(shard, "rb") as f:
        raw = f.read()
    headers = [raw[i:i + 512] for i in range(0, len(raw) - 512, 512) if raw[i + 257:i + 265] == b"ustar  \x00"]
    assert any(h[345:346] != b"\x00" for h in headers)  # the times are there, where a prefix would be
    expected = _gnu_keys(shard)
    assert expected == ["./s0", "./s1", "./s2"]

    keys, stats = _loader_keys(shard)
    assert keys == expected and not stats.dropped
    report = validate([shard])
    assert report.exit_code == 0 and report.samples == 3 and report.kept == 3
    with open(shard, "rb") as f:
        assert "./s1.txt" in [m["fname"] for m in iter_tar(f, shard) if isinstance(m, dict)]
    assert sorted({key for _, _, key in member_ranges(shard, "first-dot")[1]}) == expected


@needs_tar
def test_a_sparse_member_over_its_cap_is_skipped_by_what_the_archive_stores(tmp_path):
    # A 100 MB sparse file holding 1 byte: GNU tar --sparse stores a few blocks. Skipping its
    # expanded size ran off the end of the shard: a valid shard read as truncated, samples lost.
    src = _samples(tmp_path / "d", ["s0", "s1", "s2", "s3"])
    with open(src / "s1.bin", "wb") as f:
        f.truncate(100 << 20)
        f.seek(5000)
        f.write(b"x")
    shard = str(tmp_path / "sparse.tar")
    subprocess.run([GNU_TAR, "--sort=name", "--sparse", "-C", str(src), "-cf", shard, "."], check=True)
    assert os.path.getsize(shard) < 1 << 20
    with tarfile.open(shard) as tar:
        assert tar.getmember("./s1.bin").issparse()

    keys, stats = _loader_keys(shard)
    assert keys == _gnu_keys(shard) and not stats.dropped
    assert stats.notes["oversized_member"] == 1
    report = validate([shard])
    kinds = {f.kind for f in report.findings}
    assert "truncated_tar" not in kinds and "oversized_member" in kinds
    assert report.samples == 4 and report.kept == 4
    # The filtered copy of the shard is a tar GNU tar reads whole, sparse member included.
    result = _score(shard, tmp_path / "out", "--write-shards", str(tmp_path / "kept"))
    assert result.exit_code == 0, result.output
    (copy,) = [str(p) for p in (tmp_path / "kept").glob("*.tar")]
    listed = subprocess.run([GNU_TAR, "-tf", copy], capture_output=True, text=True, check=True).stdout.split()
    assert "./s1.bin" in listed and len(listed) == 9


@needs_tar
def test_member_names_that_are_not_utf8_are_scored_and_matched_again(tmp_path):
    # Latin-1 names (an old Windows share): tarfile gives surrogate escapes, which Parquet
    # refused ("surrogates not allowed": exit 3, nothing written).
    folder = tmp_path / "d"
    os.makedirs(folder)
    _samples(os.fsencode(folder), [b"caf\xe9_0", b"caf\xe9_1", b"na\xefve", b"d\xe9j\xe0_vu"])
    with open(os.path.join(os.fsencode(folder), b"d\xe9j\xe0_vu.jpg"), "r+b") as f:
        f.truncate(200)  # a corrupt image: a rejected row
    shard = str(tmp_path / "latin1.tar")
    subprocess.run([GNU_TAR, "--sort=name", "-C", str(folder), "-cf", shard, "."], check=True)
    result = _score(shard, tmp_path / "out", "--write-shards", str(tmp_path / "kept"))
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq
    (scores,) = (tmp_path / "out" / "scores").glob("*.parquet")
    table = pq.read_table(scores).to_pydict()
    assert sorted(table["key"]) == ["./caf\\xe9_0", "./caf\\xe9_1", "./d\\xe9j\\xe0_vu", "./na\\xefve"]
    assert table["reason"].count("corrupt_image") == 1
    keys = sorted(k for k, kept in zip(table["key"], table["kept"]) if kept)
    # The loader names the samples the same way, so the score filter finds every row.
    kept, stats = _loader_keys(shard, scores=str(tmp_path / "out"), min_scores={"luma": 0.0})
    # the corrupt one, by the reason the scoring run rejected it (issue 35 item 13)
    assert kept == keys and len(keys) == 3 and stats.dropped == {"rejected: corrupt_image": 1}
    (copy,) = (tmp_path / "kept").glob("*.tar")
    with tarfile.open(copy) as tar:
        assert len(tar.getnames()) == 6
    assert validate([shard]).exit_code == 1  # the corrupt image
    # A shard *file* name that is not UTF-8 would go into every output: refused, with the fix.
    renamed = os.path.join(os.fsencode(tmp_path), b"caf\xe9-000000.tar")
    shutil.copy(shard, renamed)
    result = _score(os.fsdecode(renamed), tmp_path / "out2")
    assert result.exit_code == 2 and "caf\\xe9-000000.tar' is not UTF-8" in result.output
    assert "convmv" in result.output


def _lfs_pointer(path, real_size=20480):
    """What a git clone without `git lfs pull` leaves in place of a shard (git-lfs spec v1)."""
    with open(path, "w") as f:
        f.write(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'4a' * 32}\nsize {real_size}\n")
    return str(path)


def test_an_epoch_from_shards_that_are_not_tars_raises_and_one_bad_shard_loses_nothing_else(tmp_path):
    pointers = [_lfs_pointer(tmp_path / f"shard-{i:06d}.tar") for i in range(2)]
    with pytest.raises(StarvationError) as e:
        _loader_keys(pointers)
    assert "the epoch ended with no sample" in str(e.value) and "unreadable_shard" in str(e.value)
    assert "git lfs pull" in str(e.value) and "shard-000000.tar" in str(e.value)
    # Resampled, the same shards are reopened forever: the watchdog counts the openings.
    from wdsfilter.stream.config import StageConfig
    config = StageConfig(starvation_samples=50, starvation_seconds=0)
    with pytest.raises(StarvationError, match=r"shard-00000[01]\.tar"):
        import wdsfilter
        next(iter(wdsfilter.loader(pointers, batch_size=4, resampled=True, config=config)))
    # One pointer among real shards is counted, and the real shards' samples all come out.
    good = write_shard(tmp_path / "good-000000.tar", [(f"{i:04d}.{ext}", data) for i in range(3) for ext, data in
                                                       (("jpg", image_bytes()), ("txt", b"a red square"))])
    keys, stats = _loader_keys([pointers[0], good])
    assert keys == ["0000", "0001", "0002"] and stats.dropped == {"unreadable_shard": 1}


def test_validate_checks_images_under_an_extension_named_in_image_key(tmp_path):
    # .jfif is JPEG; the stages decode it when --image-key names it, so the validator must too.
    jpeg = image_bytes(size=(96, 64))
    shard = write_shard(tmp_path / "jfif-000000.tar", [
        ("ok.jfif", jpeg), ("ok.txt", b"a red square"),
        ("cut.jfif", jpeg[:len(jpeg) // 2]), ("cut.txt", b"a red square, cut"),
    ])
    report = validate([shard], image_key="jpg;jfif", deep=True)
    found = {(f.kind, f.member) for f in report.findings}
    assert ("corrupt_image", "cut.jfif") in found and report.exit_code == 1
    keys, stats = _loader_keys(shard, image_key="jpg;jfif")
    assert keys == ["ok"] and stats.dropped == {"corrupt_image": 1}


@needs_tar
@pytest.mark.parametrize("flag,magic", [("-j", b"BZh"), ("-J", b"\xfd7zXZ\x00"), ("-z", b"\x1f\x8b")])
def test_filtered_copies_of_bz2_xz_and_gzip_shards_are_whole_tars_in_the_same_compression(tmp_path, flag, magic):
    # The copy's offsets are in the tar inside the compression: a bz2 or xz shard was copied as
    # slices of its compressed bytes (score --write-shards: not a tar; filter --write-shards: exit 3).
    src = _samples(tmp_path / "d", ["s0", "s1", "s2"])
    shard = str(tmp_path / "packed.tar")
    subprocess.run([GNU_TAR, "--sort=name", flag, "-C", str(src), "-cf", shard, "."], check=True)
    with open(shard, "rb") as f:
        assert f.read(6).startswith(magic)
    result = _score(shard, tmp_path / "out", "--write-shards", str(tmp_path / "kept"))
    assert result.exit_code == 0, result.output
    copy = str(tmp_path / "kept" / "packed.tar")
    with open(copy, "rb") as f:
        assert f.read(6).startswith(magic)
    assert _gnu_keys(copy) == _gnu_keys(shard) == ["./s0", "./s1", "./s2"]
    resharded = CliRunner().invoke(main, ["filter", str(tmp_path / "out"), "--min", "luma=0", "--write-shards",
                                          str(tmp_path / "resharded"), "--no-report"])
    assert resharded.exit_code == 0, resharded.output
    (written,) = [str(p) for p in (tmp_path / "resharded").glob("*.tar")]
    assert _gnu_keys(written) == ["./s0", "./s1", "./s2"]


@needs_tar
def test_frames_sharing_one_key_are_let_go_past_max_sample_bytes_not_held_whole(tmp_path):
    # ffmpeg's image2 pattern clip.%06d.jpg: under the first-dot rule every frame has the key
    # "clip" and distinct extensions, so nothing stopped one sample from holding the whole shard.
    import numpy as np
    from PIL import Image
    from wdsfilter.stream.config import StageConfig
    from wdsfilter.stream.reading import OVERSIZED, group_samples
    from wdsfilter.core.tally import Tally
    src = tmp_path / "frames"
    os.makedirs(src)
    rng = np.random.default_rng(0)
    for i in range(1, 31):  # ~20 KB of noise each
        Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(src / f"clip.{i:06d}.jpg", quality=95)
    (src / "clip.txt").write_text("a clip of noise")
    (src / "big.txt").write_text("one sample that is just too big")
    (src / "big.jpg").write_bytes(image_bytes())
    (src / "big.npy").write_bytes(bytes(300_000))
    _samples(src, ["ok"])
    shard = str(tmp_path / "frames.tar")
    subprocess.run([GNU_TAR, "--sort=name", "-C", str(src), "-cf", shard, "."], check=True)
    config = StageConfig(max_sample_bytes=200_000, emit_rejects=False)
    with open(shard, "rb") as f:
        samples = {s["__key__"]: s for s in group_samples(iter_tar(f, shard), config, Tally())}
    clip = samples["./clip"]
    assert OVERSIZED in clip and len([e for e in clip if e.endswith(".jpg")]) == 30
    assert all(v == b"" for e, v in clip.items() if not e.startswith("__"))  # names kept, bytes let go
    assert OVERSIZED in samples["./big"] and OVERSIZED not in samples["./ok"]

    import wdsfilter
    ld = wdsfilter.loader(shard, batch_size=4, output="dict", config=config)
    assert [s["__key__"] for b in ld for s in b] == ["./ok"]
    assert ld.stats.dropped == {"dotted_basename": 1, "oversized_sample": 1}
    report = validate([shard], config=config)
    assert report.kept == 1 and {"dotted_basename", "oversized_sample"} <= {f.kind for f in report.findings}
    # The default (twice the largest member cap) keeps both: their members fit.
    assert sorted(_loader_keys(shard)[1].dropped) == ["dotted_basename"]


@needs_tar
def test_sort_shard_writes_a_sparse_member_whole(tmp_path):
    # sort-shard copied a sparse member's expanded size of raw bytes and its sparse header without
    # the map: the sorted .npy became the next members' bytes (GNU tar) or 0 bytes (tarfile).
    import numpy as np
    src = _samples(tmp_path / "d", ["s0", "s1", "s2"])
    embedding = np.zeros(32768, dtype=np.float32)
    embedding[:10], embedding[-10:] = 1, 2
    np.save(tmp_path / "dense.npy", embedding)
    dense = (tmp_path / "dense.npy").read_bytes()
    with open(src / "s1.npy", "wb") as f:  # the same bytes with a hole where the zeros are
        f.write(dense[:4096])
        f.seek(len(dense) - 4096)
        f.write(dense[-4096:])
    assert (src / "s1.npy").read_bytes() == dense
    scattered = str(tmp_path / "scattered.tar")
    names = sorted(os.listdir(src), key=lambda n: (n.rsplit(".", 1)[1], n))  # *.jpg *.npy *.txt
    subprocess.run([GNU_TAR, "--sparse", "-C", str(src), "-cf", scattered, *names], check=True)
    with tarfile.open(scattered) as tar:
        assert tar.getmember("s1.npy").issparse()
    result = CliRunner().invoke(main, ["sort-shard", scattered, str(tmp_path / "sorted.tar")])
    assert result.exit_code == 0, result.output
    sorted_shard = str(tmp_path / "sorted.tar")
    extracted = subprocess.run([GNU_TAR, "-xOf", sorted_shard, "s1.npy"], capture_output=True, check=True).stdout
    assert extracted == dense
    assert subprocess.run([GNU_TAR, "-xOf", sorted_shard, "s2.jpg"], capture_output=True,
                          check=True).stdout == (src / "s2.jpg").read_bytes()
    assert validate([sorted_shard]).exit_code == 0


@needs_tar
def test_bytes_after_a_gzip_stream_lose_nothing_and_the_front_doors_agree(tmp_path):
    # A download that appended an error page to a .tar.gz: every member is there. The loader
    # called the shard truncated while validate passed it.
    src = _samples(tmp_path / "d", ["s0", "s1", "s2"])
    shard = str(tmp_path / "junk.tar.gz")
    subprocess.run([GNU_TAR, "--sort=name", "-czf", shard, "-C", str(src), "."], check=True)
    with open(shard, "ab") as f:
        f.write(b"<html><body>502 Bad Gateway</body></html>\n")
    keys, stats = _loader_keys(shard)
    assert keys == ["./s0", "./s1", "./s2"] and not stats.dropped
    report = validate([shard])
    assert report.exit_code == 0 and report.kept == 3


def test_a_shard_file_whose_name_has_brackets_is_that_file_not_a_pattern(tmp_path):
    shard = write_shard(tmp_path / "laion [part 1].tar", [(f"{i:04d}.{ext}", data) for i in range(2) for ext, data in
                                                         (("jpg", image_bytes()), ("txt", b"a red square"))])
    assert validate([shard]).samples == 2
    assert _loader_keys(shard)[0] == ["0000", "0001"]
    result = _score(shard, tmp_path / "out")
    assert result.exit_code == 0 and "scored 2 of 2 samples" in result.output, result.output


@needs_tar
def test_score_names_a_shard_cut_short_and_fails_a_file_that_is_not_a_tar(tmp_path):
    # Both used to end in "scored N of N samples", exit 0, with the counts only in summary.json.
    src = _samples(tmp_path / "d", ["s0", "s1", "s2", "s3", "s4", "s5"])
    full = str(tmp_path / "full.tar")
    subprocess.run([GNU_TAR, "--sort=name", "-C", str(src), "-cf", full, "."], check=True)
    shards = tmp_path / "shards"
    os.makedirs(shards)
    shutil.copy(full, shards / "a-000000.tar")
    with open(full, "rb") as f, open(shards / "b-000001.tar", "wb") as out:
        out.write(f.read(os.path.getsize(full) // 2))  # a copy that stopped half way
    _lfs_pointer(shards / "c-000002.tar", os.path.getsize(full))
    result = _score(shards, tmp_path / "out")
    assert result.exit_code == 3, result.output
    assert "CUT SHORT" in result.output and "b-000001.tar" in result.output.split("shard CUT SHORT")[1]
    assert "c-000002.tar: no member could be read" in result.output and "is it a tar" in result.output
    import json
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [os.path.basename(f["url"]) for f in summary["shards_cut"]] == ["b-000001.tar"]
    assert [os.path.basename(f["url"]) for f in summary["shards_failed"]] == ["c-000002.tar"]
    assert sorted(os.listdir(tmp_path / "out" / "done")) == ["a-000000.json", "b-000001.json"]



@needs_tar
def test_a_compressed_shard_cut_at_its_first_member_is_cut_short_not_called_a_non_tar(tmp_path):
    # A .tar.gz whose first member decompresses past max_decompressed_bytes was read up to that
    # member's header: it is a tar cut short (truncated_tar, as validate and the loader say), and
    # score said "is it a tar (a git-lfs pointer file, an HTML error page)?" and failed the run.
    src = tmp_path / "d"
    os.makedirs(src)
    (src / "s0.txt").write_bytes(b"\0" * (3 << 20))  # 3 MB of zeros: a few KB gzipped
    _samples(src, ["s1"])
    shards = tmp_path / "shards"
    os.makedirs(shards)
    bomb = str(shards / "b-000001.tar.gz")
    subprocess.run([GNU_TAR, "--sort=name", "-C", str(src), "-czf", bomb, "."], check=True)
    good = write_shard(shards / "a-000000.tar", [(f"{i:04d}.{ext}", data) for i in range(3) for ext, data in
                                                 (("jpg", image_bytes()), ("txt", b"a red square"))])
    cap = ["--max-bytes", "decompressed=1MiB"]
    result = _score(shards, tmp_path / "out", *cap)
    assert result.exit_code == 0, result.output
    assert "is it a tar" not in result.output
    assert "CUT SHORT" in result.output and "max_decompressed_bytes" in result.output.split("shard CUT SHORT")[1]
    import json
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [os.path.basename(f["url"]) for f in summary["shards_cut"]] == ["b-000001.tar.gz"]
    assert summary["shards_failed"] == []
    report = validate([good, bomb], byte_caps={"max_decompressed_bytes": 1 << 20}, jobs=1)
    assert [f.kind for f in report.findings if f.shard == bomb] == ["truncated_tar"]


def test_validate_and_the_decode_stage_agree_on_cut_and_padded_images(tmp_path):
    # The quick end-marker check said an animated GIF cut after its first frame and a PNG with
    # bytes after IEND "would fail to decode" (they decode: the loader keeps them), and passed a
    # cut BMP and TIFF, which it cannot read the end of (the loader drops them).
    import io
    from PIL import Image

    def encoded(fmt, **kwargs):
        buf = io.BytesIO()
        frames = [Image.new("RGB", (96, 64), (40 * i, 120, 200)) for i in range(6)]
        frames[0].save(buf, fmt, **kwargs) if fmt != "GIF" else \
            frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100)
        return buf.getvalue()

    gif, png, bmp, tif = encoded("GIF"), encoded("PNG"), encoded("BMP"), encoded("TIFF")
    members = {"gifcut.gif": gif[:len(gif) * 2 // 3], "pngtail.png": png + os.urandom(5000),
               "bmpcut.bmp": bmp[:len(bmp) * 2 // 3], "tifcut.tif": tif[:len(tif) // 2], "ok.png": png}
    shard = write_shard(tmp_path / "ends-000000.tar", [m for name, data in members.items() for m in
                                                       ((name, data), (name.split(".")[0] + ".txt", b"a caption"))])
    spec = "png;gif;bmp;tif"
    keys, stats = _loader_keys(shard, image_key=spec)
    assert keys == ["gifcut", "ok", "pngtail"] and stats.dropped == {"corrupt_image": 2}
    for deep in (False, True):
        report = validate([shard], image_key=spec, deep=deep)
        assert sorted(f.key for f in report.findings if f.kind == "corrupt_image") == ["bmpcut", "tifcut"], deep
        assert report.kept == 3


def test_write_shards_into_the_input_folder_is_refused_and_the_shards_are_untouched(tmp_path):
    # An img2dataset folder scored with --write-shards pointed at itself: each shard was replaced
    # by its filtered copy (the dropped samples gone for good) and img2dataset's stats overwritten.
    folder = tmp_path / "laion"
    os.makedirs(folder)
    shard = write_shard(folder / "00000.tar", [(f"{i:04d}.{ext}", data) for i in range(4) for ext, data in
                                               (("jpg", image_bytes()), ("txt", b"a red square"))])
    (folder / "00000_stats.json").write_text('{"count": 4, "successes": 4, "failed_to_download": 0}')
    before = {p: open(p, "rb").read() for p in (shard, str(folder / "00000_stats.json"))}
    os.symlink(folder, tmp_path / "same")
    for target in (folder, tmp_path / "same"):  # the same folder by another path too
        result = _score(shard, tmp_path / "out", "--write-shards", str(target), "--min", "luma=0.9")
        assert result.exit_code == 2, result.output
        assert "is the folder of the input shard" in result.output and "another folder" in result.output
    assert {p: open(p, "rb").read() for p in before} == before
    result = _score(shard, tmp_path / "out", "--write-shards", str(tmp_path / "kept"))
    assert result.exit_code == 0, result.output
