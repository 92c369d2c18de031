"""The sample stages on real tar shards built by the tests."""
import io
import pickle

import pytest
from PIL import Image

from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import ConfigError, StageConfig
from wdsfilter.stream.pipeline import sample_pipeline


def run(urls, **options):
    p = sample_pipeline(urls, StageConfig(**options))
    return list(p), p.tally


def test_txt_captions_decode_to_rgb_images(tmp_path):
    url = write_shard(tmp_path / "a.tar", image_text_members(5))
    samples, tally = run([url])
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(5)]
    assert samples[2]["caption"] == "a red square 2"
    assert isinstance(samples[0]["image"], Image.Image) and samples[0]["image"].mode == "RGB"
    assert tally.samples_read == tally.samples_out == 5 and not tally.dropped


def test_json_caption_key_and_alternatives(tmp_path):
    members = []
    for i in range(4):
        members.append((f"{i}.png", image_bytes(fmt="PNG")))
        members.append((f"{i}.json", {"description": f"desc {i}", "meta": {"caption": f"meta {i}"}}))
    members.append(("4.PNG", image_bytes(fmt="PNG")))
    members.append(("4.txt", "from txt"))
    url = write_shard(tmp_path / "j.tar", members)
    samples, _ = run([url], caption_key="txt;json:meta.caption")
    assert [s["caption"] for s in samples] == ["meta 0", "meta 1", "meta 2", "meta 3", "from txt"]
    assert samples[0]["json"]["description"] == "desc 0"  # metadata parsed once and kept


def test_wrong_caption_key_raises_with_the_keys_present_and_a_suggestion(tmp_path):
    members = [(f"{i}.jpg", image_bytes()) for i in range(3)]
    members = [m for i in range(3) for m in ((f"{i}.jpg", image_bytes()), (f"{i}.json", {"description": "x"}))]
    url = write_shard(tmp_path / "j.tar", members)
    with pytest.raises(ConfigError) as err:
        run([url])
    msg = str(err.value)
    assert str(url) in msg and "'txt'" in msg
    assert "jpg (100%)" in msg and "json:description (100%)" in msg
    assert "use --caption-key json:description" in msg


def test_wrong_image_key_raises(tmp_path):
    url = write_shard(tmp_path / "w.tar", image_text_members(3, ext="webp"))
    with pytest.raises(ConfigError, match="(?s)image key 'jpg'.*use --image-key webp"):
        run([url], image_key="jpg")


def test_data_errors_are_counted_per_reason_and_shard_and_lose_nothing_else(tmp_path):
    members = image_text_members(2) + [
        ("bad.jpg", image_bytes()), ("bad.txt", b"caf\xe9"),
        ("badjson.jpg", image_bytes()), ("badjson.json", b'{"description": "a red'),
        ("corrupt.jpg", image_bytes()[:40] + b"\x00" * 50), ("corrupt.txt", "c"),
        ("zero.jpg", b""), ("zero.txt", "z"),
        ("nocap.jpg", image_bytes()),
        ("noimg.txt", "only text"),
    ] + image_text_members(2, start=10)
    url = write_shard(tmp_path / "d.tar", members)
    samples, tally = run([url], caption_key="txt;json:description")
    assert [s["__key__"] for s in samples] == ["000000", "000001", "000010", "000011"]
    assert tally.dropped == {"invalid_utf8": 1, "invalid_json": 1, "corrupt_image": 1, "missing_image": 2,
                             "missing_caption": 1}
    assert tally.notes["empty_member"] == 1
    assert tally.by_shard[url]["corrupt_image"] == 1
    assert tally.examples["corrupt_image"][0].member == "corrupt.jpg"
    assert "corrupt_image" in tally.summary() and url in tally.summary()


def test_non_adjacent_members_are_merged_within_the_window(tmp_path):
    members = [("a.jpg", image_bytes()), ("b.jpg", image_bytes()), ("b.txt", "b"), ("a.txt", "a")]
    url = write_shard(tmp_path / "n.tar", members)
    samples, tally = run([url])
    assert sorted(s["__key__"] for s in samples) == ["a", "b"]
    assert tally.notes["nonadjacent_key"] == 1
    # webdataset's behaviour (window 1): two half-samples, both counted, none silently lost.
    samples, tally = run([url], group_window=1)
    assert [s["__key__"] for s in samples] == ["b"]
    assert tally.dropped == {"missing_caption": 1, "missing_image": 1}


def test_dotted_basenames_rekey_at_last_dot(tmp_path):
    members = []
    for i in (1, 2):
        members += [(f"img.v2.000{i}.jpg", image_bytes()), (f"img.v2.000{i}.txt", f"cap {i}")]
    url = write_shard(tmp_path / "dots.tar", members)
    with pytest.raises(ConfigError, match="rekey='last-dot'"):
        run([url])
    samples, _ = run([url], rekey="last-dot")
    assert [(s["__key__"], s["caption"]) for s in samples] == [("img.v2.0001", "cap 1"), ("img.v2.0002", "cap 2")]


def test_upper_case_extensions_match(tmp_path):
    url = write_shard(tmp_path / "u.tar", [("1.JPG", image_bytes()), ("1.TXT", "up"), ("2.Jpg", image_bytes()),
                                            ("2.txt", "mixed")])
    samples, _ = run([url])
    assert [s["caption"] for s in samples] == ["up", "mixed"]


def test_truncated_tar_keeps_the_samples_before_the_break(tmp_path):
    url = write_shard(tmp_path / "t.tar", image_text_members(6))
    data = open(url, "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])
    ok = write_shard(tmp_path / "ok.tar", image_text_members(2, start=50))
    samples, tally = run([str(cut), ok])
    keys = [s["__key__"] for s in samples]
    assert keys[-2:] == ["000050", "000051"] and 2 <= len(keys) - 2 < 6
    assert tally.dropped["truncated_tar"] == 1
    assert "cut.tar" in tally.examples["truncated_tar"][0].shard


@pytest.mark.parametrize("damage, words, samples", [
    (lambda d, o: d.__setitem__(slice(o, o + 1024), bytes(1024)), "followed by more data", 3),  # zeroed hole
    (lambda d, o: d.__setitem__(o + 10, d[o + 10] ^ 0xFF), "corrupt member header", 3),  # bad checksum
    (lambda d, o: d.extend(d[:o]), "followed by more data", 6),  # a second tar appended
    (lambda d, o: d.extend(bytes(64 * 1024)), None, 6),  # only more zero padding: a complete shard
])
def test_shards_that_tarfile_ends_early_are_counted_as_truncated(tmp_path, damage, words, samples):
    # Python's tarfile stops at a zero block or a corrupt header as if the archive ended there.
    import tarfile
    url = write_shard(tmp_path / "t.tar", image_text_members(6))
    data = bytearray(open(url, "rb").read())
    with tarfile.open(url) as tar:
        offset = tar.getmember("000003.jpg").offset
    damage(data, offset)
    (tmp_path / "t.tar").write_bytes(bytes(data))
    ok = write_shard(tmp_path / "ok.tar", image_text_members(2, start=50))
    found, tally = run([url, ok])
    assert [s["__key__"] for s in found] == [f"{i:06d}" for i in range(samples)] + ["000050", "000051"]
    if words is None:
        assert "truncated_tar" not in tally.dropped
    else:
        assert tally.dropped["truncated_tar"] == 1 and words in tally.examples["truncated_tar"][0].message


def test_unsafe_members_are_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise RuntimeError('pickle was executed')",))
    payload = pickle.dumps(Boom())
    members = [("0.jpg", image_bytes()), ("0.txt", "x"), ("0.pyd", payload), ("0.pth", payload)]
    url = write_shard(tmp_path / "u.tar", members)
    samples, tally = run([url])
    assert len(samples) == 1 and tally.notes["unsafe_member"] == 2
    assert "pyd" not in samples[0] and "pth" not in samples[0]


def test_image_token_normalise_and_strip(tmp_path):
    members = [("0.jpg", image_bytes()), ("0.txt", "<image> a red circle"),
               ("1.jpg", image_bytes()), ("1.txt", "<__dj__image> a blue square")]
    url = write_shard(tmp_path / "tok.tar", members)
    samples, tally = run([url], image_token="<__dj__image>")
    assert [s["caption"] for s in samples] == ["<__dj__image> a red circle", "<__dj__image> a blue square"]
    assert tally.notes["foreign_image_token"] == 1
    samples, _ = run([url], image_token="<__dj__image>", token_mode="strip")
    assert [s["caption"] for s in samples] == ["a red circle", "a blue square"]


def _big_png(width, height) -> bytes:
    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG")
    return buf.getvalue()


def test_size_guard_skips_oversized_images_without_decoding(tmp_path, monkeypatch):
    big = _big_png(5000, 4000)  # 20 MP, a few KB on disk
    url = write_shard(tmp_path / "big.tar", [("0.png", big), ("0.txt", "big"), ("1.png", image_bytes(fmt="PNG")),
                                              ("1.txt", "small")])
    loaded = []
    original = Image.Image.load
    from PIL import ImageFile
    original_file_load = ImageFile.ImageFile.load

    def spy(self):
        loaded.append(self.size)
        return original_file_load(self)
    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    samples, tally = run([url], max_pixels=10_000_000)
    assert [s["caption"] for s in samples] == ["small"]
    assert tally.dropped == {"oversized_image": 1}
    assert (5000, 4000) not in loaded  # never decoded
    assert "20.0 MP" in tally.examples["oversized_image"][0].message
    assert original is Image.Image.load


def test_oversize_reduce_decodes_jpegs_at_reduced_scale(tmp_path):
    big = image_bytes(size=(4000, 3000))
    url = write_shard(tmp_path / "bigjpg.tar", [("0.jpg", big), ("0.txt", "big")])
    samples, tally = run([url], max_pixels=1_000_000, oversize="reduce")
    w, h = samples[0]["image"].size
    assert w * h <= 1_000_000 and (w, h) == (1000, 750)
    assert not tally.dropped


def test_a_failing_pipe_command_loses_only_its_shard(tmp_path):
    # webdataset's pipe raises from close() when the command exits non-zero; that must not end
    # the stream: the next shard is read, the failure counted.
    good = write_shard(tmp_path / "good.tar", image_text_members(3))
    missing = f"pipe:cat {tmp_path / 'missing.tar'}"
    samples, tally = run([missing, good, f"pipe:cat {good}"], allow_pipe=True)
    assert [s["__key__"] for s in samples] == [f"{i:06d}" for i in range(3)] * 2
    assert tally.notes["shard_command_failed"] == 1
    assert "missing.tar" in tally.examples["shard_command_failed"][0].shard


def test_a_pipe_shard_left_mid_way_is_not_counted_as_a_failed_command(tmp_path):
    """A consumer that stops mid-shard (an epoch's end) closes the stream; the command then dies of
    SIGPIPE (status 141 or -13): that is the reader's doing, not a failure to count. A command that
    fails on its own is still counted (test above)."""
    import itertools
    from wdsfilter.core.tally import Tally
    members = [m for i in range(64) for m in ((f"{i:06d}.jpg", image_bytes()), (f"{i:06d}.txt", "caption"),
                                             (f"{i:06d}.bin", bytes(200_000)))]
    url = write_shard(tmp_path / "big.tar", members)
    tally = Tally(0, 0)
    stream = sample_pipeline([f"pipe:cat {url}"], StageConfig(caption_key="txt", allow_pipe=True), tally)
    it = iter(stream)
    assert len(list(itertools.islice(it, 2))) == 2  # the command is blocked on a full pipe now
    it.close() if hasattr(it, "close") else None
    del it, stream
    import gc
    gc.collect()
    assert "shard_command_failed" not in tally.notes


def test_json_captions_that_are_not_text_are_dropped_not_stringified(tmp_path):
    import json
    members = []
    for i, caption in enumerate(["a red square", ["a cat", "a mat"], {"en": "a cat"}, 3, True]):
        members += [(f"{i:06d}.jpg", image_bytes()), (f"{i:06d}.json", json.dumps({"caption": caption}))]
    url = write_shard(tmp_path / "j.tar", members)
    samples, tally = run([url], caption_key="json:caption")
    assert [s["caption"] for s in samples] == ["a red square"]
    assert tally.dropped["caption_not_text"] == 4


def test_a_first_shard_whose_captions_are_all_lists_is_a_config_error(tmp_path):
    import json
    members = []
    for i in range(4):
        members += [(f"{i:06d}.jpg", image_bytes()), (f"{i:06d}.json", json.dumps({"caption": ["a", "b"]}))]
    url = write_shard(tmp_path / "lists.tar", members)
    with pytest.raises(ConfigError, match="in 4 of 4 samples the caption field is a JSON list"):
        run([url], caption_key="json:caption")
