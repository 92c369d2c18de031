"""Benchmark: `wdsfilter filter RUN --top clip_score=30% --dry-run` against duckdb's
`quantile_disc` over the same score files.

A synthetic score folder in the layout `wdsfilter score` writes (scores/*.parquet with the base
fields, done/*.json markers): FILES files of ROWS rows in all, clip_score rounded to 4 decimals
(ties, 1% nulls). Each side runs as its own command (timed from start to exit; peak RSS
is the child's own high-water mark, CPU the child's user + system seconds, all threads); runs
alternate and the best of N is kept. On a machine shared with other work the wall times swing
with the load: the CPU seconds say what each side costs, whatever else runs.

    python tools/bench_filter.py [--rows 4000000] [--files 400] [--runs 3]
    python tools/bench_filter.py --rows 40000 --files 40 --runs 1      # a smoke test
    python tools/bench_filter.py --root /path/to/other/checkout         # time another version
    python tools/bench_filter.py --before /path/to/old/checkout         # and an older one beside it
    python tools/bench_filter.py --rejected 0.01                        # 1% rejected rows in every file
    python tools/bench_filter.py --rows 40000000 --folder /tmp/run40m   # kept for the next runs

Goal (issue 21): ratio wdsfilter / duckdb time = R <= 1.0, at no more peak memory. Needs duckdb
(pip install 'wdsfilter[bench]'). Results and history: docs/dev.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each side is one command as a user runs it, timed from its start to its exit (interpreter start and
# imports included: that is what the user waits for).
WDSFILTER = [sys.executable, "-m", "wdsfilter", "filter", "{run}", "--top", "clip_score=30%", "--dry-run"]
DUCKDB = r"""
import sys
import duckdb
files = sys.argv[1] + "/scores/*.parquet"
# The 70% quantile (its own rank rule: it may differ from --top's k-th largest, k = ceil(0.3 n), by
# one rank), then the rows it keeps: the two passes `filter --dry-run` makes too.
cut = duckdb.sql(f"select quantile_disc(clip_score, 0.7) from read_parquet('{files}')").fetchall()[0][0]
kept = duckdb.sql(f"select count(*) from read_parquet('{files}') where status = 'scored' "
                  f"and clip_score >= {cut!r}").fetchall()[0][0]
print(f"cut {cut!r}, kept {kept}")
"""


def make_run(folder: str, rows: int, files: int, seed: int = 0, rejected: float = 0.0) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    sys.path.insert(0, ROOT)
    from wdsfilter.runfolder.tables import KEYS_META, UNIQUE_KEYS
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(folder, "scores"))
    os.makedirs(os.path.join(folder, "done"))
    n = rows // files
    keys = pa.array([f"{i:07d}" for i in range(n)])
    for f in range(files):
        clip = np.round(rng.normal(0.3, 0.05, n), 4)
        null = rng.random(n) < 0.01
        name = f"shard-{f:06d}"
        # rows the stages rejected (no score: the status column is then read); none drawn by default, so
        # the default run is the one earlier sessions measured
        dropped = rng.random(n) < rejected if rejected else np.zeros(n, dtype=bool)
        table = pa.table({"key": keys, "shard": pa.array([name] * n), "index": pa.array(np.arange(n)),
                          "status": pa.array(np.where(dropped, "rejected", "scored").tolist(), pa.string()),
                          "reason": pa.array(np.where(dropped, "corrupt_image", None).tolist(), pa.string()),
                          "message": pa.nulls(n, pa.string()), "kept": pa.array(np.ones(n, dtype=bool)),
                          "clip_score": pa.array(clip, mask=null | dropped), "ocr_area": pa.array(rng.random(n) ** 3)},
                         metadata={KEYS_META: UNIQUE_KEYS})  # as write_table records unique keys
        path = os.path.join(folder, "scores", name + ".parquet")
        pq.write_table(table, path)
        with open(os.path.join(folder, "done", name + ".json"), "w") as fh:
            json.dump({"url": f"/data/{name}.tar", "name": name, "score_file": path}, fh)


def child(command: list, root: str = ROOT) -> dict:
    """Wall seconds, peak RSS (MiB) and the first output lines of one command."""
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # An installed package has its bytecode: compiling wdsfilter's modules at every start (an
    # environment with PYTHONDONTWRITEBYTECODE) is not what a user waits for (duckdb's is cached too).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KiB on Linux)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{command[:4]} failed: {err}")
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024,
            "said": " | ".join(lines[:3])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--root", default=ROOT, help="the wdsfilter checkout to time (another one: a before/after)")
    ap.add_argument("--before", default=None, help="an older checkout, timed beside --root in the same runs")
    ap.add_argument("--rejected", type=float, default=0.0,
                    help="the share of rows (in every file) the stages rejected: 0, the default, a clean run whose "
                         "footers say every row is scored (the status column is then not read)")
    ap.add_argument("--folder", default=None,
                    help="the score folder to time: made there when missing (--rows, --files, --rejected), used as it "
                         "is when present (a 40 M-row folder takes a while to make)")
    ap.add_argument("--make", nargs=4, metavar=("FOLDER", "ROWS", "FILES", "REJECTED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        return make_run(args.make[0], int(args.make[1]), int(args.make[2]), rejected=float(args.make[3]))
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or os.path.join(tmp, "run")
        # Made in a child: this process stays small, so no child inherits its peak RSS when forked.
        if not os.path.isdir(folder):
            subprocess.run([sys.executable, __file__, "--make", folder, str(args.rows), str(args.files),
                            str(args.rejected)], check=True)
        best: dict = {}
        ratios: dict = {}  # side -> its time / duckdb's in each run (the two ran one after the other)
        for _ in range(args.runs):
            got_now = {}
            sides = [("wdsfilter", [a.format(run=folder) for a in WDSFILTER], args.root),
                     ("duckdb", [sys.executable, "-c", DUCKDB, folder], args.root)]
            if args.before:
                sides.append(("before", [a.format(run=folder) for a in WDSFILTER], args.before))
            for name, command, root in sides:
                got = child(command, root)
                got_now[name] = got
                cpu = min(got["cpu"], best[name]["cpu"]) if name in best else got["cpu"]
                if name not in best or got["seconds"] < best[name]["seconds"]:
                    best[name] = got
                best[name]["cpu"] = cpu  # the least CPU of the runs (the wall time's run may be another)
            for name in got_now:
                ratios.setdefault(name, []).append(got_now[name]["seconds"] / got_now["duckdb"]["seconds"])
    w, d = best["wdsfilter"], best["duckdb"]
    print(f"{args.rows} rows in {args.files} score files ({args.rejected:.0%} rejected), --top clip_score=30% "
          f"--dry-run, best of {args.runs}")
    for name, got in best.items():
        print(f"  {name:9}: {got['seconds']:.2f} s (CPU {got['cpu']:.2f} s), peak RSS {got['peak_mib']:.0f} MiB; "
              f"{got['said']}")
    print(f"ratio wdsfilter / duckdb time = {w['seconds'] / d['seconds']:.2f} (goal <= 1.0)")
    print(f"ratio wdsfilter / duckdb CPU = {w['cpu'] / d['cpu']:.2f}")
    # Each side's best time may come from runs at different loads; the ratio within each run, its
    # median over the runs, is steadier on a shared machine.
    print(f"ratio wdsfilter / duckdb time, median of the runs' own ratios = {statistics.median(ratios['wdsfilter']):.2f}")
    if args.before:
        b = best["before"]
        print(f"ratio before / duckdb time = {b['seconds'] / d['seconds']:.2f}, CPU = {b['cpu'] / d['cpu']:.2f}, "
              f"peak RSS = {b['peak_mib'] / d['peak_mib']:.2f}, median of the runs' time ratios = "
              f"{statistics.median(ratios['before']):.2f}")
    print(f"ratio wdsfilter / duckdb peak RSS = {w['peak_mib'] / d['peak_mib']:.2f}")


if __name__ == "__main__":
    main()
