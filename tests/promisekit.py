"""The scoring run's promise under random faults (no tests in this module; tests/test_score_promise.py
runs a few seeds, tools/fuzz_promise.py many):

    every sample of every input shard ends in exactly one row of status scored, or is listed in
    the failure ledger with a reason; nothing is scored twice into the outputs; score files,
    ledger and filtered shards agree row for row.

One seed is one scenario (`Scenario.draw`): shards with random data errors (corrupt JPEGs, missing
and refused captions), random transient faults on random samples (a scorer's exception in
score_batch and in prepare, out of memory at any batch size), out of memory at random batch sizes
(a simulated GPU of random size: devicekit), and at most one fault that ends the run: kill -9 of
the run at a random point, kill -9 (os._exit) of a decode worker or of a model worker, a full
disk (a small tmpfs). In remote scenarios the shards are read over HTTP from a web server on
127.0.0.1 (remotekit.FaultServer) that resets connections mid-shard at random bytes (each read
resumed from the byte it reached), and may keep resetting one shard's reads until the retry
budget (remote_attempts) is spent, so that the shard fails (read_failed, transient).
`play` runs it: the faulty run, then `--resume` with the run-ending fault and the network's
gone (the sample faults still there), then `--retry-failed` with every fault gone (in some
scenarios a first --retry-failed is killed -9 at a random point, and run again); `violations`
compares the result with a one-shot run of the same shards without faults: same rows in the same
order, same statuses, reasons, kept flags and scores, the ledger listing exactly the rows not
scored, the same filtered shards byte for byte.

The run that is killed -9 runs in a child process (`run_killable`, from a fork server that
imported torch once), so kill -9 ends it and not the test; worker deaths (os._exit of a decode or model worker) end only the worker, so those
runs run in the test's process. `python promisekit.py CONFIG.json` runs one run from a file.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

SCORER = "faultkit:ChaosScorer"
KILLS = ("run", "decode_worker", "model_worker", "full_disk", None)
MB = 1 << 20
REMOTE_ATTEMPTS = 3  # failed reads in a row before a remote shard fails


@dataclass
class Scenario:
    seed: int
    kill: Optional[str]  # one of KILLS
    sizes: List[int]  # samples per shard
    bad: Dict[str, List[int]]  # shard -> corrupt JPEGs
    no_caption: Dict[str, List[int]]
    refused: Dict[str, List[int]]
    raise_keys: List[str]  # score_batch raises on these
    oom_keys: List[str]  # out of memory on these even alone
    prep_keys: List[str]  # prepare() raises on these
    victim: str  # the key whose decode or model worker dies
    kill_after: int  # kill -9 the run after this many samples were scored
    batch_size: int
    workers: int
    sim_total: int  # the simulated GPU: batches of more than sim_total / MB samples do not fit
    blob: int  # bytes of an extra member per sample (the full disk needs big filtered shards)
    min_brightness: float
    retry_kill_after: int  # > 0: kill -9 the first --retry-failed after this many samples were scored
    remote: bool = False  # the shards are read over HTTP from a server that resets connections
    resets: Dict[str, List[float]] = field(default_factory=dict)  # shard -> resets in the first run, at these fractions of its bytes
    give_up: int = -1  # >= 1: every read of this shard in the first run is reset (remote_attempts spent)

    @classmethod
    def draw(cls, seed: int, kill: object = "random", remote: object = "random") -> "Scenario":
        rng = random.Random(seed)
        kill = rng.choice(KILLS) if kill == "random" else kill
        sizes = [rng.randint(4, 12) for _ in range(rng.randint(2, 4))]

        def pick(share: float, skip=()) -> Dict[str, List[int]]:
            return {str(s): sorted(i for i in range(n) if rng.random() < share and (s, i) not in skip)
                    for s, n in enumerate(sizes)}
        bad = pick(0.08)
        no_caption = pick(0.08, {(int(s), i) for s, ix in bad.items() for i in ix})
        taken = {(int(s), i) for d in (bad, no_caption) for s, ix in d.items() for i in ix}
        refused = pick(0.08, taken)
        taken |= {(int(s), i) for s, ix in refused.items() for i in ix}
        clean = [f"s{s}_{i:05d}" for s, n in enumerate(sizes) for i in range(n) if (s, i) not in taken]
        faulty = rng.sample(clean, k=min(len(clean) - 1, rng.randint(0, max(1, len(clean) // 4))))
        cut = [rng.randint(0, 2) for _ in faulty]
        sc = cls(seed=seed, kill=kill, sizes=sizes, bad=bad, no_caption=no_caption, refused=refused,
                   raise_keys=[k for k, c in zip(faulty, cut) if c == 0], oom_keys=[k for k, c in zip(faulty, cut) if c == 1],
                   prep_keys=[k for k, c in zip(faulty, cut) if c == 2],
                   victim=rng.choice([k for k in clean if k not in faulty] or clean),
                   kill_after=rng.randint(1, max(1, sum(sizes) - 1)), batch_size=rng.choice([2, 4, 8]),
                   workers=rng.choice([1, 2]), sim_total=rng.randint(1, 6) * MB,
                   blob=150_000 if kill == "full_disk" else 0,
                   min_brightness=0.0 if kill == "full_disk" else rng.choice([0.0, 0.3, 0.5]),
                   retry_kill_after=rng.choice([0, rng.randint(1, max(1, len(faulty)))]))
        # drawn last, so that the other draws of a seed are what they were before remote reads came
        sc.remote = rng.random() < 0.5 if remote == "random" else bool(remote)
        if sc.remote:
            sc.resets = {str(s): sorted(rng.random() for _ in range(rng.randint(0, 2))) for s in range(len(sizes))}
            # never the first shard: the run reads it before it starts (the key check) and stops there
            sc.give_up = rng.choice([-1, rng.randrange(1, len(sizes))])
        return sc


# -- the shards and the run's options ------------------------------------------------------------------
def build_shards(sc: Scenario, folder: str) -> List[str]:
    from scorekit import colored_members
    from shardkit import write_shard
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(sc.seed)
    urls = []
    for s, n in enumerate(sc.sizes):
        members, _ = colored_members(n, shard=s, bad=sc.bad[str(s)], refused=sc.refused[str(s)],
                                     no_caption=sc.no_caption[str(s)])
        if sc.blob:
            members += [(f"s{s}_{i:05d}.bin", rng.randbytes(sc.blob)) for i in range(n)]
            members.sort(key=lambda m: m[0].split(".")[0])  # a sample's members together
        urls.append(write_shard(os.path.join(folder, f"shard-{s:04d}.tar"), members))
    return urls


def fault_files(folder: str) -> Dict[str, str]:
    return {k: os.path.join(folder, k) for k in ("raise", "oom", "prep", "decode_kill", "model_kill")}


def arm(files: Dict[str, str], sc: Optional[Scenario], kills: bool = True) -> None:
    """Write the fault files: the scenario's sample faults, and its run-ending fault with `kills`;
    sc None: every fault gone."""
    keys = {"raise": sc.raise_keys, "oom": sc.oom_keys, "prep": sc.prep_keys,
            "decode_kill": [sc.victim] if kills and sc.kill == "decode_worker" else [],
            "model_kill": [sc.victim] if kills and sc.kill == "model_worker" else []} if sc else {}
    for name, path in files.items():
        with open(path, "w") as f:
            f.write("\n".join(keys.get(name, [])))


def options(sc: Scenario, files: Dict[str, str], log: str, write_shards: str) -> dict:
    """The run's options: the same for every run of a scenario (the reference's too), so
    --resume and --retry-failed accept them; the faults are switched by the files' contents."""
    remote = {"remote_attempts": REMOTE_ATTEMPTS, "remote_backoff_seconds": 0.01} if sc.remote else {}
    return {"scorers": [SCORER], "progress": False, "write_shards": write_shards, **remote,
            "min_scores": {"brightness": sc.min_brightness},
            "scorer_options": {"bright": {
                "raise_file": files["raise"], "oom_file": files["oom"], "prepare_file": files["prep"],
                "decode_kill_file": files["decode_kill"], "model_kill_file": files["model_kill"],
                "fail_word": "refuse-me", "log": log,
                "sim": f"promise{sc.seed}", "sim_total": sc.sim_total, "bytes_per_sample": MB}}}


def run_here(urls: List[str], out: str, opts: dict, **kw):
    """A run in this process (no fault that kills a process may be armed)."""
    from wdsfilter.score import score
    return score(urls, out=out, device="cpu", **{**opts, **kw})


def run_killable(urls: List[str], out: str, opts: dict, kill_after: Optional[int] = None, log: str = "",
                 timeout: float = 300.0, **kw) -> int:
    """A run in a child process, in a session of its own; with kill_after, kill -9 it once `log`
    holds that many scored samples. Returns its exit status (-9 when killed). The child comes from
    a fork server that imported torch and the package once (no interpreter to start per run), not
    from this process (its threads and open connections, the test's web server's among them, are
    no child's business: a forked copy of them once left a keep-alive connection half-open)."""
    proc = _forkserver().Process(target=_killable_child, args=(urls, out, {**opts, **kw}), daemon=False)
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while proc.exitcode is None:
            if kill_after is not None and _lines(log) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)  # the run's main process, as the OOM killer does
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not end in {timeout:.0f}s")
            proc.join(0.02)
        proc.join()
        # Its workers would notice their main process is gone within torch's 5 s check and exit;
        # they write nothing (the main process writes every output), so they go at once here.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _wait_group_gone(proc.pid)
        return proc.exitcode
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join()


_CONTEXT = None


def _forkserver():
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "faultkit", "promisekit", "wdsfilter.score"])
    return _CONTEXT


def _killable_child(urls: List[str], out: str, opts: dict) -> None:
    os.setsid()  # its own process group: killpg ends its workers with it
    sys.exit(_run_child(urls, out, opts))


def _run_child(urls: List[str], out: str, opts: dict) -> int:
    from wdsfilter.core.errors import RunError
    try:
        run_here(urls, out, opts)
    except RunError as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 3
    return 0


def _lines(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _wait_group_gone(pgid: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


# -- one scenario ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    urls: List[str]
    out: str
    ref: str
    first_exit: Optional[int] = None
    steps: List[str] = field(default_factory=list)
    first_whole: List[str] = field(default_factory=list)  # reasons of the shards the first run left
    resets_met: int = 0  # connection resets the first run's reads met (remote scenarios)


def play(sc: Scenario, folder: str, small_disk=None) -> Outcome:
    """The reference run, the faulty run, --resume, --retry-failed. small_disk: (mount, grow) of a
    small filesystem for the full disk (faultkit.small_tmpfs)."""
    with contextlib.ExitStack() as stack:
        urls = build_shards(sc, os.path.join(folder, "shards"))
        web = None
        if sc.remote:
            from remotekit import FaultServer
            web = stack.enter_context(FaultServer())
            urls = [web.put(os.path.basename(u), open(u, "rb").read()) for u in urls]
        return _play(sc, folder, urls, web, small_disk)


def _network_faults(sc: Scenario, web) -> int:
    """Queue the first run's connection resets (remotekit.FaultServer: a reset meets the next GET
    whose range holds its byte, whichever of the run's reads that is); returns how many."""
    for s, fractions in sc.resets.items():
        name = f"shard-{int(s):04d}.tar"
        size = len(web.objects[name])
        web.fail(name, *[("reset", int(f * size)) for f in fractions])
    if sc.give_up >= 1:
        name = f"shard-{sc.give_up:04d}.tar"
        web.fail(name, *[("reset", len(web.objects[name]) // 2)] * 100)  # more than every read's budget
    return sum(len(q) for q in web.faults.values())


def _play(sc: Scenario, folder: str, urls: List[str], web, small_disk) -> Outcome:
    from wdsfilter.core.errors import RunError
    from wdsfilter.score.faults import DiskFullError
    files = fault_files(folder)
    log = os.path.join(folder, "scored.log")
    ref, out = os.path.join(folder, "ref"), os.path.join(folder, "out")
    arm(files, None)
    run_here(urls, ref, options(sc, files, log, ref + "-kept"), workers=0, batch_size=sc.batch_size)
    kept = os.path.join(small_disk[0], "kept") if sc.kill == "full_disk" else out + "-kept"
    if small_disk is not None:  # room for half of the filtered shards: the disk fills up half-way
        room = sum(os.path.getsize(os.path.join(ref + "-kept", f)) for f in os.listdir(ref + "-kept"))
        small_disk[1](f"{max(64, room // 2 // 1024)}k")
    opts = options(sc, files, log, kept)
    outcome = Outcome(urls, out, ref)
    arm(files, sc)
    queued = _network_faults(sc, web) if web is not None else 0
    open(log, "w").close()
    sized = {"workers": sc.workers, "batch_size": sc.batch_size}
    if sc.kill == "run":
        outcome.first_exit = run_killable(urls, out, opts, kill_after=sc.kill_after, log=log, **sized)
    else:
        # A worker's death (decode or model) ends its own process only: the run goes on here and fails.
        devices = {"devices": ("cpu", "cpu")} if sc.kill == "model_worker" else {}  # two model worker processes
        try:
            run_here(urls, out, opts, **devices, **sized)
            outcome.first_exit = 0
        except (DiskFullError, RunError):
            outcome.first_exit = 3
    outcome.steps.append(f"first run: exit {outcome.first_exit}")
    from wdsfilter.score.ledger import MERGED, read_entries
    outcome.first_whole = sorted({e["reason"] for e in read_entries(os.path.join(out, MERGED)) if e["index"] == -1})
    if small_disk is not None:
        small_disk[1]("64m")  # space freed
    if web is not None:
        outcome.resets_met = queued - sum(len(q) for q in web.faults.values())
        outcome.steps.append(f"network: {outcome.resets_met} connection reset(s) met")
        web.faults.clear()  # the network is back
    arm(files, sc, kills=False)  # the run-ending fault is gone; the samples' faults are still there
    summary = run_here(urls, out, opts, resume=True, **sized)
    outcome.steps.append(f"resume: {summary.shards_scored} shard(s) scored, failures {summary.failures}")
    arm(files, None)  # every fault gone
    if sc.retry_kill_after:
        code = run_killable(urls, out, opts, kill_after=_lines(log) + sc.retry_kill_after, log=log,
                            retry_failed="transient", **sized)
        outcome.steps.append(f"retry-failed killed at a random point: exit {code}")
    summary = run_here(urls, out, opts, retry_failed=True, **sized)
    outcome.steps.append(f"retry-failed: {summary.retried}")
    return outcome


# -- the promise -----------------------------------------------------------------------------------------
def violations(o: Outcome, kept: Optional[str] = None) -> List[str]:
    """What breaks the promise in o.out, compared with the one-shot run o.ref; [] when it holds.
    kept: where the faulty run wrote its filtered shards (default OUT-kept)."""
    from wdsfilter.score.ledger import MERGED, read_entries, shard_file
    from wdsfilter.runfolder.tables import read_rows
    from wdsfilter.score.resume import shard_names
    bad: List[str] = []
    names = shard_names(o.urls)
    kept = kept or o.out + "-kept"
    listed = {}
    for e in read_entries(os.path.join(o.out, MERGED)):
        if (e["shard"], e["index"]) in listed:
            bad.append(f"listed twice in the ledger: {e['shard']} {e['key']}")
        listed[(e["shard"], e["index"])] = e
    per_shard = sum(len(read_entries(shard_file(o.out, names[u]))) for u in o.urls)
    if per_shard != len(listed):
        bad.append(f"the merged ledger has {len(listed)} entries, the shards' files {per_shard}")
    for url in o.urls:
        name = names[url]
        if not os.path.exists(os.path.join(o.out, "done", name + ".json")):
            bad.append(f"{name}: no completion marker")
            continue
        rows = read_rows(os.path.join(o.out, "scores", name + ".parquet"))
        want = read_rows(os.path.join(o.ref, "scores", name + ".parquet"))
        if [r["index"] for r in rows] != list(range(len(rows))):
            bad.append(f"{name}: row indexes are not 0..n-1")
        if len({r["key"] for r in rows}) != len(rows):
            bad.append(f"{name}: a key has two rows (scored twice)")
        if [r["key"] for r in rows] != [r["key"] for r in want]:
            bad.append(f"{name}: other rows or another order than the one-shot run")
            continue
        for r, w in zip(rows, want):
            same = (r["status"], r["reason"], r["kept"]) == (w["status"], w["reason"], w["kept"])
            score_ok = (r["brightness"] is None) == (w["brightness"] is None) and (
                r["brightness"] is None or abs(r["brightness"] - w["brightness"]) < 1e-6)
            if not (same and score_ok):
                bad.append(f"{name} {r['key']}: {r['status']}/{r['reason']}/{r['brightness']} where the one-shot run "
                           f"has {w['status']}/{w['reason']}/{w['brightness']}")
            entry = listed.pop((url, r["index"]), None)
            if r["status"] == "scored" and entry is not None:
                bad.append(f"{name} {r['key']}: scored and listed in the ledger")
            if r["status"] != "scored" and (entry is None or entry["reason"] != (r["reason"] or r["status"])):
                bad.append(f"{name} {r['key']}: {r['status']} ({r['reason']}) but not listed with that reason")
        mine, theirs = os.path.join(kept, name + ".tar"), os.path.join(o.ref + "-kept", name + ".tar")
        if not os.path.exists(mine) or open(mine, "rb").read() != open(theirs, "rb").read():
            bad.append(f"{name}: the filtered shard differs from the one-shot run's")
    bad += [f"listed but no such row: {e['shard']} {e['key']} ({e['reason']})" for e in listed.values()]
    return bad


def describe(sc: Scenario) -> str:
    return json.dumps(asdict(sc), sort_keys=True)


def _main(config_path: str) -> int:
    """A run from a config file: `python promisekit.py CONFIG.json` ({"urls", "out", "options"})."""
    import faultkit  # noqa: F401 - the scorer's module, importable by its name
    with open(config_path) as f:
        config = json.load(f)
    opts = config["options"]
    if "devices" in opts:
        opts["devices"] = tuple(opts["devices"])
    return _run_child(config["urls"], config["out"], opts)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
