"""The interface of a report section. A section sees every judged row while `filter` (or the end of
`score`) judges them, gathers the little it shows, then renders its HTML; the cards it shows get
their thumbnails and captions in one read of each shard, shared by every section (media.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..media import number

IDENTIFIERS = ("phash",)  # columns that name an image, not score it: no histogram, no values on cards


@dataclass
class ReportContext:
    """What every section of one report is given: the run (runfolder.ScoreRun), its judged
    thresholds (runfolder.shares.Threshold), its numeric score columns, and this command's
    permissions to read the sources (never the folder's: allow_pipe, allow_remote, idle seconds)."""
    run: object
    thresholds: Sequence
    allow: Tuple[bool, bool, float] = (False, False, 0.0)
    numeric: List[str] = field(init=False)

    def __post_init__(self):
        self.thresholds = list(self.thresholds)
        self.numeric = [c for c in self.run.numeric_columns() if c not in IDENTIFIERS]

    def example(self, shard, row: dict, reason: Optional[str]) -> dict:
        """A row as a card: its shard, key, finite numeric values and verdict (media attached later)."""
        values = {c: row.get(c) for c in self.numeric if number(row.get(c)) is not None}
        return {"url": shard.url, "key": row["key"], "values": values, "kept": reason is None,
                "reason": reason, "message": row.get("message")}


class Section:
    """One part of the page. A new section is a module with a subclass and one line in
    sections/__init__.py's SECTIONS (whose order is the page's)."""

    def __init__(self, context: ReportContext):
        self.context = context

    def columns(self) -> List[str]:
        """Score columns it reads beside the numeric ones and the thresholds' (none by default)."""
        return []

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        """One judged row (reason: why it is dropped, None if kept)."""

    def finish(self, result) -> None:
        """Gather what it shows, once every row is judged (result: runfolder.judge.FilterResult)."""

    def examples(self) -> List[dict]:
        """The cards whose thumbnail and caption are read from the shards (media.attach_media)."""
        return []

    def render(self, result) -> List[str]:
        """Its HTML, as lines of the page."""
        raise NotImplementedError
