"""Hostile and unlucky shards on the input side (issue 8): deep JSON, members too big to hold,
compressed shards that blow up, pax headers declaring a terabyte, links and devices, URL-looking
file names, absurd brace patterns. Each shard is a real tar file; memory is measured in a child."""
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zlib

import pytest

from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import ConfigError, StageConfig, StarvationError
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.storage.shards import expand_urls
from wdsfilter.core.specs import parse_json_member
from wdsfilter.core.tally import Tally
from wdsfilter.validate import validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: json.loads raises RecursionError on it


def run(urls, **options):
    options.setdefault("check_first_shard", False)
    cfg = StageConfig(**options)
    tally = Tally()
    return list(sample_pipeline(urls, cfg, tally)), tally


def _child(code: str, timeout=300):
    """Run code in a fresh interpreter; its last line is printed JSON (peak RSS included)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- 1. deep JSON -------------------------------------------------------------------------------

def test_deep_json_is_invalid_json_counted_and_the_run_goes_on(tmp_path):
    members = image_text_members(3, text_ext="json")
    members = [(n, json.dumps({"caption": f"a red square {i}"}) if n.endswith(".json") else d)
               for i, (n, d) in enumerate(members)]
    members[1] = ("000000.json", DEEP)
    url = write_shard(tmp_path / "deep.tar", members)
    with pytest.raises(ValueError, match="nested"):
        parse_json_member(DEEP)
    samples, tally = run([url], caption_key="json:caption")
    assert len(samples) == 2 and tally.dropped["invalid_json"] == 1
    report = validate(url, caption_key="json:caption", jobs=1)
    assert report.counts["invalid_json"] == 1 and report.kept == 2


def test_json_nested_under_the_recursion_limit_but_past_the_depth_cap_is_invalid():
    doc = ("{\"a\":" * 200 + "1" + "}" * 200).encode()
    with pytest.raises(ValueError, match="deeper than 64"):
        parse_json_member(doc)
    wide = json.dumps({"rows": [{"x": i} for i in range(500)]}).encode()  # many containers, shallow
    assert len(parse_json_member(wide)["rows"]) == 500


# -- 2. byte caps, decompression cap, peak memory ------------------------------------------------

def _sparse_shard(path, members):
    """A plain tar of (name, bytes | str | int) members; an int is a member of that many zero bytes
    written as a hole (sparse on disk), so a test can hold gigabyte members in a few KB."""
    with open(path, "wb") as f:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, int):
                info.size = data
                f.write(info.tobuf(format=tarfile.GNU_FORMAT))
                f.seek(data + (-data % 512), 1)
            else:
                data = data.encode() if isinstance(data, str) else data
                info.size = len(data)
                f.write(info.tobuf(format=tarfile.GNU_FORMAT) + data + bytes(-len(data) % 512))
        f.write(bytes(1024))
    return str(path)


def _gzip_zeros_shard(path, name, size, after=()):
    """A .tar.gz of a few MB holding a `size`-byte member of zeros, compressed as it is written."""
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        def put(b):
            out.write(comp.compress(b))
        info = tarfile.TarInfo(name)
        info.size = size
        put(info.tobuf(format=tarfile.GNU_FORMAT))
        zeros = bytes(1 << 24)
        left = size + (-size % 512)
        while left:
            n = min(left, len(zeros))
            put(zeros[:n] if n < len(zeros) else zeros)
            left -= n
        for n, d in after:
            d = d.encode() if isinstance(d, str) else d
            info = tarfile.TarInfo(n)
            info.size = len(d)
            put(info.tobuf(format=tarfile.GNU_FORMAT) + d + bytes(-len(d) % 512))
        put(bytes(1024))
        out.write(comp.flush())
    return str(path)


def test_an_over_cap_caption_is_streamed_past_counted_with_size_and_reported(tmp_path):
    good = image_text_members(2)
    url = _sparse_shard(tmp_path / "big-txt.tar", good[:2] + [("000005.jpg", image_bytes()), ("000005.txt", 8 << 20)]
                        + good[2:])
    samples, tally = run([url], max_text_bytes=1 << 20)
    assert [s["__key__"] for s in samples] == ["000000", "000001"]
    assert tally.notes["oversized_member"] == 1 and tally.dropped["oversized_member"] == 1
    ex = tally.examples["oversized_member"][0]
    assert ex.shard == url and ex.member == "000005.txt" and "8,388,608 bytes" in ex.message
    report = validate(url, byte_caps={"max_text_bytes": 1 << 20}, jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "oversized_member"]
    assert finding.member == "000005.txt" and "8,388,608 bytes" in finding.message and "max_text_bytes" in finding.message
    assert report.kept == 2 and report.exit_code == 1
    assert report.counts.get("missing_caption", 0) == 0  # named for what it is, not a missing caption


@pytest.mark.parametrize("case", ["txt-300MB", "targz-512MiB-member", "deep-json", "many-large-images"])
def test_peak_memory_of_one_worker_on_a_hostile_shard_stays_bounded(tmp_path, case):
    """Before the caps, a 300 MB caption was held three times over while read; the .tar.gz member
    of zeros was read whole (twice over)."""
    good = image_text_members(2, start=10)
    if case == "txt-300MB":
        url = _sparse_shard(tmp_path / "h.tar", [("000001.jpg", image_bytes()), ("000001.txt", 300 << 20)] + good)
    elif case == "targz-512MiB-member":
        url = _gzip_zeros_shard(tmp_path / "h.tar.gz", "000001.bin", 512 << 20, after=good)
    elif case == "deep-json":
        url = write_shard(tmp_path / "h.tar", [("000001.jpg", image_bytes()), ("000001.json", DEEP)] * 1 + good)
    else:  # just under the image cap, 10 in a row: the grouping window holds at most group_bytes of them
        url = _sparse_shard(tmp_path / "h.tar", [m for i in range(10) for m in
                                                 ((f"{i:06d}.jpg", (60 << 20)), (f"{i:06d}.txt", "cap"))] + good)
    # A core-only worker (no torch: webdataset's optional import of it alone is ~500 MB), stages
    # then validate in one process: its peak RSS bounds both.
    out = _child(f"""
        import json, sys
        sys.modules["torch"] = None

        def peak_mb():
            # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child of a big pytest
            # process would start with the parent's peak.
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        from wdsfilter import StageConfig
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.core.tally import Tally
        from wdsfilter.validate import validate
        tally = Tally()
        n = sum(1 for _ in sample_pipeline([{url!r}], StageConfig(check_first_shard=False), tally))
        stages = peak_mb()
        report = validate([{url!r}], jobs=1)
        print(json.dumps({{"n": n, "kept": report.kept, "stages_mb": stages, "dropped": dict(tally.dropped),
                           "rss_mb": peak_mb()}}))
    """)
    assert out["n"] == 2 and out["kept"] == 2, out
    assert out["rss_mb"] < 600, out


def test_a_compressed_shard_past_the_decompression_cap_ends_as_a_truncated_shard(tmp_path):
    url = _gzip_zeros_shard(tmp_path / "bomb.tar.gz", "000001.bin", 64 << 20, after=image_text_members(1))
    samples, tally = run([url], max_decompressed_bytes=16 << 20)
    assert samples == [] and tally.dropped["truncated_tar"] == 1
    assert "max_decompressed_bytes" in tally.examples["truncated_tar"][0].message
    report = validate(url, byte_caps={"max_decompressed_bytes": 16 << 20}, jobs=1)
    assert any("max_decompressed_bytes" in f.message for f in report.findings), report.findings


def test_the_watchdog_names_the_shard_and_member_a_stage_is_stuck_in(tmp_path):
    """One sample comes out, then the reader crawls through a long member: nothing is dropped,
    yet the time limit fires and says where reading is."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(f"""
        import sys, tarfile, time
        out = sys.stdout.buffer
        def member(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            return info.tobuf() + data + bytes(-len(data) % 512)
        for key in ("000000", "000001"):
            out.write(member(key + ".jpg", {image_bytes()!r}) + member(key + ".txt", b"a caption"))
        info = tarfile.TarInfo("000002.bin")
        info.size = 64 << 20
        out.write(info.tobuf())
        for _ in range(64):
            out.write(bytes(1 << 20))
            out.flush()
            time.sleep(0.15)
    """))
    cfg = StageConfig(check_first_shard=False, allow_pipe=True, max_other_bytes=1 << 20, starvation_seconds=1.0,
                      starvation_samples=0, group_window=1)
    got = []
    with pytest.raises(StarvationError) as err:
        for s in sample_pipeline([f"pipe:{sys.executable} {script}"], cfg):
            got.append(s["__key__"])
    assert got == ["000000"]
    assert "no sample came out for" in str(err.value) and "at member 000002.bin" in str(err.value)


# -- 3. a pax header declaring a terabyte ------------------------------------------------------

def _pax_terabyte(path):
    header = tarfile.TarInfo("000001.jpg")
    header.size = 10
    pax = tarfile.TarInfo("000001.jpg")
    pax.pax_headers = {"size": str(10 ** 12)}
    pax.size = 10
    data = pax.tobuf(format=tarfile.PAX_FORMAT) + b"x" * 10 + bytes(502)
    with open(path, "wb") as f:
        f.write(data + bytes(8192))
    return str(path)


def test_a_pax_size_of_a_terabyte_is_a_damaged_tar_finding_not_a_memory_error(tmp_path):
    bad = _pax_terabyte(tmp_path / "a-000000.tar")
    good = write_shard(tmp_path / "b-000001.tar", image_text_members(3))
    report = validate([bad, good], jobs=1)
    by_shard = {r.shard: r for r in report.shards}
    assert by_shard[good].kept == 3  # the other shard's result is there
    (finding,) = [f for f in report.findings if f.shard == bad]
    assert finding.kind == "truncated_tar"  # as the loader counts it: its first header was read
    assert "1,000,000,000,000 bytes" in finding.message
    samples, tally = run([bad])
    assert samples == [] and tally.dropped["truncated_tar"] == 1


# -- 7. messages: truncated tars, failing commands, links ----------------------------------------

def test_a_truncated_tar_is_a_shard_count_not_a_dropped_sample(tmp_path):
    url = write_shard(tmp_path / "t.tar", image_text_members(2))
    data = open(url, "rb").read()
    open(url, "wb").write(data[:2048 + 700])  # inside the second sample's image
    samples, tally = run([url])
    assert len(samples) == 1
    text = tally.summary()
    assert "dropped: 0" in text.splitlines()[0] and "shards       1 truncated_tar" in text


def test_a_failing_pipe_command_has_a_real_message(tmp_path):
    samples, tally = run(["pipe:exit 3"], allow_pipe=True)
    (ex,) = tally.examples["shard_command_failed"]
    assert "exited with status 3" in ex.message and "'exit 3'" in ex.message


def test_links_devices_and_fifos_are_named_not_missing_images(tmp_path):
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as tar:
        def add(name, data=b"", kind=tarfile.REGTYPE, link=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
        add("000000.jpg", image_bytes())
        add("000000.txt", b"a real one")
        add("000001.jpg", kind=tarfile.SYMTYPE, link="000000.jpg")
        add("000001.txt", b"a symlinked image")
        add("000002.jpg", kind=tarfile.LNKTYPE, link="000000.jpg")
        add("000002.txt", b"a hard-linked image")
        add("000003.jpg", kind=tarfile.FIFOTYPE)
        add("000003.txt", b"a fifo")
        add("000004.jpg", kind=tarfile.CHRTYPE)
        add("000004.txt", b"a device")
    samples, tally = run([str(path)])
    assert [s["__key__"] for s in samples] == ["000000"]
    assert tally.dropped == {"special_member": 4} and "missing_image" not in tally.dropped
    messages = [e.message for e in tally.examples["special_member"]]
    assert "symbolic link to '000000.jpg'" in messages[0] and "hard link" in messages[1] and "FIFO" in messages[2]
    report = validate(str(path), jobs=1)
    assert report.counts["special_member"] == 4 and "missing_image" not in report.counts
    assert report.kept == 1


# -- URL-looking names and brace patterns ---------------------------------------------------------

def test_a_file_named_like_a_pipe_url_found_by_glob_or_folder_is_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "pipe:touch PWNED;.tar"
    write_shard(tmp_path / name, image_text_members(2))
    for found in (expand_urls("*.tar", allow_pipe=True), expand_urls(".", allow_pipe=True)):
        assert len(found) == 1 and not found[0].startswith("pipe:")
        samples, _ = run(found, allow_pipe=True)
        assert len(samples) == 2
    assert not (tmp_path / "PWNED").exists()


def test_absurd_brace_patterns_are_refused_before_expanding(tmp_path):
    with pytest.raises(ConfigError, match="names 100,000,000 shards"):
        expand_urls(str(tmp_path / "x-{0..99999999}.tar"))
    with pytest.raises(ConfigError, match="names 1,000,000,000,000 shards"):
        expand_urls(str(tmp_path / "x-{0..9999}-{0..9999}-{0..9999}.tar"))
    for i in range(3):
        write_shard(tmp_path / f"s-{i}.tar", image_text_members(1))
    assert len(expand_urls(str(tmp_path / "s-{0..2}.tar"))) == 3


def test_byte_caps_are_checked_and_read_from_the_cli_syntax():
    from wdsfilter.stream.config import parse_byte_caps
    assert parse_byte_caps(["image=128MiB", "text=1MB"]) == {"max_image_bytes": 128 << 20,
                                                              "max_text_bytes": 1_000_000}
    with pytest.raises(ConfigError, match="KIND=SIZE"):
        parse_byte_caps(["pictures=1MB"])
    with pytest.raises(ConfigError, match="max_json_bytes"):
        StageConfig(max_json_bytes=0)


def test_score_gives_deep_json_a_row_and_reads_gzipped_captions(tmp_path):
    """The scoring run reads through the same stages: the deep JSON is a rejected row
    (invalid_json), the .txt.gz caption is scored, and the run completes."""
    from scorekit import BrightnessScorer
    from wdsfilter.score import score
    from wdsfilter.runfolder.tables import read_rows
    url = write_shard(tmp_path / "shard-0000.tar", [
        ("a.jpg", image_bytes()), ("a.json", {"caption": "plain"}),
        ("b.jpg", image_bytes()), ("b.json", DEEP),
        ("c.jpg", image_bytes()), ("c.json.gz", gzip.compress(json.dumps({"caption": "gzipped"}).encode()))])
    out = tmp_path / "out"
    score([url], out=str(out), scorers=[BrightnessScorer()], caption_key="json:caption", device="cpu",
          progress=False, workers=0)
    folder = out / "scores"
    rows = {r["key"]: r for f in sorted(os.listdir(folder)) for r in read_rows(str(folder / f))}
    assert rows["a"]["status"] == rows["c"]["status"] == "scored"
    assert rows["b"]["status"] == "rejected" and rows["b"]["reason"] == "invalid_json"
