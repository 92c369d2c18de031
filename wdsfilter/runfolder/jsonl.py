"""JSON Lines score tables (`scores/<name>.jsonl`, `score --format jsonl`): the TableFormat of
tableformat.py. One JSON object a line, every column in every row; no footer, so columns and
their types are known only from the rows, and every read is row by row. A line that is not a
JSON object, or bytes that are not UTF-8, raise DamagedRunFolder naming the file and the line.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..core.thresholds import is_number
from ..storage.atomic import atomic_path
from .tableformat import BASE_FIELDS, BATCH_ROWS, Columns, Footer, damaged, publish_rows


@dataclass(frozen=True)
class Jsonl:
    """Score tables as JSON Lines files (tableformat.TableFormat)."""
    name: str = "jsonl"
    suffix: str = ".jsonl"
    columnar: bool = False

    def write(self, rows: Sequence[dict], columns: Columns, path: str, writer: Optional[str] = None) -> None:
        names = list(BASE_FIELDS) + list(columns)
        with atomic_path(path) as tmp, open(tmp, "w") as f:
            for row in publish_rows(rows):
                clean = {k: _json_scalar(row.get(k)) for k in names}
                f.write(json.dumps(clean, ensure_ascii=False, default=json_value) + "\n")

    def read(self, path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
        rows = list(json_rows(path))
        names = columns or (list(rows[0]) if rows else list(BASE_FIELDS))
        return {name: [r.get(name) for r in rows] for name in names}

    def batches(self, path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
        chunk: List[dict] = []
        for row in json_rows(path):
            chunk.append(row)
            if len(chunk) >= rows:
                yield {c: [r.get(c) for r in chunk] for c in columns}
                chunk = []
        if chunk:
            yield {c: [r.get(c) for r in chunk] for c in columns}

    def arrow_batches(self, path: str, columns: Sequence[str]) -> Iterator[Dict[str, Any]]:
        import pyarrow as pa
        for batch in self.batches(path, columns):
            yield {c: pa.array(v) for c, v in batch.items()}

    def numbers(self, path: str, column: str, rows: int = BATCH_ROWS) -> Iterator[Any]:
        import numpy as np
        for batch in self.batches(path, [column], rows):
            values = np.array([v for v in batch[column] if is_number(v)], dtype=np.float64)
            yield values[~np.isnan(values)]

    def columns(self, path: str) -> Dict[str, Optional[str]]:
        for row in json_rows(path):
            return dict.fromkeys(row)
        return {}

    def footer(self, path: str) -> Footer:
        return Footer()


def json_rows(path: str) -> Iterator[dict]:
    """The file's rows as dicts, one line at a time (blank lines passed over)."""
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
