"""The run folder's failure ledger as written (score/ledger.py writes it): its file names, the
reasons trying again can cure, the reader and the summary by reason. Below score/ because the
run's report (wdsfilter/report/) reads it as well as `score --retry-failed`.

    RUN_DIR/failures/<name>.parquet   one shard's entries (written before its marker)
    RUN_DIR/failures.parquet          the run's entries merged at its end
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

from .names import FAILURES as FOLDER, FAILURES_MERGED as MERGED  # noqa: F401 - the ledger's names, read here
from .layout import confined
from .tables import PARQUET

# The reasons trying again can cure: out of memory after the back-off reached a batch of one, a
# scorer that raised on the sample (score_batch, or prepare() with an error that is not a
# DataError), a device or worker that died under it, a read that broke off (a remote shard, a
# pipe: command), an output that could not be written. Every other reason is a property of the
# data (corrupt_image, missing_caption, caption_not_text, a scorer's DataError ...): the same
# bytes fail the same way, so --retry-failed skips them unless asked for `all`.
TRANSIENT = frozenset({"out_of_memory", "score_error", "prepare_error", "device_error", "worker_died",
                       "read_failed", "unreadable_remote", "remote_unreachable", "write_failed", "disk_full",
                       "shard_unfinished"})


def folder(out: str) -> str:
    return os.path.join(out, FOLDER)


def shard_file(out: str, name: str) -> str:
    return os.path.join(out, FOLDER, name + PARQUET.suffix)


def read_entries(path: str, folder: Optional[str] = None) -> List[dict]:
    """A ledger file's entries; none for a missing file or one not as the ledger writes it (another
    schema, wrong types: entries a report or a retry could not use). `folder`: the run folder the
    file must stay in (a symlink out of it is refused, runfolder.layout.confined)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if folder is not None:
        confined(folder, path)
    try:
        entries = pq.read_table(path).to_pylist()
    except (OSError, ValueError, pa.ArrowException):  # none yet, or a file from before the ledger existed
        return []
    return [e for e in entries if _well_formed(e)]


def _well_formed(e: dict) -> bool:
    index = e.get("index")
    return (isinstance(e.get("reason"), str) and isinstance(e.get("shard"), str)
            and isinstance(index, int) and not isinstance(index, bool)
            and isinstance(e.get("key"), (str, type(None))) and isinstance(e.get("message"), (str, type(None))))


def summarize(entries: Sequence[dict]) -> Dict[str, dict]:
    """By reason: samples listed, shards they are in, and whether the reason is transient;
    shard-level entries count as shards only (their samples are unknown)."""
    out: Dict[str, dict] = {}
    for e in entries:
        for reason in dict.fromkeys(e["reason"].split(";")):
            s = out.setdefault(reason, {"samples": 0, "shards": set(), "transient": reason in TRANSIENT})
            s["samples"] += e["index"] >= 0
            s["shards"].add(e["shard"])
    return {r: {**s, "shards": len(s["shards"])}
            for r, s in sorted(out.items(), key=lambda kv: (-kv[1]["samples"], kv[0]))}
