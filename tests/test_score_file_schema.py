"""Score files as the tools users read them with see them: a folder of score files is one table.
pyarrow.dataset (what pandas.read_parquet(folder), Ray and HF datasets use) and polars refuse a
folder whose files type one column differently, so a shard where no sample was scored (a column of
nulls), a shard of no sample at all (an empty tar) and a shard of videos must have the schema of a
shard of scored images."""
import os
import subprocess

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from click.testing import CliRunner

from shardkit import write_shard, image_text_members
from scorekit import BrightnessScorer, NumpyScorer
from wdsfilter.cli import main
from wdsfilter.score import score

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SS = os.path.join(REPO, "sample_shards")


def _empty_tar(path):
    subprocess.run(["tar", "-cf", str(path), "-T", "/dev/null"], check=True)  # GNU tar: two zero blocks
    return str(path)


def _one_schema(scores):
    files = sorted(os.path.join(scores, f) for f in os.listdir(scores))
    schemas = {f: pq.read_schema(f).remove_metadata() for f in files}
    first = next(iter(schemas.values()))
    assert all(s.equals(first) for s in schemas.values()), {f: str(s) for f, s in schemas.items()}
    return ds.dataset(scores, format="parquet").to_table(), first


def test_clip_score_files_share_one_schema_across_shards_with_no_score(tiny_clip, tmp_path):
    # The videos shard without a video --image-key: every sample rejected (missing_image), every
    # CLIP column null; written as float64 before, so the folder could not be read as one table.
    empty = _empty_tar(tmp_path / "empty-000000.tar")
    shards = [os.path.join(SS, "images-000000.tar"), os.path.join(SS, "videos-000000.tar"), empty]
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["score", *shards, "--out", str(out), "--model", "local-dir:" + tiny_clip,
                                  "--device", "cpu", "--no-progress", "--workers", "0"])
    assert r.exit_code == 0, r.output
    table, schema = _one_schema(str(out / "scores"))
    types = {f.name: str(f.type) for f in schema}
    assert types["clip_score"] == "double" and types["clip_frames"] == "int64" and types["clip_truncated"] == "bool"
    assert types["clip_score_frames"] == "list<element: double>" and types["key"] == "string"
    rows = table.to_pylist()
    assert len(rows) == 32 + 8 and {r["status"] for r in rows if "videos" in r["shard"]} == {"rejected"}
    assert all(r["key"].isdigit() and len(r["key"]) == 9 for r in rows)  # keys stay strings, zeros kept
    # An empty shard's file has no row group: HF datasets' Parquet reader takes its batch size from
    # the first row group and fails on one of 0 rows ("BatchSize must be greater than 0").
    assert pq.ParquetFile(str(out / "scores" / "empty-000000.parquet")).metadata.num_row_groups == 0


class NanScorer(BrightnessScorer):
    """Brightness, NaN for a sample whose caption says so, and a declared integer column that is
    null in a shard where every sample is refused."""

    name = "nan"

    def columns(self):
        return ["nan_luma", "nan_count"]

    def column_types(self):
        return {"nan_count": "int64"}

    def score_batch(self, inputs):
        rows = super().score_batch(inputs)
        return [{"nan_luma": float("nan") if i["key"].endswith("1") else r["brightness"], "nan_count": 1}
                for i, r in zip(inputs, rows)]


def test_declared_types_and_nan_as_null(tmp_path):
    good = write_shard(str(tmp_path / "a-000000.tar"), image_text_members(4))
    refused = write_shard(str(tmp_path / "b-000000.tar"),
                          image_text_members(3, start=10, caption="refuse-me"))
    out = tmp_path / "out"
    score([good, refused], out=str(out), scorers=[NanScorer(fail_word="refuse-me")], device="cpu", progress=False,
          workers=0)
    table, schema = _one_schema(str(out / "scores"))
    assert str(schema.field("nan_count").type) == "int64" and str(schema.field("nan_luma").type) == "double"
    by_key = {r["key"]: r for r in table.to_pylist()}
    # A NaN score is written as null, as JSONL writes it: duckdb and polars count NaN >= x as true,
    # where wdsfilter's thresholds count it as no score.
    assert by_key["000001"]["nan_luma"] is None and by_key["000000"]["nan_luma"] is not None
    assert table.column("nan_luma").null_count == 1 + 3


class LogScorer(BrightnessScorer):
    """log(brightness): -inf for a black image, as a scorer's log(0) gives."""

    name = "log"

    def columns(self):
        return ["log_luma"]

    def score_batch(self, inputs):
        import math
        return [{"log_luma": math.log(r["brightness"]) if r["brightness"] > 0 else float("-inf")}
                for r in super().score_batch(inputs)]


def test_an_infinite_score_is_left_out_of_the_summary_which_stays_json(tmp_path):
    # Before: the histogram of a column holding -inf divided by an infinite range and the run
    # ended in "internal error: ValueError: cannot convert float NaN to integer" after scoring
    # everything, with no summary.json (and --resume ended the same way).
    from shardkit import image_bytes
    import json
    members = []
    for i, color in enumerate([(0, 0, 0), (200, 200, 200), (90, 90, 90)]):
        members += [(f"{i:06d}.jpg", image_bytes(color=color)), (f"{i:06d}.txt", "a square")]
    out = tmp_path / "out"
    summary = score([write_shard(str(tmp_path / "s-000000.tar"), members)], out=str(out), scorers=[LogScorer()],
                    device="cpu", progress=False, workers=0)
    assert summary.rows == 3 and "1 infinite" in summary.format_text()

    def refuse(token):
        raise AssertionError(f"summary.json holds {token}, which is not JSON")
    data = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    col = data["columns"]["log_luma"]
    assert col["count"] == 2 and col["infinite"] == 1 and sum(col["histogram"]["counts"]) == 2


def test_numpy_scores_in_jsonl(tmp_path):
    # json cannot write numpy values: a JSONL run ended in "internal error: TypeError: Object of
    # type float32 is not JSON serializable" at its first shard (Parquet took them).
    import json
    out = tmp_path / "out"
    score([write_shard(str(tmp_path / "s-000000.tar"), image_text_members(3))], out=str(out), scorers=[NumpyScorer()],
          device="cpu", progress=False, workers=0, format="jsonl")
    rows = [json.loads(line) for line in (out / "scores" / "s-000000.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(isinstance(r["np_luma"], float) and len(r["np_frames"]) == 2 for r in rows)
