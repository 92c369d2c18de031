"""The size scorer (wdsfilter/score/scorers/size.py): image sizes from headers, equal to what
Pillow decodes, whether the run decoded the image (at reduced scale too) or not; videos encoded
here with PyAV in five containers: duration, frame rate and frame count as encoded, a longer audio
track ignored, a clip cut short marked partial."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from videokit import clip_with_audio, grey_frame, h264_mp4, make_video
from wdsfilter.stream.config import StageConfig
from wdsfilter.core.errors import DataError
from wdsfilter.media.images import decode_image
from wdsfilter.score.scorers.base import Noted
from wdsfilter.score.scorers.size import SizeScorer

skimage_data = pytest.importorskip("skimage.data")

CONTAINERS = [("libx264", "mp4"), ("libvpx", "webm"), ("libx264", "matroska"), ("mpeg4", "avi"), ("libx264", "mov")]


def encoded(size, fmt, **options) -> bytes:
    photo = Image.fromarray(skimage_data.astronaut()).resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    photo.save(buf, fmt, **options)
    return buf.getvalue()


@pytest.mark.parametrize("fmt,options", [("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}),
                                         ("WEBP", {}), ("GIF", {}), ("BMP", {})])
def test_image_size_from_the_header_is_the_decoded_size(fmt, options):
    scorer = SizeScorer()
    for size in ((1000, 600), (37, 411), (256, 256)):
        data = encoded(size, fmt, **options)
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            assert img.size == size
        row = scorer.prepare({"image": data})  # the member's bytes: a run that decodes nothing
        assert (row["width"], row["height"]) == size
        assert row["min_side"] == min(size) and row["aspect_ratio"] == max(size) / min(size)
        assert row["duration"] is None and row["fps"] is None and row["frame_count"] is None
        # A run whose other scorers decode: the same numbers, from the decoded image; a JPEG decoded
        # at reduced scale (a 224 px model's floor) keeps its full size.
        decoded = decode_image(data, 64_000_000, floor=(128, 128))
        assert scorer.prepare({"image": decoded}) == row
        if fmt == "JPEG" and min(size) >= 256:
            assert decoded.size != size  # it was decoded at reduced scale


def test_an_unreadable_header_is_a_corrupt_image():
    with pytest.raises(DataError) as e:
        SizeScorer().prepare({"image": b"\xff\xd8\xff\xe0 not a jpeg"})
    assert e.value.reason == "corrupt_image"


@pytest.mark.parametrize("codec,fmt", CONTAINERS)
def test_video_numbers_in_every_container(codec, fmt):
    data = make_video([grey_frame(20 + 7 * i, 160, 96) for i in range(16)], fps=8, codec=codec, fmt=fmt)
    row = SizeScorer().prepare({"video": data, "__key__": "v"})
    assert not isinstance(row, Noted)
    assert (row["width"], row["height"], row["min_side"]) == (160, 96, 96)
    assert row["aspect_ratio"] == pytest.approx(160 / 96)
    assert row["fps"] == pytest.approx(8.0)
    assert row["frame_count"] == 16  # WebM and Matroska headers hold no count: the packets are counted
    assert row["duration"] == pytest.approx(2.0, abs=0.01)


def test_a_longer_audio_track_is_not_the_videos_duration():
    row = SizeScorer().prepare({"video": clip_with_audio("matroska", seconds=2.0, audio_seconds=10.0, fps=8)})
    assert row["duration"] == pytest.approx(2.0, abs=0.01) and row["frame_count"] == 16


def test_a_video_cut_short_is_partial(tmp_path):
    data = h264_mp4(tmp_path / "clip.mp4", 75)  # 3 s at 25 fps, faststart
    whole = SizeScorer().prepare({"video": data})
    assert (whole["frame_count"], whole["fps"]) == (75, 25.0) and whole["duration"] == pytest.approx(3.0)
    noted = SizeScorer().prepare({"video": data[:int(len(data) * 0.6)]})
    assert isinstance(noted, Noted) and noted.reason == "corrupt_video" and "cut short" in noted.message
    assert 0 < noted.input["frame_count"] < 75 and noted.input["duration"] == pytest.approx(3.0)  # the header's


def test_not_a_video():
    with pytest.raises(DataError) as e:
        SizeScorer().prepare({"video": b"\x00" * 4096, "__key__": "x"})
    assert e.value.reason in ("corrupt_video", "unsupported_video")
    with pytest.raises(DataError) as e:
        SizeScorer().prepare({"caption": "no media"})
    assert e.value.reason == "missing_image"


def test_a_huge_frame_size_is_refused_before_anything_is_read():
    data = make_video([np.zeros((64, 96, 3), np.uint8)] * 4, fps=8)
    with pytest.raises(DataError) as e:
        SizeScorer(config=StageConfig(max_pixels=1000)).prepare({"video": data})
    assert e.value.reason == "video_too_large"
