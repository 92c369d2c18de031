"""Score tables: one file per shard, `scores/<name>.parquet` (or `.jsonl` with --format jsonl).

Every sample has a row: key, shard, index (order in the shard), status, reason, message, kept,
caption, url, uid (TEXT_FIELDS), then one column per score. status is "scored", "partial" (some scorers failed), "failed" (no
scorer could score it: reason says why) or "rejected" (dropped by the stages: reason says why).
The scoring run writes them (`write_table`); `wdsfilter filter`, the loader's score filter and
the run's summary read them here. A file that cannot be read as a score table (not Parquet, a
line that is not a JSON object, another schema) raises `DamagedRunFolder` naming it.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ..atomic import atomic_path
from ..errors import ConfigError
from ..thresholds import is_number

BATCH_ROWS = 65536  # rows read at a time: memory stays flat however large a score file is


class DamagedRunFolder(ConfigError):
    """A file of a scoring run's folder is not what `wdsfilter score` wrote (edited, cut, replaced):
    one line naming it and what to do."""


def damaged(path: str, what: str) -> DamagedRunFolder:
    return DamagedRunFolder(f"{path} is damaged ({what}): it is not the file `wdsfilter score` wrote; delete the "
                            f"shard's marker in done/ and score it again (wdsfilter score ... --resume)")


# What the sample said, beside its scores: the caption as the stages saw it (after clean_captions),
# and the url and uid of its .json where it has them (img2dataset's and DataComp's metadata), so
# a user in pandas sees which text got which score (score/rows.py fills them).
TEXT_FIELDS = ("caption", "url", "uid")
BASE_FIELDS = ("key", "shard", "index", "status", "reason", "message", "kept", *TEXT_FIELDS)
STATUSES = ("scored", "partial", "failed", "rejected")
EXTENSIONS = {"parquet": ".parquet", "jsonl": ".jsonl"}


# -- tables -------------------------------------------------------------------------------------
def arrow_type(name: str):
    """The pyarrow type a scorer declares by name (Scorer.column_types): a pyarrow alias
    ("float64", "int64", "bool", "string") or "list<alias>"; None for a name that is neither."""
    import pyarrow as pa
    inner = name[5:-1] if name.startswith("list<") and name.endswith(">") else None
    try:
        return pa.list_(pa.type_for_alias(inner)) if inner is not None else pa.type_for_alias(name)
    except (ValueError, TypeError):
        return None


def _score_array(values: List[Any], declared: Optional[str] = None):
    """A score column as an Arrow array (in C, no Python call per value): of its declared type,
    so every score file of a run has one schema; else of the type pyarrow infers: int64, float64
    (ints and floats mixed), bool, string, or nested for lists; a column with no value at all is
    float64, the type a score column has. A NaN is written as null, as JSONL writes it: a missing
    score, which no threshold passes (thresholds.is_missing), where duckdb and polars would count
    a NaN as above every threshold."""
    import pyarrow as pa
    if declared is not None:
        return pa.array(values, type=arrow_type(declared), from_pandas=True)
    arr = pa.array(values, from_pandas=True)
    return arr.cast(pa.float64()) if pa.types.is_null(arr.type) else arr


def preload_writer(fmt: str) -> None:
    """Warm the table writer in a background thread: pyarrow.parquet, and what pyarrow imports
    on its first array (pandas, where installed) take ~0.5 s of one core. Done lazily, that
    stalled the first shard's write; started with the scoring loop, it runs while the main
    process waits for the decode workers (before the probe, it slowed the probe as much)."""
    if fmt == "parquet":
        threading.Thread(target=_warm_parquet, daemon=True, name="wdsfilter-warm-parquet").start()


def _warm_parquet() -> None:
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401
    pa.array([0.0])


def write_table(rows: List[dict], columns: Union[Sequence[str], Mapping[str, Optional[str]]], path: str,
                fmt: str) -> None:
    """Write rows atomically: a temporary file in the same folder, then rename over `path`.
    columns: the score columns, or each with its declared type (scorerset.score_columns)."""
    names = list(BASE_FIELDS) + list(columns)
    declared = columns if isinstance(columns, Mapping) else {}
    with atomic_path(path) as tmp:
        if fmt == "jsonl":
            with open(tmp, "w") as f:
                for row in rows:
                    clean = {k: _json_scalar(row.get(k)) for k in names}
                    f.write(json.dumps(clean, ensure_ascii=False, default=json_value) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq
            base_types = {"key": pa.string(), "shard": pa.string(), "index": pa.int64(), "status": pa.string(),
                          "reason": pa.string(), "message": pa.string(), "kept": pa.bool_(),
                          **{name: pa.string() for name in TEXT_FIELDS}}
            arrays, fields = [], []
            for name in names:
                values = [row.get(name) for row in rows]
                arr = (pa.array(values, type=base_types[name]) if name in base_types
                       else _score_array(values, declared.get(name)))
                arrays.append(arr)
                fields.append(pa.field(name, arr.type))
            table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
            if table.num_rows:
                pq.write_table(table, tmp)
            else:  # a shard with no sample: a file of no row group (HF datasets fails on a row group of 0 rows)
                pq.ParquetWriter(tmp, table.schema).close()


def json_value(o):
    """json.dumps' `default` for what a scorer may return besides Python values: a numpy scalar
    (np.float32 from `.mean()`) or array, a torch tensor, as its Python value. json cannot write
    them, and a JSONL run (and every Ray run, whose scores travel as JSON) ended in an internal
    error at the first shard, where Parquet took them."""
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _json_scalar(v):
    """A JSONL value: a numpy scalar as its Python value, a NaN or an infinity as null (a missing
    score). JSON has no infinity: json.dumps would write `Infinity`, which jq, JavaScript and most
    JSON readers refuse; Parquet keeps infinities."""
    if hasattr(v, "tolist") and getattr(v, "ndim", None) == 0:
        v = v.tolist()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def read_table(path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
    """Column name -> values of one score file (either format), the whole file at once (a shard's:
    the run's summary and the loader's score filter); a column the file lacks is left out."""
    if path.endswith(".jsonl"):
        out: Dict[str, list] = {}
        rows = list(_json_rows(path))
        names = columns or (list(rows[0]) if rows else list(BASE_FIELDS))
        for name in names:
            out[name] = [r.get(name) for r in rows]
        return out
    import pyarrow.parquet as pq
    present = set(check_schema(path).names)
    if columns is not None:
        columns = [c for c in columns if c in present]
    try:
        return pq.read_table(_native(path), columns=columns).to_pydict()
    except _arrow_errors() as e:
        raise damaged(path, f"{type(e).__name__}: {e}") from None


def table_columns(paths: Sequence[str], scorers: Optional[Sequence[dict]] = None) -> List[str]:
    """The columns of a run's score files: a Parquet file's schema (one for the run). A JSON Lines
    file names its columns only in its rows, and a shard with no sample (an empty tar) has an
    empty one: the first file with a row, else the base fields and the columns of the scorers
    that run.json lists (`scorers`)."""
    for path in paths:
        if path.endswith(".parquet"):
            return list(check_schema(path).names)
        for row in _json_rows(path):
            return list(row)
    return list(BASE_FIELDS) + [c for s in scorers or () for c in s.get("columns") or ()]


def read_rows(path: str) -> List[dict]:
    cols = read_table(path)
    names = list(cols)
    n = len(cols[names[0]]) if names else 0
    return [{k: cols[k][i] for k in names} for i in range(n)]


# -- reading, damage-aware ----------------------------------------------------------------------------
_BASE_TYPES = {"key": "string", "status": "string"}  # what a reader relies on (the rest may be null)


def _native(path: str) -> str:
    """`path`, announced as Python's "open" audit event: pyarrow opens files in C++, which audit
    hooks do not see, and the fuzz test (tests/test_fuzz.py) checks every file a run folder makes
    us read."""
    sys.audit("open", path, "rb", os.O_RDONLY)
    return path


def _arrow_errors():
    import pyarrow as pa
    return (pa.ArrowException, OSError, ValueError, TypeError)


def check_schema(path: str):
    """The Arrow schema of a Parquet score file; DamagedRunFolder when it is not Parquet or lacks
    a base field with its type (a Parquet file of another schema put in its place)."""
    import pyarrow.parquet as pq
    try:
        schema = pq.read_schema(_native(path))
    except _arrow_errors() as e:
        raise damaged(path, f"not a Parquet file: {type(e).__name__}: {e}") from None
    for name, kind in _BASE_TYPES.items():
        if name not in schema.names:
            raise damaged(path, f"no {name!r} column")
        if str(schema.field(name).type) not in (kind, "large_string", "null"):
            raise damaged(path, f"its {name!r} column holds {schema.field(name).type}, not {kind}")
    return schema


def _json_rows(path: str) -> Iterator[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise damaged(path, f"line {n} is not JSON: {e}") from None
                if not isinstance(row, dict):
                    raise damaged(path, f"line {n} is not a JSON object")
                yield row
    except UnicodeDecodeError as e:
        raise damaged(path, f"not UTF-8: {e}") from None


def read_batches(path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
    """One score file, `rows` rows at a time, as {column: values}; a column the file lacks is None."""
    columns = list(dict.fromkeys(columns))
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        schema = check_schema(path)
        present = [c for c in columns if c in schema.names]
        try:
            for batch in pq.ParquetFile(_native(path)).iter_batches(batch_size=rows, columns=present):
                data = batch.to_pydict()
                n = batch.num_rows
                yield {c: data[c] if c in data else [None] * n for c in columns}
        except _arrow_errors() as e:
            raise damaged(path, f"{type(e).__name__}: {e}") from None
        return
    chunk: List[dict] = []
    for row in _json_rows(path):
        chunk.append(row)
        if len(chunk) >= rows:
            yield {c: [r.get(c) for r in chunk] for c in columns}
            chunk = []
    if chunk:
        yield {c: [r.get(c) for r in chunk] for c in columns}


def read_numbers(path: str, column: str, rows: int = BATCH_ROWS):
    """One numeric column of a score file as float64 numpy arrays, `rows` at a time, missing
    values (null, NaN) left out."""
    import numpy as np
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        if column not in check_schema(path).names:
            return
        try:
            for batch in pq.ParquetFile(_native(path)).iter_batches(batch_size=rows, columns=[column],
                                                                     use_threads=False):
                # nulls come out as NaN (no pyarrow.compute cast: its dispatch costs more than the
                # copy); strings where numbers belong raise ValueError: a damaged file
                values = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.float64)
                missing = np.isnan(values)
                yield values[~missing] if missing.any() else values
        except _arrow_errors() as e:
            raise damaged(path, f"{column}: {type(e).__name__}: {e}") from None
        return
    for batch in read_batches(path, [column], rows):
        values = np.array([v for v in batch[column] if is_number(v)], dtype=np.float64)
        yield values[~np.isnan(values)]
