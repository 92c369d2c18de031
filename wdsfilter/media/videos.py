"""The one opener of a video clip and the rules of reading one, with PyAV: used by validate's
video check (validate/checks/video.py) and the scorers' frame sampler (frames.py), so both
refuse, bound and call "cut short" the same clips.

The container header is not trusted: PyAV opens every video with FFmpeg's own `max_pixels` limit
on every stream's decoder, however many streams there are, so a header declaring 64x64 over
16000x16000 frames is refused while probing instead of decoded, and at most MAX_PACKETS packets
are read per video.
"""
from __future__ import annotations

import io
import re
import threading
from typing import Optional

from ..core.errors import DataError

# Data that ends this much before the declared duration is cut short (a little slack for rounding
# and for a last frame without a duration).
_SLACK_SHARE, _SLACK_SECONDS = 0.1, 0.05
# Packets read per video: a real clip has far fewer (10 minutes at 30 fps is 18,000); a 13 MB file
# of a million tiny frames would otherwise take minutes to demux.
MAX_PACKETS = 30_000
# Pixels decoded per video (frames x width x height): decoding costs about the same per pixel
# whatever the size, so this bounds the time one clip takes. 30,000 frames at 1280x720 (some 2-3
# minutes of decoding on one core). A 900 KB WebM of 3,000 identical 4096x4096 frames behind one
# keyframe took 189 s to sample 3 frames from (30,000 such frames: some 20 minutes, at 8000x8000
# about an hour): frames are counted as frames, not by their size.
MAX_DECODED_PIXELS = 30_000 * 1280 * 720


# The FFmpeg demuxers a member may be read with: self-contained media containers, elementary
# streams and single images. FFmpeg picks a demuxer by content, and some of the others open what
# the bytes name: a member holding `ffconcat version 1.0` + `file clip.mp4` (concat) had a file of
# the machine's read and scored as the sample's frames; HLS and DASH playlists, IMF and SDP fetch
# files or URLs too. Those are refused, whatever the member is called.
SAFE_FORMATS = ("mov,matroska,avi,flv,mpeg,mpegts,mpegvideo,asf,ogg,mxf,nut,rm,dv,wtv,h264,hevc,vvc,h263,m4v,"
                "ivf,obu,av1,vc1,mjpeg,mpjpeg,yuv4mpegpipe,gif,apng,webp_pipe,png_pipe,jpeg_pipe,gif_pipe,"
                "bmp_pipe,tiff_pipe,mp3,aac,wav,w64,flac,ac3,eac3,aiff,amr,caf,wv,ape,tta")

_LOG_LEVEL_LOCK = threading.Lock()


def open_video(data: bytes, max_pixels, what: str = "the video"):
    """A PyAV container over the bytes, with FFmpeg's max_pixels limit on every stream's decoder
    (probing decodes frames when the header leaves the size open), read only by a demuxer of
    SAFE_FORMATS. Raises PyAV's errors; DataError(unsupported_video) for another demuxer."""

    import av
    import av.logging

    # `options`, not `stream_options`: a list of per-stream options reaches only as many streams
    # as it has entries, and a file with one stream more hid its frames from the limit.
    options = {"format_whitelist": SAFE_FORMATS}
    if max_pixels:
        options["max_pixels"] = str(int(max_pixels))
    try:
        with _LOG_LEVEL_LOCK:  # PyAV's log level is the process's: threads opening videos take turns
            level = av.logging.get_level()
            av.logging.set_level(av.logging.ERROR)  # PyAV's error then ends with FFmpeg's last error line
            try:
                with av.logging.Capture():  # that line, not Python's logging
                    return av.open(io.BytesIO(data), "r", metadata_errors="ignore", options=options)
            finally:
                av.logging.set_level(level)
    except av.error.ArgumentError as e:  # EINVAL: a refused demuxer, or a probed frame over max_pixels
        refused = re.search(r"\[(\w+)\] Format not on whitelist", str(e))
        if refused is None:
            raise
        raise DataError("unsupported_video", f"{what}: FFmpeg reads it as {refused.group(1)}, a format that opens the files "
                                             f"or URLs it names; it is not read: store clips as MP4, WebM or MKV") from None


def video_streams(container) -> list:
    """The container's video streams that are clips: a cover picture (an `.m4a`/`.mp3` with album
    art, a thumbnail embedded by yt-dlp; disposition attached_pic) is one still, not a video."""
    import av

    cover = getattr(getattr(av.stream, "Disposition", None), "attached_pic", None)
    return [s for s in container.streams.video if cover is None or not (s.disposition & cover)]


def too_large(width: int, height: int, max_pixels) -> bool:
    return bool(max_pixels and width and height and width * height > max_pixels)


def limit_decoder(stream, max_pixels) -> None:
    """FFmpeg's own check of each decoded frame's real size, before any pixel is converted."""
    if max_pixels:
        stream.codec_context.options = {"max_pixels": str(int(max_pixels))}




def declared_duration(container, stream) -> Optional[float]:
    """The video stream's duration as its header says (the one rule: validate's cut-short check,
    the scorers' sampled times); the container's only when it has no other stream: a longer audio
    track must neither make the video look cut nor spread the sampled times past its last frame.
    Matroska/WebM keep no per-stream duration; FFmpeg's muxer (and mkvmerge) tag each track with
    DURATION, the end of its last frame, read here relative to the stream's start. ASF (.wmv)
    gives every stream the file's play duration, so with other streams it says nothing."""
    shared = len(container.streams) > 1 and container.format.name == "asf"
    if stream.duration is not None and stream.time_base is not None and not shared:
        return float(stream.duration * stream.time_base)
    end = _tag_seconds(stream.metadata.get("DURATION") or stream.metadata.get("duration"))
    if end is not None:
        start = float(stream.start_time * stream.time_base) if stream.start_time is not None and stream.time_base else 0.0
        return max(0.0, end - max(start, 0.0))
    if container.duration is not None and len(container.streams) == 1:
        return container.duration / 1_000_000
    return None


def _tag_seconds(value) -> Optional[float]:
    """Matroska's DURATION tag ("00:00:02.007000000") in seconds, or None."""
    try:
        h, m, s = str(value).strip().split(":")
        seconds = int(h) * 3600 + int(m) * 60 + float(s)
    except (ValueError, AttributeError):
        return None
    return seconds if seconds > 0 else None


def packets(container, stream, decode: bool = False):
    """(packets with data, seconds from the first to the end of the last, frames decoded) of the
    video stream, at most MAX_PACKETS of them (count is then MAX_PACKETS + 1); frames are decoded
    only when asked (--deep), and only until MAX_DECODED_PIXELS (then decoded is None)."""
    count, first, end, decoded, pixels = 0, None, None, 0, 0
    for packet in container.demux(stream):
        if count >= MAX_PACKETS:
            return count + 1, (end - first if end is not None else None), decoded
        if decode:  # the flush packet too: it returns the frames the decoder still holds
            frames = packet.decode()
            decoded += len(frames)
            pixels += sum(f.width * f.height for f in frames)
            if pixels > MAX_DECODED_PIXELS:
                decode, decoded = False, None  # demuxing goes on (cheap): the cut-short check still runs
        if not packet.size:
            continue
        count += 1
        if packet.pts is not None and packet.time_base is not None:
            t0 = float(packet.pts * packet.time_base)
            t1 = float((packet.pts + (packet.duration or 0)) * packet.time_base)
            first = t0 if first is None else min(first, t0)
            end = t1 if end is None else max(end, t1)
    return count, (end - first if end is not None else None), decoded


def cut_short(declared_frames: int, declared: Optional[float], packets: int, span: Optional[float]) -> Optional[str]:
    """Why the video's data ends before its header says it does, or None (the one rule: validate's
    corrupt_video, the scorers' `partial`)."""
    if packets > MAX_PACKETS:
        return None  # not read to its end; nothing to say
    if packets == 0:
        return "no video frame can be read (the data is cut short or empty)"
    if declared_frames and packets < declared_frames:
        return f"its header declares {declared_frames} frames, the data holds {packets}: cut short"
    if declared and span is not None and span < declared * (1 - _SLACK_SHARE) - _SLACK_SECONDS:
        return f"the frames end at {span:.2f}s of the {declared:.2f}s its header declares: cut short"
    return None
