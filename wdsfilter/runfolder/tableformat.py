"""The table-format interface of a run folder's tables: what a format does (`TableFormat`), what
every format shares (the score table's base fields, the footer's keys, the damage error).

A format is one module (parquet.py, jsonl.py) with a class that has these methods, plus one line
in tables.FORMATS; everything else asks `tables.format_for(path)`, never a file's suffix
(tests/test_layers.py checks that no module outside runfolder/ tests one).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Union

from ..core.errors import ConfigError
from ..core.publish import published

BATCH_ROWS = 65536  # rows read at a time: memory stays flat however large a score file is


class DamagedRunFolder(ConfigError):
    """A file of a scoring run's folder is not what `wdsfilter score` wrote (edited, cut, replaced):
    one line naming it and what to do."""


def damaged(path: str, what: str) -> DamagedRunFolder:
    """The one line saying so; `what` on one line too (pyarrow's messages span several)."""
    return DamagedRunFolder(f"{path} is damaged ({' '.join(what.split())}): it is not the file `wdsfilter score` "
                            f"wrote; delete the shard's marker in done/ and score it again (wdsfilter score ... --resume)")


def audited(path: str) -> str:
    """`path`, announced as Python's "open" audit event: pyarrow opens files in C++, which audit
    hooks do not see, and the fuzz test (tests/test_fuzz.py) checks every file a run folder makes
    us read."""
    sys.audit("open", path, "rb", os.O_RDONLY)
    return path


# What the sample said, beside its scores: the caption as the stages saw it (after clean_captions),
# and the url and uid of its .json where it has them (img2dataset's and DataComp's metadata), so
# a user in pandas sees which text got which score (score/rows.py fills them).
TEXT_FIELDS = ("caption", "url", "uid")
BASE_FIELDS = ("key", "shard", "index", "status", "reason", "message", "kept", *TEXT_FIELDS)
# The columns wdsfilter fills itself that may hold a URL (the shard's, a message quoting one): written
# as publish.published shows them (no password, no presigned signature: shards.json keeps those).
# The sample's own text (key, caption, url, uid) and the scores are data, written as read.
PUBLISHED_FIELDS = ("shard", "message")
STATUSES = ("scored", "partial", "failed", "rejected")
# In a footer (Parquet's key-value metadata) when no key repeats in the table: a reader that only
# needs to know that (filter's counts) skips reading the key column, half of its reading.
KEYS_META, UNIQUE_KEYS = "wdsfilter.keys", "unique"
WRITER_META = "wdsfilter.writer"  # a joined run's worker that wrote the file (its marker names the same)
# the column types (as Arrow names them) whose values are numbers or nothing
NUMERIC_TYPES = frozenset({"double", "float", "halffloat", "null", *(f"{s}int{b}" for s in ("", "u")
                                                                        for b in (8, 16, 32, 64))})

Columns = Union[Sequence[str], Mapping[str, Optional[str]]]  # score columns, or each with its declared type


def publish_rows(rows: Sequence[dict]) -> List[dict]:
    """The rows with their PUBLISHED_FIELDS as they may be written (every table writer calls it)."""
    return [{**r, **{k: published(r[k]) for k in PUBLISHED_FIELDS if isinstance(r.get(k), str)}} for r in rows]


@dataclass(frozen=True)
class Footer:
    """What a table says of itself without its rows being read: the row count (None where the
    format records none: JSON Lines) and the writer's key-value metadata (WRITER_META, KEYS_META)."""
    rows: Optional[int] = None
    metadata: Dict[str, str] = field(default_factory=dict)


class TableFormat(Protocol):
    """One file format of score tables. Every write is atomic and fenced (a temporary file renamed
    over `path` after the folder's guard: storage/atomic.py); a file that is not as written raises
    DamagedRunFolder naming it, in one line."""

    name: str  # as `score --format` names it
    suffix: str  # the file suffix it owns: ".parquet"
    # column-wise reads through pyarrow's Parquet reader (footer statistics, dictionary codes):
    # filter's column-wise counts (judge.count_table), shares held in memory (tables.column_numbers)
    columnar: bool

    def write(self, rows: Sequence[dict], columns: Columns, path: str, writer: Optional[str] = None) -> None:
        """The rows (dicts) with the base fields and `columns`, atomically; writer: the joined
        worker that wrote the file, in its footer where the format has one."""

    def read(self, path: str, columns: Optional[Sequence[str]] = None) -> Dict[str, list]:
        """Column -> values, the whole file at once; a column the file lacks is left out."""

    def batches(self, path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
        """`rows` rows at a time, {column: values}; a column the file lacks is all None."""

    def arrow_batches(self, path: str, columns: Sequence[str]) -> Iterator[Dict[str, Any]]:
        """{column: Arrow array} batches; a column the file lacks is all null."""

    def numbers(self, path: str, column: str, rows: int = BATCH_ROWS) -> Iterator[Any]:
        """One numeric column as float64 numpy arrays, `rows` at a time, missing values left out."""

    def columns(self, path: str) -> Dict[str, Optional[str]]:
        """Column name -> its type as Arrow names it ("double"), from the footer where the format
        has one (no row read); else from the first row, the types unknown (None); {} for a file
        without a row that names none."""

    def footer(self, path: str) -> Footer:
        """The row count and metadata the file records of itself (nothing read but the footer)."""
