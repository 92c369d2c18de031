"""Bounded fuzz (issue 8, "Required"): mutants of the committed sample shards (byte flips,
truncation, header edits, spliced and duplicated members, zeroed blocks, gzip layers) through
`wdsfilter validate` in every output format and through the training stages: no exception
escapes, nothing hangs. tools/fuzz.py runs the same for any number of shards."""
from tools import fuzz


def test_mutated_shards_never_crash_or_hang():
    counts = fuzz.run(240, seed=12345, timeout=20.0, rotate=True)
    assert counts.shards == 240 and set(counts.mutations) == set(fuzz.MUTATIONS)
    assert not counts.crashes, "\n".join(counts.crashes[:3])
    assert not counts.hangs, counts.hangs[:3]
    assert set(counts.validate_exit) <= {0, 1} and counts.validate_exit[1] > 0  # findings were found
    assert counts.samples_kept > 0  # and intact samples of damaged shards still come through
