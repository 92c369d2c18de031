"""tools/trace_modules.py: the per-sample module count ARCHITECTURE.md reports is taken over the
whole scoring loop, so decode-side modules that run once per sample are not missed."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from tools import trace_modules  # noqa: E402


def test_the_trace_counts_every_module_a_sample_passes_and_none_it_does_not(capsys):
    result = trace_modules.main([os.path.join(ROOT, "sample_shards", "images-000000.tar")])
    per_sample = set(result["per_sample"])
    # The select decision and the scorers' prepare() run once per sample, before the first row
    # for the first chunk: a window starting at the first row missed them.
    for module in ("wdsfilter.reading", "wdsfilter.selection", "wdsfilter.stages", "wdsfilter.images",
                   "wdsfilter.score.prepare", "wdsfilter.score.dispatch", "wdsfilter.score.rows"):
        assert module in per_sample, module
    # Decided once per run or per shard: never per sample.
    for module in ("wdsfilter.score.planner", "wdsfilter.score.probe", "wdsfilter.score.outputs",
                   "wdsfilter.thresholds", "wdsfilter.shards"):
        assert module not in per_sample, module
    assert "modules on the per-sample path" in capsys.readouterr().out
