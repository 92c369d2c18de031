"""Members as webdataset's own writer makes them (TarWriter): what would unpickle is flagged, what
webdataset decodes safely (msgpack, tenbin, npz) is not, and compressed members (.txt.gz,
.json.gz) are read as webdataset's decoder reads them (issue 8 item 9, issue 9 items 1 and 4)."""
import bz2
import gzip
import lzma
import pickle

import numpy as np
import pytest
import webdataset as wds

from shardkit import image_bytes, write_shard
from wdsfilter import StageConfig
from wdsfilter.stream.reading import is_unsafe_ext
from wdsfilter.stream.pipeline import sample_pipeline
from wdsfilter.stream.reading import group_samples, tar_members
from wdsfilter.core.tally import Tally
from wdsfilter.validate import validate


class Boom:
    """Unpickling this raises: proof that something unpickled it."""

    def __reduce__(self):
        return (exec, ("raise RuntimeError('pickle was executed')",))


def _write(path, samples):
    with wds.TarWriter(str(path)) as sink:
        for s in samples:
            sink.write(s)
    return str(path)


def _read(url, **options):
    cfg = StageConfig(check_first_shard=False, **options)
    tally = Tally()
    return list(group_samples(tar_members([{"url": url}], cfg, tally), cfg, tally)), tally


def test_compressed_pickles_are_unsafe_and_never_reach_webdatasets_decoder(tmp_path):
    payload = pickle.dumps(Boom())
    url = _write(tmp_path / "p-000000.tar", [
        {"__key__": "0", "jpg": image_bytes(), "txt": "zero", "pyd.gz": payload},   # TarWriter gzips it
        {"__key__": "1", "jpg": image_bytes(), "txt": "one", "pth.xz": lzma.compress(payload)},
        {"__key__": "2", "jpg": image_bytes(), "txt": "two", "pickle.bz2": bz2.compress(payload)},
    ])
    with pytest.raises(Exception) as err:  # what webdataset alone does with it
        list(wds.WebDataset(url, shardshuffle=False, empty_check=False).decode())
    assert "pickle was executed" in repr(err.value.__cause__)
    samples, tally = _read(url)
    assert len(samples) == 3 and tally.notes["unsafe_member"] == 3
    decoded = [wds.autodecode.default_decoder(s) for s in samples]  # stages.read, then webdataset's decode()
    assert [d["txt"] for d in decoded] == ["zero", "one", "two"]
    report = validate(url, jobs=1)
    unsafe = sorted(f.member for f in report.findings if f.kind == "unsafe_member")
    assert unsafe == ["0.pyd.gz", "1.pth.xz", "2.pickle.bz2"] and report.kept == 3


def test_msgpack_tenbin_and_npz_members_are_safe_and_kept(tmp_path):
    """webdataset decodes these with msgpack.unpackb, tenbin and np.load(allow_pickle=False)."""
    url = _write(tmp_path / "m-000000.tar", [
        {"__key__": str(i), "jpg": image_bytes(), "txt": f"caption {i}", "mp": {"a": i, "b": [1, 2]},
         "ten": [np.arange(4, dtype=np.float32)], "npz": {"x": np.ones(3)}} for i in range(3)])
    assert not any(is_unsafe_ext(e) for e in ("mp", "msgpack", "msg", "ten", "tb", "npz", "npy", "mp.gz"))
    assert all(is_unsafe_ext(e) for e in ("pyd", "PTH", "seg.pyd", "pyd.gz", "pth.xz", "pickle.bz2", "pkl.gz.gz"))
    assert not is_unsafe_ext("pyd.jpg")  # decoded as a JPEG, never unpickled
    samples, tally = _read(url)
    assert "unsafe_member" not in tally.notes
    assert all({"mp", "ten", "npz"} <= set(s) for s in samples)
    decoded = wds.autodecode.default_decoder(samples[1])
    assert decoded["mp"] == {"a": 1, "b": [1, 2]} and decoded["npz"]["x"].tolist() == [1.0, 1.0, 1.0]
    report = validate(url, jobs=1)
    assert "unsafe_member" not in report.counts and report.kept == 3 and report.exit_code == 0


def test_compressed_captions_and_json_are_read_as_webdataset_reads_them(tmp_path):
    url = _write(tmp_path / "gz-000000.tar", [
        {"__key__": f"{i:04d}", "jpg": image_bytes(), "txt.gz": f"a gzipped caption {i}",
         "json.gz": {"caption": f"json caption {i}", "width": 32}} for i in range(4)])
    reference = [s["txt.gz"] for s in wds.WebDataset(url, shardshuffle=False, empty_check=False).decode()]
    got = [s["caption"] for s in sample_pipeline([url], StageConfig(check_first_shard=False))]
    assert got == reference == [f"a gzipped caption {i}" for i in range(4)]
    from_json = list(sample_pipeline([url], StageConfig(caption_key="json:caption", check_first_shard=False)))
    assert [s["caption"] for s in from_json] == [f"json caption {i}" for i in range(4)]
    assert from_json[0]["json"]["width"] == 32
    spelled = list(sample_pipeline([url], StageConfig(caption_key="txt.gz", check_first_shard=False)))
    assert len(spelled) == 4
    report = validate(url, jobs=1)
    assert report.kept == 4 and report.exit_code == 0, report.counts
    report = validate(url, caption_key="json:caption", jobs=1)
    assert report.kept == 4 and report.exit_code == 0, report.counts


def test_compressed_members_are_held_to_their_cap_and_broken_ones_named(tmp_path):
    bomb = gzip.compress(b"x" * (8 << 20))  # 8 MiB of caption in a few KB
    url = write_shard(tmp_path / "gzb-000000.tar", [
        ("0.jpg", image_bytes()), ("0.txt.gz", gzip.compress(b"a caption")[:-12]),  # cut short
        ("1.jpg", image_bytes()), ("1.txt.gz", bomb),        # over the text cap once opened
        ("2.jpg", image_bytes()), ("2.txt", "fine")])
    tally = Tally()
    kept = list(sample_pipeline([url], StageConfig(check_first_shard=False, max_text_bytes=1 << 20), tally))
    assert [s["__key__"] for s in kept] == ["2"]
    assert tally.dropped["corrupt_member"] == 1 and tally.dropped["oversized_member"] == 1
    assert "cut short" in tally.examples["corrupt_member"][0].message
    report = validate(url, byte_caps={"max_text_bytes": 1 << 20}, jobs=1)
    assert report.counts["corrupt_member"] == 1 and report.counts["oversized_member"] == 1 and report.kept == 1
