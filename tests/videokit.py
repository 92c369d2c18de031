"""Small video builders for tests: frames with text or a grey level, clips encoded here with PyAV
(every container the scorers accept), an audio-only MP4. Used by the video, OCR and validator tests."""
from __future__ import annotations

import io
import struct
import zlib

import av
import numpy as np


def text_frame(text="BIG SALE", width=320, height=240, size=36, xy=(15, 90), bg=(255, 255, 255), fg=(0, 0, 0)):
    """An RGB frame with real rendered text (PIL's default font at a real size)."""
    from PIL import Image, ImageDraw, ImageFont

    im = Image.new("RGB", (width, height), bg)
    ImageDraw.Draw(im).text(xy, text, fill=fg, font=ImageFont.load_default(size=size))
    return np.asarray(im)


def grey_frame(level, width=160, height=120):
    return np.full((height, width, 3), level, np.uint8)


def make_video(frames, fps=8, codec="libx264", fmt="mp4", gop=None) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        # No scene-cut keyframes: keyframes come exactly every `gop` frames (a grey level that
        # changes every frame would otherwise make x264 insert its own).
        options = {"x264-params": "scenecut=0"} if codec == "libx264" else {}
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if gop:
            stream.codec_context.gop_size = gop
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def mux_silence(container, stream, frames: int) -> None:
    """Encode and mux `frames` frames of 1024 silent mono samples at 16 kHz, then flush."""
    for i in range(frames):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, i * 1024
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def audio_only_mp4() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        mux_silence(container, container.add_stream("aac", rate=16000), 8)
    return buf.getvalue()


def h264_mp4(path, frames=75) -> bytes:
    """A faststart MP4 (moov first, as web video is written) of H.264 frames."""
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
        rng = np.random.default_rng(0)
        for _ in range(frames):
            img = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # noise: the frames, not moov, are the bytes
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with open(path, "rb") as f:
        return f.read()


def clip_with_audio(fmt="matroska", codec="libx264", seconds=2.0, audio_seconds=10.0, fps=8) -> bytes:
    """A clip with an audio track of another length, muxed as FFmpeg's CLI muxes it (interleaved
    by time). Matroska/WebM keep no per-stream duration: the container's is the longer track's."""
    buf = io.BytesIO()
    rng = np.random.default_rng(1)
    with av.open(buf, "w", format=fmt) as container:
        video = container.add_stream(codec, rate=fps)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        audio_codec = {"webm": "libopus", "asf": "wmav2"}.get(fmt, "aac")
        audio = container.add_stream(audio_codec, rate=48000 if fmt == "webm" else 16000)
        audio.codec_context.layout, audio.bit_rate = "mono", 32000  # wmav2 opens only with a bit rate
        packets = []
        for _ in range(round(seconds * fps)):
            img = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # noise: the frames are most of the bytes
            packets += video.encode(av.VideoFrame.from_ndarray(img, format="rgb24"))
        packets += video.encode()
        rate, step = audio.codec_context.sample_rate, {"webm": 960, "asf": 512}.get(fmt, 1024)
        for i in range(int(audio_seconds * rate / step)):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, step), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = rate, i * step
            packets += audio.encode(frame)
        packets += audio.encode()
        for packet in sorted(packets, key=lambda p: float(p.dts * p.time_base) if p.dts is not None else 0.0):
            container.mux(packet)
    return buf.getvalue()


def audio_with_cover(fmt="mp3") -> bytes:
    """An audio file with album art: a one-picture mjpeg stream marked attached_pic (what taggers
    and yt-dlp's --embed-thumbnail write), then the audio."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        audio = container.add_stream("libmp3lame" if fmt == "mp3" else "aac", rate=16000)
        cover = container.add_stream("mjpeg", rate=1)
        cover.width, cover.height, cover.pix_fmt = 64, 48, "yuvj420p"
        cover.disposition = av.stream.Disposition.attached_pic
        picture = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 200, np.uint8), format="rgb24")
        for packet in [*cover.encode(picture), *cover.encode()]:
            container.mux(packet)
        mux_silence(container, audio, 8)
    return buf.getvalue()


def black_png(w, h) -> bytes:
    """A black RGB PNG of w x h, compressed row by row (never held uncompressed)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    comp = zlib.compressobj(1)
    rows = bytes(1 + 3 * w) * 256
    idat = b"".join(comp.compress(rows[:len(rows) * min(256, h - y) // 256]) for y in range(0, h, 256)) + comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
