"""Videos, member by member, with PyAV.

The decode stage keeps videos as bytes (the scorers decode frames later), so nothing here changes
what the stages keep; the findings say which videos will fail later. Without --deep nothing is
decoded: the container is opened and the video stream's packets are read (demuxed), which finds
files cut short in transfer that open cleanly (a Matroska/WebM header keeps the full duration, an
MP4/MOV moov atom the full frame count) and counts frames where the header has no count.
"""
from __future__ import annotations

import io
from typing import Optional

from ..findings import FindingLog
from .media import MediaInfo

# Data that ends this much before the declared duration is cut short (a little slack for rounding
# and for a last frame without a duration).
_SLACK_SHARE, _SLACK_SECONDS = 0.1, 0.05


class VideoStats:
    def __init__(self):
        self.count = 0
        self.frames = 0
        self.duration = 0.0
        self.min_duration = None  # None until a video with a known duration is seen
        self.max_duration = None
        self.sizes: dict = {}

    def add(self, frames: int, duration: Optional[float], w: int, h: int) -> None:
        self.count += 1
        self.frames += frames
        size = f"{w}x{h}"
        self.sizes[size] = self.sizes.get(size, 0) + 1
        if duration is not None:
            self.duration += duration
            self.min_duration = duration if self.min_duration is None else min(self.min_duration, duration)
            self.max_duration = duration if self.max_duration is None else max(self.max_duration, duration)

    def to_dict(self) -> dict:
        return {"count": self.count, "frames": self.frames, "duration_s": round(self.duration, 3),
                "min_duration_s": _round(self.min_duration), "max_duration_s": _round(self.max_duration),
                "sizes": dict(sorted(self.sizes.items(), key=lambda kv: -kv[1])[:10])}


def _round(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds, 3)


def _declared_duration(container, stream) -> Optional[float]:
    """The video stream's duration as its header says; the container's only when it has no other
    stream (a longer audio track must not make the video look cut)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and len(container.streams) == 1:
        return container.duration / 1_000_000
    return None


def _packets(container, stream, decode: bool):
    """(packets with data, seconds from the first to the end of the last, frames decoded) of the
    video stream; frames are decoded only when asked (--deep)."""
    count, first, end, decoded = 0, None, None, 0
    for packet in container.demux(stream):
        if decode:  # the flush packet too: it returns the frames the decoder still holds
            decoded += len(packet.decode())
        if not packet.size:
            continue
        count += 1
        if packet.pts is not None and packet.time_base is not None:
            t0 = float(packet.pts * packet.time_base)
            t1 = float((packet.pts + (packet.duration or 0)) * packet.time_base)
            first = t0 if first is None else min(first, t0)
            end = t1 if end is None else max(end, t1)
    return count, (end - first if end is not None else None), decoded


def _cut_short(declared_frames: int, declared: Optional[float], packets: int, span: Optional[float]) -> Optional[str]:
    if packets == 0:
        return "no video frame can be read (the data is cut short or empty)"
    if declared_frames and packets < declared_frames:
        return f"its header declares {declared_frames} frames, the data holds {packets}: cut short"
    if declared and span is not None and span < declared * (1 - _SLACK_SHARE) - _SLACK_SECONDS:
        return f"the frames end at {span:.2f}s of the {declared:.2f}s its header declares: cut short"
    return None


def check_video(name: str, key: str, data: bytes, options, log: FindingLog, stats: VideoStats) -> MediaInfo:
    import av  # only when a shard has videos

    info = MediaInfo("video")
    try:
        with av.open(io.BytesIO(data), "r") as container:
            streams = container.streams.video
            if not streams:
                found = ", ".join(f"{len(s)} {t}" for t, s in (("audio", container.streams.audio),
                                                                ("subtitle", container.streams.subtitles)) if s)
                log.add("no_video_stream", name, key, f"no video stream ({found or 'no streams'})")
                return info
            stream = streams[0]
            if stream.codec_context is None:  # PyAV found the stream but no codec parameters
                log.add("corrupt_video", name, key, "the video stream has no codec parameters (cut short?)")
                return info
            info.width, info.height = stream.codec_context.width, stream.codec_context.height
            duration = _declared_duration(container, stream)
            declared_frames = stream.frames
            packets, span, decoded = _packets(container, stream, options.deep)
            frames = decoded if options.deep else declared_frames or packets
            problem = _cut_short(declared_frames, duration, packets, span)
    except Exception as e:  # PyAV raises many types on hostile bytes
        log.add("corrupt_video", name, key, f"PyAV cannot read it: {type(e).__name__}: {e}")
        return info
    if problem:
        log.add("corrupt_video", name, key, problem)
        return info
    stats.add(frames, duration if duration is not None else span, info.width, info.height)
    return info
