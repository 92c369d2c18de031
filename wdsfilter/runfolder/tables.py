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
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ..storage.atomic import atomic_path
from ..core.errors import ConfigError, RunError
from ..core.thresholds import is_number
from ..core.publish import published

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
# The columns wdsfilter fills itself that may hold a URL (the shard's, a message quoting one): written
# as publish.published shows them (no password, no presigned signature: shards.json keeps those).
# The sample's own text (key, caption, url, uid) and the scores are data, written as read.
PUBLISHED_FIELDS = ("shard", "message")


def publish_rows(rows: Sequence[dict]) -> List[dict]:
    """The rows with their PUBLISHED_FIELDS as they may be written (every table writer calls it)."""
    return [{**r, **{k: published(r[k]) for k in PUBLISHED_FIELDS if isinstance(r.get(k), str)}} for r in rows]
# In a Parquet score file's footer (key-value metadata) when no key repeats in the table: a reader
# that only needs to know that (filter's counts) skips reading the key column, half of its reading.
KEYS_META, UNIQUE_KEYS = b"wdsfilter.keys", b"unique"
WRITER_META = b"wdsfilter.writer"  # a joined run's worker that wrote the file (its marker names the same)
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


def preload_writer(fmt: str) -> None:
    """Warm the table writer in a background thread: pyarrow.parquet's import. Done lazily, that
    stalled the first shard's write; started with the scoring loop, it runs while the main
    process waits for the decode workers (before the probe, it slowed the probe as much). The
    score files' columns are built without pa.array (arrow_array), so pandas is not imported."""
    if fmt == "parquet":
        threading.Thread(target=_warm_parquet, daemon=True, name="wdsfilter-warm-parquet").start()


def _warm_parquet() -> None:
    import pyarrow.parquet  # noqa: F401


def write_table(rows: List[dict], columns: Union[Sequence[str], Mapping[str, Optional[str]]], path: str,
                fmt: str, writer: Optional[str] = None) -> None:
    """Write rows atomically: a temporary file in the same folder, then rename over `path`.
    columns: the score columns, or each with its declared type (scorerset.score_columns).
    writer: a joined run's worker (its token), kept in a Parquet file's metadata (WRITER_META)."""
    names = list(BASE_FIELDS) + list(columns)
    declared = columns if isinstance(columns, Mapping) else {}
    rows = publish_rows(rows)
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
            table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata or None))
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
        return pq.read_table(audited(path), columns=columns).to_pydict()
    except parquet_errors() as e:
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


def audited(path: str) -> str:
    """`path`, announced as Python's "open" audit event: pyarrow opens files in C++, which audit
    hooks do not see, and the fuzz test (tests/test_fuzz.py) checks every file a run folder makes
    us read."""
    sys.audit("open", path, "rb", os.O_RDONLY)
    return path


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
    import pyarrow.parquet as pq
    version = _version(path)
    entry = _FOOTERS.get(version) if version else None
    if entry is None:
        try:
            entry = _remember(version, pq.read_metadata(audited(path)))
        except parquet_errors() as e:
            raise damaged(path, f"not a Parquet file: {type(e).__name__}: {e}") from None
    return entry


def parquet_metadata(path: str):
    """The pyarrow FileMetaData of a Parquet score file (its schema and row count), read once per
    version of the file; DamagedRunFolder when it is not Parquet."""
    return _footer(path)[0]


def unique_keys(path: str) -> bool:
    """The writer recorded that no key of this Parquet score file repeats (KEYS_META)."""
    return (parquet_metadata(path).metadata or {}).get(KEYS_META) == UNIQUE_KEYS


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


def check_schema(path: str):
    """The Arrow schema of a Parquet score file; DamagedRunFolder when it is not Parquet or lacks
    a base field with its type (a Parquet file of another schema put in its place)."""
    entry = _footer(path)
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
        schema = check_schema(path)
        present = [c for c in columns if c in schema.names]
        try:
            for batch in open_parquet(path).iter_batches(batch_size=rows, columns=present):
                data = batch.to_pydict()
                n = batch.num_rows
                yield {c: data[c] if c in data else [None] * n for c in columns}
        except parquet_errors() as e:
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
        if column not in check_schema(path).names:
            return
        try:
            for batch in open_parquet(path).iter_batches(batch_size=rows, columns=[column], use_threads=False):
                values = float_values(batch.column(0))
                missing = np.isnan(values)
                yield values[~missing] if missing.any() else values
        except parquet_errors() as e:
            raise damaged(path, f"{column}: {type(e).__name__}: {e}") from None
        return
    for batch in read_batches(path, [column], rows):
        values = np.array([v for v in batch[column] if is_number(v)], dtype=np.float64)
        yield values[~np.isnan(values)]


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
    """Every value of a numeric column over Parquet score files as one float64 numpy array,
    missing values (null, NaN) left out, each file read once (in threads); None when the files
    hold more than `limit` rows (their footers say) or one is not Parquet: read_numbers streams
    those. Peak memory: 8 bytes a row, plus one file's column per thread."""
    import numpy as np
    if not all(p.endswith(".parquet") for p in paths):
        return None
    counts = [parquet_metadata(p).num_rows for p in paths]
    if sum(counts) > limit:
        return None
    out = np.empty(sum(counts))
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def fill(i: int) -> int:
        """The file's values at the start of its slice; how many there are."""
        path = paths[i]
        if column not in check_schema(path).names:
            return 0
        try:
            values = float_values(open_parquet(path).read(columns=[column], use_threads=False).column(0))
        except parquet_errors() as e:
            raise damaged(path, f"{column}: {type(e).__name__}: {e}") from None
        if len(values) != counts[i]:
            raise damaged(path, f"{len(values)} rows where its footer says {counts[i]}")
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
