"""`wdsfilter score --scorer hash`: per row the sha256 of the image member's bytes and imagehash's
phash of the decoded image, computed in the scoring pass on real photos (scikit-image's), videos
(PyAV) and combined with other scorers in one pass."""
import hashlib
import io
import os
import tarfile

import imagehash
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dedupkit import build, jpeg, _photo
from shardkit import write_shard
from videokit import make_video
from wdsfilter.cli import main
from wdsfilter.media.hashes import hamming, majority, phash, phash_hex
from wdsfilter.runfolder.tables import read_rows


def score_cli(shards, out, *args):
    r = CliRunner().invoke(main, ["score", *shards, "--out", str(out), "--device", "cpu", "--no-progress",
                                  "--workers", "0", "--image-key", "jpg;png;mp4", *args])
    assert r.exit_code == 0, r.output
    return [row for f in sorted(os.listdir(os.path.join(out, "scores")))
            for row in read_rows(os.path.join(out, "scores", f))]


def members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def test_hash_rows_are_sha256_of_member_bytes_and_imagehash_phash(tmp_path):
    shards, truth = build(tmp_path / "shards", bases=("astronaut", "coffee", "camera"),
                          variants=("copy", "png", "jpeg_q30"), alikes=["brick", "grass"])
    rows = score_cli(shards, tmp_path / "out", "--scorer", "hash")
    assert len(rows) == len(truth) and all(r["status"] == "scored" for r in rows)
    raw = {}
    for s in shards:
        for name, data in members(s).items():
            if not name.endswith(".txt"):
                raw[name.split(".")[0]] = (name, data)
    for r in rows:
        name, data = raw[r["key"]]
        assert r["sha256"] == hashlib.sha256(data).hexdigest()
        # imagehash on the full decode: PNGs bit for bit; JPEGs decoded at reduced DCT scale (the
        # scorer's decode floor) within 2 bits.
        expected = imagehash.phash(Image.open(io.BytesIO(data)).convert("RGB"))
        got = imagehash.hex_to_hash(phash_hex(r["phash"]))
        assert (got - expected) <= (0 if name.endswith(".png") else 2), (name, got, expected)
    by_key = {r["key"]: r for r in rows}
    original = {n: k for k, (n, v) in truth.items() if v == "original"}
    for key, (name, kind) in truth.items():
        if kind == "copy":  # byte copy in another shard: the same sha256
            assert by_key[key]["sha256"] == by_key[original[name]]["sha256"]
        elif kind != "original":
            assert by_key[key]["sha256"] != by_key[original[name]]["sha256"]
    assert len({r["sha256"] for r in rows}) == len(rows) - 3  # the three copies only


def test_phash_is_imagehash_bits_and_majority_votes(tmp_path):
    img = _photo("rocket")
    value = phash(img)
    assert phash_hex(value) == str(imagehash.phash(img)) and -(1 << 63) <= value < (1 << 63)
    a, b, c = 0x0F0F, 0x0FF0, 0x00FF
    assert majority([a, b, c]) == 0x0FFF & ~0x0000 & ((a & b) | (a & c) | (b & c))
    assert majority([-1, -1, 0]) == -1 and hamming(-1, 0) == 64


def test_video_hash_is_its_frames_majority_and_bytes(tmp_path):
    photo = np.asarray(_photo("chelsea").resize((320, 240)))
    clip = make_video([photo] * 16)
    again = make_video([np.asarray(Image.fromarray(photo).resize((160, 120)))] * 16)  # re-encoded smaller
    shard = write_shard(tmp_path / "v.tar", [("a.mp4", clip), ("a.txt", "cat"), ("b.mp4", again), ("b.txt", "cat"),
                                             ("c.jpg", jpeg(Image.fromarray(photo))), ("c.txt", "cat")])
    rows = {r["key"]: r for r in score_cli([shard], tmp_path / "out", "--scorer", "hash")}
    assert rows["a"]["sha256"] == hashlib.sha256(clip).hexdigest()
    assert hamming(rows["a"]["phash"], rows["b"]["phash"]) <= 4     # the clip and its re-encode
    assert hamming(rows["a"]["phash"], rows["c"]["phash"]) <= 6     # the clip and its still frame
    assert hamming(rows["a"]["phash"], phash(_photo("coffee"))) > 16


def test_hash_combines_with_other_scorers_in_one_pass(tmp_path):
    from wdsfilter.score import score
    from scorekit import BrightnessScorer
    shards, truth = build(tmp_path / "shards", bases=("coffee",), variants=("copy",), alikes=["clock"])
    out = tmp_path / "out"
    score(shards, out=str(out), scorers=["hash", BrightnessScorer()], device="cpu", progress=False, workers=0,
          image_key="jpg;png")
    rows = [r for f in sorted(os.listdir(out / "scores")) for r in read_rows(str(out / "scores" / f))]
    assert len(rows) == 3 and all(r["sha256"] and r["phash"] is not None and r["brightness"] > 0 for r in rows)


@pytest.mark.slow
def test_hash_with_clip_and_save_embeddings(tiny_clip, tmp_path):
    shards, truth = build(tmp_path / "shards", bases=("astronaut",), variants=("copy", "resize_50"), alikes=[])
    rows = score_cli(shards, tmp_path / "out", "--scorer", "hash", "--scorer", "clip", "--model",
                     "local-dir:" + tiny_clip, "--save-embeddings")
    assert all(r["clip_score"] is not None and r["sha256"] for r in rows)
    assert len({r["sha256"] for r in rows}) == 2
    assert os.path.isdir(tmp_path / "out" / "embeddings" / "img_emb")


def test_summary_histogram_of_one_large_value():
    # Two samples with one phash (a clip and its still frame) made the summary divide by zero.
    from wdsfilter.report.statistics import _bin_counts, histogram_bins
    v = -7283425521061696308
    lo, hi, n, _ = histogram_bins(v, v, True, 20)
    assert hi > lo and 0 <= int((v - lo) / (hi - lo) * n) <= n
    assert _bin_counts([], "phash", lo, hi, n) == [0] * n
