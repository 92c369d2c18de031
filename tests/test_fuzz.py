"""Bounded fuzz (issue 8, "Required"; run folders: issue 20): mutants of the committed sample shards (byte flips,
truncation, header edits, spliced and duplicated members, zeroed blocks, gzip layers) through
`wdsfilter validate` in every output format and through the training stages: no exception
escapes, nothing hangs. tools/fuzz.py runs the same for any number of shards."""
from tools import fuzz


def test_mutated_shards_never_crash_or_hang():
    counts = fuzz.run(240, seed=12345, timeout=120.0, rotate=True)  # a hang guard: never hit by load
    assert counts.shards == 240 and set(counts.mutations) == set(fuzz.MUTATIONS)
    assert not counts.crashes, "\n".join(counts.crashes[:3])
    assert not counts.hangs, counts.hangs[:3]
    assert set(counts.validate_exit) <= {0, 1} and counts.validate_exit[1] > 0  # findings were found
    assert counts.samples_kept > 0  # and intact samples of damaged shards still come through


def test_mutated_run_folders_never_crash_run_commands_escape_or_delete():
    """Run folders as someone may hand them over (issue 20): markers, run.json, shards.json and
    score files mutated, retyped, pointed at decoys outside the folder, at `pipe:touch CANARY`, or
    replaced by symlinks out, through `wdsfilter filter` (new shards and the report) and the
    loader's score filter. An audit hook (sys.addaudithook) sees every file opened (pyarrow's reads
    included) and removed and every command started."""
    counts = fuzz.run_folders(40, seed=2026)
    assert counts.folders == 40 and set(counts.mutations) == set(fuzz.FOLDER_MUTATIONS)
    assert not counts.crashes, "\n".join(counts.crashes[:3])
    assert not counts.commands, counts.commands[:3]
    assert not counts.escapes, counts.escapes[:3]
    assert not counts.deletions, counts.deletions[:3]
    # both outcomes were reached: some mutants still filter, others are refused with a reason
    assert counts.filter_exit[0] > 0 and counts.filter_exit[2] > 0 and counts.filter_exit[3] > 0
    assert counts.loader["built"] > 0 and counts.loader["refused"] > 0
