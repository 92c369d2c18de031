"""Is a score row kept: the one rule, for the scoring run (a row's `kept`, its filtered shards),
`wdsfilter filter` and the loader's score filter (`wdsfilter.loader(scores=...)`).

    keep_reason(row, thresholds) -> None (kept) or a Drop saying why not

A row is kept when its status is "scored" or "partial" (some scorer scored it) and every
threshold column holds a number within its bounds. So with no threshold every row some scorer
scored is kept; a "failed" row (no scorer could score it) or a "rejected" one (a stage dropped
the sample) never is, nor a sample without a row. A partial row is judged on the columns it has:
a video that OCR scored and CLIP could not passes `--max ocr_area=0.2` and fails `--min
clip_score=0.28` ("no clip_score"). A threshold column whose value is missing (null, NaN) or not
a number (a string in a hand-edited table) fails as "no COLUMN": the row has no score to judge.
A text column's rule (`--equal caption_language=en`, thresholds.Match) is judged the same way: no
value is "no caption_language", another value "caption_language not en".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Union

from ..core.thresholds import Bound, Match, Thresholds

KEPT_STATUSES = ("scored", "partial")  # rejected and failed rows are never kept


@dataclass(frozen=True)
class Drop:
    """Why a row is not kept. reason: short and countable ("not scored: no_caption", "rejected:
    unsafe_member", "no clip_score", "clip_score < 0.28"); no_score: the row has no score to judge
    (its status, or no value in a threshold column) rather than a value outside a bound;
    bound: the bound it failed, if any."""
    reason: str
    no_score: bool
    bound: Optional[Union[Bound, Match]] = None

    def explain(self, row: Mapping) -> str:
        """A longer line for a per-sample log ("clip_score=0.1 < 0.28")."""
        if self.bound is not None and not self.no_score:
            return self.bound.explain(row.get(self.bound.column))
        return self.reason


def keep_reason(row: Mapping, thresholds: Union[Thresholds, Iterable[Union[Bound, Match]], None] = None
                ) -> Optional[Drop]:
    """None when `row` is kept, else the first reason it is not (status first, then each rule in
    order). thresholds: a Thresholds, or rules (a selection's: Selection.row_rules(), or a run's
    resolved `--min/--max/--top/--bottom/--equal`)."""
    status = row.get("status")
    if status not in KEPT_STATUSES:
        what = "rejected" if status == "rejected" else "not scored"
        return Drop(f"{what}: {row.get('reason') or status}", True)
    if not thresholds:
        return None
    for bound in thresholds.bounds() if isinstance(thresholds, Thresholds) else thresholds:
        value = row.get(bound.column)
        ok = bound.judge(value)
        if ok is None:  # missing, NaN, or not a value of the rule's kind at all
            return Drop(f"no {bound.column}", True, bound)
        if not ok:
            return Drop(bound.drop_reason(value), False, bound)
    return None
