"""Parquet score tables (`scores/<name>.parquet`, the default format): the TableFormat of
tableformat.py, and what only Parquet offers runfolder/'s fast paths (a footer read once per
version of a file, dictionary-coded columns, Arrow columns built from numpy buffers).

Written with the schema's key-value metadata (tableformat.KEYS_META, WRITER_META); a table of no
row is a file of no row group (HF datasets fails on a row group of 0 rows). Read back, a file that
is not Parquet, or lacks a base field of its type, raises DamagedRunFolder naming it.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from ..core.errors import RunError
from ..storage.atomic import atomic_path
from .tableformat import (BASE_FIELDS, BATCH_ROWS, KEYS_META, TEXT_FIELDS, UNIQUE_KEYS, WRITER_META, Columns, Footer,
                          audited, damaged, publish_rows)


@dataclass(frozen=True)
class Parquet:
    """Score tables as Parquet files (tableformat.TableFormat)."""
    name: str = "parquet"
    suffix: str = ".parquet"
    columnar: bool = True

    def write(self, rows: Sequence[dict], columns: Columns, path: str, writer: Optional[str] = None) -> None:
        _write(score_table(publish_rows(rows), columns, path, writer), path)  # (scores/ is made with the run)

    def read(self, path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
        import pyarrow.parquet as pq
        present = set(check_schema(path).names)
        if columns is not None:
            columns = [c for c in columns if c in present]
        try:
            return pq.read_table(audited(path), columns=columns).to_pydict()
        except parquet_errors() as e:
            raise damaged(path, f"{type(e).__name__}: {e}") from None

    def batches(self, path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
        present = [c for c in columns if c in check_schema(path).names]
        try:
            for batch in open_parquet(path).iter_batches(batch_size=rows, columns=present):
                data = batch.to_pydict()
                n = batch.num_rows
                yield {c: data[c] if c in data else [None] * n for c in columns}
        except parquet_errors() as e:
            raise damaged(path, f"{type(e).__name__}: {e}") from None

    def arrow_batches(self, path: str, columns: Sequence[str]) -> Iterator[Dict[str, Any]]:
        import pyarrow as pa
        present = [c for c in columns if c in check_schema(path).names]
        try:
            for batch in open_parquet(path).iter_batches(columns=present):
                n = batch.num_rows
                yield {c: batch.column(c) if c in present else pa.nulls(n) for c in columns}
        except parquet_errors() as e:
            raise damaged(path, f"{type(e).__name__}: {e}") from None

    def numbers(self, path: str, column: str, rows: int = BATCH_ROWS) -> Iterator[Any]:
        import numpy as np
        if column not in check_schema(path).names:
            return
        try:
            for batch in open_parquet(path).iter_batches(batch_size=rows, columns=[column], use_threads=False):
                values = float_values(batch.column(0))
                missing = np.isnan(values)
                yield values[~missing] if missing.any() else values
        except parquet_errors() as e:
            raise damaged(path, f"{column}: {type(e).__name__}: {e}") from None

    def columns(self, path: str) -> Dict[str, Optional[str]]:
        return {f.name: str(f.type) for f in check_schema(path)}

    def footer(self, path: str) -> Footer:
        metadata = parquet_metadata(path)
        return Footer(metadata.num_rows, {k.decode(errors="replace"): v.decode(errors="replace")
                                          for k, v in (metadata.metadata or {}).items()})


def write_arrow(table, path: str) -> None:
    """An Arrow table as a Parquet file, atomically (storage/atomic.py: a temporary renamed over
    `path` after the folder's guard), its folder made: the Parquet files of a run folder beside
    its score tables (the failure ledger, the embeddings' metadata, dedup's marks)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _write(table, path)


def _write(table, path: str) -> None:
    """Every Parquet file of a run folder is written here, atomically."""
    import pyarrow.parquet as pq
    with atomic_path(path) as tmp:
        if table.num_rows:
            pq.write_table(table, tmp)
        else:  # a table of no row: a file of no row group (HF datasets fails on a row group of 0 rows)
            pq.ParquetWriter(tmp, table.schema).close()


def score_table(rows: Sequence[dict], columns: Columns, path: str, writer: Optional[str] = None):
    """The rows as an Arrow table of the base fields and `columns` (each of its declared type, or
    of the type its values have), with its footer's metadata; path: named in an error."""
    import pyarrow as pa
    names = list(BASE_FIELDS) + list(columns)
    declared = columns if isinstance(columns, Mapping) else {}
    base_types = {"key": pa.string(), "shard": pa.string(), "index": pa.int64(), "status": pa.string(),
                  "reason": pa.string(), "message": pa.string(), "kept": pa.bool_(),
                  **{name: pa.string() for name in TEXT_FIELDS}}
    arrays, fields = [], []
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            arr = (arrow_array(values, base_types[name]) if name in base_types
                   else _score_array(values, declared.get(name)))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:  # a scorer's values of several types
            raise RunError(f"score column {name!r} of {os.path.basename(path)}: its values cannot be "
                           f"written as one column ({str(e)[:160]}); a scorer's column holds values of one "
                           f"type: declare it in column_types()") from None
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    keys = [row.get("key") for row in rows]
    unique = None not in keys and len(set(keys)) == len(keys)
    metadata = {**({KEYS_META: UNIQUE_KEYS} if unique else {}), **({WRITER_META: writer} if writer else {})}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata or None))


def preload() -> None:
    """Warm the writer in a background thread: pyarrow.parquet's import. Done lazily, that
    stalled the first shard's write; started with the scoring loop, it runs while the main
    process waits for the decode workers (before the probe, it slowed the probe as much). The
    score files' columns are built without pa.array (arrow_array), so pandas is not imported."""
    threading.Thread(target=_warm, daemon=True, name="wdsfilter-warm-parquet").start()


def _warm() -> None:
    import pyarrow.parquet  # noqa: F401


# -- Arrow columns from plain values ------------------------------------------------------------------
def arrow_type(name: str):
    """The pyarrow type a scorer declares by name (Scorer.column_types): a pyarrow alias
    ("float64", "int64", "bool", "string") or "list<alias>"; None for a name that is neither."""
    import pyarrow as pa
    inner = name[5:-1] if name.startswith("list<") and name.endswith(">") else None
    try:
        return pa.list_(pa.type_for_alias(inner)) if inner is not None else pa.type_for_alias(name)
    except (ValueError, TypeError):
        return None


def arrow_array(values: Sequence[Any], kind):
    """`values` (Python values, None for null) as an Arrow array of type `kind`, as
    pa.array(values, type=kind, from_pandas=True) makes it (a NaN is null), built from numpy
    buffers: pa.array imports pandas on its first list (~1 s of a small job's start-up, for nothing
    the score files need). string, int64, float64, bool and list<float64> columns of plain values
    are built here; anything else (another type, a value of the wrong kind) goes to pa.array, which
    converts it or raises its own error."""
    import pyarrow as pa
    build = _builders().get(kind)
    if build is not None:
        try:
            array = build(values, kind, [v for v in values if v is not None])
            if array is not None:
                return array
        except (UnicodeEncodeError, OverflowError, ValueError, TypeError):
            pass  # pa.array's own conversion (or its error)
    return pa.array(list(values), type=kind, from_pandas=True)


def _builders() -> dict:
    """Arrow type -> the builder of a column of that type from plain values (None: they are not)."""
    import pyarrow as pa
    return {pa.float64(): _floats, pa.int64(): _ints, pa.bool_(): _bools, pa.string(): _strings,
            pa.list_(pa.float64()): _float_lists}


def _valid(values: Sequence[Any]):
    import numpy as np
    return np.array([v is not None for v in values], dtype=bool)


def _floats(values, kind, present):
    import numpy as np
    import pyarrow as pa
    if not all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) for v in present):
        return None
    data = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return _from_buffers(kind, len(values), ~np.isnan(data), [pa.py_buffer(data)])


def _ints(values, kind, present):
    import numpy as np
    import pyarrow as pa
    if not all(type(v) is int for v in present):
        return None
    data = np.array([0 if v is None else v for v in values], dtype=np.int64)
    return _from_buffers(kind, len(values), _valid(values), [pa.py_buffer(data)])


def _bools(values, kind, present):
    import numpy as np
    import pyarrow as pa
    if not all(type(v) is bool for v in present):
        return None
    bits = np.packbits(np.array([v is True for v in values], dtype=bool), bitorder="little")
    return _from_buffers(kind, len(values), _valid(values), [pa.py_buffer(bits)])


def _strings(values, kind, present):
    import numpy as np
    import pyarrow as pa
    if not all(type(v) is str for v in present):
        return None
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None
    return _from_buffers(kind, len(values), _valid(values),
                         [pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))])


def _float_lists(values, kind, present):
    import numpy as np
    import pyarrow as pa
    if not all(isinstance(v, (list, tuple)) for v in present):
        return None
    n = len(values)
    child = arrow_array([x for v in present for x in v], pa.float64())
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([0 if v is None else len(v) for v in values], out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None
    valid = _valid(values)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.ListArray.from_buffers(kind, n, [bitmap, pa.py_buffer(offsets.astype(np.int32))],
                                     null_count=int(n - valid.sum()), children=[child])


def _from_buffers(kind, n: int, valid, buffers: list):
    import numpy as np
    import pyarrow as pa
    nulls = int(n - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(kind, n, [bitmap, *buffers], null_count=nulls)


def _score_array(values: List[Any], declared: Optional[str] = None):
    """A score column as an Arrow array (in C, no Python call per value): of its declared type,
    so every score file of a run has one schema; else of the type pyarrow infers: int64, float64
    (ints and floats mixed), bool, string, or nested for lists; a column with no value at all is
    float64, the type a score column has. A NaN is written as null, as JSONL writes it: a missing
    score, which no threshold passes (thresholds.is_missing), where duckdb and polars would count
    a NaN as above every threshold."""
    import pyarrow as pa
    if declared is not None:
        return arrow_array(values, arrow_type(declared))
    arr = pa.array(values, from_pandas=True)
    return arr.cast(pa.float64()) if pa.types.is_null(arr.type) else arr


# -- reading, damage-aware ------------------------------------------------------------------------------
_BASE_TYPES = {"key": "string", "status": "string"}  # what a reader relies on (the rest may be null)


def parquet_errors():
    import pyarrow as pa
    return (pa.ArrowException, OSError, ValueError, TypeError)


# Footers read once per version of a file: opening a run checks every file's schema, and the
# thresholds' pass and the counting pass read it again (400 files: 4 footer reads each cost more
# than reading their columns). Bounded: a run of more files reads some footers again.
_FOOTERS: "OrderedDict[tuple, list]" = OrderedDict()  # version -> [FileMetaData, its checked Arrow schema]
_FOOTERS_LOCK = threading.Lock()
FOOTERS_KEPT = 4096


def _version(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path, st.st_size, st.st_mtime_ns


def _remember(version: Optional[tuple], metadata) -> list:
    entry = [metadata, None]
    if version:
        with _FOOTERS_LOCK:
            _FOOTERS[version] = entry
            while len(_FOOTERS) > FOOTERS_KEPT:
                _FOOTERS.popitem(last=False)
    return entry


def _footer(path: str) -> list:
    """[FileMetaData, None or the Arrow schema check_schema accepted], read once per version of
    the file (path, size, modification time); DamagedRunFolder when it is not Parquet."""
    version = _version(path)
    entry = _FOOTERS.get(version) if version else None
    if entry is None:
        try:  # (pq.read_metadata's reader, without importing pyarrow.parquet: a count never needs it)
            entry = _remember(version, _reader(audited(path), None, ()).metadata)
        except parquet_errors() as e:
            raise damaged(path, f"not a Parquet file: {type(e).__name__}: {e}") from None
    return entry


def parquet_metadata(path: str):
    """The pyarrow FileMetaData of a Parquet score file (its schema and row count), read once per
    version of the file; DamagedRunFolder when it is not Parquet."""
    return _footer(path)[0]


def unique_keys(path: str) -> bool:
    """The writer recorded that no key of this Parquet score file repeats (KEYS_META)."""
    return Parquet().footer(path).metadata.get(KEYS_META) == UNIQUE_KEYS


def open_parquet(path: str, dictionary: Sequence[str] = ()):
    """A pyarrow ParquetFile of a score file whose schema check_schema accepts, `dictionary`
    columns (those the file has) read as dictionary arrays (strings as codes). The footer is read
    once per version of the file: by this open when no one read it before (then kept for
    check_schema, parquet_metadata and the next open)."""
    import pyarrow.parquet as pq
    version = _version(path)
    entry = _FOOTERS.get(version) if version else None
    try:
        # pre_buffer off: a score file's few column chunks read as they are decoded (the
        # read-ahead's asynchronous I/O cost more than the reads of a small file)
        pf = pq.ParquetFile(audited(path), metadata=entry[0] if entry else None,
                            read_dictionary=list(dictionary) or None, pre_buffer=False)
    except parquet_errors() as e:
        raise damaged(path, f"{'' if entry else 'not a Parquet file: '}{type(e).__name__}: {e}") from None
    except KeyError:  # pyarrow refuses a `dictionary` column the file lacks: opened again without it
        names = set(_footer(path)[0].schema.names)
        if all(c in names for c in dictionary):
            raise
        return open_parquet(path, [c for c in dictionary if c in names])
    if entry is None:
        _remember(version, pf.metadata)
    check_schema(path)
    return pf


class ColumnFile:
    """One Parquet score file opened once to read whole columns (filter's count: judge.ShardTable):
    its footer (read by this open unless kept from an earlier one), the schema check_schema
    accepted, what its writer recorded, and `read`, its columns in one read without threads (then
    the file is closed). One stat and one open a file; pyarrow's reader without ParquetFile's
    filesystem resolution and nested-path index, which cost as much as the read of a shard's score
    column (400 files: tools/bench_filter.py). DamagedRunFolder when it is not a score file."""

    def __init__(self, path: str, dictionary: Sequence[str] = ()):
        version = _version(path)
        entry = _FOOTERS.get(version) if version else None
        self.path = path
        try:
            try:
                self._reader = _reader(audited(path), entry[0] if entry else None, dictionary)
            except KeyError:  # pyarrow refuses a `dictionary` column the file lacks: opened again without it
                entry = entry or _footer(path)
                names = set(entry[0].schema.names)
                if all(c in names for c in dictionary):
                    raise
                self._reader = _reader(audited(path), entry[0], [c for c in dictionary if c in names])
        except parquet_errors() as e:
            raise damaged(path, f"{'' if entry else 'not a Parquet file: '}{type(e).__name__}: {e}") from None
        if entry is None:
            entry = _remember(version, self._reader.metadata)
        self.metadata = entry[0]
        self.schema = _checked_schema(path, entry)

    @property
    def unique_keys(self) -> bool:
        """The writer recorded that no key of the file repeats (KEYS_META)."""
        return (self.schema.metadata or {}).get(KEYS_META.encode()) == UNIQUE_KEYS.encode()

    def read(self, columns: Sequence[str]) -> Dict[str, Any]:
        """Column name -> Arrow ChunkedArray of the `columns` the file has, in one read."""
        names = [c for c in dict.fromkeys(columns) if c in self.schema.names]
        try:
            table = self._reader.read_all([self._reader.column_name_idx(c) for c in names], use_threads=False)
        except parquet_errors() as e:
            raise damaged(self.path, f"{type(e).__name__}: {e}") from None
        finally:
            self._reader.close()
        return dict(zip(names, table.columns))


def _reader(source: str, metadata, dictionary: Sequence[str]):
    """pyarrow's Parquet reader of `source` (the one ParquetFile holds), pre_buffer off as in
    open_parquet. pyarrow._parquet alone: pyarrow.parquet's import (its filesystems, ~15 ms) is
    more than a count's reads of a small run need."""
    from pyarrow._parquet import ParquetReader
    reader = ParquetReader()
    reader.open(source, metadata=metadata, read_dictionary=list(dictionary) or None, pre_buffer=False)
    return reader


def check_schema(path: str):
    """The Arrow schema of a Parquet score file; DamagedRunFolder when it is not Parquet or lacks
    a base field with its type (a Parquet file of another schema put in its place)."""
    return _checked_schema(path, _footer(path))


def _checked_schema(path: str, entry: list):
    """check_schema of the footer `entry` (_footer's) of `path`."""
    if entry[1] is not None:  # this version of the file was checked already
        return entry[1]
    try:
        schema = entry[0].schema.to_arrow_schema()
    except parquet_errors() as e:
        raise damaged(path, f"not a Parquet file: {type(e).__name__}: {e}") from None
    for name, kind in _BASE_TYPES.items():
        if name not in schema.names:
            raise damaged(path, f"no {name!r} column")
        if str(schema.field(name).type) not in (kind, "large_string", "null"):
            raise damaged(path, f"its {name!r} column holds {schema.field(name).type}, not {kind}")
    entry[1] = schema
    return schema


def float_values(array):
    """A numeric Arrow array (or chunked array) as float64 numpy, a null as NaN, integers as
    float64. Read from the Arrow buffers: pyarrow's to_numpy imports pandas (~1 s, for a command
    that otherwise takes less); strings where numbers belong raise ValueError: a damaged file."""
    import numpy as np
    chunks = getattr(array, "chunks", None)
    if chunks is None:
        return _float_chunk(array)
    if len(chunks) == 1:
        return _float_chunk(chunks[0])
    return np.concatenate([_float_chunk(c) for c in chunks]) if chunks else np.empty(0)


def _float_chunk(array):
    import numpy as np
    import pyarrow as pa
    n, offset, kind = len(array), array.offset, array.type
    if pa.types.is_null(kind):
        return np.full(n, np.nan)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or pa.types.is_float16(kind):
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.float64)  # the general way
    validity, data = array.buffers()[:2]
    dtype = np.dtype(f"{'f' if pa.types.is_floating(kind) else 'i' if pa.types.is_signed_integer(kind) else 'u'}"
                     f"{kind.bit_width // 8}")
    values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:].astype(np.float64)
    if array.null_count:
        valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), count=offset + n, bitorder="little")[offset:]
        values[valid == 0] = np.nan
    return values


def read_floats(path: str, column: str, rows: Optional[int] = None):
    """One numeric column of the file, whole, as float64 numpy (null as NaN); None when the file
    lacks it. rows: what its footer says it holds (a file that reads otherwise is damaged)."""
    if column not in check_schema(path).names:
        return None
    try:
        values = float_values(open_parquet(path).read(columns=[column], use_threads=False).column(0))
    except parquet_errors() as e:
        raise damaged(path, f"{column}: {type(e).__name__}: {e}") from None
    if rows is not None and len(values) != rows:
        raise damaged(path, f"{len(values)} rows where its footer says {rows}")
    return values
