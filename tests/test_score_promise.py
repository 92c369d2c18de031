"""The scoring run's promise, as a property over random fault scenarios (tests/promisekit.py):
after a fault that ends the run (kill -9 of the run at a random point, of a decode worker, of a
model worker, a full disk), connection resets mid-shard on shards read over HTTP (one shard's
reads reset until its retry budget is spent), `--resume` and `--retry-failed`, every sample of
every shard has one row, equal to a one-shot run's (status, reason, kept, score), the failure
ledger lists exactly the rows not scored, and the filtered shards are the one-shot run's byte for
byte. Each seed also draws data errors, scorer exceptions (score_batch and prepare) and
out-of-memory on random samples and at random batch sizes (a simulated GPU).
`python tools/fuzz_promise.py` runs many seeds.

Kept cheap: the runs that are not killed -9 run in the test's process, the killed ones in a forked
child (no interpreter to start); only the model worker case starts model worker processes."""
import pytest

import promisekit

# One seed per way a run can end, the rest of each scenario drawn from the seed: 11 and 301 read
# their shards over HTTP with resets mid-shard, one shard of each failing its reads until the
# retry budget is spent (301 reads it with its one decode worker before the shard where that
# worker dies, so the ledger lists both shards as the dead worker's); 14 and 301 also kill -9
# their first --retry-failed.
CASES = [(11, "run", True), (301, "decode_worker", True), (13, "model_worker", False), (14, "full_disk", False)]


@pytest.mark.parametrize("seed,kill,remote", CASES, ids=[f"{k}{'-remote' * r}" for _, k, r in CASES])
def test_the_promise_holds_after_faults_resume_and_retry(seed, kill, remote, tmp_path):
    sc = promisekit.Scenario.draw(seed, kill, remote)
    if kill == "full_disk":
        from faultkit import small_tmpfs
        with small_tmpfs(tmp_path / "small", "1m") as disk:
            outcome = promisekit.play(sc, str(tmp_path), small_disk=disk)
            found = promisekit.violations(outcome, kept=str(disk[0] / "kept"))
    else:
        outcome = promisekit.play(sc, str(tmp_path))
        found = promisekit.violations(outcome)
    assert found == [], f"{promisekit.describe(sc)}\n{outcome.steps}"
    if kill in ("decode_worker", "model_worker"):
        assert outcome.first_exit == 3, outcome.steps  # the run failed, and said so
        assert outcome.first_whole == ["worker_died"]  # the ledger named the shards it left, and why
    if kill == "full_disk":
        assert outcome.first_exit == 3 and outcome.first_whole == ["disk_full"], outcome.steps
    if kill == "run":
        assert outcome.first_exit in (-9, 0), outcome.steps  # killed, or done before the point came
    if remote and kill == "decode_worker":  # the failing shard's reads met at least a budget's worth of resets
        assert sc.give_up >= 1 and outcome.resets_met >= promisekit.REMOTE_ATTEMPTS, outcome.steps
