"""The thresholds of `wdsfilter filter` (--min/--max/--top/--bottom) are parsed and resolved in
wdsfilter/runfolder/shares.py, below `score` (which takes the same flags); here: the reason a
resolved threshold drops a row (the one keep rule, runfolder/keep.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..runfolder import keep_reason
from ..runfolder.shares import (FilterSpec, Threshold, bounds, parse_share, resolve, resolve_for_loader,  # noqa: F401
                                write_thresholds)


def drop_reason(row: dict, thresholds: Sequence[Threshold]) -> Optional[str]:
    """Why a score row is not kept (None: kept): the first reason of runfolder.keep_reason."""
    drop = keep_reason(row, [t.bound for t in thresholds])
    return None if drop is None else drop.reason
