"""Media checks of the validator on real shards: videos in every container (stats, cut-short
files), images checked from headers unless --deep, and unsafe members named like webdataset's
executing decoders."""
import os
from collections import Counter

import numpy as np
import pytest
from PIL import ImageFile

pytest.importorskip("av")

from shardkit import image_bytes, write_shard  # noqa: E402
from videokit import grey_frame, make_video, mux_silence  # noqa: E402
from wdsfilter.stream.reading import is_unsafe_ext  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
CONTAINERS = [("libx264", "mp4", "mp4"), ("libvpx", "webm", "webm"), ("libx264", "matroska", "mkv"),
              ("mpeg4", "avi", "avi"), ("libx264", "mov", "mov")]
VIDEO_KEY = "mp4;webm;mkv;avi;mov"


def clip(codec, fmt, frames=16, size=(160, 120)):
    return make_video([grey_frame(20 + 7 * (i % 32), *size) for i in range(frames)], fps=8, codec=codec, fmt=fmt)


def kinds(report):
    return Counter((f.kind, f.member) for f in report.findings)


def test_video_stats_in_every_container(tmp_path):
    """Frame count, duration and size per container, without decoding (WebM and Matroska headers
    have no frame count: the packets are counted)."""
    members = []
    for i, (codec, fmt, ext) in enumerate(CONTAINERS):
        members += [(f"{i:04d}.{ext}", clip(codec, fmt)), (f"{i:04d}.txt", f"a {fmt} clip")]
    url = write_shard(tmp_path / "videos-000000.tar", members)
    for deep in (False, True):
        report = validate(url, image_key=VIDEO_KEY, jobs=1, deep=deep)
        assert not report.counts and report.kept == 5
        videos = report.shards[0].videos
        assert videos["count"] == 5 and videos["frames"] == 5 * 16 and videos["sizes"] == {"160x120": 5}
        assert videos["min_duration_s"] == pytest.approx(2.0) and videos["max_duration_s"] == pytest.approx(2.0)


@pytest.mark.parametrize("codec, fmt, ext", CONTAINERS)
def test_videos_cut_short_are_corrupt(tmp_path, codec, fmt, ext):
    """A video cut in transfer often still opens (the header keeps the full duration or frame
    count): the packets read against the header tell."""
    data = clip(codec, fmt, frames=32)
    members = [("0000.txt", "intact"), (f"0000.{ext}", data)]
    for n, share in enumerate((0.5, 0.8), 1):
        members += [(f"{n:04d}.{ext}", data[:int(len(data) * share)]), (f"{n:04d}.txt", f"cut at {share:.0%}")]
    url = write_shard(tmp_path / f"cut-{ext}-000000.tar", members)
    report = validate(url, image_key=VIDEO_KEY, jobs=1)
    assert kinds(report) == Counter({("corrupt_video", f"0001.{ext}"): 1, ("corrupt_video", f"0002.{ext}"): 1})
    assert report.shards[0].videos["count"] == 1 and report.shards[0].videos["frames"] == 32


def test_audio_longer_than_the_video_is_not_cut_short(tmp_path):
    """The container's duration covers every stream; only the video stream's own counts."""
    import io

    import av
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        video = out.add_stream("libvpx", rate=8)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = out.add_stream("aac", rate=16000)
        audio.layout = "mono"
        for i in range(8):  # 1 s of video
            for p in video.encode(av.VideoFrame.from_ndarray(grey_frame(40 + 10 * i, 64, 48), format="rgb24")):
                out.mux(p)
        for p in video.encode():
            out.mux(p)
        mux_silence(out, audio, 48)  # 3 s of audio
    url = write_shard(tmp_path / "av-000000.tar", [("0000.mkv", buf.getvalue()), ("0000.txt", "1 s video, 3 s audio")])
    report = validate(url, image_key=VIDEO_KEY, jobs=1)
    assert not report.counts and report.shards[0].videos["frames"] == 8


def test_images_are_checked_from_headers_unless_deep(monkeypatch):
    """Default mode never decodes pixels (it must stay cheap, and a bomb must never be decoded);
    --deep decodes every image."""
    def no_decode(self, *a, **k):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decode)
    shards = [os.path.join(SHARDS, s) for s in ("images-000000.tar", "ocr-images-000000.tar")]
    shards.append(os.path.join(SHARDS, "broken", "bomb-000000.tar"))
    report = validate(shards, jobs=1)  # in this process, so the patch applies
    assert report.counts == Counter({"oversized_image": 1}) and report.shards[0].images["count"] == 32
    deep = validate(shards[:1], jobs=1, deep=True)
    assert deep.counts["corrupt_image"] == 32  # every image went through load()
    assert "pixels decoded" in deep.findings[0].message


def test_unsafe_extensions_cover_webdataset_executing_decoders():
    """Every extension webdataset's default decoders unpickle or torch.load is unsafe here."""
    from webdataset import autodecode

    executing = [ext for ext, fn in autodecode.decoders.items()
                 if fn is autodecode.unpickle_loads or "torch_loads" in getattr(fn, "__code__", fn.__call__).co_names]
    assert {"pyd", "pickle", "pth"} <= set(executing)
    assert all(is_unsafe_ext(ext) for ext in executing), executing


def test_unsafe_members_in_any_case_and_compound_extension(tmp_path):
    members = [("0000.jpg", image_bytes()), ("0000.txt", "fine"), ("0000.PTH", b"\x80\x04K\x01."),
               ("0001.jpg", image_bytes()), ("0001.txt", "fine"), ("0001.seg.pyd", b"\x80\x04K\x01."),
               ("0002.jpg", image_bytes()), ("0002.txt", "fine"), ("0002.npy", b"\x93NUMPY")]
    url = write_shard(tmp_path / "unsafe-000000.tar", members)
    report = validate(url, jobs=1)
    assert kinds(report) == Counter({("unsafe_member", "0000.PTH"): 1, ("unsafe_member", "0001.seg.pyd"): 1,
                                     ("mixed_case_extension", "0000.PTH"): 1})
    assert report.kept == 3 and report.exit_code == 1


def _jpegs():
    """JPEGs as encoders write them: modes, progressive, EXIF, ICC, JFIF dpi, restart markers."""
    import io

    from PIL import Image, ImageCms

    rng = np.random.default_rng(11)
    base = Image.fromarray(rng.integers(0, 255, (37, 53, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112], exif[0x011A], exif[0x0128] = 6, 300.0, 2  # orientation, x resolution, unit
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    variants = [("RGB", {}), ("RGB", {"progressive": True}), ("RGB", {"optimize": True, "quality": 50}),
                ("L", {}), ("CMYK", {}), ("RGB", {"exif": exif.tobytes()}), ("RGB", {"icc_profile": icc}),
                ("RGB", {"dpi": (300, 300)}), ("RGB", {"subsampling": 0}), ("RGB", {"restart_marker_blocks": 1})]
    out = []
    for mode, opts in variants:
        buf = io.BytesIO()
        base.convert(mode).save(buf, "JPEG", **opts)
        out.append(buf.getvalue())
    return out


def test_jpeg_header_sizes_match_pil():
    """The fast JPEG header walk gives PIL's size on what encoders write (and skips nothing PIL
    would reject)."""
    from wdsfilter.media.images import image_size
    from wdsfilter.validate.checks.jpeg_header import jpeg_size

    jpegs = _jpegs()
    for path in ("images-000000.tar", "images-000001.tar", "json-captions-000000.tar"):
        import tarfile
        with tarfile.open(os.path.join(SHARDS, path)) as tar:
            jpegs += [tar.extractfile(m).read() for m in tar if m.name.endswith(".jpg")]
    from wdsfilter.validate.checks.media import _jpeg_scan_start
    for data in jpegs:
        w, h, scan = jpeg_size(data)
        assert (w, h) == image_size(data) and scan == _jpeg_scan_start(data) > 0


@pytest.mark.filterwarnings("ignore::UserWarning")  # PIL on the damaged EXIF of the mutants
def test_jpeg_header_walk_never_accepts_what_pil_rejects():
    """Damaged headers (bytes flipped before the first scan, cut headers, 12-bit or 2-component
    frames): the walk gives PIL's size or leaves the image to PIL."""
    from wdsfilter.media.images import image_size
    from wdsfilter.validate.checks.jpeg_header import jpeg_size

    rng = np.random.default_rng(12)
    accepted = rejected = 0
    for data in _jpegs():
        scan = data.index(b"\xff\xda")
        mutants = [data[:cut] for cut in range(4, scan + 4, 7)]
        for _ in range(150):
            m = bytearray(data)
            for pos in rng.integers(2, scan + 2, rng.integers(1, 4)):
                m[pos] = rng.integers(0, 256)
            mutants.append(bytes(m))
        for m in mutants:
            fast = jpeg_size(m)
            fast = fast and fast[:2]
            try:
                slow = image_size(m)
            except Exception:
                slow = None
            if fast is not None:
                assert fast == slow
                accepted += 1
            else:
                rejected += 1
    assert accepted > 100 and rejected > 100  # both branches really exercised
