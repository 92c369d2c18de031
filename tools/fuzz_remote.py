"""The remote fault matrix under random faults (issue 32): web servers that name a version in
each way real ones do (a strong ETag with If-Match honoured or ignored, a weak ETag, an old or a
recent Last-Modified, nothing), shard URLs holding a password or a presigned signature, and at
random bytes: resets, clean cuts, stalls, 5xx and 429 answers, a drip, a trickle, and the object
replaced by another version of the same size (before the first read or between a break and its
resume). Each trial reads the shard through the reader (remote_read.RemoteShard) under a hang
guard; every few trials `validate` (its stats folder and JSON report) and `score` (its run folder)
run on it too. Counted:

* splices: bytes read, or a scored shard's rows, that are not those of one whole version;
* hangs past the bound: a read that took longer than docs/remote.md's bound for its settings
  ((retry budget + 1) windows of the speed floor or idle limit, the back-offs between them);
* leaks: the password or signature in a message, a retry line, an output line, a file or a
  folder name the commands wrote (shards.json, written 0600, is the one file that keeps them);
* other errors: a read that failed with anything but a changed object, a read given up on, or a
  server that did not answer in time.

    python tools/fuzz_remote.py [--trials 200] [--seed 0] [--validate-every 5] [--score-every 20]

Prints one line per trial with -v, then the summary line; exit status 1 when any count is not 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

PASSWORD, SIGNATURE = "fuzzPW9xQ2", "fuzzSIG7kR4"
HOUR = 3600.0
# FaultServer.put keywords of each kind of server, and whether its first answer proves a version
SERVERS = {
    "if-match honoured": {},
    "etag, if-match ignored": {"preconditions": False},
    "weak etag": {"etag": "weak", "preconditions": False},
    "old last-modified": {"etag": None, "modified": -HOUR, "preconditions": False},
    "recent last-modified": {"etag": None, "modified": +HOUR, "preconditions": False},
    "no validator": {"etag": None},
}
FAULTS = ("reset", "short", "stall", "status", "replace", "drip", "trickle")


def options():
    """Small bounds, so a trial takes seconds (the settings every command takes: docs/remote.md)."""
    from wdsfilter.storage.remote import RemoteOptions
    return RemoteOptions(block_bytes=8192, readahead=2, attempts=4, retry_budget=4, backoff_seconds=0.01,
                         max_backoff_seconds=0.05, idle_seconds=1.0, speed_limit=1024, speed_seconds=0.5)


def bound(o) -> float:
    """docs/remote.md's bound on one read with these settings, for a shard this small (a healthy
    read takes milliseconds): each failed request ends within a window of the floor (or the idle
    limit, or the answer timeout), plus the slice it is looked at in, then a back-off."""
    window = max(o.speed_seconds, o.idle_seconds) * 1.125
    return (o.retry_budget + 1) * (window + o.max_backoff_seconds) + 2.0  # + the HEADs, a loaded machine


@dataclasses.dataclass
class Counts:
    trials: int = 0
    splices: int = 0
    hangs: int = 0
    leaks: int = 0
    other: int = 0
    outcomes: Counter = dataclasses.field(default_factory=Counter)
    faults: Counter = dataclasses.field(default_factory=Counter)
    servers: Counter = dataclasses.field(default_factory=Counter)
    commands: Counter = dataclasses.field(default_factory=Counter)
    slowest: float = 0.0
    problems: List[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        faults = ", ".join(f"{n} {k}" for k, n in sorted(self.faults.items()))
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items()))
        return (f"fuzz_remote: {self.trials} trials on {len(self.servers)} kinds of server (faults: {faults}; "
                f"{self.commands['validate']} validate and {self.commands['score']} score runs): "
                f"{self.splices} splices, {self.hangs} hangs past the bound, {self.leaks} leaks, {self.other} other "
                f"errors; outcomes: {outcomes}; slowest read {self.slowest:.1f}s")

    @property
    def clean(self) -> bool:
        return not (self.splices or self.hangs or self.leaks or self.other)


class Shards:
    """The shards trials read: small tars (12 to 30 samples), each with a second version of the same
    size (every caption upper-cased, or only those after a byte), and each version's score rows
    (scored once from a local file, for the score trials' check)."""

    def __init__(self, folder: str):
        from scorekit import make_shards
        self.folder = folder
        self.paths, _ = make_shards(os.path.join(folder, "src"), [12, 20, 30])
        self.data = [open(p, "rb").read() for p in self.paths]
        self._rows: Dict[bytes, list] = {}

    def versions(self, rng: random.Random, which: int) -> Tuple[bytes, bytes]:
        v1 = self.data[which]
        cut = rng.choice([0, rng.randrange(len(v1))])  # everything changed, or only after `cut`
        return v1, v1[:cut] + v1[cut:].replace(b"sample ", b"SAMPLE ")

    def rows(self, data: bytes) -> list:
        if data not in self._rows:
            from click.testing import CliRunner
            from wdsfilter.cli import main
            folder = tempfile.mkdtemp(dir=self.folder)
            with open(os.path.join(folder, "x.tar"), "wb") as f:
                f.write(data)
            out = os.path.join(folder, "out")
            r = CliRunner().invoke(main, ["score", os.path.join(folder, "x.tar"), "--scorer",
                                          "scorekit:ByteLengthScorer", "--out", out, "--device", "cpu", "--workers",
                                          "0", "--no-progress", "--format", "jsonl", "-q"])
            assert r.exit_code == 0, r.output
            self._rows[data] = _score_rows(out)
        return self._rows[data]


def _score_rows(out: str) -> list:
    from wdsfilter.runfolder.tables import read_rows
    folder = os.path.join(out, "scores")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [{k: v for k, v in r.items() if k != "shard"} for n in names for r in read_rows(os.path.join(folder, n))]


def draw_faults(rng: random.Random, size: int, v2: bytes, server: str) -> Tuple[List[tuple], Optional[tuple]]:
    """(the faults queued for the object, in order; a pace for every GET of it, or None)."""
    faults: List[tuple] = []
    pace = rng.choice([("drip", 0.2), ("trickle",)]) if rng.random() < 0.15 else None
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(FAULTS[:5])
        if kind in ("reset", "short", "stall"):
            faults.append((kind, rng.randrange(1, size)))
        elif kind == "status":
            faults.append(("status", rng.choice([500, 503, 429]), rng.choice([None, "0"])))
        else:
            faults.append(("replace", v2, "same date") if server == "recent last-modified" else ("replace", v2))
    return faults, pace


def guarded_read(url: str, opts, limit: float):
    """(bytes or the error, retry lines, seconds, hung): the read in a thread under a hang guard."""
    from wdsfilter.storage.remote_read import open_remote
    box: Dict[str, object] = {}
    told: List[str] = []

    def run():
        try:
            box["got"] = open_remote(url, opts, told.append).read()
        except Exception as e:  # noqa: BLE001 - what the trial looks at
            box["got"] = e
    started = time.monotonic()
    thread = threading.Thread(target=run, name="fuzz-remote-read", daemon=True)
    thread.start()
    thread.join(limit)
    return box.get("got"), told, time.monotonic() - started, thread.is_alive()


def _secret_url(web, name: str, data: bytes, server: str, rng: random.Random) -> Tuple[str, str]:
    """(the URL as a user gives it, the path the server keys it by): a password or a presigned query."""
    profile = dict(SERVERS[server])
    if "modified" in profile:
        profile["modified"] = time.time() + profile["modified"]
    if rng.random() < 0.5:
        path = f"{name}?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=300"
        return web.put(path, data, **profile), path
    return web.put(name, data, **profile).replace("http://", f"http://fuzz:{PASSWORD}@"), name


def _leaked(*texts: str) -> bool:
    return any(s in t for t in texts for s in (PASSWORD, SIGNATURE))


def _files_leak(folder: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        found += [os.path.join(root, d) for d in dirs if _leaked(d)]
        for name in files:
            path = os.path.join(root, name)
            if name == "shards.json":
                if os.stat(path).st_mode & 0o077:
                    found.append(path + " (not 0600)")
                continue
            with open(path, "rb") as f:
                data = f.read()
            if PASSWORD.encode() in data or SIGNATURE.encode() in data:
                found.append(path)
    return found


def trial(n: int, rng: random.Random, web, shards: Shards, counts: Counts, folder: str, commands: Tuple[bool, bool],
          verbose: bool = False) -> None:
    from wdsfilter.storage.remote import ObjectChanged, RemoteReadError
    from wdsfilter.storage.remote_net import RemoteUnreachable
    server = rng.choice(list(SERVERS))
    which = rng.randrange(len(shards.data))
    v1, v2 = shards.versions(rng, which)
    url, path = _secret_url(web, f"t{n}.tar", v1, server, rng)
    faults, pace = draw_faults(rng, len(v1), v2, server)
    web.fail(path, *faults)
    web.pace(path, pace)
    counts.trials += 1
    counts.servers[server] += 1
    counts.faults.update(f[0] for f in faults)
    if pace:
        counts.faults[pace[0]] += 1
    opts = options()
    got, told, seconds, hung = guarded_read(url, opts, 4 * bound(opts) + 30)
    counts.slowest = max(counts.slowest, seconds)
    what = f"trial {n}: {server}, faults {[f[:2] if f[0] != 'replace' else ('replace',) for f in faults]}, pace {pace}"
    if hung or seconds > bound(opts):
        counts.hangs += 1
        counts.problems.append(f"{what}: took {seconds:.1f}s (bound {bound(opts):.1f}s){' and still runs' if hung else ''}")
    if isinstance(got, (bytes, bytearray)):
        outcome = "first version" if got == v1 else "second version" if got == v2 else None
        if outcome is None:
            counts.splices += 1
            counts.problems.append(f"{what}: read {len(got)} bytes that are neither version")
    elif isinstance(got, ObjectChanged):
        outcome = "failed: changed"
    elif isinstance(got, RemoteReadError):
        outcome = "failed: gave up"
    elif isinstance(got, RemoteUnreachable):  # its HEAD unanswered within the (small) window: bounded too
        outcome = "failed: not answered"
    else:
        outcome = f"other: {type(got).__name__}"
        counts.other += 1
        counts.problems.append(f"{what}: {type(got).__name__}: {got}")
    counts.outcomes[outcome or "splice"] += 1
    if _leaked(str(got) if not isinstance(got, (bytes, bytearray)) else "", *told):
        counts.leaks += 1
        counts.problems.append(f"{what}: a secret in the error or a retry line")
    if verbose:
        print(f"{what}: {outcome} in {seconds:.2f}s", flush=True)
    validate, score = commands
    if validate or score:
        web.fail(path, *faults)  # the same faults again, met by the command's reads
        _commands(n, url, (v1, v2), shards, counts, folder, validate, score, what)


def _commands(n: int, url: str, versions, shards: Shards, counts: Counts, folder: str, validate: bool, score: bool,
              what: str) -> None:
    from click.testing import CliRunner
    from wdsfilter.cli import main
    here = os.path.join(folder, f"t{n}")
    bounds = ["--remote-speed-limit", "1024", "--remote-speed-time", "0.5", "--remote-retry-budget", "4"]
    outputs = []
    if validate:
        counts.commands["validate"] += 1
        r = CliRunner().invoke(main, ["validate", url, "--stats-dir", os.path.join(here, "stats"), "--format", "json",
                                      "--output", os.path.join(here, "report.json"), *bounds])
        outputs.append(r.output)
    if score:
        counts.commands["score"] += 1
        out = os.path.join(here, "out")
        r = CliRunner().invoke(main, ["score", url, "--scorer", "scorekit:ByteLengthScorer", "--out", out, "--device",
                                      "cpu", "--workers", "0", "--no-progress", "--format", "jsonl", *bounds])
        outputs.append(r.output)
        rows = _score_rows(out)
        if rows and rows not in (shards.rows(versions[0]), shards.rows(versions[1])):
            counts.splices += 1
            counts.problems.append(f"{what}: score rows of neither version")
        if r.exit_code not in (0, 3):
            counts.other += 1
            counts.problems.append(f"{what}: score exited {r.exit_code}: {r.output[-300:]}")
    leaks = _files_leak(here) + [f"output: {o[:200]}" for o in outputs if _leaked(o)]
    if leaks:
        counts.leaks += 1
        counts.problems.append(f"{what}: secrets in {leaks[:3]}")


def run(trials: int = 200, seed: int = 0, validate_every: int = 5, score_every: int = 20,
        verbose: bool = False) -> Counts:
    from remotekit import FaultServer, clear_http_cache
    counts = Counts()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="wdsfilter-fuzz-remote-") as folder:
        shards = Shards(folder)
        clear_http_cache()
        with FaultServer() as web:
            for n in range(trials):
                commands = (bool(validate_every) and n % validate_every == validate_every - 1,
                            bool(score_every) and n % score_every == score_every - 1)
                trial(n, rng, web, shards, counts, folder, commands, verbose)
        clear_http_cache()
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--validate-every", type=int, default=5, help="run validate on every Nth trial's shard (0: none)")
    ap.add_argument("--score-every", type=int, default=20, help="run score on every Nth trial's shard (0: none)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    started = time.monotonic()
    counts = run(args.trials, args.seed, args.validate_every, args.score_every, args.verbose)
    for problem in counts.problems:
        print(f"  {problem}")
    print(f"{counts.line()}; {time.monotonic() - started:.0f}s")
    return 0 if counts.clean else 1


if __name__ == "__main__":
    sys.exit(main())
