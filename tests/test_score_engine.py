"""The scoring engine end to end on real tar shards: every sample gets a row, scores are right,
model workers in separate processes give the same tables, filtered shards keep original bytes,
and the loader filters by the score files."""
import gzip
import io
import json
import os
import tarfile

import pytest

from shardkit import image_bytes, write_shard
from scorekit import (BrightnessScorer, BrokenScorer, ByteLengthScorer, expected_brightness,
                            make_shards)
from wdsfilter import ConfigError
from wdsfilter.score import score
from wdsfilter.score.backoff import ScorerError
from wdsfilter.score.rows import NothingScoredError
from wdsfilter.runfolder.tables import read_rows


def rows_by_key(out, fmt="parquet"):
    rows = {}
    folder = os.path.join(out, "scores")
    for f in sorted(os.listdir(folder)):
        assert f.endswith("." + fmt)
        for r in read_rows(os.path.join(folder, f)):
            assert r["key"] not in rows, f"key {r['key']} has two rows"
            rows[r["key"]] = r
    return rows


@pytest.fixture
def shards(tmp_path):
    # shard 0: sample 3 refused by prepare(); shard 1: sample 2 corrupt, sample 5 has no caption.
    return make_shards(tmp_path / "shards", [10, 7, 12], refused={0: (3,)}, bad={1: (2,)}, no_caption={1: (5,)})


def run(urls, out, scorers=None, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    kw.setdefault("workers", 0)
    return score(urls, out=str(out), scorers=scorers or [BrightnessScorer(fail_word="refuse-me")], **kw)


def test_every_sample_gets_a_row_with_its_score_or_reason(shards, tmp_path):
    urls, images = shards
    out = tmp_path / "out"
    summary = run(urls, out, batch_size=4, workers=1, min_scores={"brightness": 0.4})
    rows = rows_by_key(out)
    assert set(rows) == set(images)  # nothing lost, nothing invented
    assert rows["s1_00002"]["status"] == "rejected" and rows["s1_00002"]["reason"] == "corrupt_image"
    assert rows["s1_00005"]["status"] == "rejected" and rows["s1_00005"]["reason"] == "missing_caption"
    refused = rows["s0_00003"]
    assert refused["status"] == "failed" and refused["reason"] == "caption_refused"
    assert "refuse-me" in refused["message"] and refused["brightness"] is None
    scored = {k: r for k, r in rows.items() if r["status"] == "scored"}
    assert len(scored) == len(images) - 3
    for key, r in scored.items():
        assert r["brightness"] == pytest.approx(expected_brightness(images[key]), abs=1e-5)
        assert r["kept"] == (r["brightness"] >= 0.4)
    # Rows keep tar order within each shard.
    for s, url in enumerate(urls):
        in_shard = sorted((r for r in rows.values() if r["shard"] == url), key=lambda r: r["index"])
        assert [r["index"] for r in in_shard] == list(range(len(in_shard)))
        assert [r["key"] for r in in_shard] == sorted(k for k in images if k.startswith(f"s{s}_"))
    # The summary counts what the files hold, on disk and returned.
    assert summary.rows == len(images) and summary.scored == len(scored)
    assert summary.status == {"scored": len(scored), "failed": 1, "rejected": 2}
    assert summary.reasons == {"caption_refused": 1, "corrupt_image": 1, "missing_caption": 1}
    kept = sum(r["kept"] for r in rows.values())
    assert summary.thresholds["brightness"] == {"min": 0.4, "kept": kept, "dropped": len(scored) - kept,
                                                "no_score": 3}
    on_disk = json.load(open(out / "summary.json"))
    assert on_disk["status"] == summary.status and on_disk["kept"] == kept
    assert on_disk["columns"]["brightness"]["histogram"]["counts"] and sum(
        on_disk["columns"]["brightness"]["histogram"]["counts"]) == len(scored)
    assert open(out / "histograms.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "brightness >= 0.4: kept" in summary.format_text()


def test_two_scorers_in_one_pass_and_jsonl(shards, tmp_path):
    urls, images = shards
    out = tmp_path / "out"
    summary = run(urls, out, scorers=[BrightnessScorer(fail_word="refuse-me"), ByteLengthScorer()],
                  format="jsonl", batch_size=8)
    rows = rows_by_key(out, "jsonl")
    assert set(rows) == set(images)
    refused = rows["s0_00003"]  # the brightness scorer refused it, the caption scorer did not
    assert refused["status"] == "partial" and refused["reason"] == "caption_refused"
    assert refused["caption_bytes"] == len("sample 3 of shard 0 refuse-me") and refused["brightness"] is None
    assert rows["s2_00011"]["caption_bytes"] == len("sample 11 of shard 2")
    assert summary.status["partial"] == 1 and summary.scored == len(images) - 2


def test_model_workers_in_separate_processes_give_the_same_tables(shards, tmp_path):
    urls, images = shards
    local = run(urls, tmp_path / "local", batch_size=4)
    multi = run(urls, tmp_path / "multi", batch_size=4, devices=["cpu", "cpu"], workers=1)
    a, b = rows_by_key(tmp_path / "local"), rows_by_key(tmp_path / "multi")
    assert set(a) == set(b) == set(images)
    for key in a:
        assert {k: v for k, v in a[key].items() if k != "brightness"} == \
               {k: v for k, v in b[key].items() if k != "brightness"}
        assert a[key]["brightness"] == pytest.approx(b[key]["brightness"], abs=1e-6)
    # Both processes really scored: work went to each, and together they scored each sample once.
    assert [w["worker"] for w in multi.workers] == [0, 1]
    assert all(w["batches"] >= 1 for w in multi.workers)
    assert sum(w["backoff"]["bright"]["scored"] for w in multi.workers) == multi.scored == local.scored


def test_a_run_that_scores_nothing_is_an_error_with_the_counts(tmp_path):
    urls, _ = make_shards(tmp_path / "shards", [5, 4], bad={0: range(5), 1: range(4)})
    with pytest.raises(NothingScoredError, match=r"no sample was scored: 9 row\(s\)[\s\S]*9 corrupt_image"):
        run(urls, tmp_path / "out")
    assert json.load(open(tmp_path / "out" / "summary.json"))["reasons"] == {"corrupt_image": 9}


def test_configuration_errors_raise_before_scoring(shards, tmp_path):
    urls, _ = shards
    with pytest.raises(ConfigError, match="unknown scorer 'nope'"):
        run(urls, tmp_path / "a", scorers=["nope"])
    with pytest.raises(ConfigError, match=r"threshold\(s\) on \['clip_score'\].*brightness, bright_wide"):
        run(urls, tmp_path / "b", min_clip=0.3)
    with pytest.raises(ConfigError, match="use --caption-key txt"):
        run(urls, tmp_path / "c", caption_key="json:caption", devices=["cpu", "cpu"])
    assert not os.path.exists(tmp_path / "c" / "done") or not os.listdir(tmp_path / "c" / "done")
    with pytest.raises(ConfigError, match="batch_size must be 'auto' or an integer"):
        run(urls, tmp_path / "d", batch_size="lots")
    with pytest.raises(ConfigError, match=r"scorer 'bright'.*unexpected keyword.*its options are: size, sim"):
        run(urls, tmp_path / "e", scorers=["scorekit:BrightnessScorer"], scorer_options={"bright": {"colour": 1}})
    run(urls, tmp_path / "f")
    with pytest.raises(ConfigError, match="already holds a scoring run .3 shard.s. done.*--resume"):
        run(urls, tmp_path / "f")


def test_a_scorer_that_fails_on_everything_stops_the_run(shards, tmp_path):
    urls, _ = shards
    with pytest.raises(ScorerError, match="failed on the first 8 samples.*model weights are garbage"):
        run(urls, tmp_path / "out", scorers=[BrokenScorer()])


def test_errors_of_one_sample_stay_with_that_sample(tmp_path):
    urls, images = make_shards(tmp_path / "shards", [9], refused={0: (4,)})
    out = tmp_path / "out"
    run(urls, out, scorers=[BrightnessScorer(error_word="refuse-me")], batch_size=8)
    rows = rows_by_key(out)
    assert rows["s0_00004"]["status"] == "failed" and rows["s0_00004"]["reason"] == "score_error"
    assert "this input breaks the model" in rows["s0_00004"]["message"]
    assert all(r["status"] == "scored" for k, r in rows.items() if k != "s0_00004")


def _raw_member_bytes(path):
    """{member name: its exact bytes in the tar, headers included}, computed independently."""
    opener = gzip.open if path.endswith("gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            end = info.offset_data + -(-info.size // 512) * 512
            out[info.name] = data[info.offset:end]
    return out


def test_filtered_shards_copy_the_original_member_bytes_of_kept_samples(tmp_path):
    long_key = "deep/" + "x" * 120  # a GNU long-name header in front of its members
    members = []
    for i, color in enumerate([(250, 250, 250), (5, 5, 5), (240, 240, 200), (10, 20, 30)]):
        key = long_key if i == 2 else f"k{i}"
        members += [(f"{key}.jpg", image_bytes(color=color)), (f"{key}.txt", f"caption {i}"),
                    (f"{key}.json", {"id": i})]
    url = write_shard(tmp_path / "a.tar", members)
    gz_url = str(tmp_path / "b.tar.gz")
    with open(url, "rb") as f, gzip.open(gz_url, "wb") as g:
        g.write(f.read())
    out, filtered = tmp_path / "out", tmp_path / "filtered"
    run([url, gz_url], out, min_scores={"brightness": 0.5}, write_shards=str(filtered))
    kept = {r["key"] for r in read_rows(str(out / "scores" / "a.parquet")) if r["kept"]}
    assert kept == {"k0", long_key}
    source = _raw_member_bytes(url)
    for name in ("a.tar", "b.tar.gz"):
        path = str(filtered / name)
        copied = _raw_member_bytes(path)
        assert list(copied) == [n for n in source if n.rsplit(".", 1)[0] in kept]  # order kept too
        assert all(copied[n] == source[n] for n in copied)  # headers and data, byte for byte
    assert open(filtered / "b.tar.gz", "rb").read(2) == b"\x1f\x8b"
    # no temporaries left; the sample table and per-shard stats beside the shards
    assert sorted(os.listdir(filtered)) == ["a.tar", "a_stats.json", "b.tar.gz", "b_stats.json", "sizes.json"]


def test_write_shards_leaves_sizes_json_that_open_clip_reads_and_resume_keeps_it_right(shards, tmp_path):
    from open_clip_train.data import get_dataset_size
    urls, _ = shards
    out, kept = tmp_path / "out", tmp_path / "kept"
    (kept).mkdir()
    (kept / "sizes.json").write_text(json.dumps({"other-shard.tar": 5}))  # someone else's entry: kept
    opts = dict(min_scores={"brightness": 0.4}, write_shards=str(kept), batch_size=4)
    run(urls[:2], out, **opts)
    run(urls, out, resume=True, **opts)  # the third shard added by a resumed run
    rows = rows_by_key(out)
    kept_per_shard = {}
    for r in rows.values():
        name = os.path.basename(r["shard"])
        kept_per_shard[name] = kept_per_shard.get(name, 0) + bool(r["kept"])
    sizes = json.loads((kept / "sizes.json").read_text())
    assert sizes == {**kept_per_shard, "other-shard.tar": 5}
    assert 0 < sum(kept_per_shard.values()) < len(rows)
    for name, n in kept_per_shard.items():
        with tarfile.open(kept / name) as tar:  # the count is what the shard holds
            assert len({m.name.split(".", 1)[0] for m in tar}) == n
        stats = json.loads((kept / (name[:-len(".tar")] + "_stats.json")).read_text())
        assert stats["successes"] == n and stats["bytes"] == os.path.getsize(kept / name)
        assert list(stats["sources"].values()) == [n]
    total, num = get_dataset_size("::".join(str(kept / name) for name in sorted(kept_per_shard)))  # its --train-data
    assert (total, num) == (sum(kept_per_shard.values()), 3)
    # A shard scored again (its marker gone) with another threshold sets its own entry anew.
    first = sorted(kept_per_shard)[0]
    os.remove(out / "done" / (first[:-len(".tar")] + ".json"))
    run(urls, out, resume=True, overwrite=False, **opts)
    assert json.loads((kept / "sizes.json").read_text()) == sizes
    (kept / first).unlink()
    (kept / "sizes.json").write_text(json.dumps({**sizes, first: 999}))  # stale entry
    os.remove(out / "done" / (first[:-len(".tar")] + ".json"))
    run(urls, out, resume=True, **opts)
    assert json.loads((kept / "sizes.json").read_text()) == sizes


def test_loader_filters_by_the_score_files(shards, tmp_path):
    import wdsfilter
    urls, images = shards
    out = tmp_path / "out"
    run(urls[:2], out, min_scores={"brightness": 0.4})
    rows = rows_by_key(out)
    expect = sorted(k for k, r in rows.items() if r["kept"])
    below = sum(1 for r in rows.values() if r["status"] == "scored" and not r["kept"])
    for workers in (0, 2):
        loader = wdsfilter.loader(urls, scores=str(out), min_scores={"brightness": 0.4}, output="dict",
                                  batch_size=5, num_workers=workers)
        keys = sorted(s["__key__"] for batch in loader for s in batch)
        assert keys == expect
        stats = loader.stats
        assert stats.dropped["filtered_by_score"] == below
        # The refused sample has a row without a score, and shard 2 was never scored; the corrupt
        # one is counted by the reason the scoring run rejected it (issue 35 item 13). The filter
        # runs before decoding: the corrupt image is never decoded.
        assert stats.dropped["no_score"] == 1 + sum(1 for k in images if k.startswith("s2_"))
        assert stats.dropped["rejected: corrupt_image"] == 1 and "corrupt_image" not in stats.dropped
    with pytest.raises(ConfigError, match=r"thresholds on clip_score, which the score files .* brightness"):
        wdsfilter.loader(urls, scores=str(out), min_clip=0.3)
    with pytest.raises(ConfigError, match="no done/ folder"):
        wdsfilter.loader(urls, scores=str(tmp_path), min_scores={"brightness": 0.4})


def test_the_loader_refuses_score_files_of_a_shard_that_changed_since(shards, tmp_path):
    """Scores are joined to samples by key: a shard re-created under its name with the same keys
    would be filtered by scores of other bytes. Its completion marker records the shard's size and
    modification time, so the loader refuses it before training; a score file damaged since it was
    written is not used either (its samples have no score, counted)."""
    import wdsfilter
    urls, images = shards
    out = tmp_path / "out"
    run(urls, out)
    other, _ = make_shards(tmp_path / "other", [10, 8, 12])
    os.replace(other[1], urls[1])  # its keys and one more, other bytes (no corrupt image, every caption)
    with pytest.raises(ConfigError, match=r"1 shard\(s\) changed since they were scored .*shard-0001.tar"):
        wdsfilter.loader(urls, scores=str(out), min_scores={"brightness": 0.0})
    run(urls, out, resume=True)  # scored again: accepted
    score_file = next(p for p in (out / "scores").iterdir() if p.name.startswith("shard-0002"))
    score_file.write_bytes(score_file.read_bytes()[:50])
    loader = wdsfilter.loader(urls, scores=str(out), min_scores={"brightness": 0.0}, output="dict", batch_size=5)
    assert not any(s["__key__"].startswith("s2_") for batch in loader for s in batch)
    assert loader.stats.dropped["no_score"] >= sum(1 for k in images if k.startswith("s2_"))


def test_a_shard_given_twice_is_scored_once(shards, tmp_path, caplog):
    # As a file, again under another spelling, and inside its folder: two readers of one shard
    # would write its rows twice or overwrite them with an empty table.
    urls, images = shards
    again = os.path.join(os.path.dirname(urls[0]), ".", os.path.basename(urls[0]))
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="wdsfilter"):
        summary = run([urls[0], again, os.path.dirname(urls[0])], out, batch_size=1, workers=2)
    assert set(rows_by_key(out)) == set(images) and summary.rows == len(images)
    assert summary.shards == len(urls)
    assert "2 shard(s) given more than once are scored once" in caplog.text


def test_scorers_get_the_runs_stage_config(tiny_clip):
    from wdsfilter.score import build_config
    from wdsfilter.score.scorerset import resolve_scorers
    cfg = build_config("o", ["clip", "ocr"], model="local-dir:" + tiny_clip, max_pixels=1_000_000,
                       image_token="<img>")
    clip, ocr = resolve_scorers(cfg)
    assert ocr.max_pixels == clip.max_pixels == 1_000_000 and ocr.config is cfg.stage
    assert clip.cleaner.clean("<img> a red <image> square")[0].split() == ["a", "red", "square"]


def test_a_first_shard_longer_than_the_probe_with_no_captions_raises_before_scoring(tmp_path):
    # The probe reads at most probe_scan samples; the key check reads the first shard to the end.
    urls, _ = make_shards(tmp_path / "shards", [30, 5], no_caption={0: tuple(range(30))})
    with pytest.raises(ConfigError, match="no sample of the first shard .* has a caption"):
        run(urls, tmp_path / "out", probe_scan=5, workers=1)
    assert not os.path.exists(tmp_path / "out" / "done") or not os.listdir(tmp_path / "out" / "done")


def test_a_pipe_shard_that_fails_with_write_shards_is_failed_not_fatal(shards, tmp_path):
    # Its command prints the shard whenever it is read (key check, probe, scoring) and fails only
    # while the filtered shard is written (the writer's local copy `.source.tmp-*` exists then):
    # that shard gets no marker.
    urls, images = shards
    out, kept = tmp_path / "out", tmp_path / "kept"
    broken = f"pipe:if ls {kept}/.source.tmp-* >/dev/null 2>&1; then exit 1; else cat {urls[0]}; fi"
    summary = run([broken, urls[1]], out, write_shards=str(kept), allow_pipe=True, batch_size=4)
    assert [f["url"] for f in summary.shards_failed] == [broken]
    assert "filtered shard not written" in summary.shards_failed[0]["reason"]
    assert summary.shards_scored == 1 and sorted(f for f in os.listdir(kept) if f.endswith(".tar")) == [os.path.basename(urls[1])]
    assert sorted(os.listdir(out / "done")) == [os.path.basename(urls[1])[:-4] + ".json"]


def test_score_file_column_types(tmp_path):
    # A score column's Parquet type follows its values; one with no value at all is float64.
    import numpy as np
    import pyarrow.parquet as pq
    from wdsfilter.runfolder.tables import write_table
    columns = {"none": [None, None, None], "int": [1, None, 3], "mixed": [1, 2.5, None], "nan": [0.5, float("nan"), None],
               "flag": [True, None, False], "text": ["a", None, "b"], "np64": [np.float64(1.5), 2, None],
               "np32": [np.float32(1.5), None, np.float32(2)], "list": [[1, 2], None, [3]]}
    rows = [dict({"key": str(i), "shard": "s.tar", "index": i, "status": "scored", "reason": None, "message": None,
                  "kept": True}, **{c: v[i] for c, v in columns.items()}) for i in range(3)]
    path = str(tmp_path / "s.parquet")
    write_table(rows, list(columns), path, "parquet")
    types = {f.name: str(f.type) for f in pq.read_schema(path)}
    assert types == {"key": "string", "shard": "string", "index": "int64", "status": "string", "reason": "string",
                     "message": "string", "kept": "bool", "caption": "string", "url": "string", "uid": "string",
                     "none": "double", "int": "int64", "mixed": "double",
                     "nan": "double", "flag": "bool", "text": "string", "np64": "double", "np32": "float",
                     "list": "list<element: int64>"}
    write_table([], list(columns), path, "parquet")  # a shard with no rows: every score column float64
    assert {str(f.type) for f in pq.read_schema(path) if f.name in columns} == {"double"}
