"""Score files and embeddings/metadata carry what the sample said beside its scores: the caption
as the stages saw it, and the url and uid of its .json (img2dataset's, DataComp's), so a user in
pandas sees which text got which score and clip-retrieval's back can show a hit. Shards written by
webdataset's TarWriter with img2dataset-style json; real scoring runs (the hash scorer: no model;
the tiny CLIP model for the embeddings)."""
import json
import os

import pyarrow.parquet as pq
import pytest
import webdataset as wds

from filterkit import img2dataset_shards
from shardkit import image_bytes
from wdsfilter.score import score
from wdsfilter.runfolder.tables import read_rows


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    paths = img2dataset_shards(str(folder), [6, 5], png_every=3)
    odd = str(folder / "odd-000000.tar")  # what real metadata also holds
    with wds.TarWriter(odd) as sink:
        sink.write({"__key__": "a", "jpg": image_bytes(), "txt": "  a <image> red   square  "})  # no json
        sink.write({"__key__": "b", "jpg": image_bytes(), "txt": "b", "json": {"uid": 1234, "url": ["not text"]}})
        sink.write({"__key__": "c", "jpg": image_bytes(), "txt": "c", "json": b"[1, 2]"})  # not an object
        sink.write({"__key__": "d", "jpg": image_bytes(), "json": {"url": "https://x/d.jpg"}})  # no caption: rejected
    return paths + [odd]


def rows_of(out):
    folder = os.path.join(out, "scores")
    return {r["key"]: r for f in sorted(os.listdir(folder)) for r in read_rows(os.path.join(folder, f))}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_score_rows_carry_caption_url_and_uid(shards, tmp_path, fmt):
    out = str(tmp_path / "run")
    score(shards, out=out, scorers=["hash"], device="cpu", workers=0, progress=False, format=fmt,
          image_key="jpg;png", image_token="<image>", token_mode="strip")
    rows = rows_of(out)
    for s, n in ((0, 6), (1, 5)):
        for i in range(n):
            row = rows[f"{s:05d}{i:04d}"]
            with_png = i % 3 == 2
            assert row["caption"] == f"photo {i} of shard {s}: a café sign"
            assert row["url"] == f"https://img.example.com/{s}/{i}.{'png' if with_png else 'jpg'}"
            assert row["uid"] == f"{s:04x}{i:028x}"
            assert row["status"] == "scored"
    # the caption as the stages saw it: the image token stripped and the spaces folded (--token-mode strip)
    assert (rows["a"]["caption"], rows["a"]["url"], rows["a"]["uid"]) == ("a red square", None, None)
    assert (rows["b"]["caption"], rows["b"]["url"], rows["b"]["uid"]) == ("b", None, "1234")  # a uid number, as digits
    assert (rows["c"]["url"], rows["c"]["uid"]) == (None, None)
    assert rows["d"]["status"] == "rejected" and rows["d"]["caption"] is None
    if fmt == "parquet":  # one schema for the run: text columns typed string even where every value is null
        schemas = {pq.read_schema(os.path.join(out, "scores", f)).remove_metadata() for f in os.listdir(os.path.join(out, "scores"))}
        assert len(schemas) == 1
        schema = schemas.pop()
        assert [str(schema.field(c).type) for c in ("caption", "url", "uid")] == ["string"] * 3
    else:
        with open(os.path.join(out, "scores", "00000.jsonl"), encoding="utf-8") as f:
            assert "café" in f.readline()  # UTF-8, not \u escapes


def test_filter_counts_thresholds_on_a_run_with_text_columns(shards, tmp_path):
    # The text columns are no score columns: filter counts, --top ranks and the report leave them alone.
    from wdsfilter.filtering import filter_scores
    from wdsfilter.runfolder import ScoreRun
    out = str(tmp_path / "run")
    score(shards, out=out, scorers=["hash"], device="cpu", workers=0, progress=False, image_key="jpg;png")
    run = ScoreRun.open(out)
    assert {"caption", "url", "uid"} <= set(run.columns) and not {"caption", "url", "uid"} & set(run.numeric_columns())
    assert "phash" not in run.numeric_columns()  # 16 hex digits: an identifier, not a score (issue 35 item 11)
    result = filter_scores(out, report=None)
    assert result.rows == 15 and 0 < result.kept < 15
    from wdsfilter.core.errors import ConfigError
    with pytest.raises(ConfigError, match="phash, which does not hold numbers"):
        filter_scores(out, top_shares={"phash": 50}, report=None)


@pytest.mark.slow
def test_embedding_metadata_carries_caption_and_url(shards, tmp_path, tiny_clip):
    out = str(tmp_path / "run")
    score(shards[:2], out=out, scorers=["clip"], scorer_options={"clip": {"model": "local-dir:" + tiny_clip,
                                                                          "save_embeddings": True}},
          device="cpu", workers=0, progress=False, image_key="jpg;png")
    rows = rows_of(out)
    meta = [m for f in sorted(os.listdir(os.path.join(out, "embeddings", "metadata")))
            for m in pq.read_table(os.path.join(out, "embeddings", "metadata", f)).to_pylist()]
    assert len(meta) == 11
    for m in meta:
        row = rows[m["key"]]
        assert (m["caption"], m["url"], m["uid"]) == (row["caption"], row["url"], row["uid"])
        assert m["caption"].startswith("photo ") and m["url"].startswith("https://img.example.com/")
    # what clip-retrieval's back reads for a hit (its columns_to_return default: url, caption)
    table = pq.read_table(os.path.join(out, "embeddings", "metadata"), columns=["url", "caption"])
    assert table.num_rows == 11 and json.dumps(table.to_pylist()[0])


def test_score_keeps_a_sample_whose_json_text_is_not_valid_unicode(tmp_path):
    """The score file's caption, url and uid columns (rows.sample_text): a .json whose url or
    caption holds a lone surrogate escape (a caption cut inside an emoji's pair) is written with
    U+FFFD in its place, as the caption is (specs.no_lone_surrogates), not a UnicodeEncodeError
    that fails the run."""
    import json

    from click.testing import CliRunner
    from shardkit import write_shard
    from wdsfilter.cli import main
    members = [("a.jpg", image_bytes()), ("a.txt", "fine"),
               ("b.jpg", image_bytes()), ("b.txt", "also fine"),
               ("b.json", b'{"url": "http://x/cut-\\ud83d", "uid": "u\\udce9"}')]
    shard = write_shard(str(tmp_path / "odd-0000.tar"), members)
    out = str(tmp_path / "scores")
    r = CliRunner().invoke(main, ["score", shard, "--scorer", "scorekit:BrightnessScorer", "--out", out,
                                  "--device", "cpu", "--workers", "0", "--no-progress", "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    rows = {row["key"]: row for row in map(json.loads, open(os.path.join(out, "scores", "odd-0000.jsonl")))}
    assert rows["b"]["status"] == "scored" and rows["b"]["url"] == "http://x/cut-\ufffd"
    assert rows["b"]["uid"] == "u\ufffd" and rows["a"]["url"] is None
