"""RUN_DIR/dedup/: what `wdsfilter dedup` decided, per row, and the one rule that reads it (used by
`wdsfilter filter --dedup` and `wdsfilter.loader(scores=..., dedup=True)`):

    dedup/<shard>.parquet   every row of the shard's score file: key, index, group (null: no
                            duplicate), kind (exact, near, semantic), survivor, eval_match (null, or
                            "KIND:EVAL IMAGE" it matches)
    dedup/summary.json      settings, groups per kind, rows marked, the largest groups; `shards`:
                            each score file's size, time and sha256, so a dedup older than them is refused

A row is dropped when it matches an eval image ("eval_match") or is not its group's survivor
("duplicate"); every other row is kept.
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, Optional, Sequence, Tuple

from ..core.errors import ConfigError
from .names import DEDUP as FOLDER, DEDUP_SUMMARY as SUMMARY
from .layout import confined, read_json
from .tables import PARQUET, audited, damaged, parquet_errors

DUPLICATE = "duplicate"
EVAL_MATCH = "eval_match"


def marks_file(folder: str, name: str) -> str:
    """dedup/<name>.parquet: shard `name`'s marks in the dedup folder `folder`."""
    return os.path.join(folder, name + PARQUET.suffix)


def drop_reason(survivor, eval_match) -> Optional[str]:
    """The rule: why a row is dropped, or None when it is kept."""
    if eval_match:
        return EVAL_MATCH
    if survivor is False:
        return DUPLICATE
    return None


def score_file_state(path: str) -> dict:
    """What the dedup records of a score file, to know it later for the same file: its size and
    time, and its sha256 for a copy of the folder (a bucket's run folder read back has other times)."""
    st = os.stat(path)
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path)}


def same_score_file(recorded, path: str) -> bool:
    """Is `path` the score file the dedup recorded? The same size and time, or (a copy) the same
    size and bytes; the bytes are read only when the time differs."""
    if not isinstance(recorded, dict):
        return False
    st = os.stat(path)
    if recorded.get("bytes") != st.st_size:
        return False
    return recorded.get("mtime_ns") == st.st_mtime_ns or recorded.get("sha256") == _sha256(path)


def _sha256(path: str) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class DedupMarks:
    """The dedup of a run folder, checked against its finished shards."""

    def __init__(self, run_dir: str, shards: Sequence[Tuple[str, str]] = ()):
        """shards: (output name, score file) of the run's finished shards: a shard the dedup did not
        see, or whose score file changed since (--resume, a re-scored shard), is refused. The
        folder's files are read as every run-folder file is (layout.py): confined to the folder,
        a damaged one named in one line."""
        self.run_dir = run_dir
        self.folder = confined(run_dir, os.path.join(run_dir, FOLDER))
        path = os.path.join(self.folder, SUMMARY)
        summary = read_json(run_dir, path, None)
        if summary is None:
            raise ConfigError(f"{run_dir} has no dedup results ({path}); run `wdsfilter dedup {run_dir}` first")
        if not isinstance(summary, dict) or not isinstance(summary.get("shards", {}), dict):
            raise damaged(path, "not the summary `wdsfilter dedup` writes; run it again")
        self.summary = summary
        known = self.summary.get("shards", {})
        stale = [name for name, path in shards if not same_score_file(known.get(name), path)]
        if stale:
            raise ConfigError(f"the dedup in {self.folder} is older than the score files of {len(stale)} shard(s) "
                              f"({', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}); run `wdsfilter dedup "
                              f"{run_dir}` again")

    def dropped(self, name: str) -> Dict[int, Tuple[str, str]]:
        """{index: (key, reason)} of the shard's dropped rows (only those are held)."""
        out = {}
        for key, index, survivor, match in self._rows(name):
            reason = drop_reason(survivor, match)
            if reason is not None:
                out[index] = (key, reason)
        return out

    def eval_matches(self, name: str) -> Iterator[Tuple[str, int, str]]:
        """(key, index, what it matches) of the shard's rows that match an eval image."""
        return ((key, index, match) for key, index, _, match in self._rows(name) if match)

    def _rows(self, name: str) -> Iterator[tuple]:
        """The shard's marks; DamagedRunFolder when its file is missing (the summary names the
        shard: every row would be kept silently) or not as `wdsfilter dedup` wrote it."""
        path = confined(self.run_dir, marks_file(self.folder, name))
        if not os.path.exists(path):
            if name in self.summary.get("shards", {}):
                raise damaged(path, "missing, though dedup/summary.json lists its shard; run `wdsfilter dedup` again")
            return
        import pyarrow.parquet as pq
        try:
            t = pq.read_table(audited(path), columns=["key", "index", "survivor", "eval_match"]).to_pydict()
        except (parquet_errors() + (KeyError,)) as e:
            raise damaged(path, f"not as `wdsfilter dedup` writes it ({type(e).__name__}: {e}); run it again") from None
        if not all(isinstance(i, int) for i in t["index"]):
            raise damaged(path, "an index that is not a number; run `wdsfilter dedup` again")
        yield from zip(t["key"], t["index"], t["survivor"], t["eval_match"])
