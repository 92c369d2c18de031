"""Sample N frames of an in-memory video with PyAV, seeking instead of decoding the whole clip.

Runs in DataLoader workers (CPU). Two modes:

* uniform (default): N timestamps at the middles of N equal slices of the duration (the middles
  skip the black first frame and the fade-out of the last). For each timestamp the demuxer seeks
  to the keyframe at or before it and decodes forward to it; when the next timestamp is close
  ahead (within `seek_gap` seconds) decoding simply goes on, which is cheaper than a new seek.
  Containers that cannot seek, or whose duration is unknown, are decoded once from the start.
* keyframes: packets are scanned (no decoding) for keyframes, N of them are picked evenly, and
  only those are decoded: the cheapest mode for long clips, at the cost of exact timestamps.

A video that cannot be opened or decoded raises DataError("corrupt_video"), one without a video
stream DataError("no_video_stream"), one whose codec this FFmpeg build lacks
DataError("unsupported_video"), one with frames over `max_pixels` DataError("video_too_large"):
the scoring engine writes the reason into the sample's row and goes on.

The header is not trusted: FFmpeg's own max_pixels check refuses a frame larger than the limit
before it is decoded (also while probing), packets scanned and frames decoded per clip are capped,
and a clip whose data ends before its header says is sampled from what is there, with
SampledFrames.partial saying why (the rules of validate's video check: wdsfilter/media/videos.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from ..core.errors import DataError
from .videos import (MAX_DECODED_PIXELS, MAX_PACKETS, cut_short, declared_duration, limit_decoder, open_video,
                      packets, too_large, video_streams)

_FIX = ("drop the sample, or re-encode it (ffmpeg -i in.mp4 -c:v libx264 out.mp4) and rewrite the shard; "
        "`wdsfilter validate` lists every such member")


@dataclass
class SampledFrames:
    """Frames (N, H, W, 3) uint8 RGB with their timestamps, plus what it cost (for benchmarks)."""

    frames: np.ndarray
    times: List[float]
    decoded: int = 0        # frames the decoder produced, sampled or not
    seeks: int = 0
    seconds: float = 0.0    # wall time of open + demux + decode + colour conversion
    notes: List[str] = field(default_factory=list)
    # Why the clip is incomplete ("its header declares 75 frames, the data holds 32: cut short"),
    # or None: the frames were sampled from the part that is there.
    partial: Optional[str] = None


def _target_size(width: int, height: int, max_side: Optional[int]) -> Tuple[int, int]:
    if not max_side or max(width, height) <= max_side:
        return width, height
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


class _BadTimestamps(Exception):
    pass


# Frames decoded per clip: seeking keeps real clips far below (a 13 MB file of a million tiny
# frames that cannot seek would otherwise be decoded whole).
MAX_DECODED = 30_000


class _Reader:
    """One open container and its first video stream; every PyAV failure becomes a DataError."""

    def __init__(self, data: bytes, what: str, max_pixels: Optional[int]):
        import av

        self.av = av
        self.data = data
        self.what = what
        self.max_pixels = max_pixels
        self.broken: Optional[str] = None  # why decoding ended early, if it did
        self.container = None
        self.stream = None
        self.decoded = 0
        self.pixels = 0  # decoded, held to MAX_DECODED_PIXELS
        self._open()
        ctx = self.stream.codec_context
        if too_large(ctx.width, ctx.height, max_pixels):
            self.close()
            raise DataError("video_too_large", f"{what}: {ctx.width}x{ctx.height} frames are over max_pixels="
                                               f"{max_pixels}; raise the limit or drop the sample")

    def _open(self):
        av = self.av
        try:
            self.container = open_video(self.data, self.max_pixels, self.what)
        except av.error.FFmpegError as e:
            raise DataError("corrupt_video", f"{self.what}: PyAV cannot open it ({e}); {_FIX}") from None
        clips = video_streams(self.container)
        if not clips:
            kinds = ", ".join("cover picture" if s.type == "video" else s.type for s in self.container.streams) \
                or "no streams"
            self.close()
            raise DataError("no_video_stream", f"{self.what}: the container has no video stream ({kinds}); "
                                               f"it is not a video clip: drop it or point --image-key at the video member")
        self.stream = clips[0]
        if self.stream.codec_context is not None:
            limit_decoder(self.stream, self.max_pixels)
        tb = self.stream.time_base
        self.start = self.stream.start_time * float(tb) if self.stream.start_time is not None and tb else 0.0
        if self.stream.codec_context is None or not getattr(self.stream.codec_context, "name", None):
            self.close()
            raise DataError("unsupported_video", f"{self.what}: this FFmpeg build has no decoder for its video codec; "
                                                 f"re-encode it (e.g. to H.264) or install a PyAV build with that decoder")

    def reopen(self):
        self.close()
        self._open()

    def close(self):
        if self.container is not None:
            self.container.close()
            self.container = None

    def fail(self, e: Exception) -> DataError:
        av = self.av
        if isinstance(e, av.error.ArgumentError) and self.max_pixels:  # FFmpeg's max_pixels check (EINVAL)
            ctx = self.stream.codec_context if self.stream is not None else None
            said = f"{ctx.width}x{ctx.height}" if ctx is not None and ctx.width else "no size"
            return DataError("video_too_large", f"{self.what}: the decoder refused a frame over max_pixels="
                                                f"{self.max_pixels} (its header says {said}; or the frame is invalid: "
                                                f"{e}); drop the sample")
        if isinstance(e, av.error.DecoderNotFoundError):
            return DataError("unsupported_video", f"{self.what}: no decoder for its codec ({e}); re-encode it (e.g. to H.264)")
        return DataError("corrupt_video", f"{self.what}: decoding failed ({type(e).__name__}: {e}); {_FIX}")

    @property
    def time_base(self) -> float:
        tb = self.stream.time_base
        return float(tb) if tb else 1e-6

    def time_range(self) -> Optional[Tuple[float, float]]:
        """(start, duration) in seconds from the headers, or None when they do not say."""
        s, tb = self.stream, self.time_base
        start = s.start_time * tb if s.start_time is not None else 0.0
        duration = declared_duration(self.container, s)
        if duration:
            return start, duration
        if s.frames and s.average_rate:
            return start, s.frames / float(s.average_rate)
        return None

    @property
    def rate(self) -> Optional[float]:
        rate = self.stream.average_rate or self.stream.guessed_rate
        return float(rate) if rate else None

    def scan_packets(self) -> Tuple[List[float], List[float]]:
        """Times of all video packets and of keyframe packets, by demuxing only (no decoding).
        Raw streams (an .h264 elementary stream) have no timestamps: packets count at the frame rate."""
        times, keys = [], []
        tb, rate, n = self.time_base, self.rate, 0
        for packet in self.container.demux(self.stream):
            if packet.size == 0 or getattr(packet, "is_discard", False):
                continue  # the demuxer's empty flush packet; one an edit list hides (never shown)
            if n >= MAX_PACKETS:
                break  # enough to place the samples: the rest of an absurdly long clip is not read
            stamp = packet.pts if packet.pts is not None else packet.dts
            t = stamp * tb if stamp is not None else (n / rate if rate else None)
            n += 1
            if t is None:
                continue
            times.append(t)
            if packet.is_keyframe:
                keys.append(t)
        return sorted(times), sorted(keys)

    def decode(self, index_times: bool = False):
        """(frame, time in seconds) in presentation order. Frames without timestamps, and every
        frame with index_times=True, are timed by their index at the frame rate (meaningful only
        when decoding from the start). Raises _BadTimestamps when times go backwards: AVI cannot
        store B-frame timestamps, so H.264 in AVI comes out with decode-order times."""
        index, rate, last = 0, self.rate, None
        for frame in self._frames():
            self.decoded += 1
            self.pixels += frame.width * frame.height
            if self.pixels > MAX_DECODED_PIXELS:
                raise DataError("corrupt_video", f"{self.what}: {self.decoded} frames of {frame.width}x{frame.height} "
                                                 f"decoded to reach the sampled times, over the budget of "
                                                 f"{MAX_DECODED_PIXELS / 1e9:.1f} gigapixels per clip (a long clip with "
                                                 f"one keyframe?); {_FIX}")
            if self.decoded > MAX_DECODED:
                raise DataError("corrupt_video", f"{self.what}: more than {MAX_DECODED} frames decoded to reach the "
                                                 f"sampled times (a clip of countless tiny frames?); {_FIX}")
            if frame.pts is not None and not index_times:
                t = frame.pts * self.time_base
            elif frame.time is not None and not index_times:
                t = frame.time
            else:
                t = self.start + index / rate if rate else None
            if t is not None and last is not None and t <= last and not index_times:
                raise _BadTimestamps()
            last = t if t is not None else last
            index += 1
            yield frame, t

    def _frames(self):
        """The decoder's frames; data that breaks off after some frames ends the stream there
        (a clip cut short in transfer), noted in self.broken, instead of failing the clip."""
        frames = self.container.decode(self.stream)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                return
            except self.av.error.InvalidDataError as e:
                if not self.decoded:
                    raise
                self.broken = f"the data breaks off after {self.decoded} decoded frames ({e}): cut short"
                return
            yield frame

    def seek(self, t: float) -> None:
        # backward=True: land on the keyframe at or before t, then decode forward to t.
        self.container.seek(int(t / self.time_base), stream=self.stream, backward=True, any_frame=False)


def _to_rgb(frame, max_side: Optional[int]) -> np.ndarray:
    """The frame upright: phones store portrait clips as landscape frames plus a display matrix
    (rotation 90 or -90), which players and the ffmpeg CLI apply; scorers must see what they see."""
    width, height = _target_size(frame.width, frame.height, max_side)
    rgb = frame.to_ndarray(format="rgb24", width=width, height=height)
    turns = round((getattr(frame, "rotation", 0) or 0) / 90) % 4  # counter-clockwise quarter turns
    return np.ascontiguousarray(np.rot90(rgb, turns)) if turns else rgb


def _uniform_times(start: float, duration: float, n: int) -> List[float]:
    return [start + (i + 0.5) * duration / n for i in range(n)]


def _decode_at(reader: _Reader, targets: List[float], max_side: Optional[int], seek: bool, seek_gap: float,
               result: SampledFrames, index_times: bool = False) -> Tuple[list, list]:
    """The frame nearest to each target (targets ascending). Returns (frames, times)."""
    frames, times = [], []
    frame_iter = None
    cur = cur_t = None      # the last decoded frame and its time
    before = before_t = None  # the frame decoded before it (since the last seek)
    exhausted = seeked = False
    tolerance = 0.5 / reader.rate if reader.rate else 0.02  # half a frame
    for target in targets:
        if seek and (cur_t is None or target - cur_t > seek_gap):
            try:
                reader.seek(target)
                result.seeks += 1
                # Seeking flushes the decoder: decode anew from the keyframe it landed on.
                frame_iter, cur, cur_t, before, before_t, exhausted, seeked = None, None, None, None, None, False, True
            except reader.av.error.FFmpegError:
                seek = False  # not seekable: decode on from where we are
        if frame_iter is None:
            frame_iter = reader.decode(index_times)
        while not exhausted and (cur is None or (cur_t is not None and cur_t < target)):
            decoded = next(frame_iter, None)
            if seeked and (decoded is None or (decoded[1] is not None and decoded[1] > target + tolerance)):
                # A backward seek lands at or before the target; this one found nothing or landed
                # after it (byte-based seeking in MPEG-TS lands a keyframe late, broken indexes):
                # decode this clip from the start instead, without seeking.
                reader.reopen()
                result.notes.append("seeking failed: decoded from the start")
                seek = seeked = False
                frame_iter, cur, cur_t, before, before_t = reader.decode(index_times), None, None, None, None
                continue
            seeked = False
            if decoded is None:
                exhausted = True  # the header duration overshot the stream: the last frame is the nearest
                result.notes.append("the frames ended before the sampled time")
                break
            before, before_t = cur, cur_t
            cur, cur_t = decoded
        picked, picked_t = cur, cur_t
        if before is not None and before_t is not None and cur_t is not None and cur_t >= target \
                and target - before_t < cur_t - target:
            picked, picked_t = before, before_t  # the frame before the target is nearer than the one after
        if picked is None:
            break
        frames.append(_to_rgb(picked, max_side))
        times.append(round(picked_t if picked_t is not None else target, 4))
    return frames, times


def sample_frames(data: bytes, n: int = 3, *, keyframes: bool = False, max_side: Optional[int] = 1280,
                  seek: bool = True, seek_gap: float = 1.0, max_pixels: Optional[int] = 64_000_000,
                  what: str = "video") -> SampledFrames:
    """N RGB frames spread over the clip's duration (see the module docstring).

    max_side: frames are scaled (in swscale, while converting to RGB) so the long side is at most
    this. `what` names the sample in error messages (e.g. "sample 000123.mp4 of shard x.tar").
    """
    if n < 1:
        raise ValueError(f"frames must be >= 1, got {n}")
    av = __import__("av")
    t0 = time.perf_counter()
    reader = _Reader(bytes(data), what, max_pixels)
    result = SampledFrames(frames=np.zeros((0, 0, 0, 3), np.uint8), times=[])
    try:
        try:
            picked = _sample_keyframes(reader, n, max_side, result) if keyframes else None
            if picked is not None:
                frames, times = picked
            else:
                if keyframes:  # no keyframe is shown: uniform times, decoded from the keyframe before
                    reader.reopen()
                span = reader.time_range()
                if span is None or span[1] <= 0:
                    # No usable duration in the headers: scan packet times, then decode from the start.
                    packet_times, _ = reader.scan_packets()
                    if not packet_times:
                        raise DataError("corrupt_video", f"{what}: the video stream has no packets; {_FIX}")
                    step = (packet_times[-1] - packet_times[0]) / max(len(packet_times) - 1, 1)
                    span = (packet_times[0], packet_times[-1] - packet_times[0] + step)
                    reader.reopen()
                    seek = False
                    result.notes.append("no duration in the headers: decoded from the start")
                targets = _uniform_times(span[0], span[1], n)
                try:
                    frames, times = _decode_at(reader, targets, max_side, seek, seek_gap, result)
                except _BadTimestamps:
                    # Time frames by their index instead, decoding from the start.
                    reader.reopen()
                    result.notes.append("timestamps out of order: frames timed by their index")
                    frames, times = _decode_at(reader, targets, max_side, False, seek_gap, result, index_times=True)
        except av.error.FFmpegError as e:
            raise reader.fail(e) from None
        if not frames:
            raise DataError("corrupt_video", f"{what}: no frame could be decoded; {_FIX}")
        result.partial = _partial(data, max_pixels) or reader.broken
        result.frames = np.stack(frames) if len({f.shape for f in frames}) == 1 else _same_size(frames)
        result.times = times
        result.decoded = reader.decoded
    finally:
        reader.close()
    result.seconds = time.perf_counter() - t0
    return result


@dataclass
class VideoInfo:
    """A clip's numbers from its container, nothing decoded (the size scorer)."""

    width: int
    height: int
    duration: Optional[float]   # seconds: the header's (videos.declared_duration), else its packets' span
    fps: Optional[float]        # the stream's average frame rate (else FFmpeg's guess)
    frames: Optional[int]       # frames in its data (packets demuxed); None past MAX_PACKETS without a header count
    partial: Optional[str] = None  # why its data ends before its header says (validate's corrupt_video rule)


def video_info(data: bytes, max_pixels: Optional[int] = 64_000_000, what: str = "video") -> VideoInfo:
    """Size, duration, frame rate and frame count of a clip from its container: the stream header
    and its packets, demuxed (a few ms for a real clip), never decoded. Opened and refused by the
    rules of sample_frames (DataError: corrupt_video, no_video_stream, video_too_large, ...).
    The stored frame size: a phone clip's display rotation is not applied (its aspect ratio and
    smallest side are the same either way)."""
    av = __import__("av")
    reader = _Reader(bytes(data), what, max_pixels)
    try:
        stream, ctx = reader.stream, reader.stream.codec_context
        try:
            count, span, _ = packets(reader.container, stream)
        except av.error.FFmpegError as e:
            raise reader.fail(e) from None
        declared = declared_duration(reader.container, stream)
        frames = count if count <= MAX_PACKETS else (stream.frames or None)
        duration = declared if declared else span
        return VideoInfo(ctx.width, ctx.height, duration, reader.rate, frames,
                         cut_short(stream.frames, declared, count, span))
    finally:
        reader.close()


def _sample_keyframes(reader: _Reader, n: int, max_side: Optional[int], result: SampledFrames):
    shown, keys = reader.scan_packets()
    if not keys and shown:
        # A clip cut without re-encoding (ffmpeg -ss 0.5 -i in.mp4 -c copy) keeps the keyframe before
        # its start, which an edit list hides: no keyframe is ever shown. Sample it uniformly.
        result.notes.append("no keyframe is shown (an edit list starts the clip after it): uniform times")
        return None
    if not keys:
        raise DataError("corrupt_video", f"{reader.what}: no keyframe in the video stream; {_FIX}")
    # n keyframes spread evenly: the middles of n slices of the keyframe list (all when fewer).
    chosen = sorted({int((i + 0.5) * len(keys) / n) for i in range(n)}) if len(keys) > n else list(range(len(keys)))
    reader.reopen()
    # Only keyframes come out of the decoder: seeking to one and taking the first frame is exact.
    reader.stream.codec_context.skip_frame = "NONKEY"
    frames, times = [], []
    tolerance = 0.5 / reader.rate if reader.rate else 0.02  # half a frame
    try:
        for k in chosen:
            reader.seek(keys[k])
            result.seeks += 1
            decoded = next(reader.decode(index_times=True), None)
            landed = _frame_seconds(reader, decoded[0], keys[k]) if decoded is not None else None
            if landed is None or abs(landed - keys[k]) > tolerance:
                raise _BadTimestamps()  # the seek found nothing or another keyframe: see below
            frames.append(_to_rgb(decoded[0], max_side))
            times.append(round(landed, 4))
        return frames, times
    except (reader.av.error.FFmpegError, _BadTimestamps):
        pass
    # Not seekable (raw .h264), or seeking found nothing or the wrong keyframe (byte-based seeking
    # in MPEG-TS): decode keyframes from the start and take the chosen ones by their order.
    result.notes.append("seeking failed: keyframes decoded from the start")
    reader.reopen()
    reader.stream.codec_context.skip_frame = "NONKEY"
    frames, times = [], []
    wanted = set(chosen)
    for ordinal, (frame, _) in enumerate(reader.decode(index_times=True)):
        if ordinal in wanted:
            frames.append(_to_rgb(frame, max_side))
            times.append(round(_frame_seconds(reader, frame, keys[min(ordinal, len(keys) - 1)]), 4))
            if len(frames) == len(chosen):
                break
    return frames, times


def _partial(data: bytes, max_pixels: Optional[int]) -> Optional[str]:
    """Why the clip's data ends before its header says (validate's corrupt_video rule), from its
    packets (demuxed, not decoded: a few ms for a real clip), or None."""
    try:
        with open_video(data, max_pixels) as container:
            stream = video_streams(container)[0]
            count, span, _ = packets(container, stream)
            return cut_short(stream.frames, declared_duration(container, stream), count, span)
    except Exception:  # the frames were sampled already; a second look that fails says nothing
        return None


def _frame_seconds(reader: _Reader, frame, fallback: float) -> float:
    if frame.pts is not None:
        return frame.pts * reader.time_base
    return frame.time if frame.time is not None else fallback


def _same_size(frames: List[np.ndarray]) -> np.ndarray:
    """A stream that changes resolution mid-clip (allowed in some codecs): fit all to the first."""
    import cv2

    h, w = frames[0].shape[:2]
    return np.stack([f if f.shape[:2] == (h, w) else cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA)
                     for f in frames])
