"""A short run of tools/fuzz_remote.py (the remote fault matrix: web servers that name a version in
every way real ones do, random breaks, stalls, 5xx and 429, drips and trickles, the object
replaced by a same-size version; secret-bearing URLs; validate and score on some): 0 splices,
0 hangs past the bound, 0 leaks. `python tools/fuzz_remote.py --trials 200` runs the long one."""
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from tools import fuzz_remote  # noqa: E402


def test_the_remote_fault_matrix_holds_on_a_few_random_trials():
    counts = fuzz_remote.run(8, seed=3, validate_every=4, score_every=0)  # score's splices: test_remote_versions
    assert counts.trials == 8 and counts.commands["validate"] == 2
    assert counts.clean, "\n".join(counts.problems)
    assert len(counts.servers) >= 3 and "replace" in counts.faults, counts.line()
