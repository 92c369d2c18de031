"""Many `wdsfilter score --join` workers on one run folder, killed and stopped at random, over many
seeds (the long version of tests/test_score_join_faults.py; the trial and the check are
tests/workerkit.py's).

Each seed runs the same shards into a local run folder and a run folder in moto's S3 server (on
127.0.0.1), each with 2 to 4 workers (half of the seeds with slices, --task-index), and on the
folders' events kills (SIGKILL) and stops (SIGSTOP) 1 to 4 workers that hold a claim, starting new
ones, until both runs are done; then compares each folder with a one-process run of the same
shards (every sample in one row or the ledger, the same rows, whole markers, one writer per
shard, stopped workers fenced).

    python tools/fuzz_workers.py [--seeds 100] [--first 0] [--keep DIR]

Prints one line per seed and a summary line; exit status 1 when the promise broke for any.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

SHARDS = 12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--keep", default=None, help="keep each seed's folders here")
    args = ap.parse_args()
    import workerkit
    from click.testing import CliRunner
    from remotekit import BUCKET, s3_server
    from scorekit import make_shards
    from wdsfilter.cli import main as cli
    base = tempfile.mkdtemp(prefix="fuzz-workers-")
    os.environ["TMPDIR"] = os.path.join(base, "tmp")  # staging copies of the S3 runs: swept with `base`
    os.makedirs(os.environ["TMPDIR"])
    tempfile.tempdir = None
    shards, _ = make_shards(os.path.join(base, "shards"), [9] * SHARDS, bad={3: (2,)}, no_caption={5: (1,)})
    names = [f"shard-{i:04d}" for i in range(SHARDS)]
    reference = os.path.join(base, "reference")
    r = CliRunner().invoke(cli, workerkit.worker_args(shards, reference), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    broken = trials = faults = fenced = 0
    started = time.monotonic()
    with s3_server() as (_, client):
        env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TMPDIR"))}
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
        for seed in range(args.first, args.first + args.seeds):
            draw = random.Random(seed)
            workers, kills, slices = draw.randint(2, 4), draw.randint(1, 4), draw.random() < 0.5
            folder = os.path.join(base, f"seed-{seed}")
            folders = {"local": workerkit.LocalFolder(os.path.join(folder, "out")),
                       "s3": workerkit.S3Folder(client, BUCKET, f"fuzz/seed-{seed}")}
            try:
                trial = workerkit.play(seed, shards, folders, env, os.path.join(folder, "logs"), workers=workers,
                                       faults=kills, slices=slices)
                found = workerkit.violations(trial, reference, names, folders)
            except Exception as e:  # noqa: BLE001 - a run that did not finish is a broken promise too
                trial, found = None, [f"{type(e).__name__}: {e}"]
            trials += 1
            if trial is not None:
                faults += sum(d.startswith(("kill", "stop")) for done in trial.kills.values() for d in done)
                fenced += sum(w.fenced_stop and w.proc.exitcode == 3 for f in trial.fleets.values() for w in f.workers)
            broken += bool(found)
            what = "; ".join(f"{k}: {', '.join(v)}" for k, v in trial.kills.items()) if trial else ""
            print(f"seed {seed}: {workers} workers{' in slices' if slices else ''}, "
                  f"{'BROKEN ' + ' | '.join(found)[:2000] if found else 'ok'} "
                  f"({trial.seconds if trial else 0:.1f}s; {what})", flush=True)
            if args.keep:
                shutil.copytree(folder, os.path.join(args.keep, f"seed-{seed}"), dirs_exist_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
    for name in os.listdir(base):  # not tmp/: the fork server's own folder there goes when it does
        if name != "tmp":
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    print(f"fuzz_workers: {trials} trial(s), {trials - broken} kept the promise, {broken} broke it; "
          f"{faults} workers killed or stopped holding a claim, {fenced} stopped past their lease and fenced; "
          f"{time.monotonic() - started:.0f}s")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
