"""Choosing thresholds after scoring (`wdsfilter filter`), without loading a model.

Modules, one job each (a score folder is read back by wdsfilter/runfolder/): rules (the --min/--max/--top/--bottom
thresholds, resolved in runfolder/shares.py), run (judge, count, write),
reshard (new shards of N samples), report_data and report_html (the HTML report), cli.
"""
from .rules import FilterSpec, Threshold, resolve_for_loader
from .apply import FilterResult, filter_scores

__all__ = ["filter_scores", "FilterResult", "FilterSpec", "Threshold", "resolve_for_loader"]
