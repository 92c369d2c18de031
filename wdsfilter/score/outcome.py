"""What an engine's scoring did, one record for every engine (the local engine, a joined run's
worker, the Ray runner): Run.finish builds the summary from it, so each fills the same fields the
same way. Also the one wording of a shard that never opened."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Outcome:
    """What an engine's scoring did; each engine returns one and Run.finish builds the summary
    from it, so both engines fill the same fields the same way."""
    shards_scored: int = 0  # written (score file, marker) by this run
    samples: int = 0  # rows of those shards
    failed: List[dict] = field(default_factory=list)  # {"url", "reason"}: no marker, --resume tries it again
    stage_counts: Optional[Dict[str, dict]] = None  # {"dropped": {...}, "notes": {...}}, where the stages ran
    seconds: float = 0.0  # the whole run
    scoring_seconds: float = 0.0  # the scoring loop alone


def unopened_reason(url: str, stage_tally) -> str:
    """Why a shard gave no row at all, from the decode stages' tally: unreadable (its first error)
    or not opened."""
    if stage_tally is not None and stage_tally.by_shard.get(url, {}).get("unreadable_shard"):
        ex = [e.message for e in stage_tally.examples.get("unreadable_shard", []) if e.shard == url]
        return "unreadable: " + (ex[0] if ex else "could not be opened")
    return "could not be opened"
