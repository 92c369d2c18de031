"""What dedup reads of a scoring run: its finished shards' hash columns, clip_score and saved
embeddings, as flat numpy arrays over one row numbering (shard order, then row order), so the
result does not depend on the order shards finished in.

The run folder is read through `open_run`, the one place that knows how (today
runfolder.ScoreRun: completion markers, damaged files left out).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ..core.errors import ConfigError
from ..runfolder.embeddings import has_image_vectors, image_vectors
from ..runfolder.names import DEDUP, DEDUP_WORK
from .hashindex import HAS_PHASH, HAS_SHA, hex_prefix, sha_prefix
from .spill import Column, Workspace
from ..runfolder import ScoreRun
from ..runfolder.layout import confined
from ..runfolder.tables import format_for
from ..media.hashes import phash_int
from .semantic import Embeddings
from ..core.progress import Progress

HASH_HINT = "score the run with `wdsfilter score ... --scorer hash` (it adds sha256 and phash)"
EMBED_HINT = "score the run with `wdsfilter score ... --scorer clip --save-embeddings`"


@dataclass
class Shard:
    name: str        # its output name (score file stem)
    url: str         # the source shard
    score_file: str


@dataclass
class RunRows:
    """The rows' columns, each one file of RUN_DIR/dedup/tmp in row order (spill.Column): read in
    ranges, never all at once."""
    folder: str
    shards: List[Shard]
    starts: np.ndarray            # first row number of each shard; last: the total
    index: "Column"               # int64: each row's index in its shard's score file
    clip: "Column"                # float64, NaN where missing
    columns: List[str]
    unfinished: List[str]
    stage: dict = None                    # run.json's stage options (keys, rekey: the report's thumbnails)
    sha: Optional["Column"] = None        # (n, 2) uint64: the first 128 bits of sha256 (0 where missing)
    phash: Optional["Column"] = None      # uint64 (0 where missing)
    has: Optional["Column"] = None        # uint8: HAS_SHA | HAS_PHASH
    space: object = None                  # spill.Workspace holding the column files

    @property
    def count(self) -> int:
        return int(self.starts[-1])

    @property
    def hashed(self) -> bool:
        return self.phash is not None

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, rows, side="right") - 1




def open_run(folder: str):
    """The run folder's finished shards (the one reader of a run folder, behind this function)."""
    return ScoreRun.open(folder)


def hashed(run) -> bool:
    """Whether the run's score files have the hash columns (the hash scorer's)."""
    return "sha256" in run.columns and "phash" in run.columns


def load_rows(folder: str, want_hashes: bool, memory_mb: int, progress: bool = False, run=None) -> RunRows:
    """Read the finished shards' columns once, a batch at a time, into column files of
    RUN_DIR/dedup/tmp (rows.space: the caller closes it): vectorised (arrow arrays to numpy), no
    Python object a row. progress: a progress line of the rows read (wdsfilter/progress.py).
    run: the folder's open_run, when the caller has it."""
    run = run or open_run(folder)  # before anything is written: a folder that is no run stays untouched
    space = Workspace(confined(folder, os.path.join(folder, DEDUP, DEDUP_WORK)), memory_mb)
    line = None
    if progress:  # in rows where every marker counted them, and in shards
        counted = [s.rows for s in run.shards]
        line = Progress("dedup: reading scores", "rows", total=sum(counted) if all(counted) else None,
                        parts=len(run.shards))
    try:
        rows = _read(run, folder, want_hashes, space, line)
    except BaseException:
        space.close()
        raise
    finally:
        if line is not None:
            line.close()
    rows.space = space
    return rows


def _read(run, folder: str, want_hashes: bool, space, progress=None) -> RunRows:
    # a source the run's own record does not name is never read (its thumbnails are left out)
    shards = [Shard(s.name, s.url if s.trusted else "", s.score_file) for s in run.shards]
    with_hashes = want_hashes and hashed(run)
    columns = ["index", "clip_score"] + (["sha256", "phash"] if with_hashes else [])
    index, clip = Column(space.path("index"), np.int64), Column(space.path("clip"), np.float64)
    if with_hashes:
        sha = Column(space.path("sha"), np.uint64, width=2)
        phash, has = Column(space.path("phash"), np.uint64), Column(space.path("has"), np.uint8)
    starts = [0]
    for s in shards:
        n = 0
        for batch in arrow_batches(s.score_file, columns):
            index.append(_numbers(batch["index"], np.int64, 0))
            clip.append(_numbers(batch["clip_score"], np.float64, np.nan))
            if with_hashes:
                prefix, valid = _sha_prefix(batch["sha256"])
                sha.append(prefix)
                present = ~_nulls(batch["phash"])
                phash.append(_phashes(batch["phash"], present))
                has.append(valid * np.uint8(HAS_SHA) | present * np.uint8(HAS_PHASH))
            n += len(batch["index"])
            if progress is not None:
                progress.update(len(batch["index"]))
        starts.append(starts[-1] + n)
        if progress is not None:
            progress.part_done()
    rows = RunRows(folder=folder, shards=shards, starts=np.array(starts, dtype=np.int64),
                   index=index.done(), clip=clip.done(), columns=list(run.columns),
                   unfinished=list(run.unfinished), stage=dict(run.stage))
    if with_hashes:
        rows.sha, rows.phash, rows.has = sha.done(), phash.done(), has.done()
    return rows


def arrow_batches(path: str, columns: List[str]):
    """{column: arrow array} batches of one score file (a column it lacks: all null)."""
    return format_for(path).arrow_batches(path, columns)


def _nulls(array) -> np.ndarray:
    """Which values of an arrow array are null, from its validity bitmap (no pandas import)."""
    import pyarrow as pa
    n = len(array)
    if pa.types.is_null(array.type):
        return np.ones(n, dtype=bool)
    if not array.null_count:
        return np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], dtype=np.uint8), bitorder="little")
    return ~bits[array.offset:array.offset + n].astype(bool)


def _numbers(array, dtype, missing) -> np.ndarray:
    """A numeric arrow array as numpy, nulls as `missing`, read from its buffer (Array.to_numpy
    would import pandas: seconds of a short command)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_null(array.type):
        return np.full(len(array), missing, dtype=dtype)
    array = array.cast(pa.from_numpy_dtype(np.dtype(dtype)))
    if array.null_count:
        array = pc.fill_null(array, missing)
    return np.frombuffer(array.buffers()[1], dtype=dtype)[array.offset:array.offset + len(array)]


def _phashes(array, present) -> np.ndarray:
    """A phash column as uint64 (0 where missing): the hex texts score files hold (16 digits,
    decoded all at once), or the signed int64 of runs scored before."""
    import pyarrow as pa
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return _numbers(array, np.int64, 0).view(np.uint64)
    texts = array.to_pylist()
    if all(t is None or (len(t) == 16) for t in texts):
        joined = "".join(t if t is not None else "0" * 16 for t in texts)
        try:
            return np.frombuffer(bytes.fromhex(joined), dtype=">u8").astype(np.uint64)
        except ValueError:
            pass  # not hex: each one read alone below, a bad one as missing
    out = np.zeros(len(texts), dtype=np.uint64)
    for i, t in enumerate(texts):
        try:
            out[i] = np.int64(phash_int(t)).view(np.uint64) if t is not None else 0
        except ValueError:
            present[i] = False
    return out


def _sha_prefix(array):
    """(n, 2) uint64 of each digest's first 128 bits, and which rows have a valid one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(array)
    valid = ~_nulls(array)
    if pa.types.is_null(array.type):
        return np.zeros((n, 2), np.uint64), valid
    if pa.types.is_string(array.type) and not array.null_count and n:  # the hash scorer's: 64 hex digits each
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset:array.offset + n + 1]
        if offsets[-1] - offsets[0] == 64 * n and (np.diff(offsets) == 64).all():
            data = np.frombuffer(array.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
            return hex_prefix(data.reshape(n, 64)[:, :32], valid)
    text = pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(array.cast(pa.string()), ""), 0, 32), 32, "-")
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[text.offset:text.offset + n + 1]
    if offsets[-1] - offsets[0] != 32 * n:  # a digest with non-ASCII characters: the slow way
        prefix = sha_prefix(array.to_pylist())
        return prefix, valid & prefix.any(axis=1)
    chars = np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]].reshape(n, 32)
    return hex_prefix(chars, valid)


def require_hashes(run, folder: str, kind: str) -> None:
    if not hashed(run):
        raise ConfigError(f"{kind} dedup needs the sha256 and phash columns, which the score files in "
                          f"{folder} do not have; {HASH_HINT}")


def embeddings(rows: RunRows):
    """The run's saved image embeddings (semantic.Embeddings), each vector tied to its row."""
    files, counts, owners = [], [], []
    for s, shard in enumerate(rows.shards):
        found = image_vectors(rows.folder, shard.name)
        if found is None:
            continue  # a shard where no sample has a CLIP score has no files
        npy, wanted = found
        lo, hi = int(rows.starts[s]), int(rows.starts[s + 1])
        position = lo + np.searchsorted(rows.index.read(lo, hi), wanted)  # score files are in index order
        files.append(npy)
        counts.append(len(wanted))
        owners.append(position)
    if not files:
        require_embeddings(rows.folder, found=False)
    return Embeddings(files, np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                      np.concatenate(owners).astype(np.int64))


def require_embeddings(folder: str, found: Optional[bool] = None) -> None:
    """A ConfigError unless the run saved image embeddings (found: whether they were, when known)."""
    if not (has_image_vectors(folder) if found is None else found):
        raise ConfigError(f"semantic dedup needs the run's saved CLIP image embeddings, which {folder} does "
                          f"not have; {EMBED_HINT}")

