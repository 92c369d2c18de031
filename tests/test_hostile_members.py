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
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.core.tally import Tally
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


# -- videos: a frame size hidden in a stream past the first 64 ------------------------------------

def many_streams_mov(small_streams: int, real: int, declared: int) -> bytes:
    """A QuickTime file of `small_streams` honest 16x16 PNG streams, then one whose header
    declares `declared` pixels square over PNG frames `real` pixels square."""
    import fractions

    import av
    from videokit import black_png

    buf = io.BytesIO()
    small, big = black_png(16, 16), black_png(real, real)
    with av.open(buf, "w", format="mov") as c:
        streams = []
        for size, frame in [(16, small)] * small_streams + [(declared, big)]:
            s = c.add_stream("png", rate=1)
            s.width = s.height = size
            s.pix_fmt = "rgb24"
            streams.append((s, frame))
        for i in range(2):
            for s, frame in streams:
                p = av.Packet(frame)
                p.stream, p.pts, p.dts, p.time_base = s, i, i, fractions.Fraction(1, 1)
                c.mux(p)
    return buf.getvalue()


def test_a_lying_stream_past_the_64th_is_held_to_max_pixels_too(tmp_path):
    """max_pixels went to FFmpeg as a list of 64 per-stream option sets: the 71st stream of a
    mov, declaring 64x64 over 12000x12000 PNG frames, was decoded at full size while probing
    (validate: 476 MB peak RSS; 16000 px frames: 800 MB). Now every stream gets the limit."""
    url = write_shard(tmp_path / "streams.tar", [("000000.mov", many_streams_mov(70, 12000, 64)),
                                                ("000000.txt", "a clip")])
    out = _child(f"""
        import json, sys, tarfile
        sys.modules["torch"] = None
        from wdsfilter.media.frames import sample_frames
        from wdsfilter.validate import validate
        report = validate([{url!r}], image_key="mov", jobs=1)
        frames = sample_frames(tarfile.open({url!r}).extractfile("000000.mov").read(), 2).frames
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        print(json.dumps({{"counts": dict(report.counts), "shape": list(frames.shape), "rss_mb": peak}}))
    """)
    # The first video stream (16x16) is the clip the scorers sample; the hidden one is never decoded.
    assert out["shape"][1:3] == [16, 16] and not out["counts"].get("corrupt_video"), out
    assert out["rss_mb"] < 250, out


# -- captions: one long word ----------------------------------------------------------------------

def test_a_caption_of_one_long_word_is_tokenized_at_once_and_short_ones_exactly():
    """open_clip's BPE is quadratic in a word's length: a 40 KB one-word caption (the text cap is
    4 MB) took 75 s in the CLIP scorer's prepare(), a 200 KB one about half an hour, in every
    decode worker that met it. Only the ids that fit the context are encoded now."""
    out = _child("""
        import json, random, string
        from open_clip.tokenizer import SimpleTokenizer
        from wdsfilter.score.models import tokenize
        tok = SimpleTokenizer()
        random.seed(0)
        word = "".join(random.choice(string.ascii_lowercase) for _ in range(200_000))
        tokens, truncated = tokenize(tok, word, 77)
        print(json.dumps({"n": int((tokens != 0).sum()), "truncated": truncated}))
    """, timeout=120)  # a hang guard: it takes well under a second
    assert out == {"n": 77, "truncated": True}
    from open_clip.tokenizer import SimpleTokenizer

    from wdsfilter.score.models import tokenize
    tok = SimpleTokenizer()
    words = "a photo of the Eiffel tower at night, 4k &amp; HDR: don't miss it! ".split()
    for n in (1, 5, 12, 70, 74, 75, 76, 77, 300):
        caption = " ".join(words[i % len(words)] for i in range(n))
        tokens, truncated = tokenize(tok, caption, 77)
        assert tokens.tolist() == tok(caption)[0].tolist(), n
        assert truncated == (len(tok.encode(caption)) + 2 > 77), n


# -- captions: half of a UTF-16 pair, escaped in JSON -----------------------------------------------

def test_a_json_caption_with_a_lone_surrogate_is_repaired_for_every_reader(tiny_clip, tmp_path):
    """'{"caption": "a red \\ud83d square"}' (an emoji cut in half by a JavaScript substring) is
    valid JSON; json.loads keeps the lone surrogate, and score's report.html was not written
    (UnicodeEncodeError), nor could any UTF-8 writer take the loader's caption."""
    from click.testing import CliRunner

    from wdsfilter.cli import main

    members = image_text_members(3, text_ext="json", caption="")
    members = [(n, {"caption": f"a red \ud83d square {i}"} if n.endswith(".json") else d)
               for i, (n, d) in enumerate(members)]
    url = write_shard(tmp_path / "half-000000.tar", members)
    samples, _ = run([url], caption_key="json:caption")
    assert [s["caption"] for s in samples] == [f"a red \ufffd square {i}" for i in (1, 3, 5)]
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["score", url, "--model", "local-dir:" + tiny_clip, "--device", "cpu",
                                       "--caption-key", "json:caption", "--out", out, "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert "not written" not in result.output
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert "a red \ufffd square" in page


# -- images: a thin strip ---------------------------------------------------------------------------

def test_a_thin_image_is_cropped_before_it_is_resized_for_clip(tiny_clip, tmp_path):
    """A 1x40000 PNG (242 bytes, 40,000 pixels: far under max_pixels) went through CLIP's resize
    of the short side to the model's size: a 64 x 2,560,000 strip (1.1 GB more peak RSS with the
    64-pixel tiny model, 6 GB at 224 px) only to crop its middle."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 40000), (200, 30, 30)).save(buf, "PNG")
    url = write_shard(tmp_path / "thin-000000.tar", [("000000.png", buf.getvalue()), ("000000.txt", "a thin line")]
                      + image_text_members(1, start=1))
    out = _child(f"""
        import json
        from wdsfilter import StageConfig
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.score.scorers.clip import ClipScorer
        from wdsfilter.core.tally import Tally

        def peak_mb():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        scorer = ClipScorer(model="local-dir:" + {tiny_clip!r})
        samples = list(sample_pipeline([{url!r}], StageConfig(check_first_shard=False), Tally()))
        normal = scorer.prepare(samples[1])["image"]  # imports and buffers: the baseline
        before = peak_mb()
        thin = scorer.prepare(samples[0])["image"]
        print(json.dumps({{"shape": list(thin.shape), "red": int(thin[0].min()), "grown_mb": peak_mb() - before,
                           "same_shape": list(normal.shape) == list(thin.shape)}}))
    """)
    assert out["same_shape"] and out["red"] > 150, out  # the middle of the red line, filling the crop
    assert out["grown_mb"] < 100, out


# -- videos: countless large frames behind one keyframe ---------------------------------------------

def one_keyframe_webm(side: int, frames: int) -> bytes:
    """A VP8 WebM of `frames` identical frames `side` pixels square: one keyframe, then the same
    inter frame muxed again and again (a few hundred bytes each, however large the frame)."""
    import fractions

    import av
    import numpy as np

    def stream(c):
        s = c.add_stream("libvpx", rate=30)
        s.width = s.height = side
        s.pix_fmt = "yuv420p"
        return s

    with av.open(io.BytesIO(), "w", format="webm") as c:
        s = stream(c)
        s.codec_context.gop_size = 1 << 20
        s.options = {"deadline": "realtime", "cpu-used": "8"}
        pkts = []
        for i in range(2):
            frame = av.VideoFrame.from_ndarray(np.full((side, side, 3), 100, np.uint8), format="rgb24")
            frame.pts = i
            pkts += [bytes(p) for p in s.encode(frame)]
        pkts += [bytes(p) for p in s.encode()]
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm") as c:
        s = stream(c)
        for i in range(frames):
            p = av.Packet(pkts[0] if i == 0 else pkts[1])
            p.stream, p.pts, p.dts, p.time_base = s, i, i, fractions.Fraction(1, 30)
            p.is_keyframe = i == 0
            c.mux(p)
    return buf.getvalue()


def test_decoding_one_clip_is_held_to_a_pixel_budget(tmp_path, monkeypatch):
    """Frames decoded per clip were capped by count (30,000), not size: a 900 KB WebM of 3,000
    4096x4096 frames behind one keyframe took 189 s to sample 3 frames from, 30,000 of them some
    20 minutes (one decode worker, or the watchdog ending the run). The budget is in pixels; here
    it is lowered so that a small clip meets it."""
    import pytest

    from wdsfilter.core.errors import DataError
    from wdsfilter.media import frames as score_video
    from wdsfilter.media import videos

    data = one_keyframe_webm(64, 600)
    assert score_video.sample_frames(data, 3).frames.shape[0] == 3  # within the real budget
    budget = 100 * 64 * 64  # 100 frames of this clip; sampling its middle needs 300
    monkeypatch.setattr(score_video, "MAX_DECODED_PIXELS", budget)
    monkeypatch.setattr(videos, "MAX_DECODED_PIXELS", budget)
    with pytest.raises(DataError) as err:
        score_video.sample_frames(data, 3)
    assert err.value.reason == "corrupt_video" and "gigapixels per clip" in str(err.value)
    url = write_shard(tmp_path / "gop-000000.tar", [("000000.webm", data), ("000000.txt", "a clip")])
    report = validate(url, image_key="webm", deep=True, jobs=1)  # --deep stops decoding at the budget
    assert report.shards[0].videos["frames"] == 600 and not report.counts.get("corrupt_video")


# -- images: an ICO icon, decoded by Pillow while it is opened ---------------------------------------

def test_an_ico_is_refused_before_pillow_decodes_it_on_open(tmp_path):
    """Pillow's ICO plugin decodes the largest embedded image inside Image.open, so the size guard
    (which reads the header) came too late: a 109 KB .ico named .png, embedding a 1-bit PNG of
    30000x30000, took 900 MB to size in validate, the stages and score."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    side = 30000
    comp = zlib.compressobj(9)
    rows = bytes(1 + side // 8) * 1000
    idat = b"".join(comp.compress(rows) for _ in range(side // 1000)) + comp.flush()
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
           + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    ico = struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 22) + png
    url = write_shard(tmp_path / "ico-000000.tar", [("000000.png", ico), ("000000.txt", "an icon")]
                      + image_text_members(1, start=1))
    out = _child(f"""
        import json, sys
        sys.modules["torch"] = None
        from wdsfilter import StageConfig
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.core.tally import Tally
        from wdsfilter.validate import validate
        tally = Tally()
        kept = [s["__key__"] for s in sample_pipeline([{url!r}], StageConfig(check_first_shard=False), tally)]
        report = validate([{url!r}], jobs=1)
        (finding,) = [f for f in report.findings if f.kind == "corrupt_image"]
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        print(json.dumps({{"kept": kept, "dropped": dict(tally.dropped), "validate_kept": report.kept,
                           "message": finding.message, "rss_mb": peak}}))
    """)
    assert out["kept"] == ["000001"] and out["dropped"] == {"corrupt_image": 1} and out["validate_kept"] == 1, out
    assert "ICO" in out["message"] and out["rss_mb"] < 300, out


def test_an_eps_is_never_handed_to_ghostscript(tmp_path):
    """Pillow opens EPS (PostScript) by content, under any name, and decodes it by running
    Ghostscript on it where `gs` is installed: a program interpreting the shard's bytes. A `gs` on
    PATH that leaves a file behind shows whether it ran, in the stages, validate --deep and the
    filter report's thumbnails' opener."""
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), "red").save(buf, "EPS")  # Pillow's own EPS writer
    url = write_shard(tmp_path / "eps-000000.tar", [("000000.jpg", buf.getvalue()), ("000000.txt", "a red square")]
                      + image_text_members(1, start=1))
    bin_dir, ran = tmp_path / "bin", tmp_path / "gs-ran"
    bin_dir.mkdir()
    (bin_dir / "gs").write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    (bin_dir / "gs").chmod(0o755)
    code = f"""
        import json, os, sys
        os.environ["PATH"] = {str(bin_dir)!r} + os.pathsep + os.environ["PATH"]
        sys.modules["torch"] = None
        from wdsfilter import StageConfig
        from wdsfilter.media.images import open_image
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.core.tally import Tally
        from wdsfilter.validate import validate
        tally = Tally()
        kept = [s["__key__"] for s in sample_pipeline([{url!r}], StageConfig(check_first_shard=False), tally)]
        report = validate([{url!r}], jobs=1, deep=True)
        messages = [f.message for f in report.findings if f.kind == "corrupt_image"]
        try:
            open_image(open({str(tmp_path / "eps.bin")!r}, "rb").read()).load()
            opened = True
        except Exception:
            opened = False
        print(json.dumps({{"kept": kept, "dropped": dict(tally.dropped), "messages": messages, "opened": opened}}))
    """
    (tmp_path / "eps.bin").write_bytes(buf.getvalue())
    out = _child(code)
    assert not ran.exists(), "Ghostscript was run on a member's bytes"
    assert out["kept"] == ["000001"] and out["dropped"] == {"corrupt_image": 1} and not out["opened"], out
    assert len(out["messages"]) == 1 and "Ghostscript" in out["messages"][0], out


def test_a_member_that_is_an_ffconcat_playlist_opens_no_file_of_the_machine(tmp_path, monkeypatch):
    """FFmpeg picks its demuxer by content: a `.mp4` member holding an ffconcat playlist
    (`file secret.mp4`) had PyAV open that file, relative to the working folder, and its frames
    were sampled as the member's (a file of the machine read into scores and thumbnails). Only
    self-contained formats are read (wdsfilter/videos.SAFE_FORMATS); a real clip still is."""
    import pytest
    from videokit import grey_frame, make_video
    from wdsfilter.core.errors import DataError
    from wdsfilter.media.frames import sample_frames
    clip = make_video([grey_frame(40 * i) for i in range(6)])
    (tmp_path / "secret.mp4").write_bytes(clip)
    monkeypatch.chdir(tmp_path)
    playlist = b"ffconcat version 1.0\nfile secret.mp4\n"
    with pytest.raises(DataError) as refused:
        sample_frames(playlist, 3, what="000000.mp4")
    assert refused.value.reason == "unsupported_video" and "concat" in str(refused.value)
    assert len(sample_frames(clip, 3).frames) == 3  # the same clip as a member is read
    url = write_shard(tmp_path / "playlist-000000.tar", [("000000.mp4", playlist), ("000000.txt", "a clip"),
                                                         ("000001.mp4", clip), ("000001.txt", "a clip")])
    report = validate([url], jobs=1, image_key="mp4")
    (finding,) = [f for f in report.findings if f.kind == "corrupt_video"]
    assert finding.key == "000000" and "concat" in finding.message and not report.passed


# -- tar: names of a megabyte ----------------------------------------------------------------------

def test_member_names_longer_than_path_max_are_a_damaged_tar_not_a_memory_bomb(tmp_path):
    """Every reader holds a shard's keys (duplicates, keys that come back): 1,000 GNU long names of
    1 MB (a 4.5 MB .tar.gz) took 2.4 GB to validate and 1 GB to read through the stages. A name
    longer than PATH_MAX (4096) now ends the shard as a damaged header, after the good samples."""
    import gzip

    path = tmp_path / "names-000000.tar.gz"
    with gzip.open(path, "wb", compresslevel=1) as raw, tarfile.open(fileobj=raw, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for i in range(400):
            for name, data in (image_text_members(2) if i == 0 else []) + [(f"{i:06d}{'a' * 1_000_000}.txt", b"cap")]:
                data = data.encode() if isinstance(data, str) else data
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    url = str(path)
    out = _child(f"""
        import json, sys
        sys.modules["torch"] = None
        from wdsfilter import StageConfig
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.core.tally import Tally
        from wdsfilter.validate import validate
        tally = Tally()
        kept = sum(1 for _ in sample_pipeline([{url!r}], StageConfig(check_first_shard=False), tally))
        report = validate([{url!r}], jobs=1)
        (finding,) = [f for f in report.findings if f.kind == "truncated_tar"]
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        print(json.dumps({{"kept": kept, "validate_kept": report.kept, "message": finding.message, "rss_mb": peak}}))
    """)
    assert out["kept"] == 2 and out["validate_kept"] == 2, out
    assert "over 4,096" in out["message"] and out["rss_mb"] < 300, out


# -- shard files that are not files ----------------------------------------------------------------

def test_a_fifo_or_a_device_named_like_a_shard_is_unreadable_not_a_hang(tmp_path):
    """A FIFO named b.tar in a shard folder blocked validate, the stages and score in open() for
    ever; a link to /dev/zero named c.tar read zeros for ever (they read as the end of a tar, and
    the padding after it is read to its end). Both are unreadable shards now."""
    folder = tmp_path / "shards"
    folder.mkdir()
    write_shard(folder / "a.tar", image_text_members(2))
    os.mkfifo(folder / "b.tar")
    os.symlink("/dev/zero", folder / "c.tar")
    out = _child(f"""
        import json, sys
        sys.modules["torch"] = None
        from wdsfilter import StageConfig
        from wdsfilter.stream.pipeline import sample_pipeline
        from wdsfilter.storage.shards import expand_urls
        from wdsfilter.core.tally import Tally
        from wdsfilter.validate import validate
        urls = expand_urls([{str(folder)!r}])
        tally = Tally()
        kept = sum(1 for _ in sample_pipeline(urls, StageConfig(check_first_shard=False), tally))
        report = validate(urls, jobs=1)
        print(json.dumps({{"kept": kept, "dropped": dict(tally.dropped), "counts": dict(report.counts),
                           "messages": sorted(f.message for f in report.findings if f.kind == "unreadable_tar")}}))
    """, timeout=120)  # a hang guard
    assert out["kept"] == 2 and out["dropped"] == {"unreadable_shard": 2}, out
    assert out["counts"].get("unreadable_tar") == 2, out
    assert "is a FIFO (named pipe), not a regular file" in out["messages"][0]
    assert "is a device, not a regular file" in out["messages"][1]
