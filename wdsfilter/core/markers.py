"""The stream protocol: markers that flow beside samples through every stage.

With StageConfig.emit_rejects (the scoring run sets it) the pipeline drops nothing silently:

    {"__marker__": "reject", "__key__", "__url__", "__reject__": reason, "__message__": message,
     "caption": text or None, "json": {"url", "uid"} or None}
        where a stage dropped a sample (the sample gets a row with status "rejected", which keeps
        the caption, url and uid where its text members were read), and
    {"__marker__": "shard_end", "__key__": "", "__url__", "members": n, "error": str or None,
     "failed": bool}
        after the last sample of each shard (reading.group_samples): the shard's rows are all
        announced, so its outputs can be written as soon as the models are done with it.

Every stage passes an item with MARKER through untouched. A shard that cannot be opened at all
gets no shard_end (its reader counts it as unreadable_shard).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Optional, Union

MARKER = "__marker__"
REJECT = "__reject__"  # the reason of a reject marker
REJECTED = "reject"
SHARD_END = "shard_end"
# Where a reject marker's sample was dropped: the stage and the member it named (the failure ledger's).
STAGE, MEMBER = "__stage__", "__member__"


def reject_marker(key: str, url: str, reason: str, message: str, stage: str = "", member: str = "",
                  caption: Optional[str] = None, meta: Optional[Mapping] = None) -> dict:
    """caption, meta: what the dropped sample said, where its text members were read (its caption,
    the url and uid of its .json): its row keeps them, so a user can fetch a broken image again by url."""
    slim = {k: meta[k] for k in ("url", "uid") if k in meta} if isinstance(meta, Mapping) else None
    return {"__key__": key, "__url__": url, MARKER: REJECTED, REJECT: reason, "__message__": message,
            STAGE: stage, MEMBER: member, "caption": caption if isinstance(caption, str) else None, "json": slim}


@dataclass
class ShardEnd:
    """What a shard_end marker says of its shard: the record the engines hand to the row model
    (rows.write_shard), whose completion marker keeps `members` and `error`."""
    members: int = 0
    error: Optional[str] = None  # the tar broke here: the rows before it are the shard's
    failed: Union[bool, str, None] = False  # the stream failed (a pipe: command, a cut download): not done
    not_a_tar: bool = False  # no member header could be read: not done either

    @classmethod
    def of(cls, item: Union["ShardEnd", Mapping]) -> "ShardEnd":
        """From a shard_end marker, or its fields as a dict (the Ray rows carry them as JSON)."""
        if isinstance(item, cls):
            return item
        return cls(members=item.get("members") or 0, error=item.get("error"), failed=item.get("failed") or False,
                   not_a_tar=bool(item.get("not_a_tar")))

    def to_dict(self) -> dict:
        return asdict(self)


def shard_end_marker(url: str, members: int, error: Optional[str], failed: bool = False,
                     not_a_tar: bool = False) -> dict:
    """failed: the shard's stream failed (a pipe: command, a cut download): it is not done.
    not_a_tar: no member header could be read (reading.TarEnd.not_a_tar): it is not done either."""
    return {MARKER: SHARD_END, "__url__": url, "__key__": "",
            **ShardEnd(members, error, failed, not_a_tar).to_dict()}

