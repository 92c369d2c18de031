"""Fuzz the input side: mutate the committed sample shards and run each mutant through
`wdsfilter validate` (the CLI, in every output format) and through the training stages.

Mutations: byte flips, truncation, header edits (size, type, name, checksum fields), members
spliced from another shard, duplicated members, zeroed blocks, gzip layers (whole, or gzip then
cut or flipped). A mutant passes when validate exits 0 or 1 with its report written, and the
stages end without an exception; a run that takes longer than --timeout seconds is a hang.

    python tools/fuzz.py [-n 10000] [--seed 0] [--timeout 30] [--keep DIR]

Prints counts per mutation and per outcome; exit status 1 when anything crashed or hung.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BLOCK = 512
FORMATS = ("text", "json", "junit")


def sample_shards() -> List[bytes]:
    paths = sorted(glob.glob(os.path.join(ROOT, "sample_shards", "**", "*.tar"), recursive=True))
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def _headers(data: bytes) -> List[int]:
    """Offsets of the member headers (walking the sizes; stops at anything odd)."""
    offsets, pos = [], 0
    while pos + BLOCK <= len(data):
        block = data[pos:pos + BLOCK]
        if block == bytes(BLOCK):
            break
        try:
            size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            break
        offsets.append(pos)
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return offsets


def flip(rng: random.Random, data: bytes, _) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 2, 8, 64))):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def truncate(rng: random.Random, data: bytes, _) -> bytes:
    cut = rng.choice((rng.randrange(len(data)), rng.randrange(0, len(data), BLOCK)))
    return data[:cut]


def header_edit(rng: random.Random, data: bytes, _) -> bytes:
    heads = _headers(data)
    if not heads:
        return flip(rng, data, _)
    b = bytearray(data)
    h = rng.choice(heads)
    what = rng.choice(("size", "type", "name", "checksum", "size-huge", "name-bytes"))
    if what == "size":
        b[h + 124:h + 136] = f"{rng.randrange(1 << 20):011o}\0".encode()
    elif what == "size-huge":
        b[h + 124:h + 136] = b"77777777777\0"
    elif what == "type":
        b[h + 156] = rng.choice(b"0123456LKxgS7V")
    elif what == "name":
        name = rng.choice((b"", b".hidden", b"a.b.c.d.jpg", b"x" * 99, b"pipe:true;.txt", b"0.pyd.gz", b"0.txt.gz"))
        b[h:h + 100] = name.ljust(100, b"\0")
    elif what == "name-bytes":
        for _ in range(4):
            b[h + rng.randrange(16)] = rng.randrange(128, 256)
    else:
        b[h + 148:h + 156] = b"0000000\0"
    if what != "checksum" and rng.random() < 0.7:  # mostly a valid checksum, so the edit is read
        block = b[h:h + BLOCK]
        block[148:156] = b" " * 8
        b[h + 148:h + 156] = f"{sum(block):06o}\0 ".encode()
    return bytes(b)


def splice(rng: random.Random, data: bytes, others: List[bytes]) -> bytes:
    other = rng.choice(others)
    a, o = _headers(data), _headers(other)
    if not a or not o:
        return data + other
    return data[:rng.choice(a)] + other[rng.choice(o):]


def duplicate(rng: random.Random, data: bytes, _) -> bytes:
    heads = _headers(data)
    if len(heads) < 2:
        return data + data
    i = rng.randrange(len(heads) - 1)
    member = data[heads[i]:heads[i + 1]]
    at = rng.choice(heads)
    return data[:at] + member * rng.choice((1, 2)) + data[at:]


def zero_blocks(rng: random.Random, data: bytes, _) -> bytes:
    b = bytearray(data)
    start = rng.randrange(0, max(len(b) - BLOCK, 1), BLOCK)
    n = rng.choice((1, 1, 2, 8)) * BLOCK
    b[start:start + n] = bytes(len(b[start:start + n]))
    return bytes(b)


def gzip_layer(rng: random.Random, data: bytes, others: List[bytes]) -> bytes:
    inner = rng.choice((data, flip(rng, data, others), truncate(rng, data, others)))
    z = gzip.compress(inner, compresslevel=1)
    how = rng.choice(("whole", "cut", "flip", "double"))
    if how == "cut":
        return z[:rng.randrange(len(z))]
    if how == "flip":
        return flip(rng, z, others)
    if how == "double":
        return gzip.compress(z, compresslevel=1)
    return z


MUTATIONS: Dict[str, Callable] = {"flip": flip, "truncate": truncate, "header": header_edit, "splice": splice,
                                  "duplicate": duplicate, "zero": zero_blocks, "gzip": gzip_layer}


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


@dataclass
class Counts:
    shards: int = 0
    mutations: Counter = field(default_factory=Counter)
    validate_exit: Counter = field(default_factory=Counter)
    crashes: List[str] = field(default_factory=list)
    hangs: List[str] = field(default_factory=list)
    samples_kept: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"fuzz: {self.shards} mutated shards in {self.seconds:.1f}s",
                 "  mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.mutations.items())),
                 "  validate exit codes (per format run): " + ", ".join(f"{k}: {v}" for k, v in
                                                                        sorted(self.validate_exit.items())),
                 f"  samples the stages kept: {self.samples_kept}",
                 f"  uncaught exceptions: {len(self.crashes)}", f"  hangs: {len(self.hangs)}"]
        for what in self.crashes[:5] + self.hangs[:5]:
            lines.append("    " + what.replace("\n", "\n    "))
        return "\n".join(lines)


def _validate_cli(path: str, fmt: str, out: str) -> int:
    """`wdsfilter validate PATH --format FMT --output OUT -j 1 -q`, in this process."""
    from click.testing import CliRunner

    from wdsfilter.cli import main

    result = CliRunner().invoke(main, ["validate", path, "--format", fmt, "--output", out, "-j", "1", "-q",
                                       "--no-progress"], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if result.exit_code not in (0, 1):
        raise RuntimeError(f"validate --format {fmt} exited {result.exit_code}: {result.output[-500:]}")
    if not os.path.getsize(out):
        raise RuntimeError(f"validate --format {fmt} left an empty report")
    return result.exit_code


def _stages(path: str) -> int:
    from wdsfilter import StageConfig
    from wdsfilter.pipeline import sample_pipeline

    cfg = StageConfig(check_first_shard=False, starvation_samples=0, starvation_seconds=0)
    return sum(1 for _ in sample_pipeline([path], cfg))


def run(n: int, seed: int = 0, timeout: float = 30.0, keep: str = "", rotate: bool = False) -> Counts:
    """Mutate and check n shards. rotate: each shard goes through one output format in turn
    (a third of the time, every format still sees many shards) instead of all three."""
    rng = random.Random(seed)
    sources = sample_shards()
    counts = Counts()
    started = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    with tempfile.TemporaryDirectory(prefix="wdsfilter-fuzz-") as folder:
        try:
            for i in range(n):
                name = rng.choice(sorted(MUTATIONS))
                data = MUTATIONS[name](rng, rng.choice(sources), sources)
                if data and rng.random() < 0.15:  # a second mutation now and then (an empty file has no bytes to mutate)
                    data = MUTATIONS[rng.choice(sorted(MUTATIONS))](rng, data, sources) or data
                suffix = ".tar.gz" if data[:2] == b"\x1f\x8b" else ".tar"
                path = os.path.join(folder, f"fuzz-{i:06d}{suffix}")
                with open(path, "wb") as f:
                    f.write(data)
                counts.shards += 1
                counts.mutations[name] += 1
                where = f"#{i} ({name}, seed {seed})"
                signal.setitimer(signal.ITIMER_REAL, timeout)
                try:
                    for fmt in (FORMATS[i % len(FORMATS)],) if rotate else FORMATS:
                        code = _validate_cli(path, fmt, os.path.join(folder, f"report.{fmt}"))
                        counts.validate_exit[code] += 1
                    counts.samples_kept += _stages(path)
                except Hang:
                    counts.hangs.append(f"{where}: over {timeout}s")
                    _keep(keep, path)
                except BaseException as e:  # anything escaping is what the fuzz looks for
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    counts.crashes.append(f"{where}: {type(e).__name__}: {e}\n"
                                          + "".join(traceback.format_exception(e)[-3:]))
                    _keep(keep, path)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                os.remove(path)
        finally:
            signal.signal(signal.SIGALRM, old)
    counts.seconds = time.perf_counter() - started
    return counts


def _keep(folder: str, path: str) -> None:
    if folder:
        import shutil
        os.makedirs(folder, exist_ok=True)
        shutil.copy(path, folder)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10_000, help="mutated shards [10000]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one shard may take [30]")
    ap.add_argument("--keep", default="", help="copy crashing or hanging shards into this folder")
    ap.add_argument("--rotate", action="store_true", help="one output format per shard, in turn (faster)")
    args = ap.parse_args(argv)
    counts = run(args.n, args.seed, args.timeout, args.keep, args.rotate)
    print(counts.summary())
    sys.exit(1 if counts.crashes or counts.hangs else 0)


if __name__ == "__main__":
    main()
