"""--retry-failed's writing: the samples read again put in place of the failed ones in their shard's
rows (`merge_retried`), the saved embeddings of the others kept, each listed sample's attempts
counted, and the shard's outputs rewritten through the row model (`write_retried` -> rows.write_shard),
the marker last. The plan of what to read again is the ledger's (ledger.retry_plan, OnlyKeys)."""
from __future__ import annotations

from typing import Dict, List, Optional

from ..runfolder.embeddings import FIELD as EMBEDDINGS_FIELD, read_shard as read_embeddings
from .ledger import read_entries, shard_file
from .rows import write_shard
from ..runfolder.tables import read_rows
from ..core.markers import ShardEnd


def merge_retried(url: str, retried: List[dict], plan: Dict[int, dict], state) -> List[dict]:
    """The shard's rows with the retried ones in place: the rows of its score file (and their
    embeddings, where the run saves them), each retried row at the index of its sample. The
    retry reads every sample of a listed key, in shard order, so the n-th row of a key read back
    is the n-th row of that key in the score file (a key that returns later in the shard has
    several); only those the plan lists are replaced."""
    rows = read_rows(state.score_path(url))
    _attach_embeddings(state, url, rows)
    occurrences: Dict[str, List[int]] = {}
    for row in rows:
        occurrences.setdefault(row["key"], []).append(row["index"])
    for row in retried:
        left = occurrences.get(row["key"])
        if not left:  # more samples of this key than the first reading had: not this run's to place
            continue
        index = left.pop(0)
        if index in plan:
            row["index"] = index
            rows[index] = row
    return rows


def _attach_embeddings(state, url: str, rows: List[dict]) -> None:
    """The saved embeddings of a shard's rows back on them (embeddings.FIELD), so that rewriting
    the shard keeps the vectors of the rows not retried."""
    for index, vectors in (read_embeddings(state.out, state.names[url]) or {}).items():
        rows[index][EMBEDDINGS_FIELD] = vectors


def attempts_after_retry(state, url: str, plan: Dict[int, dict]) -> Dict[int, int]:
    """index -> attempts of the shard's listed samples once this retry is done: one more for
    those retried, as many as before for the others."""
    before = {int(e["index"]): int(e["attempts"]) for e in read_entries(shard_file(state.out, state.names[url]))
              if e["index"] >= 0}
    return {index: n + (index in plan) for index, n in before.items()}


def write_retried(url: str, retried: List[dict], end: dict, cfg, state, columns, plan: Dict[int, dict],
                  source: Optional[str] = None, **marker_extra) -> Optional[str]:
    """rows.write_shard for a shard of --retry-failed: `retried` are the rows of the samples read
    again (`plan`), put in place of the failed ones in the shard's rows (merge_retried); every
    output of the shard is rewritten, each atomically, the marker last, with the members and
    error the first reading recorded (the retry read part of the shard). A retry whose read
    failed writes nothing: the shard keeps its outputs and its ledger."""
    import json

    end = ShardEnd.of(end)
    if end.failed or end.not_a_tar:
        return write_shard(url, retried, end, cfg, state, columns, source=source)  # its reason, nothing written
    with open(state.marker_path(url)) as f:
        first = json.load(f)
    rows = merge_retried(url, retried, plan, state)
    end = dict(end.to_dict(), members=first.get("members", 0), error=first.get("error"))
    return write_shard(url, rows, end, cfg, state, columns, source=source,
                       attempts=attempts_after_retry(state, url, plan), **marker_extra)
