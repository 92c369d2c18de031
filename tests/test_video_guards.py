"""Videos whose headers lie or whose data is cut, made with PyAV's own muxers and encoders:
validate and the scorers' frame sampler give the same verdict, and nothing is decoded at a size
the header hid (issue 8 item 3, issue 9 item 6)."""
import fractions
import io
import json
import os
import subprocess
import sys
import textwrap

import av
import numpy as np
import pytest

from shardkit import write_shard
from videokit import black_png, h264_mp4
from wdsfilter import StageConfig
from wdsfilter.core.errors import DataError
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.media.frames import sample_frames
from wdsfilter.core.tally import Tally
from wdsfilter.validate import validate
from wdsfilter.media import videos

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def png_mov(real: int, declared: int, frames: int = 3) -> bytes:
    """A QuickTime file of PNG frames `real` pixels square whose header declares `declared`."""
    buf = io.BytesIO()
    frame = black_png(real, real)
    with av.open(buf, "w", format="mov") as c:
        s = c.add_stream("png", rate=1)
        s.width = s.height = declared
        s.pix_fmt = "rgb24"
        for i in range(frames):
            p = av.Packet(frame)
            p.stream, p.pts, p.dts, p.time_base = s, i, i, fractions.Fraction(1, 1)
            c.mux(p)
    return buf.getvalue()


def aac_m4a(seconds=1.0) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="ipod") as c:  # the .m4a muxer
        s = c.add_stream("aac", rate=44100)
        samples = np.zeros((1, int(44100 * seconds)), np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 44100
        for p in s.encode(frame):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def _video_shard(tmp_path, name, data, ext="mp4"):
    return write_shard(tmp_path / name, [(f"000000.{ext}", data), ("000000.txt", "a clip")])


def test_a_header_that_understates_the_frame_size_is_refused_before_decoding(tmp_path):
    """A mov declaring 64x64 over 16000x16000 PNG frames: before, probing alone decoded it (24 s,
    790 MB) and validate said PASS. Now both refuse it, in a child whose peak RSS is measured."""
    url = _video_shard(tmp_path, "lie-000000.tar", png_mov(16000, 64), "mov")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, tarfile
        # This process's own peak (VmHWM): getrusage's ru_maxrss keeps the forking parent's peak.
        peak_mb = lambda: int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024
        from wdsfilter.core.errors import DataError
        from wdsfilter.media.frames import sample_frames
        from wdsfilter.validate import validate
        report = validate([{url!r}], image_key="mov", jobs=1)
        data = tarfile.open({url!r}).extractfile("000000.mov").read()
        try:
            sample_frames(data, 3)
            reason = None
        except DataError as e:
            reason, message = e.reason, str(e)
        print(json.dumps({{"counts": dict(report.counts), "reason": reason, "message": message,
                           "findings": [f.message for f in report.findings],
                           "rss_mb": peak_mb()}}))
    """)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["counts"].get("oversized_video") == 1, got
    assert got["reason"] == "video_too_large" and "max_pixels" in got["message"], got
    assert got["rss_mb"] < 400, got


def test_honest_huge_dimensions_get_the_same_verdict_in_validate_and_score(tmp_path):
    data = png_mov(9000, 9000, frames=1)  # 81 MP, over the default 64 MP
    url = _video_shard(tmp_path, "huge-000000.tar", data, "mov")
    report = validate(url, image_key="mov", jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "oversized_video"]
    with pytest.raises(DataError) as err:
        sample_frames(data, 3)
    assert err.value.reason == "video_too_large"
    assert "max_pixels=64000000" in str(err.value) and "max_pixels=64000000" in finding.message


def test_a_cut_short_faststart_mp4_is_corrupt_in_validate_and_partial_in_score(tmp_path):
    data = h264_mp4(tmp_path / "clip.mp4", 75)
    cut = data[:int(len(data) * 0.6)]
    url = _video_shard(tmp_path, "cut-000000.tar", cut)
    report = validate(url, image_key="mp4", jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "corrupt_video"]
    assert "declares 75 frames" in finding.message and "cut short" in finding.message
    sampled = sample_frames(cut, 3)
    assert len(sampled.frames) == 3  # sampled from the part that is there
    assert sampled.partial == finding.message  # one rule, one wording
    assert sample_frames(data, 3).partial is None


def test_packets_read_per_video_are_capped(tmp_path):
    buf = io.BytesIO()
    frame = black_png(2, 2)
    with av.open(buf, "w", format="mov") as c:
        s = c.add_stream("png", rate=1000)
        s.width = s.height = 2
        s.pix_fmt = "rgb24"
        for i in range(videos.MAX_PACKETS + 500):
            p = av.Packet(frame)
            p.stream, p.pts, p.dts, p.time_base = s, i, i, fractions.Fraction(1, 1000)
            c.mux(p)
    with videos.open_video(buf.getvalue(), 64_000_000) as container:
        count, _, _ = videos.packets(container, container.streams.video[0])
    assert count == videos.MAX_PACKETS + 1
    report = validate(_video_shard(tmp_path, "long-000000.tar", buf.getvalue(), "mov"), image_key="mov", jobs=1)
    assert "corrupt_video" not in report.counts and report.kept == 1


def test_an_audio_only_m4a_under_the_image_key_is_named_the_same_everywhere(tmp_path):
    data = aac_m4a()
    url = _video_shard(tmp_path, "audio-000000.tar", data, "m4a")
    report = validate(url, image_key="m4a", jobs=1)
    (finding,) = [f for f in report.findings if f.kind == "no_video_stream"]
    assert "1 audio" in finding.message and report.kept == 1
    tally = Tally()
    samples = list(sample_pipeline([url], StageConfig(image_key="m4a", check_first_shard=False), tally))
    assert len(samples) == 1 and samples[0]["video"] == data  # kept as a clip, as validate counts it
    assert "corrupt_image" not in tally.dropped
    with pytest.raises(DataError) as err:
        sample_frames(data, 3)
    assert err.value.reason == "no_video_stream" and "audio" in str(err.value)


def test_a_cut_short_video_scored_by_ocr_gets_a_partial_row_saying_so(tmp_path):
    """The same file: validate says corrupt_video; `wdsfilter score` scores the frames that are
    there and its row says the video is incomplete (status partial, reason corrupt_video, the
    same message), beside a whole video of the same shard that is plainly scored."""
    pytest.importorskip("rapidocr_onnxruntime")
    from click.testing import CliRunner
    from wdsfilter.cli import main
    data = h264_mp4(tmp_path / "clip.mp4", 75)
    cut = data[:int(len(data) * 0.6)]
    url = write_shard(tmp_path / "mixed-000000.tar", [("000000.mp4", cut), ("000000.txt", "a cut clip"),
                                                      ("000001.mp4", data), ("000001.txt", "a whole clip")])
    (finding,) = [f for f in validate(url, image_key="mp4", jobs=1).findings if f.kind == "corrupt_video"]
    assert finding.key == "000000"
    out = tmp_path / "out"
    # OCR as 0.x ran it (frames at their own size, boxes not read): the rows' status is the point.
    args = ["score", url, "--image-key", "mp4", "--caption-key", "txt", "--scorer", "ocr", "--frames", "3",
            "--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null",
            "--device", "cpu", "--format", "jsonl", "--no-progress", "--out"]
    result = CliRunner().invoke(main, [*args, str(out)])
    assert result.exit_code == 0, result.output
    with open(out / "scores" / "mixed-000000.jsonl") as f:
        rows = {r["key"]: r for r in map(json.loads, f)}
    cut_row, whole = rows["000000"], rows["000001"]
    assert cut_row["status"] == "partial" and cut_row["reason"] == "corrupt_video"
    assert cut_row["message"] == f"ocr: {finding.message}"
    assert cut_row["ocr_frames"] == 3 and cut_row["ocr_area"] is not None  # scored from what is there
    assert whole["status"] == "scored" and whole["reason"] is None and whole["kept"]
    assert cut_row["kept"]  # without thresholds, every row some scorer scored is kept (runfolder.keep_reason)
    # With a threshold, a partial row is judged by its scores, as the loader judges it.
    result = CliRunner().invoke(main, [*args, str(tmp_path / "th"), "--max", "ocr_area=1"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "th" / "scores" / "mixed-000000.jsonl") as f:
        rows = {r["key"]: r for r in map(json.loads, f)}
    assert rows["000000"]["status"] == "partial" and rows["000000"]["kept"] and rows["000001"]["kept"]
