"""tools/trace_modules.py: the per-sample module count docs/dev.md reports is taken over the
whole scoring loop, so decode-side modules that run once per sample are not missed, and a
function's comprehension is not counted as a call of its own."""
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from tools import trace_modules  # noqa: E402

# docs/dev.md ("Measured: modules a run enters") lists these, in the order a sample meets them.
PER_SAMPLE_PATH = {"wdsfilter.stream.reading", "wdsfilter.core.specs", "wdsfilter.stream.stages", "wdsfilter.media.images",
                   "wdsfilter.core.tally", "wdsfilter.score.transport", "wdsfilter.score.dispatch",
                   "wdsfilter.score.rows", "wdsfilter.runfolder.keep",
                   "wdsfilter.score.backoff", "wdsfilter.score.outputs", "wdsfilter.core.publish",
                   "wdsfilter.storage.tars", "wdsfilter.core.urls", "wdsfilter.runfolder.parquet"}


def test_the_trace_counts_every_module_a_sample_passes_and_none_it_does_not(capsys):
    result = trace_modules.main([os.path.join(ROOT, "sample_shards", "images-000000.tar")])
    # The select decision and the scorers' prepare() run once per sample, before the first row
    # for the first chunk (a window starting at the first row missed them). The model runner runs
    # once per batch: its per-sample dict comprehension is its own loop, not a call.
    # A module added to the path must be added to docs/dev.md's list (and here).
    assert set(result["per_sample"]) == PER_SAMPLE_PATH
    assert "wdsfilter.score.modelrunner" in result["all"]
    assert "modules on the per-sample path" in capsys.readouterr().out

