"""The committed sample_shards/ are what tools/make_sample_shards.py writes, and each broken case is
really broken the way broken/MANIFEST.json says."""
import io
import json
import os
import pickle
import tarfile
import zlib
from collections import defaultdict

import av
import PIL
import pytest
from PIL import Image

from tools import make_sample_shards as mss

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards")
BROKEN = os.path.join(SHARDS, "broken")
PINNED = {"pillow": "13.0.0", "av": "18.1.0"}


def manifest():
    with open(os.path.join(BROKEN, "MANIFEST.json"), encoding="utf-8") as f:
        return json.load(f)


def case(name):
    return next(c for c in manifest()["cases"] if c["case"] == name)


def members(path):
    """(name, bytes) of a complete tar, in order."""
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def member(path, name):
    return next(data for n, data in members(path) if n == name)


def test_regenerating_reproduces_every_committed_file(tmp_path):
    versions = {"pillow": PIL.__version__, "av": av.__version__}
    if versions != PINNED:
        pytest.skip(f"sample shards are byte-reproducible only with {PINNED}, installed {versions} (the [test] "
                    f"extra pins them on Python >= 3.11; they have no wheels for 3.10)")
    fresh = mss.write_all(str(tmp_path))
    assert fresh == mss.list_files(SHARDS), "file sets differ: run python tools/make_sample_shards.py"
    differing = [p for p in fresh
                 if (tmp_path / p).read_bytes() != open(os.path.join(SHARDS, p), "rb").read()]
    assert not differing, f"regenerated files differ from the committed ones: {differing}"


def test_tar_metadata_is_fixed():
    for path in mss.list_files(SHARDS):
        if path.endswith(".tar") and "truncated" not in path:
            with tarfile.open(os.path.join(SHARDS, path)) as tar:
                for m in tar:
                    assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644), (path, m.name)


def test_image_shards_layout_and_mismatch_share():
    keys, mismatched = [], 0
    for shard in ("images-000000.tar", "images-000001.tar"):
        samples = defaultdict(dict)
        for name, data in members(os.path.join(SHARDS, shard)):
            key, ext = name.rsplit(".", 1)
            samples[key][ext] = data
        assert len(samples) == 32
        for key, sample in samples.items():
            image_ext = ({"jpg", "png", "webp"} & set(sample)).pop()
            meta = json.loads(sample["json"])
            assert sorted(sample) == sorted([image_ext, "txt", "json"])
            assert meta["key"] == key and meta["caption"] == sample["txt"].decode() and meta["status"] == "success"
            assert Image.open(io.BytesIO(sample[image_ext])).size == (meta["width"], meta["height"])
            assert 128 <= meta["width"] <= 256 and 128 <= meta["height"] <= 256
            mismatched += not meta["caption_matches"]
        keys += list(samples)
    assert keys == [f"{i:09d}" for i in range(64)]
    assert 0.15 <= mismatched / 64 <= 0.25
    json_only = members(os.path.join(SHARDS, "json-captions-000000.tar"))
    assert len(json_only) == 64 and not any(n.endswith(".txt") for n, _ in json_only)
    assert all("description" in json.loads(d) for n, d in json_only if n.endswith(".json"))


def test_ocr_shard_has_eight_text_images():
    metas = [json.loads(d) for n, d in members(os.path.join(SHARDS, "ocr-images-000000.tar")) if n.endswith(".json")]
    assert len(metas) == 16 and sum(m["has_text"] for m in metas) == 8


def test_video_clips_decode_with_recorded_frame_count():
    samples = defaultdict(dict)
    for name, data in members(os.path.join(SHARDS, "videos-000000.tar")):
        key, ext = name.rsplit(".", 1)
        samples[key][ext] = data
    assert len(samples) == 8 and sum(json.loads(s["json"])["has_text"] for s in samples.values()) == 4
    for key, sample in samples.items():
        meta = json.loads(sample["json"])
        assert len(sample["mp4"]) < 150_000
        with av.open(io.BytesIO(sample["mp4"])) as container:
            stream = container.streams.video[0]
            assert (stream.width, stream.height, stream.average_rate) == (meta["width"], meta["height"], meta["fps"])
            assert stream.frames == meta["frames"]
            assert sum(1 for _ in container.decode(video=0)) == meta["frames"], key


def test_manifest_cases_shards_and_members_exist():
    cases = manifest()["cases"]
    assert len({c["case"] for c in cases}) == len(cases) == 15
    for c in cases:
        assert c["expect"], c["case"]
        for shard in c["shards"]:
            assert os.path.isfile(os.path.join(BROKEN, shard)), shard
        for finding in c["expect"]:
            assert finding["kind"] in mss.FINDING_KINDS and finding["shard"] in c["shards"]
            with open(os.path.join(BROKEN, finding["shard"]), "rb") as f:
                assert finding["member"].encode() in f.read(), finding  # name in a tar header


def test_broken_shards_keep_valid_samples_around_the_broken_ones():
    for c in manifest()["cases"]:
        if c["case"] == "truncated":
            continue
        names = [n for shard in c["shards"] for n, _ in members(os.path.join(BROKEN, shard))]
        valid = [n for n in names if n.endswith(".json") and n[:-5] + ".jpg" in names and n[:-5] + ".txt" in names]
        assert len(valid) >= 3, c["case"]


def test_bomb_header_is_huge_and_file_is_tiny(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow refuses to even open it otherwise
    path = os.path.join(BROKEN, "bomb-000000.tar")
    png = next(d for n, d in members(path) if n.endswith(".png"))
    assert len(png) < 200_000 and os.path.getsize(path) < 200_000
    w, h = Image.open(io.BytesIO(png)).size  # header only, never .load()
    assert w * h > 500_000_000 and (w, h) == (case("bomb")["width"], case("bomb")["height"])
    # The hand-written deflate stream is valid: it inflates to exactly the rows' bytes, all zero.
    start = png.index(b"IDAT")
    stream = png[start + 4:start + 4 + int.from_bytes(png[start - 4:start], "big")]
    inflater, total, nonzero = zlib.decompressobj(), 0, 0
    while stream:
        out = inflater.decompress(stream, 1 << 24)
        total, nonzero, stream = total + len(out), nonzero + len(out.strip(b"\0")), inflater.unconsumed_tail
    assert inflater.eof and total == h * (1 + (w + 7) // 8) and nonzero == 0


def test_truncated_tar_raises_after_the_recorded_complete_samples():
    info = case("truncated")
    done, seen = 0, defaultdict(int)
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(os.path.join(BROKEN, "truncated-000000.tar")) as tar:
            for m in tar:
                tar.extractfile(m).read()
                seen[m.name.rsplit(".", 1)[0]] += 1
                done = sum(n == info["members_per_sample"] for n in seen.values())
    assert done == info["complete_samples_before_break"] == 3


def test_unsafe_pickle_payload_is_real():
    findings = case("unsafe")["expect"]
    assert sorted(f["member"].rsplit(".", 1)[1] for f in findings) == ["pickle", "pth", "pyd"]
    for finding in findings:
        payload = member(os.path.join(BROKEN, finding["shard"]), finding["member"])
        with pytest.raises(RuntimeError, match=mss.PICKLE_MESSAGE):
            pickle.loads(payload)


def test_corrupt_jpegs_fail_to_decode():
    path = os.path.join(BROKEN, "corrupt-jpeg-000000.tar")
    truncated, garbage = (member(path, f["member"]) for f in case("corrupt-jpeg")["expect"])
    image = Image.open(io.BytesIO(truncated))
    assert image.size == (160, 120)  # the header is fine
    with pytest.raises(OSError):
        image.load()
    with pytest.raises(Image.UnidentifiedImageError):
        Image.open(io.BytesIO(garbage))


def test_small_broken_members_are_as_described():
    misc = case("keys-misc")
    names = [n for n, _ in members(os.path.join(BROKEN, "keys-misc-000000.tar"))]
    assert names.count("000010.jpg") == misc["duplicate_member_count"] == 2 and "README" in names and ".DS_Store" in names
    assert member(os.path.join(BROKEN, "zero-byte-000000.tar"), case("zero-byte")["expect"][0]["member"]) == b""
    bad_text = member(os.path.join(BROKEN, "non-utf8-000000.tar"), case("non-utf8")["expect"][0]["member"])
    with pytest.raises(UnicodeDecodeError):
        bad_text.decode("utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(member(os.path.join(BROKEN, "invalid-json-000000.tar"), case("invalid-json")["expect"][0]["member"]))
    first, second = (dict(members(os.path.join(BROKEN, s))) for s in case("split")["shards"])
    key = case("split")["split_key"]
    assert list(first)[-1] == f"{key}.jpg" and list(second)[:2] == [f"{key}.txt", f"{key}.json"]


def test_corrupt_and_audio_only_videos():
    info = case("corrupt-video")
    path = os.path.join(BROKEN, "corrupt-video-000000.tar")
    expect = {f["kind"]: f["member"] for f in info["expect"]}
    with pytest.raises(av.error.FFmpegError):
        av.open(io.BytesIO(member(path, expect["corrupt_video"])))
    with av.open(io.BytesIO(member(path, expect["no_video_stream"]))) as container:
        assert not container.streams.video and len(container.streams.audio) == 1
    with av.open(io.BytesIO(member(path, info["valid_clip"]["member"]))) as container:
        assert sum(1 for _ in container.decode(video=0)) == info["valid_clip"]["frames"]
