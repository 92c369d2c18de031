"""Fuzz the input side: mutate the committed sample shards and run each mutant through
`wdsfilter validate` (the CLI, in every output format) and through the training stages; and
(--folders) mutate scoring run folders and run each through `wdsfilter filter` (counts, new
shards, the report) and the loader's score filter.

Mutations: byte flips, truncation, header edits (size, type, name, checksum fields), members
spliced from another shard, duplicated members, zeroed blocks, gzip layers (whole, or gzip then
cut or flipped). A mutant passes when validate exits 0 or 1 with its report written, and the
stages end without an exception; a run that takes longer than --timeout seconds is a hang.

    python tools/fuzz.py [-n 10000] [--seed 0] [--timeout 30] [--keep DIR]
    python tools/fuzz.py --folders [-n 1000] [--seed 0]

Prints counts per mutation and per outcome; exit status 1 when anything crashed or hung.

A run folder is input as a shard is (issue 20): a mutated folder (markers, run.json, shards.json,
score files, symlinks, all pointed at decoys outside the folder, at `pipe:touch CANARY` commands,
damaged or retyped) passes when `filter` exits 0-3 without an internal error, the loader's score
filter raises only a wdsfilter error when built and none while iterating, no command ran (no
canary file, no subprocess started: an audit hook), no file outside the folder, the outputs and
the sources its shards.json names was opened (the audit hook on "open"; pyarrow's reads announce
themselves, runfolder/tables.py) and no file was deleted but the tool's own outputs and temporaries.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

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
    from wdsfilter.stream.pipeline import sample_pipeline

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


# -- run folders -------------------------------------------------------------------------------------
@dataclass
class FolderCounts:
    folders: int = 0
    mutations: Counter = field(default_factory=Counter)
    filter_exit: Counter = field(default_factory=Counter)
    loader: Counter = field(default_factory=Counter)  # built / refused
    crashes: List[str] = field(default_factory=list)
    commands: List[str] = field(default_factory=list)  # commands run, canaries made
    escapes: List[str] = field(default_factory=list)  # files opened outside the folder and its sources
    deletions: List[str] = field(default_factory=list)  # files deleted that the tool did not write
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"fuzz: {self.folders} mutated run folders in {self.seconds:.1f}s",
                 "  mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.mutations.items())),
                 "  filter exit codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.filter_exit.items())),
                 "  loader's score filter: " + ", ".join(f"{k} {v}" for k, v in sorted(self.loader.items())),
                 f"  uncaught exceptions: {len(self.crashes)}", f"  commands run: {len(self.commands)}",
                 f"  files read outside: {len(self.escapes)}", f"  files deleted: {len(self.deletions)}"]
        for what in (self.crashes + self.commands + self.escapes + self.deletions)[:8]:
            lines.append("    " + what.replace("\n", "\n    "))
        return "\n".join(lines)


class _Audit:
    """One audit hook for the process (they cannot be removed): while `active`, it records the
    files opened and removed and the commands started."""
    installed = None

    def __init__(self):
        self.active = False
        self.opened: List[str] = []
        self.removed: List[str] = []
        self.commands: List[str] = []

    @classmethod
    def get(cls) -> "_Audit":
        if cls.installed is None:
            cls.installed = cls()
            sys.addaudithook(cls.installed)
        return cls.installed

    def __call__(self, event, args):
        if not self.active:
            return
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            self.opened.append(os.fsdecode(args[0]))
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
            self.removed.append(os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else "?")
        elif event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn"):
            if "ldconfig" not in str(args[0]):  # ctypes.util.find_library's lookup on a first import
                self.commands.append(f"{event}: {str(args)[:200]}")


def _base_folders(root: str) -> Dict[str, str]:
    """Two small scoring run folders (Parquet, JSON Lines) over copies of two sample shards,
    written by the run folder's own writers; returns {format: folder}."""
    import shutil
    import tarfile

    from wdsfilter.runfolder import layout, tables
    data = os.path.join(root, "data")
    os.makedirs(data)
    sources = [shutil.copy(os.path.join(ROOT, "sample_shards", f"images-00000{i}.tar"), data) for i in (0, 1)]
    names = layout.shard_names(sources)
    rng = random.Random(1)
    out = {}
    for fmt in ("parquet", "jsonl"):
        folder = os.path.join(root, f"run-{fmt}")
        os.makedirs(os.path.join(folder, layout.SCORES))
        os.makedirs(os.path.join(folder, layout.DONE))
        for url in sources:
            with tarfile.open(url) as tar:
                keys = list(dict.fromkeys(m.name.split(".", 1)[0] for m in tar.getmembers()))
            rows = [{"key": k, "shard": url, "index": i, "status": "failed" if i == 3 else "scored",
                     "reason": "x" if i == 3 else None, "kept": i != 3, "score": None if i == 3 else rng.random()}
                    for i, k in enumerate(keys)]
            path = os.path.join(folder, layout.SCORES, tables.table_name(names[url], fmt))
            tables.write_table(rows, {"score": "float64"}, path, fmt)
            layout.write_marker(folder, layout.Marker(
                url=url, name=names[url], score_file=os.path.relpath(path, folder), rows=len(rows),
                source=layout.source_state(url), sizes=layout.output_sizes(folder, [path])))
        layout.write_shard_list(folder, sources, names)
        with open(os.path.join(folder, layout.RUN_JSON), "w") as f:
            json.dump({"scorers": [{"name": "fuzz", "columns": ["score"]}],
                       "stage": {"caption_key": "txt", "image_key": "jpg", "rekey": "first-dot"}}, f)
        out[fmt] = folder
    return out


def _json_edit(path: str, edit: Callable) -> None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)


def _hostile(rng: random.Random, ctx: dict):
    return rng.choice((ctx["pipe"], ctx["decoy_tar"], ctx["decoy_parquet"], "/etc/passwd", "../" * 6 + "etc/passwd",
                       "http://127.0.0.1:9/x.tar", 7, -1, 1e308, None, [], {}, True, "", "scores/../../x"))


def _pick(rng: random.Random, folder: str, sub: str) -> Optional[str]:
    d = os.path.join(folder, sub)
    names = sorted(os.listdir(d)) if os.path.isdir(d) and not os.path.islink(d) else []
    return os.path.join(d, rng.choice(names)) if names else None


def m_marker_field(rng, folder, ctx):
    marker = _pick(rng, folder, "done")
    key = rng.choice(("url", "name", "score_file", "source", "sizes", "embeddings", "rows", "error", "source.path"))

    def edit(d):
        if key == "source.path" and isinstance(d.get("source"), dict):
            d["source"]["path"] = rng.choice((ctx["decoy_tar"], ctx["pipe"]))
        else:
            d[key] = _hostile(rng, ctx)
    if marker:
        _json_edit(marker, edit)


def m_marker_bytes(rng, folder, ctx):
    marker = _pick(rng, folder, "done")
    if marker:
        with open(marker, "rb") as f:
            data = f.read()
        with open(marker, "wb") as f:
            f.write(rng.choice((flip, truncate))(rng, data, None) if data else b"")


def m_run_json(rng, folder, ctx):
    path = os.path.join(folder, "run.json")
    how = rng.choice(("allow", "types", "bytes", "keys"))
    if how == "bytes":
        with open(path, "r+b") as f:
            data = f.read()
            f.seek(0)
            f.truncate()
            f.write(flip(rng, data, None))
    elif how == "allow":  # the permission taken from the folder, with every URL a command
        _json_edit(path, lambda d: d["stage"].update(allow_pipe=True, allow_remote=True))
        for marker in os.listdir(os.path.join(folder, "done")):
            _json_edit(os.path.join(folder, "done", marker), lambda d: d.update(url=ctx["pipe"], source=None))
        _json_edit(os.path.join(folder, "shards.json"),
                   lambda d: [e.update(url=ctx["pipe"], path=None) for e in d["shards"]])
    elif how == "types":
        _json_edit(path, lambda d: d.update({rng.choice(("stage", "scorers")): _hostile(rng, ctx)}))
    else:
        _json_edit(path, lambda d: d["stage"].update({rng.choice(("image_key", "caption_key", "rekey")):
                                                     rng.choice(("", ";;", "json:a.b", "nope", 3))}))


def m_shards_json(rng, folder, ctx):
    path = os.path.join(folder, "shards.json")

    def edit(d):
        entry = rng.choice(d["shards"])
        entry[rng.choice(("url", "name", "path"))] = _hostile(rng, ctx)
    if rng.random() < 0.3:
        with open(path, "w") as f:
            f.write(rng.choice(("", "{", "[]", '{"shards": 3}', '{"shards": [null]}')))
    else:
        _json_edit(path, edit)


def m_score_file(rng, folder, ctx):
    path = _pick(rng, folder, "scores")
    if path is None:
        return
    how = rng.choice(("flip", "truncate", "schema", "strings", "lines"))
    if how in ("flip", "truncate"):
        with open(path, "rb") as f:
            data = f.read()
        data = MUTATIONS[how](rng, data, None) if data else data
        with open(path, "wb") as f:
            f.write(data)
    elif how == "schema":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({rng.choice(("a", "key", "status")): [1, 2]}), path)
    elif how == "strings":
        from wdsfilter.runfolder.tables import format_for, read_rows, write_table
        rows = read_rows(path)
        mixed = not format_for(path).columnar  # a Parquet column has one type: strings
        for r in rows:
            r["score"] = rng.choice(("0.5", "high", None, float("nan"), float("inf")) if mixed else ("0.5", "high"))
        write_table(rows, ["score"], path, format_for(path).name)
    else:
        with open(path, "ab") as f:
            f.write(rng.choice((b"not json\n", b"[1, 2]\n", b'{"key": 3}\n', b"\xff\xfe\n")))
    if rng.random() < 0.7:  # the marker's sizes edited to match, so the file is read
        name = os.path.splitext(os.path.basename(path))[0]
        _json_edit(os.path.join(folder, "done", name + ".json"),
                   lambda d: d.update(sizes={os.path.relpath(path, folder): os.path.getsize(path)}))


def m_symlink(rng, folder, ctx):
    target = rng.choice((ctx["decoy_parquet"], ctx["decoy_tar"], ctx["secret"], os.path.dirname(ctx["secret"])))
    victim = rng.choice((_pick(rng, folder, "scores"), _pick(rng, folder, "done"), os.path.join(folder, "scores"),
                         os.path.join(folder, "done"), os.path.join(folder, "run.json")))
    if victim is None:
        return
    import shutil
    if os.path.isdir(victim) and not os.path.islink(victim):
        shutil.rmtree(victim)
    else:
        os.remove(victim)
    os.symlink(target, victim)


def m_delete(rng, folder, ctx):
    victim = rng.choice((_pick(rng, folder, "scores"), _pick(rng, folder, "done"), os.path.join(folder, "run.json"),
                         os.path.join(folder, "shards.json")))
    if victim and os.path.exists(victim):
        os.remove(victim)


def m_paths(rng, folder, ctx):
    marker = _pick(rng, folder, "done")
    what = rng.choice(("score_file", "source"))
    value = rng.choice((ctx["decoy_parquet"], os.path.relpath(ctx["decoy_parquet"], folder),
                        os.path.join(os.path.dirname(ctx["decoy_parquet"]), "scores", "images-000000.parquet")))

    def edit(d):
        if what == "score_file":
            d["score_file"] = value
        else:
            d["source"] = {"path": ctx["decoy_tar"]}
    if marker:
        _json_edit(marker, edit)


FOLDER_MUTATIONS: Dict[str, Callable] = {
    "marker_field": m_marker_field, "marker_bytes": m_marker_bytes, "run_json": m_run_json,
    "shards_json": m_shards_json, "score_file": m_score_file, "symlink": m_symlink, "delete": m_delete,
    "paths": m_paths}
THRESHOLD_ARGS = ([], ["--min", "score=0.3"], ["--top", "score=50%"], ["--max", "score=0.8", "--allow-incomplete"])


def _named_sources(folder: str) -> set:
    """What the mutant's own shards.json names (those sources may be read)."""
    try:
        with open(os.path.join(folder, "shards.json")) as f:
            entries = json.load(f)["shards"]
        return {os.path.realpath(e[k]) for e in entries if isinstance(e, dict) for k in ("url", "path")
                if isinstance(e.get(k), str)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def _files(folder: str) -> set:
    out = set()
    for dirpath, _dirs, files in os.walk(folder):
        out.update(os.path.join(dirpath, f) for f in files)
    return out


def _run_folder(folder: str, outputs: str, sources: List[str], rng: random.Random) -> Tuple[int, str]:
    """filter, then the loader's score filter, over one mutant: (filter's exit code, loader outcome)."""
    from click.testing import CliRunner

    from wdsfilter.cli import main
    from wdsfilter.core.errors import WdsFilterError
    from wdsfilter.scorefilter import ScoreFilter
    from wdsfilter.core.selection import Selection
    args = ["filter", folder, "--write-shards", os.path.join(outputs, "shards"), "--samples-per-shard", "7",
            "--report", os.path.join(outputs, "report.html"), *rng.choice(THRESHOLD_ARGS)]
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if result.exit_code not in (0, 1, 2, 3) or "internal error" in result.output:
        raise RuntimeError(f"filter exited {result.exit_code}: {result.output[-400:]}")
    try:
        stage = ScoreFilter(folder, rng.choice((Selection(), Selection(minima={"score": 0.3}))))
    except WdsFilterError:
        return result.exit_code, "refused"
    import tarfile
    samples = []
    for url in sources:
        with tarfile.open(url) as tar:
            keys = dict.fromkeys(m.name.split(".", 1)[0] for m in tar.getmembers())
        samples += [{"__url__": url, "__key__": k} for k in keys]
    list(stage(iter(samples)))  # any exception here would reach the training loop
    return result.exit_code, "built"


def run_folders(n: int, seed: int = 0, keep: str = "") -> FolderCounts:
    """Mutate and check n run folders (see the module docstring)."""
    import shutil
    rng = random.Random(seed)
    counts = FolderCounts()
    audit = _Audit.get()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wdsfilter-fuzz-folders-") as root:
        root = os.path.realpath(root)
        bases = _base_folders(os.path.join(root, "bases"))
        sources = sorted(os.path.join(root, "bases", "data", f) for f in os.listdir(os.path.join(root, "bases", "data")))
        outside = os.path.join(root, "outside")
        os.makedirs(os.path.join(outside, "scores"))
        ctx = {"decoy_tar": shutil.copy(sources[0], os.path.join(outside, "decoy.tar")),
               "decoy_parquet": shutil.copy(os.path.join(bases["parquet"], "scores", "images-000000.parquet"),
                                            os.path.join(outside, "decoy.parquet")),
               "secret": os.path.join(outside, "secret.txt"), "canary": os.path.join(root, "CANARY")}
        shutil.copy(ctx["decoy_parquet"], os.path.join(outside, "scores", "images-000000.parquet"))
        with open(ctx["secret"], "w") as f:
            f.write("secret\n")
        ctx["pipe"] = f"pipe:touch {ctx['canary']}; cat {sources[0]}"
        protected = _files(outside) | _files(os.path.join(root, "bases"))
        for i in range(n):
            fmt = rng.choice(sorted(bases))
            folder = shutil.copytree(bases[fmt], os.path.join(root, f"m{i:05d}"), symlinks=True)
            outputs = os.path.join(root, f"o{i:05d}")
            os.makedirs(outputs)
            names = rng.sample(sorted(FOLDER_MUTATIONS), rng.choice((1, 1, 2)))
            for name in names:
                FOLDER_MUTATIONS[name](rng, folder, ctx)
                counts.mutations[name] += 1
            counts.folders += 1
            where = f"#{i} ({'+'.join(names)}, {fmt}, seed {seed})"
            named = _named_sources(folder) | {os.path.realpath(s) for s in sources}
            before = _files(folder)
            audit.opened, audit.removed, audit.commands = [], [], []
            audit.active = True
            try:
                code, loader = _run_folder(folder, outputs, sources, rng)
                counts.filter_exit[code] += 1
                counts.loader[loader] += 1
            except BaseException as e:  # anything escaping is what the fuzz looks for
                if isinstance(e, KeyboardInterrupt):
                    raise
                counts.crashes.append(f"{where}: {type(e).__name__}: {e}\n"
                                      + "".join(traceback.format_exception(e)[-3:]))
            finally:
                audit.active = False
            if audit.commands or os.path.exists(ctx["canary"]):
                counts.commands.append(f"{where}: {audit.commands[:2]}")
                if os.path.exists(ctx["canary"]):
                    os.remove(ctx["canary"])
            for path in audit.opened:
                real = os.path.realpath(path)
                if (real.startswith(outside + os.sep) or real == "/etc/passwd") and real not in named:
                    counts.escapes.append(f"{where}: opened {path}")
            for path in audit.removed:
                base = os.path.basename(path)
                if not (os.path.realpath(path).startswith(outputs + os.sep) or (base.startswith(".") and ".tmp-" in base)):
                    counts.deletions.append(f"{where}: removed {path}")
            gone = sorted(p for p in (before | protected) if not os.path.lexists(p))
            if gone:
                counts.deletions.append(f"{where}: gone {gone[:3]}")
            if keep and len(counts.crashes) + len(counts.escapes) + len(counts.deletions) + len(counts.commands):
                shutil.copytree(folder, os.path.join(keep, os.path.basename(folder)), symlinks=True, dirs_exist_ok=True)
            shutil.rmtree(folder)
            shutil.rmtree(outputs)
    counts.seconds = time.perf_counter() - started
    return counts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10_000, help="mutated shards [10000]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one shard may take [30]")
    ap.add_argument("--keep", default="", help="copy crashing or hanging shards into this folder")
    ap.add_argument("--rotate", action="store_true", help="one output format per shard, in turn (faster)")
    ap.add_argument("--folders", action="store_true", help="mutate scoring run folders instead of shards")
    args = ap.parse_args(argv)
    if args.folders:
        folder_counts = run_folders(args.n, args.seed, args.keep)
        print(folder_counts.summary())
        bad = folder_counts.crashes or folder_counts.commands or folder_counts.escapes or folder_counts.deletions
        sys.exit(1 if bad else 0)
    counts = run(args.n, args.seed, args.timeout, args.keep, args.rotate)
    print(counts.summary())
    sys.exit(1 if counts.crashes or counts.hangs else 0)


if __name__ == "__main__":
    main()
