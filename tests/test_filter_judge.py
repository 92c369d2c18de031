"""`wdsfilter filter` counts a Parquet score file column-wise (judge.count_table) when no report
looks at its rows: the same counts, and the drop reasons in the same order, as judging it row by
row with the one keep rule (run.judge_shard -> judge.count_rows)."""
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wdsfilter.runfolder.judge import Threshold, count_rows, count_table, judge_shard
from wdsfilter.runfolder import ScoredShard
from wdsfilter.core.thresholds import Bound


def score_table(path, n, seed, with_ocr=True, int_column=False):
    """Every kind of row: scored, partial, rejected, failed and null statuses, repeated keys,
    null and NaN scores, values tied with the cuts."""
    rng = np.random.default_rng(seed)
    keys = [f"{i:05d}" for i in range(n)]
    for i in rng.choice(n, n // 20, replace=False):  # a key repeated later in the shard
        keys[i] = keys[max(0, i - 3)]
    status = rng.choice(["scored", "scored", "scored", "partial", "rejected", "failed"], n).astype(object)
    status[rng.random(n) < 0.01] = None
    reason = [None if s in ("scored", "partial") else rng.choice(["corrupt_image", "no_caption", None])
              for s in status]
    clip = np.round(rng.normal(0.3, 0.05, n), 2)  # coarse: many rows tie with a cut
    clip[rng.random(n) < 0.03] = np.nan
    columns = {"key": pa.array(keys), "index": pa.array(np.arange(n)), "status": pa.array(list(status), pa.string()),
               "reason": pa.array(reason, pa.string()), "message": pa.nulls(n, pa.string()),
               "clip_score": pa.array(clip, mask=rng.random(n) < 0.03)}
    if with_ocr:
        area = rng.integers(0, 10, n) if int_column else rng.random(n)
        columns["ocr_area"] = pa.array(area, mask=rng.random(n) < 0.02)
    pq.write_table(pa.table(columns), path)
    return ScoredShard(url=f"/data/{seed}.tar", name=str(seed), score_file=str(path))


THRESHOLDS = [
    [],
    [Threshold(Bound("clip_score", 0.3, True), "--min clip_score=0.3")],
    [Threshold(Bound("clip_score", 0.28, True), "--top clip_score=60%"),
     Threshold(Bound("ocr_area", 0.5, False), "--max ocr_area=0.5")],
    [Threshold(Bound("ocr_area", 4, False), "--max ocr_area=4"),
     Threshold(Bound("clip_score", 0.35, False), "--bottom clip_score=90%"),
     Threshold(Bound("clip_score", 0.25, True), "--min clip_score=0.25")],
]


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=["none", "one", "two", "three"])
@pytest.mark.parametrize("kind", ["float", "int", "no_ocr_column"])
def test_a_table_counted_column_wise_matches_row_by_row(tmp_path, thresholds, kind):
    for seed in range(3):
        shard = score_table(tmp_path / f"{kind}-{seed}.parquet", 3000, seed, with_ocr=kind != "no_ocr_column",
                            int_column=kind == "int")
        by_rows = count_rows(judge_shard(shard, thresholds), thresholds)
        by_table = count_table(shard.score_file, thresholds)
        assert by_table == by_rows
        assert by_rows.rows == 3000 and 0 < len(by_rows.reasons)  # the shard has rows of every kind
        if thresholds:
            assert any(r.startswith("no ") for r, _ in by_rows.reasons)
            assert math.fsum(c["no_score"] for c in by_rows.thresholds) > 0


def test_a_table_with_rows_without_a_key_is_left_to_the_row_by_row_count(tmp_path):
    path = tmp_path / "nokey.parquet"
    pq.write_table(pa.table({"key": pa.array(["a", None, None]), "status": pa.array(["scored"] * 3)}), path)
    assert count_table(str(path), []) is None


def test_the_writer_records_unique_keys_and_the_count_then_skips_reading_them(tmp_path):
    """write_table records in the footer that no key repeats; count_table then reads no key column
    (most of its reading) and still counts as row by row; a table with a repeated key has no such
    record, and its duplicate is counted as one."""
    from wdsfilter.runfolder.tables import unique_keys, write_table
    thresholds = THRESHOLDS[2]
    for keys in (["a", "b", "c", "d"], ["a", "b", "a", "d"]):
        rows = [{"key": k, "index": i, "status": "scored", "clip_score": 0.2 + 0.05 * i, "ocr_area": 0.1 * i}
                for i, k in enumerate(keys)]
        path = str(tmp_path / f"{''.join(keys)}.parquet")
        write_table(rows, {"clip_score": "float64", "ocr_area": "float64"}, path, "parquet")
        shard = ScoredShard(url="/data/x.tar", name="x", score_file=path)
        assert unique_keys(path) == (len(set(keys)) == len(keys))
        by_table = count_table(path, thresholds)
        assert by_table == count_rows(judge_shard(shard, thresholds), thresholds)
        assert ("duplicate key in shard" in dict(by_table.reasons)) == (not unique_keys(path))


def test_filter_scores_takes_a_selection_its_keywords_and_the_old_names_alike(tmp_path):
    """filter_scores(selection=) and its keywords (min_scores=, ...) count as the old names did
    (the --min/--max texts, thresholds=Thresholds), which still work with a DeprecationWarning."""
    import json
    import os

    from wdsfilter.filtering import filter_scores
    from wdsfilter.core.thresholds import Thresholds
    os.makedirs(tmp_path / "run" / "scores")
    os.makedirs(tmp_path / "run" / "done")
    shard = score_table(tmp_path / "run" / "scores" / "s.parquet", 500, 7)
    with open(tmp_path / "run" / "done" / "s.json", "w") as f:
        json.dump({"url": shard.url, "name": "s", "score_file": shard.score_file}, f)
    from wdsfilter.core.selection import Selection
    with pytest.warns(DeprecationWarning, match="mins= is deprecated; use min_scores="):
        texts = filter_scores(str(tmp_path / "run"), mins=["clip_score=0.3"], maxes=["ocr_area=0.5"], dry_run=True)
    with pytest.warns(DeprecationWarning, match="thresholds= is deprecated"):
        typed = filter_scores(str(tmp_path / "run"), thresholds=Thresholds.build({"clip_score": 0.3}, {"ocr_area": 0.5}),
                              dry_run=True)
    keywords = filter_scores(str(tmp_path / "run"), min_scores={"clip_score": 0.3}, max_scores={"ocr_area": 0.5},
                             dry_run=True)
    selection = filter_scores(str(tmp_path / "run"), Selection.parse(["clip_score=0.3"], ["ocr_area=0.5"]),
                              dry_run=True)
    for other in (typed, keywords, selection):
        assert (other.kept, other.counts, other.reasons) == (texts.kept, texts.counts, texts.reasons)
    assert [t.given for t in typed.thresholds] == ["--min clip_score=0.3", "--max ocr_area=0.5"]
    assert 0 < typed.kept < 500


@pytest.mark.parametrize("statuses,stats,footer_says", [
    (["scored"], True, True),  # the footer's statistics say every row is kept: the status column is not read
    (["scored", "partial"], True, False),  # every status in its dictionary is kept
    (["scored", "partial"], False, False),
    (["scored", "rejected"], True, False),  # the rejected rows coded row by row
    (["scored"], False, False),  # no statistics: read
])
def test_the_status_column_is_read_only_where_the_footer_leaves_it_open(tmp_path, statuses, stats, footer_says):
    """count_table skips the status column where every row group's statistics say one kept status
    and no null, and where its dictionary holds kept statuses only; the counts stay row by row's."""
    from wdsfilter.runfolder.judge import _footer_all_kept
    rng = np.random.default_rng(7)
    n = 4000
    status = [statuses[0]] * n if len(statuses) == 1 else list(rng.choice(statuses, n))
    if "rejected" in statuses:
        status[:5] = ["scored", "rejected", "scored", "rejected", "scored"]
    clip = np.round(rng.normal(0.3, 0.05, n), 2)
    table = pa.table({"key": pa.array([f"{i:05d}" for i in range(n)]), "index": pa.array(np.arange(n)),
                      "status": pa.array(status, pa.string()), "reason": pa.nulls(n, pa.string()),
                      "clip_score": pa.array(clip, mask=rng.random(n) < 0.02)})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path, row_group_size=1000, write_statistics=stats)  # four row groups
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == 4
    assert _footer_all_kept(pf.metadata, pf.schema_arrow) == footer_says
    shard = ScoredShard(url="/data/x.tar", name="x", score_file=path)
    for thresholds in THRESHOLDS[:2]:
        by_table = count_table(path, thresholds)
        assert by_table == count_rows(judge_shard(shard, thresholds), thresholds)
        assert by_table.kept < n if thresholds or "rejected" in statuses else by_table.kept == n


def test_reasons_that_are_not_strings_are_left_to_the_row_by_row_count(tmp_path):
    """A reason column of numbers (not what `wdsfilter score` writes) cannot be read as codes: the
    column-wise count steps aside (None) and the row-by-row judge counts the file."""
    path = str(tmp_path / "odd.parquet")
    pq.write_table(pa.table({"key": pa.array(["a", "b", "c"]), "index": pa.array([0, 1, 2]),
                             "status": pa.array(["scored", "rejected", "failed"]), "reason": pa.array([None, 7, 8]),
                             "clip_score": pa.array([0.5, 0.1, None])}), path)
    assert count_table(path, []) is None
    shard = ScoredShard(url="/data/x.tar", name="x", score_file=path)
    by_rows = count_rows(judge_shard(shard, []), [])
    assert by_rows.rows == 3 and by_rows.kept == 1
