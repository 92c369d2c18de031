"""Lock files. One scoring run per output folder (and one `filter --write-shards` run per OUT): an exclusive lock on `<out>/.lock`, held for
the whole run; and `file_lock`, which makes processes that share a folder take turns (a model
download into one folder).

The lock is `fcntl.flock` on an open file: the kernel drops it when the process ends in any way
(SIGKILL and out-of-memory kills included), so a lock left by a killed run is no lock at all and
the next run takes it over without a stale-PID guess. Forked children (decode workers) let go of
their copy of the descriptor at once, so the lock ends with the run's own process. The file itself stays; it records who holds
the lock (pid, host, start time) for the message a second run prints. flock works on local
filesystems and on NFS (Linux emulates it with POSIX locks there); a Ray run holds it on the driver.
"""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from ..errors import ConfigError

LOCK_NAME = ".lock"


# The descriptors of the output locks this process holds. A forked child (a DataLoader decode
# worker) shares the locked open file, and flock holds until every descriptor of it is closed:
# when a run was killed with kill -9, its orphaned decode workers kept the lock until they noticed
# (seconds, or as long as a decode takes), and a --resume at once was refused, naming the dead pid.
_HELD = set()


def _let_go_in_child() -> None:
    """After a fork, in the child: point the held locks' descriptors at /dev/null. dup2 closes
    the child's reference to the locked file without unlocking it (no LOCK_UN) for the run, and
    the file object the child inherited closes /dev/null if it is ever closed there."""
    for fd in list(_HELD):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, fd)
        os.close(null)
    _HELD.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


class OutputLockedError(ConfigError):
    """Another live run holds the lock on this output folder (a usage error: exit code 2)."""


class OutputLock:
    def __init__(self, out: str, command: str = "score", option: str = "--out"):
        self.path = os.path.join(out, LOCK_NAME)
        self.command, self.option = command, option  # who takes it, for the message a second run prints
        self._file = None  # a file object, so a lock dropped without release() is closed by the GC

    def acquire(self) -> "OutputLock":
        import fcntl  # POSIX only, like the rest of the process model (spawned model workers, pipes)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        f = open(self.path, "a+b")
        fd = f.fileno()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            f.close()
            raise OutputLockedError(
                f"{os.path.dirname(self.path)} is in use by another wdsfilter {self.command} run{holder}; wait for "
                f"it to finish or stop it, or use another {self.option} (a run that was killed holds no lock)") from None
        except BaseException:
            f.close()
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
        self._file = f
        _HELD.add(fd)
        return self

    def release(self) -> None:
        if self._file is not None:
            _HELD.discard(self._file.fileno())
            self._file.close()  # closing the descriptor drops the flock
            self._file = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f" (pid {info['pid']} on {info['host']}, started {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing), waiting for any other holder."""
    import fcntl
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes, or its process dies
        yield
