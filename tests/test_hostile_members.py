"""Hostile members found by a red-team pass over the three front doors (validate, the stages,
score): tar headers declaring negative sizes, member names that collide with a sample's
metadata fields, images whose decoded size is not the size their header declares, videos that
hide a stream past the streams FFmpeg's options reach. Each file is made with a real tool."""
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap

from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import StageConfig
from wdsfilter.pipeline import sample_pipeline
from wdsfilter.tally import Tally
from wdsfilter.validate import validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(urls, **options):
    options.setdefault("check_first_shard", False)
    tally = Tally()
    return list(sample_pipeline(urls, StageConfig(**options), tally)), tally


def _child(code: str, timeout=300):
    """Run code in a fresh interpreter (no torch); its last line is printed JSON."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- tar headers with a negative size -----------------------------------------------------------

def _negative_size_shard(path, pax: bool, tail: int) -> str:
    """Two good samples, then a member whose size is -1 (in the ustar size field, or in a pax
    size record), then `tail` bytes of zeros (a sparse file: no disk used)."""
    members = image_text_members(2)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT if pax else tarfile.GNU_FORMAT) as tar:
        for name, data in members + [("000009.txt", b"caption")]:
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax and name == "000009.txt":
                info.pax_headers = {"size": "-1"}
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(open(path, "rb").read())
    if not pax:  # python's tarfile refuses to write it; the size field of the last header, by hand
        at = raw.rfind(b"000009.txt")
        raw[at + 124:at + 136] = b"-0000000001\0"
        raw[at + 148:at + 156] = b" " * 8
        raw[at + 148:at + 156] = b"%06o\0 " % sum(raw[at:at + 512])
    with open(path, "wb") as f:
        f.write(raw)
        f.truncate(len(raw) + tail)
    return str(path)


def test_a_negative_member_size_is_a_damaged_tar_and_never_reads_the_rest_of_the_shard(tmp_path):
    """The validator's fast reader passed -1 to read(), which reads the rest of the file into
    memory (a 300 MB shard: 600 MB RSS); tarfile read the member as empty and went on."""
    for pax in (False, True):
        url = _negative_size_shard(tmp_path / f"neg-{pax}.tar", pax, tail=300 << 20)
        samples, tally = run([url])
        assert len(samples) == 2, pax
        (ex,) = tally.examples["truncated_tar"]
        assert "negative size -1" in ex.message and ex.shard == url
        out = _child(f"""
            import json, sys
            sys.modules["torch"] = None
            from wdsfilter.validate import validate
            report = validate([{url!r}], jobs=1)
            with open("/proc/self/status") as f:
                peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
            print(json.dumps({{"counts": dict(report.counts), "kept": report.kept, "rss_mb": peak}}))
        """)
        assert out["counts"].get("truncated_tar") == 1 and out["kept"] == 2, out
        assert out["rss_mb"] < 200, out


# -- member names that are a sample's metadata fields -------------------------------------------

def test_members_named_like_sample_metadata_are_ignored_and_named(tmp_path):
    """`x.__skipped__` crashed validate, the loader and score (TypeError: 'bytes' object does not
    support item assignment) when the sample also had a link or over-cap member; `x.__marker__`
    made the stages pass the sample on as a marker (lost without a word: validate counted 5 of 6
    samples); `x.__oversized__` dropped it as oversized_sample."""
    for ext in ("__skipped__", "__marker__", "__oversized__", "__key__"):
        members = image_text_members(3) + [(f"000003.{ext}", b"shard_end"), ("000003.txt", b"a caption")]
        url = write_shard(tmp_path / f"m{ext}.tar", members)
        with tarfile.open(url, "a") as tar:  # a link under the image key: the sample's __skipped__ entry
            link = tarfile.TarInfo("000003.jpg")
            link.type, link.linkname = tarfile.SYMTYPE, "000000.jpg"
            tar.addfile(link)
            for name, data in [("000003.png", image_bytes(fmt="PNG"))] + image_text_members(2, start=4):
                data = data.encode() if isinstance(data, str) else data
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        samples, tally = run([url], emit_rejects=True)
        keys = [s["__key__"] for s in samples if "__marker__" not in s]
        assert keys == ["000000", "000001", "000002", "000003", "000004", "000005"], ext
        (ex,) = tally.examples["reserved_extension"]
        assert ex.member == f"000003.{ext}" and "reserve for a sample" in ex.message
        report = validate(url, jobs=1)
        assert report.samples == 6 and report.kept == 6, ext
        (finding,) = [f for f in report.findings if f.kind == "reserved_extension"]
        assert finding.member == f"000003.{ext}" and finding.key == "000003"
