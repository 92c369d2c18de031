"""A sample's row and a shard's completion: the row model that both runners share (the local
engine, engines/local.py, and the Ray engine, engines/ray.py).

Every sample gets one row: key, shard, index (order in the shard), status, reason, message,
kept, caption, url, uid (what the sample said: `sample_text`), then one column per score. status:
    "rejected"  a stage dropped it (reason: the stage's reason), from a reject marker
    "failed"    no scorer could score it (reason: each scorer's reason, ";"-joined)
    "partial"   some scorers did, some did not; or the sample was scored from incomplete data
                (a video cut short: reason corrupt_video, as validate names it)
    "scored"    every scorer did
A shard is complete when its shard_end marker came and every row announced before it has its
final status; then write_shard() writes its score file, its filtered shard and, last, its
completion marker (so --resume never trusts a shard whose outputs are not all in place).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Union

from ..core.errors import RunError
from ..storage.remote import redact_url
from ..core.markers import MARKER, MEMBER, REJECT, STAGE, ShardEnd
from ..runfolder.keep import keep_reason
from ..runfolder.embeddings import write_embeddings
from .faults import is_disk_full, read_failed_reason
from .ledger import row_entries, write_shard_failures
from .scorers.base import NOTES
from ..runfolder.tables import BASE_FIELDS, STATUSES, write_table  # noqa: F401 - the fields are the score file's schema
from ..runfolder.tables import TEXT_FIELDS
from ..core.specs import no_lone_surrogates
from ..storage.shardstats import update_sizes, write_shard_stats
from ..storage.shardcopy import write_filtered


class NothingScoredError(RunError):
    """The run finished and no sample got a score: the counts say why."""


# -- one row -----------------------------------------------------------------------------------------
TEXT = "text"  # the stream item's field (transport.Prepare) that carries sample_text to the row
TEXT_LIMIT = 4096  # characters kept of each text field: a shard's rows are held until it ends


def sample_text(sample: dict) -> Dict[str, Optional[str]]:
    """caption, url, uid of a sample after the stages: the caption as the stages saw it (special
    tokens cleaned, as the scorers get it), the url and uid of its .json where it has them
    (img2dataset: url, and uid with its --save_additional_columns; DataComp: uid, url). A value
    that is not text (a uid given as a number is written as its digits) or a json that is not an
    object gives None. Each is cut at TEXT_LIMIT characters (docs/score.md); a lone surrogate becomes
    U+FFFD (specs.no_lone_surrogates, as for the caption)."""
    meta = sample.get("json")
    meta = meta if isinstance(meta, dict) else {}

    def text(value) -> Optional[str]:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            return None
        return no_lone_surrogates(value[:TEXT_LIMIT])  # a JSON "\ud83d" no score file writer takes
    return {"caption": text(sample.get("caption")), "url": text(meta.get("url")), "uid": text(meta.get("uid"))}


def new_row(key: str, url: str, index: int, status: Optional[str] = None, reason: Optional[str] = None,
            message: Optional[str] = None, text: Optional[dict] = None) -> dict:
    """A row; status None means the models still have to score the sample. text: sample_text's
    fields (None where the sample was dropped before they were known)."""
    return {"key": key, "shard": url, "index": index, "status": status, "reason": reason, "message": message,
            "kept": False, **{f: (text or {}).get(f) for f in TEXT_FIELDS}}


def item_row(item: dict, index: int, scorers: Sequence, thresholds: Optional[Sequence]) -> dict:
    """The row of one stream item that is not a shard end: a reject marker's row is final, so is
    the row of a sample no scorer could prepare; any other row waits for item["inputs"] to be
    scored (status None)."""
    url = item.get("__url__", "")
    if MARKER in item:
        key = item.get("__key__", "")
        row = new_row(key, url, index, "rejected", item.get(REJECT), item.get("__message__"), text=sample_text(item))
        row[STAGE] = item.get(STAGE) or ""  # for the failure ledger (ledger.py); not a score file column
        row[MEMBER] = item.get(MEMBER) if item.get(MEMBER) != key else ""
        return row
    row = new_row(item["__key__"], url, index, text=item.get(TEXT))
    if not item["inputs"]:
        complete_row(row, scorers, {}, item["errors"], thresholds)
    return row


def complete_row(row: dict, scorers: Sequence, scores: dict, errors: dict, thresholds: Optional[Sequence]) -> None:
    """Fill a sample's row from its scores and its per-scorer errors (prepare or scoring).
    thresholds: the run's rules (Selection.row_rules), or None when it has none
    (ScoreConfig.row_bounds, decided once per run, not per row).

    kept: the one rule of `wdsfilter filter` and wdsfilter.loader(scores=...) too
    (runfolder.keep_reason): some scorer scored it and every threshold column is within bounds.
    A partial row (say a video, which OCR scores and CLIP cannot, or a video cut short, scored
    from the frames that are there) is kept when the thresholds only involve the scorers that
    succeeded, and without thresholds."""
    row.update(scores)
    failed = [s.name for s in scorers if s.name in errors]
    # Scorers that scored, but from incomplete data (prepare() returned scorers.base.Noted).
    noted = {n: v for n, v in errors.get(NOTES, {}).items() if n not in failed}
    problems = {**{name: errors[name] for name in failed}, **noted}
    if not problems:
        row["status"] = "scored"
    else:
        row["status"] = "failed" if len(failed) == len(scorers) else "partial"
        row["reason"] = ";".join(dict.fromkeys(reason for reason, _ in problems.values()))
        row["message"] = "; ".join(f"{name}: {message}" for name, (_, message) in problems.items())
    row["kept"] = keep_reason(row, thresholds) is None


# -- one shard ---------------------------------------------------------------------------------------
class ShardRows:
    """The rows of one shard while it is being scored (local engine)."""

    def __init__(self, url: str):
        self.url = url
        self.rows: List[dict] = []
        self.prep_errors: Dict[int, dict] = {}  # index -> prepare errors of rows the models still score
        self.pending = 0
        self.ended = False
        self.error: Optional[str] = None
        self.failed: Optional[str] = None  # the stream failed: not read to its end
        self.not_a_tar = False  # no member header could be read
        self.members = 0

    def add(self, item: dict, scorers: Sequence, thresholds: Optional[Sequence]) -> Optional[int]:
        """Give a stream item its row; returns its index when the models still have to score it."""
        index = len(self.rows)
        row = item_row(item, index, scorers, thresholds)
        self.rows.append(row)
        if row["status"] is not None:
            return None
        self.prep_errors[index] = item["errors"]
        self.pending += 1
        return index

    def end(self, marker: dict) -> None:
        end = ShardEnd.of(marker)
        self.ended, self.error, self.members = True, end.error, end.members
        self.failed, self.not_a_tar = end.failed, end.not_a_tar

    @property
    def complete(self) -> bool:
        return self.ended and self.pending == 0


def status_counts(rows: Sequence[dict]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def write_shard(url: str, rows: List[dict], end: Union[ShardEnd, dict], cfg, state, columns: Sequence[str],
                source: Optional[str] = None, attempts: Optional[Dict[int, int]] = None,
                **marker_extra) -> Optional[str]:
    """Write one complete shard's outputs in order (score file, embeddings, filtered shard, its
    failure ledger file, completion marker). `end` is its shard_end marker (members, error,
    failed, not_a_tar); attempts: the ledger's count for retried samples (ledger.row_entries).
    Returns None when done, else why the shard failed; a failed shard gets no marker, so --resume scores it again.
    A full disk raises (faults.py): the run stops."""
    end = ShardEnd.of(end)
    if end.failed:  # the stream failed, the shard was not read to its end: no outputs
        return read_failed_reason(end.failed)
    if end.not_a_tar:  # no member header could be read: no outputs, no marker
        return (f"no member could be read ({end.error}); is it a tar (a git-lfs pointer file, an HTML "
                f"error page)? Re-create or re-download it; no marker: --resume reads it again")
    if state.fence is not None:  # a Ray worker's writes are fenced by the run's lease too (runfolder/lease.py)
        state.fence.install()
    write_table(rows, columns, state.score_path(url), cfg.format, writer=state.writer)
    embeddings = write_embeddings(cfg.out, state.names[url], rows) or {}
    filtered = None
    if cfg.copies_shards:  # (with --samples-per-shard the kept samples are resharded at the run's end)
        keep = {r["key"] for r in rows if r["kept"]}
        dest = state.filtered_path(url)
        try:
            filtered = write_filtered(source or url, keep, dest, cfg.stage.rekey, cfg.stage.allow_pipe,
                                      cfg.stage.allow_remote, cfg.stage.stream_idle_seconds, cfg.stage.remote_options())
            # the stats and sizes.json entry before the marker: a resumed run that trusts the
            # marker finds them in place; a rescored shard sets its entry again
            folder, name = os.path.split(dest)
            # _stats.json is published with the shards: the source without password or signed query
            write_shard_stats(folder, name, filtered["samples"], filtered["members"], {redact_url(url): filtered["samples"]},
                              filtered["bytes"])
            if not state.writer:  # a joined run's sizes.json is the end of the run's (join.py), not each worker's
                update_sizes(folder, {name: filtered["samples"]})
        except OSError as e:  # the shard cannot be read again (a pipe: command failed): no marker
            if is_disk_full(e):
                raise
            return f"filtered shard not written: {e}"
    # the ledger's file before the marker, which records its size: a shard trusted as done has
    # its failures listed, never an older attempt's
    ledger_file = write_shard_failures(cfg.out, state.names[url], row_entries(rows, attempts))
    state.mark_done(url, {"rows": len(rows), "status": status_counts(rows), "kept": sum(bool(r["kept"]) for r in rows),
                          "members": end.members, "error": end.error, "filtered": filtered,
                          # relative to --out: --resume checks they are still there
                          "embeddings": sorted(os.path.relpath(p, cfg.out) for p in embeddings.values()),
                          "failures": os.path.relpath(ledger_file, cfg.out),
                          **marker_extra}, source=source)
    return None
