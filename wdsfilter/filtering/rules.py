"""The thresholds of `wdsfilter filter` (--min/--max/--top/--bottom) are parsed and resolved in
wdsfilter/runfolder/shares.py, below `score` (which takes the same flags); the reason a resolved
threshold drops a row is runfolder/judge.drop_reason (the one keep rule, runfolder/keep.py).
"""
from ..runfolder.judge import drop_reason  # noqa: F401
from ..runfolder.shares import (FilterSpec, Threshold, bounds, parse_share, resolve, resolve_for_loader,  # noqa: F401
                                write_thresholds)
