"""Shared fixtures. `tiny_clip`: a tiny open_clip model trained on the sample shards, built once."""
import fcntl
import hashlib
import os
import shutil
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # `tools` must import under plain `pytest` too, not only `python -m pytest`
    sys.path.insert(0, REPO)

# The README's model (tools/make_tiny_clip.py's defaults): enough steps that matched captions
# clearly outscore mismatched ones (tests/test_clip_scorer.py): at 100 steps the mean gap was
# 0.95-0.97 and a matched pair beat a mismatched one in 96-99% of pairs over seeds 0-2 (the tests
# ask for > 0.05 and an AUC >= 0.8); 400 steps gave 1.03 and 100%. One thread: the model is too
# small to gain from two, and torch's threads spin-wait when the cores are busy (parallel CI
# jobs): with two threads on a loaded 2-core machine a step took ten times the CPU time of one.
from tools.make_tiny_clip import DEFAULT_STEPS as TINY_CLIP_STEPS  # noqa: E402
from tools.make_tiny_clip import DEFAULT_THREADS as TINY_CLIP_THREADS  # noqa: E402


def _digest(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:12]


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory) -> str:
    """Folder of a tiny open_clip model in open_clip's local-dir layout (use "local-dir:" + path),
    trained by tools/make_tiny_clip.py on the sample shards with a fixed number of steps and seed.
    Training takes a while on a CPU, so the folder is cached in models/.cache/ (gitignored), keyed
    by the tool's source and the shards' content: a run pays once, later runs reuse it."""
    from tools import make_tiny_clip as tool

    shards = tool.find_shards(tool.DEFAULT_SHARDS)
    key = f"{tool.source_hash()}-{_digest(shards)}-{TINY_CLIP_STEPS}"  # threads change rounding only
    # WDSFILTER_TEST_CACHE lets several checkouts (worktrees) share one build.
    cache = os.environ.get("WDSFILTER_TEST_CACHE") or os.path.join(REPO, "models", ".cache")
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        pass
    if not os.access(cache, os.W_OK):
        cache = str(tmp_path_factory.mktemp("tiny-clip"))
    out = os.path.join(cache, "tiny-clip-" + key)
    # One build at a time per key: pytest runs started together (several checkouts, xdist) wait
    # for the first builder instead of each training its own copy on the same cores.
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(out, tool.WEIGHTS_FILE)):
            shutil.rmtree(out, ignore_errors=True)  # a folder without weights is left from an older layout
            tool.build(out, shards, steps=TINY_CLIP_STEPS, threads=TINY_CLIP_THREADS, quiet=True, replace=False)
    return out


# `slow` means: the test trains or runs a real model (the tiny CLIP model, the OCR detectors,
# training steps) or starts Ray. `pytest -m "not slow"` is the quick subset: stages, loader
# plumbing, validator, engine with toy scorers, CLI errors. Tests that use the tiny CLIP model
# are marked here, so a new one cannot forget it; the other slow files mark themselves.
SLOW_FIXTURES = ("tiny_clip",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(name in SLOW_FIXTURES for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
