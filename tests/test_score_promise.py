"""The scoring run's promise, as a property over random fault scenarios (tests/promisekit.py):
after a fault that ends the run (kill -9 of the run at a random point, of a decode worker, of a
model worker, a full disk), `--resume` and `--retry-failed`, every sample of every shard has one
row, equal to a one-shot run's (status, reason, kept, score), the failure ledger lists exactly the
rows not scored, and the filtered shards are the one-shot run's byte for byte. Each seed also
draws data errors, scorer exceptions (score_batch and prepare) and out-of-memory on random samples
and at random batch sizes (a simulated GPU). `python tools/fuzz_promise.py` runs many seeds."""
import pytest

import promisekit

# One seed per way a run can end, the rest of each scenario drawn from the seed (14 and 30 also
# kill -9 their first --retry-failed).
CASES = [(11, "run"), (12, "decode_worker"), (13, "model_worker"), (14, "full_disk"), (30, None)]


@pytest.mark.parametrize("seed,kill", CASES, ids=[str(k) for _, k in CASES])
def test_the_promise_holds_after_faults_resume_and_retry(seed, kill, tmp_path):
    sc = promisekit.Scenario.draw(seed, kill)
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
