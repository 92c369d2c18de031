"""Atomic file writes: write a temporary in the destination's folder, then rename it over the
destination, so a reader (or a run resumed after SIGKILL) sees the whole file or none of it.

Every temporary is named `.<name>.tmp-<pid>`: hidden, and recognisable by is_temporary(), so the
next run can delete what a killed run left behind (remove_temporaries).

A folder may be guarded (`guard(folder, check)`): every rename into it runs `check()` first, which
raises when this writer no longer owns the folder (runfolder/lease.py: a run stalled past its
lease, whose folder another run took over). The one place every file write passes.

    with atomic_path("out/scores/00.parquet") as tmp:
        pq.write_table(table, tmp)
    write_json("out/done/00.json", {"url": ...}, fsync=True)
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional
from ..core.publish import published
from .remote import is_fsspec_url, write_object

TMP_TAG = ".tmp-"
_GUARDS: Dict[str, Callable[[], None]] = {}  # folder (absolute) -> its owner's check


def guard(folder: str, check: Callable[[], None]) -> None:
    """Run `check()` before every write into `folder` (below it too) from now on, in this process."""
    _GUARDS[os.path.abspath(folder)] = check


def unguard(folder: str) -> None:
    _GUARDS.pop(os.path.abspath(folder), None)


def check_guards(path: str) -> None:
    """The checks of the guarded folders holding `path` (their errors propagate)."""
    if _GUARDS:
        target = os.path.abspath(path)
        for folder, check in list(_GUARDS.items()):
            if target == folder or target.startswith(folder.rstrip(os.sep) + os.sep):
                check()


def temporary_path(path: str) -> str:
    """The temporary name for `path` in this process: `.<name>.tmp-<pid>` in the same folder (same
    filesystem, so the rename is atomic)."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}{TMP_TAG}{os.getpid()}")


def is_temporary(name: str) -> bool:
    """A file name written by temporary_path (in any process)."""
    return name.startswith(".") and TMP_TAG in name


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temporary path to write; on success it is renamed to `path` (after the folder's
    guard, if it has one), on any error (or KeyboardInterrupt) it is removed."""
    tmp = temporary_path(path)
    try:
        yield tmp
        check_guards(path)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, data: Any, *, fsync: bool = False, indent: Optional[int] = 1, private: bool = False,
               **dump_options) -> str:
    """json.dump `data` to `path` atomically; fsync=True flushes it to disk before the rename (a
    completion marker must not outlive a power cut that loses the data it vouches for). Every URL
    in it is written without its secrets (publish.published), unless `private`: the one file that
    keeps them (shards.json), readable by its owner only (0600)."""
    dump_options.setdefault("default", str)
    data = data if private else published(data)
    if is_fsspec_url(path):  # one object, whole or not at all (thresholds.json of a run folder in a bucket)
        return write_object(path, json.dumps(data, indent=indent, **dump_options).encode())
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", opener=_owner_only if private else None) as f:
            if private:
                os.fchmod(f.fileno(), 0o600)  # whatever the umask, and over a temporary left by a killed run
            json.dump(data, f, indent=indent, **dump_options)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    return path


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def remove_temporaries(folder: Optional[str]) -> int:
    """Delete the temporaries a killed run left in `folder` (never complete); returns how many."""
    removed = 0
    if folder and os.path.isdir(folder):
        for name in os.listdir(folder):
            if is_temporary(name):
                try:
                    os.remove(os.path.join(folder, name))
                    removed += 1
                except OSError:
                    pass  # another run's cleanup got there first
    return removed


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing), waiting for any other holder:
    processes that write one file in turns (a model download into a shared folder)."""
    import fcntl
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes, or its process dies
        yield
