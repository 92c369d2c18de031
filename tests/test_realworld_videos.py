"""Verdicts on the videos users have: video2dataset's shard layout (clip keys, an audio track
beside each clip, its failed samples), clips whose audio track is longer than the video
(Matroska/WebM, WMV), phone clips stored sideways with a display matrix, clips cut with
`-c copy` (an edit list), FLV, MPEG program and transport streams, raw H.264, audio with album
art. Shards are written with webdataset's TarWriter as video2dataset 1.3 writes them; clips by
libav's own muxers through PyAV (what the ffmpeg CLI runs), the rotated ones by the ffmpeg CLI."""
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, os.path.dirname(__file__))
from videokit import audio_only_mp4, audio_with_cover, clip_with_audio, make_video, text_frame  # noqa: E402

from wdsfilter.cli import main  # noqa: E402
from wdsfilter.media.frames import sample_frames  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="the ffmpeg CLI is not installed")
# OCR as the other plumbing tests run it (no enlarging, boxes not read): rows and statuses here.
CHEAP_OCR = ["--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null"]


def _video2dataset_shard(path, clips):
    """video2dataset 1.3's WebDatasetSampleWriter: TarWriter samples {"__key__", "mp4", "m4a",
    "txt", "json" (indent=4)}, keys {sample:09d}_{clip:05d} for subsampled clips; a sample that
    failed is still written, with only its txt and json (status failed_to_download)."""
    import webdataset as wds

    audio = audio_only_mp4()
    with wds.TarWriter(str(path)) as w:
        for i, clip in enumerate(clips):
            for c in range(2):
                key = f"{i:09d}_{c:05d}"
                meta = {"url": f"http://localhost/{i}.mp4", "key": key, "status": "success", "clips": [[c, c + 1.0]]}
                w.write({"__key__": key, "mp4": clip, "m4a": audio, "txt": f"clip {i} part {c}",
                         "json": json.dumps(meta, indent=4)})
        for i in range(3):
            key = f"{100 + i:09d}"
            w.write({"__key__": key, "txt": f"clip {100 + i}",
                     "json": json.dumps({"key": key, "status": "failed_to_download", "error_message": "404"}, indent=4)})
    return str(path)


def test_video2dataset_audio_tracks_are_not_videos_and_the_front_doors_agree(tmp_path):
    """An .m4a audio track beside each clip (video2dataset with an audio modality) was checked as a
    video and reported as no_video_stream on every sample, though nothing reads it (the image key is
    mp4) and scoring scores the clip. Only the 3 failed samples are findings; the loader and score
    keep exactly the 6 clips validate keeps."""
    import wdsfilter

    clips = [make_video([text_frame(f"CLIP {i}", 96, 64, 16, (4, 20))] * 6, fmt="mp4") for i in range(3)]
    shard = _video2dataset_shard(tmp_path / "00000.tar", clips)
    report = validate([shard], image_key="mp4", caption_key="txt", jobs=1)
    assert "no_video_stream" not in report.counts, report.counts
    assert report.counts == {"missing_image": 3} and (report.samples, report.kept) == (9, 6)
    ld = wdsfilter.loader(shard, image_key="mp4", batch_size=4, output="dict")
    assert sorted(s["__key__"] for b in ld for s in b) == sorted(f"{i:09d}_{c:05d}" for i in range(3) for c in range(2))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["score", shard, "--image-key", "mp4", "--scorer", "ocr", "--device", "cpu",
                                       "--workers", "0", "--no-progress", "--out", str(out), "--format", "jsonl",
                                       *CHEAP_OCR])
    assert result.exit_code == 0, result.output
    with open(out / "scores" / "00000.jsonl") as f:
        rows = {r["key"]: r for r in map(json.loads, f)}
    assert len(rows) == 9
    assert {k: r["status"] for k, r in rows.items() if r["status"] != "scored"} == \
        {f"{100 + i:09d}": "rejected" for i in range(3)}
    assert all(r["reason"] == "missing_image" for r in rows.values() if r["status"] == "rejected")


@pytest.mark.parametrize("fmt,codec", [("matroska", "libx264"), ("webm", "libvpx-vp9")])
def test_a_longer_audio_track_neither_spreads_the_frames_nor_hides_a_cut(tmp_path, fmt, codec):
    """Matroska/WebM have no per-stream duration; the container's (10 s) is the audio track's. The
    sampler used it for the 2 s video: the 3 frames were taken at 1.7, 2.0, 2.0 s (the last frame
    twice), and a copy cut at half its bytes passed validate and was scored as complete. The video
    track's DURATION tag (FFmpeg's muxer, mkvmerge) is its duration."""
    data = clip_with_audio(fmt, codec, seconds=2.0, audio_seconds=10.0)
    sampled = sample_frames(data, 3)
    assert sampled.times == pytest.approx([0.375, 1.0, 1.625], abs=0.07), sampled.times
    assert sampled.partial is None and not sampled.notes
    cut = data[: len(data) // 2]
    partial = sample_frames(cut, 3).partial
    assert partial and "cut short" in partial
    shard = _tar_of(tmp_path / "clips.tar", {"000.mkv": data, "001.mkv": cut}, {"000.txt": b"whole", "001.txt": b"cut"})
    report = validate([shard], image_key="mkv", caption_key="txt", jobs=1)
    assert report.counts == {"corrupt_video": 1}, report.counts
    assert next(f for f in report.findings if f.kind == "corrupt_video").key == "001"


def _tar_of(path, *members):
    import tarfile

    names = sorted({n: d for m in members for n, d in m.items()}.items())
    with tarfile.open(path, "w") as tar:
        for name, data in names:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@needs_ffmpeg
@pytest.mark.parametrize("rotate", [90, 180, 270])
def test_frames_of_a_clip_with_a_display_matrix_are_upright_as_ffmpeg_shows_them(tmp_path, rotate):
    """Phones store portrait clips as landscape frames plus a display matrix; players and the
    ffmpeg CLI (so video2dataset's ffmpeg subsamplers) turn them upright. The scorers got them
    sideways (CLIP and OCR saw text on its side). Each sampled frame must equal ffmpeg's own."""
    src = tmp_path / "src.mp4"
    src.write_bytes(make_video([text_frame(f"FRAME {i}", 128, 64, 14, (4, 20)) for i in range(8)], fps=8))
    rotated = tmp_path / f"r{rotate}.mp4"
    subprocess.run([FFMPEG, "-y", "-loglevel", "error", "-i", str(src), "-c", "copy",
                    "-metadata:s:v:0", f"rotate={rotate}", str(rotated)], check=True)
    sampled = sample_frames(rotated.read_bytes(), 3, max_side=None)
    assert sampled.frames.shape[1:3] == ((128, 64) if rotate != 180 else (64, 128))
    for frame, t in zip(sampled.frames, sampled.times):
        png = tmp_path / "f.png"
        index = round(t * 8)
        subprocess.run([FFMPEG, "-y", "-loglevel", "error", "-i", str(rotated), "-vf", f"select=eq(n\\,{index})",
                        "-frames:v", "1", str(png)], check=True)
        from PIL import Image
        expected = np.asarray(Image.open(png).convert("RGB"))
        assert frame.shape == expected.shape
        assert np.abs(frame.astype(int) - expected.astype(int)).mean() < 1.0


@pytest.mark.parametrize("ext,fmt,codec", [("flv", "flv", "libx264"), ("flv", "flv", "flv"),
                                           ("mpg", "mpeg", "mpeg2video"), ("mpeg", "mpeg", "mpeg1video")])
def test_flv_and_mpeg_program_streams_open(tmp_path, ext, fmt, codec):
    """PyAV 18 refuses per-stream options (our max_pixels limit) for containers that expose no
    stream before probing: every .flv, .mpg and .mpeg clip was a corrupt_video error in validate,
    and the frame sampler raised a bare ValueError. They open, pass and are sampled."""
    frames = [text_frame(f"CLIP {i}", 96, 64, 16, (4, 20)) for i in range(16)]
    buf = io.BytesIO()
    import av
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=25 if fmt == "mpeg" else 8)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for f in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        container.mux(stream.encode())
    data = buf.getvalue()
    sampled = sample_frames(data, 3)
    assert sampled.frames.shape == (3, 64, 96, 3) and sampled.partial is None
    assert sampled.times == sorted(sampled.times) and len(set(sampled.times)) == 3
    shard = _tar_of(tmp_path / "clips.tar", {f"000.{ext}": data, "000.txt": b"a clip"})
    report = validate([shard], image_key=ext, caption_key="txt", jobs=1)
    assert report.counts == {} and report.kept == 1, report.counts


def test_a_wmv_with_a_longer_audio_track_is_not_cut_short(tmp_path):
    """ASF gives every stream the file's play duration: a 2 s WMV video with 10 s of audio was a
    corrupt_video error ("the frames end at 2.00s of the 10.03s its header declares: cut short"),
    and the scorers got it as partial, with frames sampled at 1.7, 2.0, 2.0 s."""
    data = clip_with_audio("asf", "wmv2", seconds=2.0, audio_seconds=10.0)
    sampled = sample_frames(data, 3)
    assert sampled.partial is None
    assert sampled.times == pytest.approx([0.375, 1.0, 1.625], abs=0.15), sampled.times
    shard = _tar_of(tmp_path / "clips.tar", {"000.wmv": data, "000.txt": b"a clip"})
    report = validate([shard], image_key="wmv", caption_key="txt", jobs=1)
    assert report.counts == {} and report.kept == 1, report.counts


def _cut_without_reencoding(data, seconds):
    """`ffmpeg -ss S -i in.mp4 -c copy out.mp4`: packets kept from the keyframe before S, shifted
    so S is 0; the MP4 muxer writes an edit list that hides what comes before S."""
    import av

    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(out, "w", format="mp4") as dst:
        stream = src.streams.video[0]
        copy = dst.add_stream_from_template(stream)
        shift = round(seconds / stream.time_base)
        for packet in src.demux(stream):
            if packet.dts is None:
                continue
            packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, copy
            dst.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("gop", [None, 8])
def test_keyframes_of_a_clip_cut_without_reencoding_are_the_shown_ones(tmp_path, gop):
    """A clip cut with -c copy starts on a keyframe the edit list hides. --keyframes took that
    keyframe: with no other keyframe the sampler found no frame (a corrupt_video row for a clip
    validate passes); with later ones it sought the hidden one and fell back. Hidden packets are
    not the clip's: keyframes mode takes shown keyframes, or uniform times when none is shown."""
    frames = [text_frame(f"F {i}", 96, 64, 16, (4, 20)) for i in range(32)]
    clip = _cut_without_reencoding(make_video(frames, fps=8, gop=gop or 64), 0.5)
    sampled = sample_frames(clip, 3, keyframes=True)
    if gop is None:
        assert sampled.times == pytest.approx([0.583, 1.75, 2.917], abs=0.07), sampled.times  # 3.5 s shown
        assert any("no keyframe is shown" in note for note in sampled.notes)
    else:
        assert sampled.times == pytest.approx([0.5, 1.5, 2.5], abs=0.01), sampled.times
    shard = _tar_of(tmp_path / "clips.tar", {"000.mp4": clip, "000.txt": b"a clip"})
    assert validate([shard], image_key="mp4", caption_key="txt", jobs=1).counts == {}


def test_mpeg_ts_and_raw_streams_under_the_image_key_are_videos(tmp_path):
    """`.ts`/`.m2ts` (camcorders, HLS segments) and raw `.h264` under --image-key were decoded as
    images: corrupt_image on every sample, all_filtered, and score rejected them, though the frame
    sampler reads them. They are videos there; a `ts` field elsewhere (a timestamp) is not checked."""
    import av

    frames = [text_frame(f"CLIP {i}", 96, 64, 16, (4, 20)) for i in range(16)]
    clips = {}
    for ext, fmt in (("ts", "mpegts"), ("m2ts", "mpegts"), ("h264", "h264")):
        buf = io.BytesIO()
        with av.open(buf, "w", format=fmt) as container:
            stream = container.add_stream("libx264", rate=8)
            stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
            for f in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            container.mux(stream.encode())
        clips[f"{len(clips):03d}.{ext}"] = buf.getvalue()
    shard = _tar_of(tmp_path / "clips.tar", clips, {f"{i:03d}.txt": b"a clip" for i in range(3)})
    spec = "ts;m2ts;h264"
    report = validate([shard], image_key=spec, caption_key="txt", jobs=1)
    assert report.counts == {} and (report.samples, report.kept) == (3, 3), report.counts
    import wdsfilter
    ld = wdsfilter.loader(shard, image_key=spec, batch_size=4, output="dict")
    assert sorted(s["__key__"] for b in ld for s in b if "video" in s) == ["000", "001", "002"]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["score", shard, "--image-key", spec, "--scorer", "ocr", "--device", "cpu",
                                       "--workers", "0", "--no-progress", "--out", str(out), "--format", "jsonl",
                                       "--frames", "2", *CHEAP_OCR])
    assert result.exit_code == 0, result.output
    with open(out / "scores" / "clips.jsonl") as f:
        rows = {r["key"]: r for r in map(json.loads, f)}
    assert {k: (r["status"], r["ocr_frames"]) for k, r in rows.items()} == {k: ("scored", 2) for k in ("000", "001", "002")}
    # Beside a jpg image key, a `ts` field is a timestamp: not read as a video.
    from tests.shardkit import image_bytes
    photo = _tar_of(tmp_path / "photo.tar", {"000.jpg": image_bytes(), "000.ts": b"1732492800", "000.txt": b"a photo"})
    assert validate([photo], image_key="jpg", jobs=1).counts == {}


def test_an_audio_file_with_album_art_is_not_a_video_in_validate_or_score(tmp_path):
    """An .mp3 with a cover picture (a one-frame mjpeg stream, disposition attached_pic) under the
    image key passed validate as a 1-frame, 3 s video, and scoring failed it as corrupt_video ("no
    frame could be decoded"). The cover is not a clip: both say no_video_stream."""
    data = audio_with_cover("mp3")
    with pytest.raises(Exception) as info:
        sample_frames(data, 3)
    assert getattr(info.value, "reason", None) == "no_video_stream" and "cover picture" in str(info.value)
    shard = _tar_of(tmp_path / "songs.tar", {"000.mp3": data, "000.txt": b"a song"})
    report = validate([shard], image_key="mp3", caption_key="txt", jobs=1)
    assert report.counts == {"no_video_stream": 1}, report.counts
    beside = _tar_of(tmp_path / "clip.tar", {"000.mp4": make_video([text_frame("A CLIP", 96, 64, 16, (4, 20))] * 4),
                                              "000.mp3": data, "000.txt": b"a clip"})
    assert validate([beside], image_key="mp4", caption_key="txt", jobs=1).counts == {}


def test_audio_only_shards_get_no_image_key_suggestion(tmp_path):
    """A shard of songs (.mp3, .m4a) and captions validated with the default image key was told
    "image found under mp3 ...; use --image-key mp3": audio is no place for a sample's image."""
    shard = _tar_of(tmp_path / "songs.tar", {"000.mp3": audio_with_cover("mp3"), "001.m4a": audio_only_mp4()},
                    {"000.txt": b"a song", "001.txt": b"another"})
    report = validate([shard], jobs=1)
    finding = next(f for f in report.findings if f.kind == "all_filtered")
    assert "--image-key" not in finding.message and not report.suggestions(), finding.message


def test_an_unreadable_audio_track_beside_the_clip_is_not_an_error(tmp_path):
    """.mp3 joined the video extensions (to name audio under the image key no_video_stream); an
    audio track beside the image or clip is nobody's video and is not opened: a damaged one
    (here random bytes, as a download that failed writes) is no corrupt_video error."""
    junk = os.urandom(500)
    clip = make_video([text_frame("A CLIP", 96, 64, 16, (4, 20))] * 4)
    shard = _tar_of(tmp_path / "clip.tar", {"000.mp4": clip, "000.m4a": junk, "000.mp3": junk, "000.txt": b"a clip"})
    report = validate([shard], image_key="mp4", caption_key="txt", jobs=1)
    assert report.counts == {} and report.kept == 1, report.counts
