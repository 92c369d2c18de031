"""The failure ledger (failures/<shard>.parquet, failures.parquet): every sample that did not end
in a row of status scored is listed with its reason, stage and member, transient or not; failed
shards are listed whole; the run's summary and report.html sum it up by reason."""
import json
import os

import pytest

from scorekit import BrightnessScorer, make_shards
from shardkit import write_shard
from wdsfilter.score import score
from wdsfilter.score.ledger import TRANSIENT, is_transient
from wdsfilter.runfolder.tables import read_rows


def run(urls, out, scorers=None, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    kw.setdefault("workers", 0)
    return score(urls, out=str(out), scorers=scorers or [BrightnessScorer(fail_word="refuse-me")], **kw)


def all_rows(out):
    folder = os.path.join(out, "scores")
    return [r for f in sorted(os.listdir(folder)) for r in read_rows(os.path.join(folder, f))]


@pytest.fixture
def shards(tmp_path):
    # shard 0: sample 3 refused by prepare(), sample 4's caption makes score_batch raise;
    # shard 1: sample 2 a corrupt JPEG, sample 5 without caption.
    return make_shards(tmp_path / "shards", [10, 7, 12], refused={0: (3,)}, bad={1: (2,)}, no_caption={1: (5,)})


def test_every_sample_not_scored_is_in_the_ledger_with_its_reason(shards, tmp_path):
    pd = pytest.importorskip("pandas")
    urls, images = shards
    out = tmp_path / "out"
    summary = run(urls, out, scorers=[BrightnessScorer(fail_word="refuse-me", error_word="sample 4 of shard 0")],
                  batch_size=4, workers=1)
    ledger = pd.read_parquet(out / "failures.parquet")
    rows = all_rows(out)
    not_scored = {(r["key"], r["index"], r["status"], r["reason"]) for r in rows if r["status"] != "scored"}
    assert {(e.key, e.index, e.status, e.reason) for e in ledger.itertuples()} == not_scored
    assert len(ledger) == len(not_scored) == 4
    by_key = ledger.set_index("key")
    assert by_key.loc["s1_00002", ["stage", "member", "transient"]].tolist() == ["decode", "s1_00002.jpg", False]
    assert by_key.loc["s1_00005", ["stage", "reason", "transient"]].tolist() == ["select", "missing_caption", False]
    assert by_key.loc["s0_00003", ["stage", "reason", "transient"]].tolist() == ["prepare", "caption_refused", False]
    # a scorer that raised on one sample of a batch: retried alone, that sample failed, the others scored
    assert by_key.loc["s0_00004", ["stage", "reason", "transient"]].tolist() == ["score", "score_error", True]
    assert "breaks the model" in by_key.loc["s0_00004", "message"]
    assert set(ledger.attempts) == {1}
    # appended per shard as the run goes: one file per shard, the merged file their union
    per_shard = pd.concat([pd.read_parquet(out / "failures" / f) for f in sorted(os.listdir(out / "failures"))])
    assert sorted(per_shard.key) == sorted(ledger.key)
    # the summary by reason, in summary.json and in the printed summary
    saved = json.loads((out / "summary.json").read_text())["failures"]
    assert saved["score_error"] == {"samples": 1, "shards": 1, "transient": True}
    assert saved["corrupt_image"]["transient"] is False
    text = summary.format_text(histograms=False)
    assert "failure ledger" in text and "score_error (transient: --retry-failed)" in text
    # report.html: the ledger's counts by reason; the samples themselves are shown once, as thumbnails
    # under "Dropped, by reason" (issue 35 item 6: not twice)
    html = (out / "report.html").read_text()
    section = html[html.index("Failure ledger"):]
    assert "score_error" in section and section.count("<img") == 0 and "shown above" in section
    dropped = html[html.index("Dropped, by reason"):html.index("Failure ledger")]
    assert "not scored: score_error" in dropped and dropped.count("<img") == 3  # the corrupt JPEG has no preview


def test_duckdb_reads_the_ledger_while_and_after_the_run(shards, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    urls, _ = shards
    out = tmp_path / "out"
    run(urls, out)
    merged = duckdb.sql(f"SELECT reason, count(*) FROM '{out}/failures.parquet' GROUP BY reason ORDER BY reason")
    per_shard = duckdb.sql(f"SELECT reason, count(*) FROM '{out}/failures/*.parquet' GROUP BY reason ORDER BY reason")
    assert merged.fetchall() == per_shard.fetchall() == [("caption_refused", 1), ("corrupt_image", 1),
                                                         ("missing_caption", 1)]


def test_a_shard_that_fails_is_listed_whole_and_its_entry_goes_when_it_is_scored(shards, tmp_path):
    pd = pytest.importorskip("pandas")
    urls, _ = shards
    junk = tmp_path / "shards" / "shard-0003.tar"
    junk.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n" * 20)
    out = tmp_path / "out"
    summary = run(urls + [str(junk)], out)
    assert [f["url"] for f in summary.shards_failed] == [str(junk)]
    ledger = pd.read_parquet(out / "failures.parquet")
    whole = ledger[ledger["index"] == -1]
    assert whole[["shard", "status", "reason", "transient"]].values.tolist() == [[str(junk), "shard", "not_a_tar",
                                                                                  False]]
    # replaced by a real shard: --resume scores it and its file now lists its rows, not the failure
    write_shard(str(junk), [("k0.jpg", b"not a jpeg"), ("k0.txt", "a caption")])
    run(urls + [str(junk)], out, resume=True)
    ledger = pd.read_parquet(out / "failures.parquet")
    assert -1 not in set(ledger["index"]) and "not_a_tar" not in set(ledger.reason)


def test_which_reasons_are_transient_is_decided_in_one_place():
    for reason in ("out_of_memory", "score_error", "prepare_error", "device_error", "worker_died", "read_failed"):
        assert reason in TRANSIENT and is_transient(reason)
    for reason in ("corrupt_image", "missing_caption", "caption_refused", "not_a_tar"):
        assert not is_transient(reason)
    assert is_transient("caption_refused;out_of_memory")  # two scorers, one of them transient


def test_a_scorer_whose_prepare_raises_on_every_sample_stops_the_run(shards, tmp_path):
    from faultkit import FlakyScorer
    urls, images = shards
    every = tmp_path / "every"
    every.write_text("\n".join(images))
    with pytest.raises(RuntimeError, match="prepared none: a bug in the scorer"):
        run(urls, tmp_path / "out", scorers=[FlakyScorer(prepare_file=str(every))])
