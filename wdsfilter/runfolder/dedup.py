"""RUN_DIR/dedup/: what `wdsfilter dedup` decided, per row, and the one rule that reads it (used by
`wdsfilter filter --dedup` and `wdsfilter.loader(scores=..., dedup=True)`):

    dedup/<shard>.parquet   every row of the shard's score file: key, index, group (null: no
                            duplicate), kind (exact, near, semantic), survivor, eval_match (null, or
                            "KIND:EVAL IMAGE" it matches)
    dedup/summary.json      settings, groups per kind, rows marked, the largest groups; `shards`:
                            each score file's size and time, so a dedup older than them is refused

A row is dropped when it matches an eval image ("eval_match") or is not its group's survivor
("duplicate"); every other row is kept.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Iterator, Optional, Sequence, Tuple

from ..errors import ConfigError

FOLDER = "dedup"
SUMMARY = "summary.json"
DUPLICATE = "duplicate"
EVAL_MATCH = "eval_match"


def drop_reason(survivor, eval_match) -> Optional[str]:
    """The rule: why a row is dropped, or None when it is kept."""
    if eval_match:
        return EVAL_MATCH
    if survivor is False:
        return DUPLICATE
    return None


def score_file_state(path: str) -> dict:
    """What the dedup records of a score file, to know it later for the same file."""
    st = os.stat(path)
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


class DedupMarks:
    """The dedup of a run folder, checked against its finished shards."""

    def __init__(self, run_dir: str, shards: Sequence[Tuple[str, str]] = ()):
        """shards: (output name, score file) of the run's finished shards: a shard the dedup did not
        see, or whose score file changed since (--resume, a re-scored shard), is refused."""
        self.folder = os.path.join(run_dir, FOLDER)
        path = os.path.join(self.folder, SUMMARY)
        if not os.path.exists(path):
            raise ConfigError(f"{run_dir} has no dedup results ({path}); run `wdsfilter dedup {run_dir}` first")
        with open(path) as f:
            self.summary = json.load(f)
        known = self.summary.get("shards", {})
        stale = [name for name, path in shards if known.get(name) != score_file_state(path)]
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

    def _rows(self, name: str) -> Iterator[tuple]:
        path = os.path.join(self.folder, name + ".parquet")
        if not os.path.exists(path):
            return
        import pyarrow.parquet as pq
        t = pq.read_table(path, columns=["key", "index", "survivor", "eval_match"]).to_pydict()
        yield from zip(t["key"], t["index"], t["survivor"], t["eval_match"])
