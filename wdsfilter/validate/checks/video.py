"""Videos, member by member, with PyAV.

The decode stage keeps videos as bytes (the scorers decode frames later), so nothing here changes
what the stages keep; the findings say which videos will fail later. Without --deep nothing is
decoded: the container is opened and the video stream's packets are read (demuxed), which finds
files cut short in transfer that open cleanly (a Matroska/WebM header keeps the full duration, an
MP4/MOV moov atom the full frame count) and counts frames where the header has no count.

The opener and the reading rules (open, cut short, too large) are `wdsfilter/media/videos.py`'s,
which the scorers' frame sampler (frames.py) uses too.
"""
from __future__ import annotations

from typing import Optional

from ...core.errors import DataError
from ...media.videos import cut_short, declared_duration, limit_decoder, open_video, packets, too_large, video_streams
from ..findings import FindingLog
from .media import MediaInfo


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

def check_video(name: str, key: str, data: bytes, options, log: FindingLog, stats: VideoStats,
                under_image_key: bool = True) -> MediaInfo:
    """under_image_key=False: a container beside the clip (video2dataset's `.m4a`/`.mp3` audio
    track): nothing reads it as video, so having no video stream is what it is, not a finding."""
    import av  # only when a shard has videos

    info = MediaInfo("video")
    max_pixels = options.stage.max_pixels
    try:
        with open_video(data, max_pixels, name) as container:
            streams = video_streams(container)
            if not streams:
                if not under_image_key:
                    return info
                covers = len(container.streams.video)
                found = ", ".join(f"{len(s)} {t}" for t, s in (("audio", container.streams.audio),
                                                                ("subtitle", container.streams.subtitles)) if s)
                found += f"{', ' if found else ''}{covers} cover picture" if covers else ""
                log.add("no_video_stream", name, key, f"no video stream ({found or 'no streams'}): not a video clip; "
                                                      f"scoring gives it no_video_stream")
                return info
            stream = streams[0]
            if stream.codec_context is None:  # PyAV found the stream but no codec parameters
                log.add("corrupt_video", name, key, "the video stream has no codec parameters (cut short?)")
                return info
            info.width, info.height = stream.codec_context.width, stream.codec_context.height
            if too_large(info.width, info.height, max_pixels):
                log.add("oversized_video", name, key, f"{info.width}x{info.height} frames are over max_pixels="
                                                      f"{max_pixels} (from the header); scoring refuses it as video_too_large")
                return info
            limit_decoder(stream, max_pixels)
            if not (info.width and info.height):
                # The probe could not size the frames within max_pixels: decode one, as scoring will.
                with open_video(data, max_pixels) as probe:
                    first = next(v for v in probe.streams.video if v.index == stream.index)
                    limit_decoder(first, max_pixels)
                    next(probe.decode(first), None)
            duration = declared_duration(container, stream)
            declared_frames = stream.frames
            count, span, decoded = packets(container, stream, options.deep)
            frames = decoded if options.deep and decoded is not None else declared_frames or count
            problem = cut_short(declared_frames, duration, count, span)
    except DataError as e:  # a demuxer that is not read (open_video); scoring drops it as unsupported_video
        log.add("corrupt_video", name, key, str(e))
        return info
    except av.error.ArgumentError as e:  # EINVAL: what FFmpeg's max_pixels check raises
        log.add("oversized_video", name, key, f"a frame is over max_pixels={max_pixels} though the header says "
                                              f"{info.width}x{info.height} (or the frame is invalid): {e}; "
                                              f"scoring refuses it as video_too_large")
        return info
    except Exception as e:  # PyAV raises many types on hostile bytes
        log.add("corrupt_video", name, key, f"PyAV cannot read it: {type(e).__name__}: {e}")
        return info
    if problem:
        log.add("corrupt_video", name, key, problem)
        return info
    stats.add(frames, duration if duration is not None else span, info.width, info.height)
    return info
