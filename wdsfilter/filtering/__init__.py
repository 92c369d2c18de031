"""Choosing thresholds after scoring (`wdsfilter filter`), without loading a model.

Modules, one job each (a score folder is read back by wdsfilter/runfolder/): rules (the --min/--max/--top/--bottom
thresholds, resolved in runfolder/shares.py), apply (judge, count, write: filter_scores; the rows
are judged and counted by runfolder/judge.py), reshard (new shards of N samples), hfcard, rename,
cli. The HTML report is wdsfilter/report/'s, shared with `wdsfilter score`.
"""
from .rules import FilterSpec, Selection, Threshold, resolve_for_loader
from .apply import FilterResult, filter_scores

__all__ = ["filter_scores", "FilterResult", "FilterSpec", "Selection", "Threshold", "resolve_for_loader"]
