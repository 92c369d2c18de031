"""The scoring run's promise over many random fault scenarios (the long version of
tests/test_score_promise.py; the scenarios and the check are tests/promisekit.py's).

Each seed draws shards with data errors, transient faults on random samples (scorer exceptions
in score_batch and prepare, out of memory at any batch size), a simulated GPU of random size (out
of memory at random batch sizes) and at most one fault that ends the run (kill -9 of the run at a
random point, of a decode worker or of a model worker; a full disk where a tmpfs can be mounted); about half
of the seeds read their shards over HTTP from a server on 127.0.0.1 that resets connections
mid-shard at random bytes (one shard's reads, in some, until its retry budget is spent); the run
is resumed, its failures retried, and the result compared with a one-shot run.

    python tools/fuzz_promise.py [--seeds 50] [--first 0] [--keep DIR]

Prints one line per seed; exit status 1 when the promise broke for any (the scenario is printed).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)


def one(seed: int, folder: str):
    import promisekit
    sc = promisekit.Scenario.draw(seed)
    if sc.kill == "full_disk":
        import subprocess
        mnt = os.path.join(folder, "small")
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True).returncode:
            sc.kill, sc.blob = None, 0  # no root: this seed runs without the full disk
        else:
            try:
                def grow(size):
                    subprocess.run(["mount", "-o", f"remount,size={size}", mnt], check=True)
                outcome = promisekit.play(sc, folder, small_disk=(mnt, grow))
                return sc, outcome, promisekit.violations(outcome, kept=os.path.join(mnt, "kept"))
            finally:
                subprocess.run(["umount", "-l", mnt], check=False)
    outcome = promisekit.play(sc, folder)
    return sc, outcome, promisekit.violations(outcome)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--keep", default=None, help="keep each seed's folder here")
    args = ap.parse_args()
    import promisekit
    broken = 0
    for seed in range(args.first, args.first + args.seeds):
        folder = tempfile.mkdtemp(prefix=f"promise-{seed}-", dir=args.keep)
        start = time.perf_counter()
        sc, outcome, found = one(seed, folder)
        took = time.perf_counter() - start
        fails = f"shard {sc.give_up} fails" if sc.give_up >= 1 else "no shard fails"
        remote = f", remote ({outcome.resets_met} resets met, {fails})" if sc.remote else ""
        print(f"seed {seed}: kill {sc.kill}{remote}, {sum(sc.sizes)} samples, first run exit {outcome.first_exit}: "
              f"{'OK' if not found else 'BROKEN'} ({took:.1f}s)", flush=True)
        if found:
            broken += 1
            print("  " + promisekit.describe(sc) + "\n  " + "\n  ".join(outcome.steps + found), flush=True)
        elif not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.seeds} seed(s), {broken} broke the promise")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
