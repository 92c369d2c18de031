"""Private working folders in $TMPDIR (a bucket's run folder's staging copy, the tallies worker
processes write): made, held and swept by one rule, so a run killed with `kill -9` leaves nothing
that the next run does not remove.

Each is `$TMPDIR/wdsfilter-<kind>-<pid>-<random>/` with a file `.owner` that its maker holds an
exclusive flock on for its life (forked workers share it while they live); the kernel drops the
flock however the maker ends. `make()` first sweeps: a folder of ours (our prefix, a `.owner`
file) whose flock can be taken has no living maker, and is removed. A folder kept on purpose
(`keep()`: a staging copy whose upload failed, named in the log for the user) has a `.kept` file
and is never swept; folders without `.owner` (another program's, an older version's) are left
alone.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Optional

PREFIX = "wdsfilter-"
KINDS = ("out", "stats")
OWNER = ".owner"
KEPT = ".kept"
_NAME = re.compile(rf"^{PREFIX}({'|'.join(KINDS)})-\d+-")


class Scratch:
    """One working folder, held by this process until remove() (or its end)."""

    def __init__(self, kind: str):
        import fcntl
        assert kind in KINDS, kind
        sweep()
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-")
        self._owner = open(os.path.join(self.path, OWNER), "wb")
        fcntl.flock(self._owner.fileno(), fcntl.LOCK_EX)

    def keep(self) -> None:
        """Never swept: the user was told to copy it (or remove it)."""
        with contextlib.suppress(OSError):
            open(os.path.join(self.path, KEPT), "wb").close()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()  # the flock ends with it
            self._owner = None


def sweep(folder: Optional[str] = None) -> int:
    """Remove the working folders in `folder` ($TMPDIR) whose maker is gone; returns how many."""
    import fcntl
    folder = folder or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(folder, name)
        if not _NAME.match(name) or os.path.islink(path) or os.path.exists(os.path.join(path, KEPT)):
            continue
        try:
            owner = open(os.path.join(path, OWNER), "rb")
        except OSError:  # not one of ours to judge (no .owner), or gone
            continue
        with owner:
            try:
                fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its maker (or a worker it forked) lives
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed
