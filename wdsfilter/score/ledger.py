"""The failure ledger of a scoring run: every sample that did not end in a row of status `scored`,
and every shard that could not be finished, with a reason, in one table per run.

    OUT/failures/<shard>.parquet   one small file per shard, written (atomically) by
                                   rows.write_shard after the shard's score file and before its
                                   completion marker; a failed shard (no marker) gets one row of
                                   index -1 naming why. Rewritten whenever the shard is scored
                                   again (--resume, --retry-failed): it always describes the
                                   shard's current outputs, never an older attempt's.
    OUT/failures.parquet           all of them merged at the end of the run (Run.finish), for
                                   pandas, polars or duckdb in one read.

That is the ledger's way of being appended to as the run goes: Parquet files cannot be appended
to, but a folder of per-shard files can, and a run killed with SIGKILL leaves a complete file for
every finished shard (`duckdb "SELECT * FROM 'OUT/failures/*.parquet'"` reads them before the
merge).

Columns: key, shard, index (the row in the shard's score file; -1: the whole shard), member (the
member a stage refused, where it named one), stage (read, select, decode, prepare, score, write),
status (the row's: rejected, failed, partial; "shard" for a shard-level entry), reason, message,
attempts (scoring attempts of the sample so far), transient (whether trying again can help), and
what the sample said where its text members were read: caption, url, uid (img2dataset's loop:
download the broken images again by url).

The promise (docs/score.md): every sample of every input shard ends in exactly one row of status
scored, or is listed here. Which reasons are transient is decided in one place, TRANSIENT.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List, Optional, Sequence

from ..core.markers import MEMBER, STAGE, MARKER, SHARD_END  # noqa: F401 - a row's private fields: where it was dropped
# the run folder's failures/ files, their reader and summary (runfolder/failures.py: the report reads them too)
from ..runfolder.failures import FOLDER, MERGED, TRANSIENT, folder, read_entries, shard_file, summarize  # noqa: F401
from ..runfolder.tables import publish_rows, write_arrow
from ..storage.tarsubset import ReadOnly

FIELDS = ("key", "shard", "index", "member", "stage", "status", "reason", "message", "attempts", "transient", "caption",
          "url", "uid")

# A sample's stage, by reason, for rows whose stage no stage recorded.
SCORE_REASONS = frozenset({"out_of_memory", "score_error", "bad_score_output"})
RETRY_MODES = ("transient", "all")


def is_transient(reason: Optional[str]) -> bool:
    """A row's reason (several scorers' reasons are ";"-joined) is transient when any part is."""
    return any(part in TRANSIENT for part in (reason or "").split(";"))


# -- entries -------------------------------------------------------------------------------------------
def row_entries(rows: Iterable[dict], attempts: Optional[Dict[int, int]] = None) -> List[dict]:
    """The ledger entries of a shard's rows: one per row whose status is not `scored`.
    attempts: index -> the sample's scoring attempts so far where it has a history (a retry), else 1."""
    attempts = attempts or {}
    out = []
    for r in rows:
        if r["status"] == "scored":
            continue
        reason = r.get("reason") or r["status"]
        stage = r.get(STAGE) or ("score" if set(reason.split(";")) & SCORE_REASONS else "prepare"
                                 if r["status"] != "rejected" else "select")
        out.append({"key": r["key"], "shard": r["shard"], "index": int(r["index"]), "member": r.get(MEMBER) or "",
                    "stage": stage, "status": r["status"], "reason": reason, "message": r.get("message") or "",
                    "attempts": attempts.get(int(r["index"]), 1), "transient": is_transient(reason),
                    "caption": r.get("caption"), "url": r.get("url"), "uid": r.get("uid")})
    return out


def shard_entry(url: str, reason_text: str, remote: bool) -> dict:
    """The one entry of a shard that has no outputs (no marker), from the run's reason for it."""
    text = reason_text or ""
    if text.startswith("unreadable"):
        reason, stage = (remote_reason(text) if remote else "unreadable_shard"), "read"
    elif text.startswith("not read to its end"):
        reason, stage = "read_failed", "read"
    elif text.startswith("no member could be read"):
        reason, stage = "not_a_tar", "read"
    elif text.startswith("filtered shard not written"):
        reason, stage = "write_failed", "write"
    elif text.startswith("no space left"):
        reason, stage = "disk_full", "write"
    elif "died" in text or "lost" in text:
        reason, stage = "worker_died", "score"
    elif "device" in text and "failed" in text:
        reason, stage = "device_error", "score"
    else:
        reason, stage = "shard_unfinished", "score"
    return {"key": "", "shard": url, "index": -1, "member": "", "stage": stage, "status": "shard", "reason": reason,
            "message": text, "attempts": 1, "transient": reason in TRANSIENT}


def remote_reason(text: str) -> str:
    """A remote shard that could not be opened, by what its message says (remote_net, remote_read):
    the store not reached, access refused or no credentials, the object missing, else unreadable."""
    if ": cannot be reached: " in text:
        return "remote_unreachable"
    if "access denied" in text or "no credentials were found" in text:
        return "remote_access_denied"
    if " does not exist (credentials: " in text:
        return "remote_object_missing"
    return "unreadable_remote"


# -- files ----------------------------------------------------------------------------------------------
def _schema():
    import pyarrow as pa
    return pa.schema([("key", pa.string()), ("shard", pa.string()), ("index", pa.int64()), ("member", pa.string()),
                      ("stage", pa.string()), ("status", pa.string()), ("reason", pa.string()),
                      ("message", pa.string()), ("attempts", pa.int64()), ("transient", pa.bool_()),
                      ("caption", pa.string()), ("url", pa.string()), ("uid", pa.string())])


def _write(entries: Sequence[dict], path: str) -> None:
    import pyarrow as pa
    write_arrow(pa.Table.from_pylist(publish_rows(entries), schema=_schema()), path)  # atomically


def write_shard_failures(out: str, name: str, entries: Sequence[dict]) -> str:
    """The shard's ledger file (even when empty: it replaces an older attempt's), atomically."""
    path = shard_file(out, name)
    _write(entries, path)
    return path


def merge(out: str, names: Sequence[str]) -> List[dict]:
    """failures.parquet: the per-shard files of these shards (the run's) in one file; returns
    its entries."""
    entries: List[dict] = []
    for name in names:
        entries += read_entries(shard_file(out, name))
    _write(entries, os.path.join(out, MERGED))
    return entries


def summary_lines(by_reason: Dict[str, dict], path: str) -> List[str]:
    if not by_reason:
        return []
    lines = [f"  failure ledger ({path}), by reason:"]
    for reason, s in by_reason.items():
        what = f"{s['samples']} sample(s)" if s["samples"] else f"{s['shards']} whole shard(s)"
        lines.append(f"    {what:>18}  {reason} ({'transient: --retry-failed' if s['transient'] else 'data'})")
    return lines


# -- --retry-failed ---------------------------------------------------------------------------------------
def retry_plan(state, mode: str) -> Dict[str, Dict[int, dict]]:
    """url -> {index: entry} of the sample-level entries to score again, in shards that are done
    (a shard without a marker is scored again whole, as --resume does). mode: "transient", or
    "all" (data errors too)."""
    plan: Dict[str, Dict[int, dict]] = {}
    for url in state.urls:
        if not state.is_done(url):
            continue
        for e in read_entries(shard_file(state.out, state.names[url])):
            if e["index"] >= 0 and (mode == "all" or e["transient"]):
                plan.setdefault(url, {})[int(e["index"])] = e
    return plan


class OnlyKeys:
    """Picklable stage (before decoding): in the shards of `keys` ({url: keys}), only the samples
    (and reject markers) of those keys go on; other shards pass whole. What it drops is never
    decoded, prepared or scored; with its reader() stage, a local shard's other members are not
    even read."""

    def __init__(self, keys: Dict[str, Iterable[str]]):
        self.keys = {url: frozenset(k) for url, k in keys.items()}

    def reader(self):
        """The shard-list stage that has the reader read only these samples' members, by their
        offsets, where a shard is a local file (tarsubset.py)."""
        return ReadOnly(self.keys)

    def opened_as(self, url: str, path: str) -> "OnlyKeys":
        """The same stage for a shard its reader opens by another name (a Ray worker: its path)."""
        return OnlyKeys({path: self.keys[url]})

    def __call__(self, data):
        for sample in data:
            wanted = self.keys.get(sample.get("__url__", ""))
            if wanted is None or sample.get(MARKER) == SHARD_END or sample.get("__key__") in wanted:
                yield sample
