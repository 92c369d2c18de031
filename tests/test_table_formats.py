"""The score tables' formats behind one interface (runfolder/tableformat.TableFormat: Parquet and
JSON Lines), on real files: what is written reads back the same through every reading method,
columns and footers come without the rows where the format has a footer, a file cut short or
garbled is one line naming it, and every write is atomic and fenced."""
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from wdsfilter.core.errors import ConfigError, RunError
from wdsfilter.runfolder.tables import (BASE_FIELDS, FORMATS, JSONL, PARQUET, WRITER_META, DamagedRunFolder, format_for,
                                        read_batches, read_numbers, read_rows, read_table, table_columns,
                                        table_name, table_stem, write_table)
from wdsfilter.storage.atomic import guard, unguard

FORMAT_NAMES = sorted(FORMATS)
COLUMNS = {"clip_score": "float64", "label": "string"}


def rows(n: int = 5) -> list:
    """n rows as the scoring run makes them: every base field, a float score with a missing value
    (None) and a NaN (written as no value), a text column."""
    out = []
    for i in range(n):
        out.append({"key": f"{i:04d}", "shard": "shard-000.tar", "index": i, "status": "scored", "reason": None,
                    "message": None, "kept": i % 2 == 0, "caption": f"a photo {i}", "url": None, "uid": f"u{i}",
                    "clip_score": None if i == 1 else float("nan") if i == 2 else 0.25 * i, "label": "cat"})
    return out


def written(folder, fmt: str, n: int = 5, writer=None) -> str:
    path = os.path.join(str(folder), table_name("shard-000", fmt))
    write_table(rows(n), COLUMNS, path, fmt, writer=writer)
    return path


def garble_rows(path: str) -> None:
    """The rows' bytes garbled, what a footer says left as written: in a Parquet file every byte
    between its leading magic and its footer, in a JSON Lines file 63 bytes of its first line."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if format_for(path).columnar:
            f.seek(size - 8)  # a Parquet file ends: footer, its length (4 bytes), "PAR1"
            end = size - 8 - int.from_bytes(f.read(4), "little")
        else:
            end = 4 + 63
        f.seek(4)
        f.write((b"\xfe\x00garbage" * size)[:end - 4])


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_what_is_written_reads_back_the_same_by_every_method(tmp_path, fmt):
    path = written(tmp_path, fmt)
    table = format_for(path)
    assert table is FORMATS[fmt] and path.endswith(table.suffix) and table_stem(path) == "shard-000"
    back = read_rows(path)
    assert [r["key"] for r in back] == [f"{i:04d}" for i in range(5)]
    assert [r["clip_score"] for r in back] == [0.0, None, None, 0.75, 1.0]  # NaN written as no value
    assert [r["kept"] for r in back] == [True, False, True, False, True] and back[4]["uid"] == "u4"
    assert list(read_table(path))[:len(BASE_FIELDS)] == list(BASE_FIELDS)
    batches = list(read_batches(path, ["key", "clip_score", "absent"], rows=2))
    assert [len(b["key"]) for b in batches] == [2, 2, 1]
    assert sum((b["absent"] for b in batches), []) == [None] * 5  # a column the file lacks: no value
    assert np.concatenate(list(read_numbers(path, "clip_score", rows=2))).tolist() == [0.0, 0.75, 1.0]
    arrow = list(table.arrow_batches(path, ["key", "absent"]))
    assert sum((b["key"].to_pylist() for b in arrow), []) == [f"{i:04d}" for i in range(5)]
    assert all(b["absent"].null_count == len(b["absent"]) for b in arrow)


def test_parquet_and_jsonl_of_the_same_rows_read_alike(tmp_path):
    (tmp_path / "p").mkdir(), (tmp_path / "j").mkdir()
    p, j = written(tmp_path / "p", "parquet"), written(tmp_path / "j", "jsonl")
    assert read_rows(p) == read_rows(j)
    assert table_columns([p]) == table_columns([j]) == [*BASE_FIELDS, *COLUMNS]


def test_parquet_columns_and_footer_come_from_the_footer_without_the_rows(tmp_path):
    path = written(tmp_path, "parquet", n=2000, writer="worker-7")
    garble_rows(path)
    columns = PARQUET.columns(path)
    assert columns["clip_score"] == "double" and columns["key"] == "string" and columns["index"] == "int64"
    footer = PARQUET.footer(path)
    assert footer.rows == 2000 and footer.metadata[WRITER_META] == "worker-7"
    with pytest.raises(DamagedRunFolder) as e:  # the rows themselves cannot be read
        read_table(path, ["key", "clip_score"])
    assert path in str(e.value) and "\n" not in str(e.value)


def test_jsonl_columns_come_from_its_first_row_and_it_has_no_footer(tmp_path):
    path = written(tmp_path, "jsonl")
    with open(path, "a") as f:
        f.write("{not json\n")  # a later line garbled: the first row still names the columns
    assert list(JSONL.columns(path)) == [*BASE_FIELDS, *COLUMNS] and set(JSONL.columns(path).values()) == {None}
    assert JSONL.footer(path).rows is None and JSONL.footer(path).metadata == {}
    with pytest.raises(DamagedRunFolder, match="line 6 is not JSON"):
        read_rows(path)
    empty = os.path.join(str(tmp_path), "empty.jsonl")
    write_table([], COLUMNS, empty, "jsonl")
    assert JSONL.columns(empty) == {}
    assert table_columns([empty], [{"columns": ["clip_score"]}]) == [*BASE_FIELDS, "clip_score"]  # run.json's


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("cut", ["truncated", "garbled"])
def test_a_damaged_table_is_one_line_naming_the_file(tmp_path, fmt, cut):
    path = written(tmp_path, fmt, n=50)
    data = open(path, "rb").read()
    if cut == "truncated":  # cut in half (a Parquet file loses its footer)
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
    else:
        garble_rows(path)
    reads = [read_rows, lambda p: list(read_batches(p, ["key"])), lambda p: list(read_numbers(p, "index"))]
    if cut == "truncated" and FORMATS[fmt].columnar:
        reads.append(lambda p: format_for(p).columns(p))  # no footer left: not even its columns
    for read in reads:
        with pytest.raises(DamagedRunFolder) as e:
            read(path)
        assert str(e.value).startswith(f"{path} is damaged (") and "\n" not in str(e.value)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_write_is_whole_or_not_at_all_and_fenced(tmp_path, fmt):
    path = written(tmp_path, fmt, n=3)
    before = open(path, "rb").read()
    bad = rows(3)
    bad[1]["clip_score"] = object()  # a value neither format can write
    with pytest.raises((RunError, TypeError)):
        write_table(bad, {"clip_score": None, "label": None}, path, fmt)
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == [os.path.basename(path)]

    class Fenced(Exception):
        pass

    def taken_over():
        raise Fenced("another run holds the folder")
    guard(str(tmp_path), taken_over)
    try:
        with pytest.raises(Fenced):
            write_table(rows(4), COLUMNS, path, fmt)
    finally:
        unguard(str(tmp_path))
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == [os.path.basename(path)]


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_table_of_no_row_reads_as_one(tmp_path, fmt):
    path = os.path.join(str(tmp_path), table_name("empty", fmt))
    write_table([], COLUMNS, path, fmt)
    assert read_rows(path) == [] and list(read_batches(path, ["key"])) == []
    if FORMATS[fmt].columnar:  # a file of no row group (HF datasets fails on a row group of 0 rows)
        assert pq.read_metadata(path).num_row_groups == 0 and PARQUET.footer(path).rows == 0


def test_a_format_is_found_by_name_or_suffix_and_nothing_else(tmp_path):
    assert format_for("parquet") is PARQUET and format_for("jsonl") is JSONL
    assert format_for("/x/scores/a.b.jsonl") is JSONL and table_stem("/x/scores/a.b.parquet") == "a.b"
    with pytest.raises(ConfigError, match=r"scores/a\.csv is not a score table"):
        format_for("scores/a.csv")


def test_score_offers_every_format_of_the_registry():
    from wdsfilter.score.cli import score as score_cmd
    from wdsfilter.score.config import FORMATS as SCORE_FORMATS
    option = next(p for p in score_cmd.params if p.name == "fmt")
    assert list(option.type.choices) == list(SCORE_FORMATS) == list(FORMATS)
