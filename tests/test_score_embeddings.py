"""`wdsfilter score --save-embeddings`: per-shard float16 image and caption embeddings of the CLIP
scorer in clip-retrieval's layout (img_emb/, text_emb/, metadata/), one vector per sample with a
CLIP score, whose row-wise dot product is that sample's clip_score."""
import io
import os
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

from wdsfilter.cli import main
from wdsfilter.runfolder.tables import read_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SS = os.path.join(REPO, "sample_shards")
SHARDS = [os.path.join(SS, f) for f in ("images-000000.tar", "videos-000000.tar", "json-captions-000000.tar",
                                        "broken/corrupt-jpeg-000000.tar")]
KEYS = ["--caption-key", "txt;json:description", "--image-key", "jpg;png;jpeg;webp;mp4"]
FP16 = 3e-3  # two unit vectors rounded to float16: their dot product moves by about 1e-3

pytestmark = pytest.mark.slow


def score(tiny_clip, out, *args, shards=SHARDS):
    r = CliRunner().invoke(main, ["score", *shards, "--out", str(out), "--model", "local-dir:" + tiny_clip,
                                  "--device", "cpu", "--no-progress", "--workers", "0", *KEYS, *args])
    return r


def tables(out):
    """{shard name: (score rows, image embeddings, text embeddings, metadata rows)}."""
    import pyarrow.parquet as pq
    got = {}
    emb = os.path.join(out, "embeddings")
    for f in sorted(os.listdir(os.path.join(out, "scores"))):
        name = f[:-len(".parquet")]
        got[name] = (read_rows(os.path.join(out, "scores", f)), np.load(os.path.join(emb, "img_emb", name + ".npy")),
                     np.load(os.path.join(emb, "text_emb", name + ".npy")),
                     pq.read_table(os.path.join(emb, "metadata", name + ".parquet")).to_pylist())
    return got


def check_consistent(rows, img, txt, meta, unit_images=True):
    assert img.dtype == txt.dtype == np.float16 and img.shape == txt.shape and img.shape[0] == len(meta)
    # One vector per sample with a CLIP score, in shard order; its metadata names the score row.
    scored_rows = [r for r in rows if r["clip_score"] is not None]
    assert [m["index"] for m in meta] == [r["index"] for r in scored_rows]
    assert [(m["key"], m["shard"]) for m in meta] == [(r["key"], r["shard"]) for r in scored_rows]
    dots = (img.astype(np.float32) * txt.astype(np.float32)).sum(1)
    for r, m, dot, i, t in zip(scored_rows, meta, dots, img, txt):
        assert abs(dot - r["clip_score"]) < FP16 and m["clip_score"] == r["clip_score"], (r["key"], dot)
        assert abs(np.linalg.norm(t.astype(np.float32)) - 1) < FP16
        norm = np.linalg.norm(i.astype(np.float32))
        if unit_images or r["clip_frames"] == 1:
            assert abs(norm - 1) < FP16, (r["key"], norm)
        else:  # a video's mean embedding
            assert norm < 1 + FP16
    return len(scored_rows)


def test_embeddings_dot_product_is_the_clip_score(tiny_clip, tmp_path):
    out = tmp_path / "out"
    r = score(tiny_clip, out, "--save-embeddings")
    assert r.exit_code == 0, r.output
    got = tables(str(out))
    assert sorted(got) == sorted(os.path.basename(s)[:-4] for s in SHARDS)
    total = 0
    videos = 0
    for rows, img, txt, meta in got.values():
        total += check_consistent(rows, img, txt, meta, unit_images=False)
        videos += sum(1 for r in rows if r["clip_frames"] and r["clip_frames"] > 1)
    assert total > 20 and videos > 0
    # The corrupt JPEG's row has no score, and no vector (a zero vector would sit in an index).
    rows, img, _, meta = got["corrupt-jpeg-000000"]
    assert any(r["clip_score"] is None for r in rows) and len(meta) < len(rows) and not (img == 0).all(1).any()


def test_video_max_reduce_takes_the_best_frame(tiny_clip, tmp_path):
    out = tmp_path / "out"
    r = score(tiny_clip, out, "--save-embeddings", "--frame-reduce", "max", shards=[SHARDS[1]])
    assert r.exit_code == 0, r.output
    (rows, img, txt, meta), = tables(str(out)).values()
    assert check_consistent(rows, img, txt, meta, unit_images=True) > 0
    assert any(r["clip_frames"] > 1 for r in rows)


def test_resume_rewrites_an_unfinished_shard_consistently(tiny_clip, tmp_path):
    out = tmp_path / "out"
    assert score(tiny_clip, out, "--save-embeddings").exit_code == 0
    emb = out / "embeddings"
    files = sorted(p.relative_to(emb) for p in emb.rglob("*") if p.is_file())
    before = {f: (emb / f).read_bytes() for f in files}
    stamps = {f: (emb / f).stat().st_mtime_ns for f in files}
    # The images shard did not finish: no marker, and its embeddings are stale.
    os.remove(out / "done" / "images-000000.json")
    np.save(emb / "img_emb" / "images-000000.npy", np.zeros((3, 4), dtype=np.float16))
    r = score(tiny_clip, out, "--save-embeddings", "--resume")
    assert r.exit_code == 0, r.output
    rows, img, txt, meta = tables(str(out))["images-000000"]
    check_consistent(rows, img, txt, meta)
    for f in files:
        if not f.name.startswith("images-000000."):
            assert (emb / f).stat().st_mtime_ns == stamps[f]  # finished shards untouched
    # The same vectors as the first run, to float16's last bit: the planner sizes batches by the
    # measured speed, and a CPU matmul over another batch may round one element the other way
    # (a loaded CI run differed in one byte)
    again = np.load(emb / "img_emb" / "images-000000.npy")
    first = np.load(io.BytesIO(before[pathlib.Path("img_emb", "images-000000.npy")]))
    assert again.shape == first.shape and again.dtype == first.dtype and np.abs(again).max() > 0
    np.testing.assert_allclose(again.astype(np.float32), first.astype(np.float32), rtol=2e-3, atol=2e-3)
    # A finished shard whose embeddings file is gone is not done: --resume writes it again.
    os.remove(emb / "text_emb" / "images-000000.npy")
    r = score(tiny_clip, out, "--save-embeddings", "--resume")
    assert r.exit_code == 0, r.output
    again = np.load(emb / "text_emb" / "images-000000.npy")
    first = np.load(io.BytesIO(before[pathlib.Path("text_emb", "images-000000.npy")]))
    assert again.shape == first.shape and np.abs(again).max() > 0
    np.testing.assert_allclose(again.astype(np.float32), first.astype(np.float32), rtol=2e-3, atol=2e-3)
    # Resume refuses a run without embeddings into this folder (the settings differ).
    r = score(tiny_clip, out, "--resume")
    assert r.exit_code == 2 and "save_embeddings" in r.output


def test_without_the_flag_no_embeddings_and_only_with_clip(tiny_clip, tmp_path):
    assert score(tiny_clip, tmp_path / "a", shards=[SHARDS[0]]).exit_code == 0
    assert not os.path.exists(tmp_path / "a" / "embeddings")
    r = CliRunner().invoke(main, ["score", SHARDS[0], "--out", str(tmp_path / "b"), "--scorer", "ocr",
                                  "--save-embeddings", *KEYS])
    assert r.exit_code == 2 and "clip scorer" in r.output
