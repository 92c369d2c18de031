"""Choosing thresholds after scoring (`wdsfilter filter`), without loading a model.

Modules, one job each (a score folder is read back by wdsfilter/runfolder/): rules (the --min/--max/--top/--bottom
thresholds, resolved in runfolder/shares.py), apply (plan, count, then write: filter_scores; the rows
are judged and counted by runfolder/judge.py), write (what is written: thresholds.json, new shards by
runfolder/reshard.py, the report; a dry run never imports it), uids, cli. The HTML report is
wdsfilter/report/'s, shared with `wdsfilter score`.

apply's names are imported on first use: `wdsfilter filter` (cli.py) loads numpy its own way
(one BLAS thread) before apply and the report pull it in.
"""
from .rules import FilterSpec, Selection, Threshold, resolve_for_loader

__all__ = ["filter_scores", "FilterResult", "FilterSpec", "Selection", "Threshold", "resolve_for_loader"]


def __getattr__(name):
    if name in ("filter_scores", "FilterResult"):
        from . import apply
        return getattr(apply, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
