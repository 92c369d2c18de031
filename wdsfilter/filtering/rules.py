"""The rules of `wdsfilter filter` are one wdsfilter.Selection (wdsfilter/core/selection.py: parsed from
--min/--max/--top/--bottom/--equal/--dedup/--recipe) resolved against the run folder in
wdsfilter/runfolder/shares.py, below `score` (which takes the same flags); the reason a resolved
rule drops a row is runfolder/judge.drop_reason (the one keep rule, runfolder/keep.py).
"""
from ..runfolder.judge import drop_reason  # noqa: F401
from ..runfolder.shares import (FilterSpec, Resolved, Threshold, bounds, parse_share, resolve,  # noqa: F401
                                loader_selection, resolve_for_loader, resolve_selection, write_thresholds)
from ..core.selection import Selection  # noqa: F401
