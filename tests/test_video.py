"""Frame sampling with PyAV (wdsfilter/media/frames.py) on videos encoded here, in every container
the scorers accept, and on broken ones. Frames carry their index as a grey level, so a test can
tell which frame the sampler really returned."""
from __future__ import annotations


import numpy as np
import pytest

av = pytest.importorskip("av")

from wdsfilter.core.errors import DataError  # noqa: E402
from wdsfilter.media.frames import sample_frames  # noqa: E402

from videokit import audio_only_mp4, grey_frame, make_video, text_frame  # noqa: E402


LEVEL_STEP, LEVELS = 12, 18


def indexed_clip(n=16, fps=8, gop=None, codec="libx264", fmt="mp4") -> bytes:
    """Frame i is uniformly grey at level 20 + 12 (i mod 18): the level read back names the frame."""
    return make_video([grey_frame(20 + LEVEL_STEP * (i % LEVELS)) for i in range(n)], fps=fps, gop=gop,
                      codec=codec, fmt=fmt)


def frame_index(frame: np.ndarray) -> int:
    """The frame's index modulo 18."""
    return int(round((float(frame.mean()) - 20) / LEVEL_STEP))


# -- tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec,fmt", [
    ("libx264", "mp4"), ("libvpx", "webm"), ("libx264", "matroska"), ("mpeg4", "avi"), ("libx264", "mov"),
    ("libx264", "avi"),     # B-frames in AVI: decode-order timestamps, timed by frame index instead
    ("libx264", "mpegts"),  # byte-based seeking finds nothing: decoded from the start instead
    ("libx264", "h264"),    # raw elementary stream: no duration, no timestamps
])
def test_uniform_frames_are_the_middles_of_equal_slices_in_every_container(codec, fmt):
    clip = indexed_clip(codec=codec, fmt=fmt)  # 16 frames at 8 fps: 2 s
    got = sample_frames(clip, 4)
    assert got.frames.shape == (4, 120, 160, 3) and got.frames.dtype == np.uint8
    # Targets 0.25, 0.75, 1.25, 1.75 s are exactly frames 2, 6, 10, 14.
    assert [frame_index(f) for f in got.frames] == [2, 6, 10, 14]
    if fmt not in ("mpegts", "h264"):  # (TS starts its clock late; raw H.264 guesses 25 fps)
        assert got.times == pytest.approx([0.25, 0.75, 1.25, 1.75], abs=1e-3)


def test_long_clip_seeks_instead_of_decoding_everything():
    clip = indexed_clip(n=240, fps=8, gop=8)  # 30 s, a keyframe every second
    seeked = sample_frames(clip, 4)
    linear = sample_frames(clip, 4, seek=False)
    # Same frames either way (targets 3.75, 11.25, 18.75, 26.25 s -> frames 30, 90, 150, 210) ...
    assert [frame_index(f) for f in seeked.frames] == [i % LEVELS for i in (30, 90, 150, 210)]
    assert np.array_equal(seeked.frames, linear.frames)
    # ... but seeking decodes a few frames per target, not the 211 up to the last one.
    assert seeked.seeks == 4 and linear.seeks == 0
    assert seeked.decoded <= 4 * 8 < linear.decoded


@pytest.mark.parametrize("codec,fmt", [("libx264", "mp4"), ("libvpx", "webm"), ("libx264", "matroska"),
                                       ("mpeg4", "avi"), ("libx264", "avi"), ("libx264", "mov"),
                                       ("libx264", "mpegts"), ("libx264", "h264")])
def test_seeking_returns_the_frames_decoding_everything_would(codec, fmt):
    # 30 s clips with a keyframe every second. MPEG-TS seeks land a keyframe late, AVI with
    # B-frames has decode-order timestamps: both must fall back rather than return other frames.
    clip = indexed_clip(n=240, fps=8, gop=8, codec=codec, fmt=fmt)
    seeked, linear = sample_frames(clip, 5), sample_frames(clip, 5, seek=False)
    assert [frame_index(f) for f in seeked.frames] == [i % LEVELS for i in (24, 72, 120, 168, 216)]
    assert np.array_equal(seeked.frames, linear.frames)


def test_close_targets_decode_on_instead_of_seeking_again():
    got = sample_frames(indexed_clip(), 3, seek_gap=1.0)  # 2 s clip: targets 0.67 s apart
    assert got.seeks == 1


def test_keyframes_mode_decodes_only_keyframes():
    clip = indexed_clip(n=240, fps=8, gop=8)
    got = sample_frames(clip, 3, keyframes=True)
    assert got.decoded == 3 and len(got.frames) == 3
    # Keyframes are every 8th frame; 30 of them, picked at the middles of 3 slices: 5, 15, 25.
    assert [t for t in got.times] == pytest.approx([5.0, 15.0, 25.0])
    assert [frame_index(f) for f in got.frames] == [i % LEVELS for i in (40, 120, 200)]


@pytest.mark.parametrize("fmt", ["mp4", "matroska", "mov", "avi", "mpegts", "h264"])
def test_keyframes_mode_picks_the_same_keyframes_in_every_container(fmt):
    # 10 s, a keyframe every 8 frames: keyframes 0, 8, ..., 72; the middles of 4 slices of those
    # 10 are the 2nd, 4th, 7th and 9th: frames 8, 24, 48, 64. MPEG-TS cannot seek to them and a
    # raw .h264 stream cannot seek at all: keyframes are then decoded from the start.
    got = sample_frames(indexed_clip(n=80, gop=8, fmt=fmt), 4, keyframes=True)
    assert [frame_index(f) for f in got.frames] == [i % LEVELS for i in (8, 24, 48, 64)]


def test_keyframes_mode_with_fewer_keyframes_than_asked_returns_them_all():
    got = sample_frames(indexed_clip(), 5, keyframes=True)  # one keyframe in a 2 s x264 clip
    assert len(got.frames) == 1 and frame_index(got.frames[0]) == 0


def test_frames_are_scaled_to_max_side_while_converting():
    clip = make_video([text_frame(width=640, height=480)] * 4)
    assert sample_frames(clip, 2, max_side=320).frames.shape == (2, 240, 320, 3)
    assert sample_frames(clip, 2, max_side=None).frames.shape == (2, 480, 640, 3)


def test_more_frames_than_the_clip_has_repeats_the_nearest():
    got = sample_frames(indexed_clip(n=4), 8)
    assert len(got.frames) == 8
    assert sorted(set(frame_index(f) for f in got.frames)) == [0, 1, 2, 3]


@pytest.mark.parametrize("name,data,reason", [
    ("garbage", b"\x00\x01not a video" * 300, "corrupt_video"),
    ("empty", b"", "corrupt_video"),
    ("audio-only", None, "no_video_stream"),
])
def test_broken_videos_raise_data_errors_naming_the_sample(name, data, reason):
    data = audio_only_mp4() if data is None else data
    with pytest.raises(DataError) as e:
        sample_frames(data, 3, what=f"sample {name}.mp4 of shard x.tar")
    assert e.value.reason == reason
    assert f"sample {name}.mp4 of shard x.tar" in str(e.value)


def test_truncated_and_damaged_videos_are_corrupt_not_a_crash():
    clip = indexed_clip()
    for data in (clip[: len(clip) // 2], clip[:1500] + bytes(600) + clip[2100:]):
        with pytest.raises(DataError) as e:
            sample_frames(data, 3)
        assert e.value.reason == "corrupt_video"


def test_frames_over_max_pixels_are_refused_before_decoding():
    clip = make_video([grey_frame(100, 640, 480)] * 2)
    with pytest.raises(DataError) as e:
        sample_frames(clip, 1, max_pixels=640 * 480 - 1)
    assert e.value.reason == "video_too_large"
    assert len(sample_frames(clip, 1, max_pixels=640 * 480).frames) == 1


def test_rejects_zero_frames():
    with pytest.raises(ValueError):
        sample_frames(indexed_clip(), 0)
