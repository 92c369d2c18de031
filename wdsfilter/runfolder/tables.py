"""Score tables: one file per shard, `scores/<name>.parquet` (or `.jsonl` with --format jsonl).

Every sample has a row: key, shard, index (order in the shard), status, reason, message, kept,
caption, url, uid (TEXT_FIELDS), then one column per score. status is "scored", "partial" (some
scorers failed), "failed" (no scorer could score it: reason says why) or "rejected" (dropped by
the stages: reason says why). The scoring run writes them (`write_table`); `wdsfilter filter`, the
loader's score filter and the run's summary read them here. A file that cannot be read as a score
table (not Parquet, a line that is not a JSON object, another schema) raises `DamagedRunFolder`
naming it.

The formats: FORMATS, name -> a tableformat.TableFormat (parquet.py, jsonl.py); `format_for(path
or name)` is the one place a file's suffix decides its format. A new format is one module and one
line in FORMATS.
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Sequence

from ..core.errors import ConfigError
from .jsonl import Jsonl, json_value
from .parquet import (Parquet, arrow_array, arrow_type, check_schema, open_parquet, parquet_errors, parquet_metadata,
                      preload, read_floats, unique_keys, write_arrow)
from .tableformat import (BASE_FIELDS, BATCH_ROWS, KEYS_META, NUMERIC_TYPES, STATUSES, TEXT_FIELDS, UNIQUE_KEYS,
                          WRITER_META, Columns, DamagedRunFolder, Footer, TableFormat, audited, damaged, publish_rows)

PARQUET, JSONL = Parquet(), Jsonl()
FORMATS: Dict[str, TableFormat] = {f.name: f for f in (PARQUET, JSONL)}

__all__ = ["FORMATS", "PARQUET", "JSONL", "format_for", "table_name", "table_stem", "write_table", "read_table",
           "read_rows", "read_batches", "read_numbers", "table_columns", "column_numbers", "in_threads",
           "preload_writer", "TableFormat", "Footer", "Columns", "DamagedRunFolder", "damaged", "audited",
           "publish_rows", "BASE_FIELDS", "TEXT_FIELDS", "STATUSES", "BATCH_ROWS", "KEYS_META", "UNIQUE_KEYS",
           "WRITER_META", "NUMERIC_TYPES", "json_value", "arrow_array", "arrow_type", "check_schema", "open_parquet",
           "parquet_errors", "parquet_metadata", "unique_keys", "write_arrow"]


def format_for(path_or_name: str) -> TableFormat:
    """The format named so ("parquet", as `--format` says), or the one whose suffix ends the
    path's file name; ConfigError for a file of no format's suffix."""
    if path_or_name in FORMATS:
        return FORMATS[path_or_name]
    for fmt in FORMATS.values():
        if path_or_name.endswith(fmt.suffix):
            return fmt
    raise ConfigError(f"{path_or_name} is not a score table: its name ends in none of "
                      f"{', '.join(f.suffix for f in FORMATS.values())}")


def table_name(stem: str, fmt: str) -> str:
    """The file name of shard `stem`'s table in format `fmt` (by name)."""
    return stem + FORMATS[fmt].suffix


def table_stem(path: str) -> str:
    """A table's shard name: its file name without the format's suffix."""
    name = os.path.basename(path)
    return name[:-len(format_for(name).suffix)]


def preload_writer(fmt: str) -> None:
    """Warm format `fmt`'s writer in a background thread (Parquet's: pyarrow.parquet's import,
    which stalled the first shard's write otherwise)."""
    if FORMATS[fmt] is PARQUET:
        preload()


def write_table(rows: List[dict], columns: Columns, path: str, fmt: str, writer: Optional[str] = None) -> None:
    """Write rows atomically in format `fmt` (by name): a temporary file in the same folder, then
    renamed over `path` after the folder's guard. columns: the score columns, or each with its
    declared type (scorerset.score_columns). writer: a joined run's worker (its token), kept in
    the footer (WRITER_META) where the format has one."""
    FORMATS[fmt].write(rows, columns, path, writer)


def read_table(path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
    """Column name -> values of one score file (either format), the whole file at once (a shard's:
    the run's summary and the loader's score filter); a column the file lacks is left out."""
    return format_for(path).read(path, columns)


def read_rows(path: str) -> List[dict]:
    cols = read_table(path)
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    return [{k: cols[k][i] for k in names} for i in range(n)]


def read_batches(path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
    """One score file, `rows` rows at a time, as {column: values}; a column the file lacks is None."""
    return format_for(path).batches(path, list(dict.fromkeys(columns)), rows)


def read_numbers(path: str, column: str, rows: int = BATCH_ROWS):
    """One numeric column of a score file as float64 numpy arrays, `rows` at a time, missing
    values (null, NaN) left out."""
    return format_for(path).numbers(path, column, rows)


def table_columns(paths: Sequence[str], scorers: Optional[Sequence[dict]] = None) -> List[str]:
    """The columns of a run's score files: the first file's that names any (a footer names them
    without a row; a JSON Lines file only in its rows, and a shard with no sample has none), else
    the base fields and the columns of the scorers that run.json lists (`scorers`)."""
    for path in paths:
        columns = format_for(path).columns(path)
        if columns:
            return list(columns)
    return list(BASE_FIELDS) + [c for s in scorers or () for c in s.get("columns") or ()]


def in_threads(function, items: Sequence, threads: int = 0) -> list:
    """[function(item) for item in items], a few at a time in threads (pyarrow reads and
    decompresses without the GIL), results in order; the first error is raised."""
    items = list(items)
    threads = threads or min(4, os.cpu_count() or 1, len(items))
    if threads <= 1:
        return [function(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads, thread_name_prefix="wdsfilter-tables") as pool:
        return list(pool.map(function, items))


def column_numbers(paths: Sequence[str], column: str, limit: int):
    """Every value of a numeric column over columnar score files as one float64 numpy array,
    missing values (null, NaN) left out, each file read once (in threads); None when the files
    hold more than `limit` rows (their footers say) or one is not columnar: read_numbers streams
    those. Peak memory: 8 bytes a row, plus one file's column per thread."""
    import numpy as np
    if not all(format_for(p).columnar for p in paths):
        return None
    counts = [format_for(p).footer(p).rows for p in paths]
    if sum(counts) > limit:
        return None
    out = np.empty(sum(counts))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def fill(i: int) -> int:
        """The file's values at the start of its slice; how many there are."""
        values = read_floats(paths[i], column, counts[i])
        if values is None:
            return 0
        values = values[~np.isnan(values)]
        out[starts[i]:starts[i] + len(values)] = values
        return len(values)
    import pyarrow as pa
    end = 0
    for start, n in zip(starts, in_threads(fill, range(len(paths)))):  # the slices moved together, in place
        out[end:end + n] = out[start:start + n]
        end += n
    pa.default_memory_pool().release_unused()  # the reads' buffers, which the pool would keep
    return out[:end]
