"""`filter --export-uids FILE.npy`: the kept samples' uids in the subset format of DataComp's
filtering track, which its resharder (mlfoundations/datacomp resharder.py) reads to build the
training shards of a submission:

    a numpy array of dtype np.dtype("u8,u8") (pairs of unsigned 64-bit integers), shape (n,),
    each uid's 128 bits as (high 64, low 64): divmod(int(uid, 16), 2**64), the way the resharder
    turns a sample's .json uid into the key it looks up; in lexicographic sorted order (the
    resharder finds a uid by np.searchsorted), saved by np.save (`.npy`).

The uid is the score files' `uid` column (the sample's .json `uid`, as img2dataset and DataComp
write it: 32 hex digits). A kept row without one (or whose uid is not hex digits) cannot be named
to the resharder: it is counted and said, never silently dropped.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..core.errors import ConfigError
from ..storage.writing import check_output_file, atomic_path
from ..runfolder.judge import judge_shard
from ..storage.remote import is_fsspec_url, write_object

UID = "uid"
DTYPE = "u8,u8"  # DataComp's u16: np.dtype("u8,u8")


def check_export(path: str, run) -> None:
    """Before any work: the run has a uid column, and PATH can be written (a .npy file)."""
    if UID not in run.columns:
        raise ConfigError(f"--export-uids: the score files in {run.folder} have no uid column (the sample's .json "
                          f"uid, as DataComp and img2dataset write it), so no kept sample can be named by uid")
    if not path.endswith(".npy"):
        raise ConfigError(f"--export-uids {path}: DataComp's subset file is a .npy file; name it FILE.npy")
    check_output_file(path, "--export-uids")


def uid_pair(uid) -> Optional[tuple]:
    """(high, low) 64-bit halves of a uid of 1 to 32 hex digits, as the resharder reads it; None otherwise."""
    if not isinstance(uid, str) or not 0 < len(uid) <= 32:
        return None
    try:
        return divmod(int(uid, 16), 2 ** 64)
    except ValueError:
        return None


def kept_uid_pairs(run, thresholds: Sequence, marks) -> tuple:
    """(pairs of the kept rows' uids, kept rows without a usable uid), shard by shard."""
    import numpy as np

    parts: List = []
    without = 0
    for shard in run.shards:
        dropped = marks.dropped(shard.name) if marks is not None else None
        pairs = []
        for row, reason in judge_shard(shard, thresholds, extra=[UID], dropped=dropped):
            if reason is not None:
                continue
            pair = uid_pair(row.get(UID))
            if pair is None:
                without += 1
            else:
                pairs.append(pair)
        parts.append(np.array(pairs, dtype=np.dtype(DTYPE)))
    return np.concatenate(parts) if parts else np.zeros(0, np.dtype(DTYPE)), without


def export_kept_uids(path: str, run, thresholds: Sequence, marks=None) -> Dict[str, object]:
    """Write the kept rows' uids to `path` (sorted, each once) atomically; what was written."""
    import io

    import numpy as np

    pairs, without = kept_uid_pairs(run, thresholds, marks)
    if without and not len(pairs):
        raise ConfigError(f"--export-uids: none of the {without} kept sample(s) of {run.folder} has a uid (the .json "
                          f"uid DataComp and img2dataset write, as 32 hex digits): nothing to name to DataComp's "
                          f"resharder; no file written")
    pairs = np.unique(pairs)  # sorted as DataComp sorts them (by high, then low), each uid once
    data = io.BytesIO()  # a file object: np.save would add .npy to a temporary's name
    np.save(data, pairs)
    if is_fsspec_url(path):  # one object, whole or not at all
        write_object(path, data.getvalue())
    else:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data.getvalue())
    return {"path": path, "written": int(len(pairs)), "without_uid": without}
