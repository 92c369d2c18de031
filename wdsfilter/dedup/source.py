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

from ..errors import ConfigError
from .hashindex import sha_prefix

HASH_HINT = "score the run with `wdsfilter score ... --scorer hash` (it adds sha256 and phash)"
EMBED_HINT = "score the run with `wdsfilter score ... --scorer clip --save-embeddings`"


@dataclass
class Shard:
    name: str        # its output name (score file stem)
    url: str         # the source shard
    score_file: str


@dataclass
class RunRows:
    folder: str
    shards: List[Shard]
    starts: np.ndarray            # first row number of each shard; last: the total
    index: np.ndarray             # each row's index in its shard's score file
    columns: List[str]
    unfinished: List[str]
    stage: dict = None                    # run.json's stage options (keys, rekey: the report's thumbnails)
    sha: Optional[np.ndarray] = None      # (n, 2) uint64: the first 128 bits of sha256
    has_sha: Optional[np.ndarray] = None
    phash: Optional[np.ndarray] = None    # int64
    has_phash: Optional[np.ndarray] = None
    clip: Optional[np.ndarray] = None     # float64, NaN where missing

    @property
    def count(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, rows, side="right") - 1


def open_run(folder: str):
    """The run folder's finished shards (the one reader of a run folder, behind this function)."""
    from ..runfolder import ScoreRun
    return ScoreRun.open(folder)


def load_rows(folder: str, want_hashes: bool) -> RunRows:
    from ..runfolder.tables import read_batches
    run = open_run(folder)
    # a source the run's own record does not name is never read (its thumbnails are left out)
    shards = [Shard(s.name, s.url if s.trusted else "", s.score_file) for s in run.shards]
    hashed = want_hashes and "sha256" in run.columns and "phash" in run.columns
    columns = ["index", "clip_score"] + (["sha256", "phash"] if hashed else [])
    index, clip, sha, phash, present, starts = [], [], [], [], [], [0]
    for s in shards:
        n = 0
        for batch in read_batches(s.score_file, columns):
            index.append(np.asarray(batch["index"], dtype=np.int64))
            clip.append(np.array([np.nan if v is None else v for v in batch["clip_score"]], dtype=np.float64))
            if hashed:
                sha.append(sha_prefix(batch["sha256"]))
                phash.append(np.array([0 if v is None else v for v in batch["phash"]], dtype=np.int64))
                present.append(np.array([v is not None for v in batch["phash"]], dtype=bool))
            n += len(batch["index"])
        starts.append(starts[-1] + n)
    rows = RunRows(folder=folder, shards=shards, starts=np.array(starts, dtype=np.int64),
                   index=_cat(index, np.int64), columns=list(run.columns), unfinished=list(run.unfinished), stage=dict(run.stage),
                   clip=_cat(clip, np.float64))
    if hashed:
        rows.sha = np.concatenate(sha) if sha else np.zeros((0, 2), np.uint64)
        rows.has_sha = rows.sha.any(axis=1)
        rows.phash = _cat(phash, np.int64)
        rows.has_phash = _cat(present, bool)
    return rows


def _cat(parts, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def require_hashes(rows: RunRows, kind: str) -> None:
    if rows.phash is None:
        raise ConfigError(f"{kind} dedup needs the sha256 and phash columns, which the score files in "
                          f"{rows.folder} do not have; {HASH_HINT}")


def embeddings(rows: RunRows):
    """The run's saved image embeddings (semantic.Embeddings), each vector tied to its row."""
    from ..runfolder.layout import confined
    from ..runfolder.tables import _arrow_errors, _native, damaged
    from ..score.embeddings import FOLDER, METADATA, PARTS
    from .semantic import Embeddings
    base = os.path.join(rows.folder, FOLDER)
    files, counts, owners = [], [], []
    for s, shard in enumerate(rows.shards):
        npy = confined(rows.folder, os.path.join(base, PARTS["img"], shard.name + ".npy"))
        meta = confined(rows.folder, os.path.join(base, METADATA, shard.name + ".parquet"))
        if not (os.path.exists(npy) and os.path.exists(meta)):
            continue  # a shard where no sample has a CLIP score has no files
        import pyarrow.parquet as pq
        try:  # files of the run folder: confined, and a damaged one named in one line
            wanted = pq.read_table(_native(meta), columns=["index"]).column(0).to_numpy()
            shape = np.load(npy, mmap_mode="r", allow_pickle=False).shape
        except (_arrow_errors() + (KeyError,)) as e:
            raise damaged(meta, f"embeddings not as `wdsfilter score --save-embeddings` writes them "
                                f"({type(e).__name__}: {e})") from None
        if shape[0] != len(wanted):
            raise ConfigError(f"embeddings of shard {shard.name} in {base} are damaged ({shape[0]} vectors, "
                              f"{len(wanted)} metadata rows); score the shard again (--resume after removing "
                              f"its done/ marker)")
        lo, hi = rows.starts[s], rows.starts[s + 1]
        position = lo + np.searchsorted(rows.index[lo:hi], wanted)  # score files are in index order
        files.append(npy)
        counts.append(len(wanted))
        owners.append(position)
    if not files:
        raise ConfigError(f"semantic dedup needs the run's saved CLIP image embeddings, which {rows.folder} does "
                          f"not have; {EMBED_HINT}")
    return Embeddings(files, np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                      np.concatenate(owners).astype(np.int64))


def has_embeddings(folder: str) -> bool:
    from ..score.embeddings import FOLDER, PARTS
    path = os.path.join(folder, FOLDER, PARTS["img"])
    return os.path.isdir(path) and any(f.endswith(".npy") for f in os.listdir(path))
