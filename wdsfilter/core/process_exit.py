"""How a `wdsfilter` process ends. A command that wrote nothing (a count: `filter --dry-run`) and
left no other thread running may end the process without the interpreter's teardown: freeing
every module and object one by one takes 20-30 ms after a 4 M-row count that takes 300 ms
(tools/bench_filter.py), time a user waits for and nothing needs. Its output is flushed first.
mypy ends its process the same way. Only the process's own entry (wdsfilter.cli.run: the
console script and `python -m wdsfilter`) does this; `main` called from Python (click's
CliRunner, a notebook) always returns or raises as usual."""
from __future__ import annotations

import os
import sys
import threading

_WROTE_NOTHING = [False]


def wrote_nothing() -> None:
    """Said by a command at its end when it wrote no file and started no process or thread that
    is still running: nothing is left to close or flush but the output."""
    _WROTE_NOTHING[0] = True


def end_now_if_nothing_to_close(code) -> None:
    """End the process at once with sys.exit's meaning of `code` when the command said
    wrote_nothing and no other thread runs (one could be writing); else return."""
    if not _WROTE_NOTHING[0] or threading.active_count() != 1:
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1
        status = 1
        if sys.stderr is not None:
            try:
                print(code, file=sys.stderr)
            except (OSError, ValueError):
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # (None: the process was started with that descriptor closed)
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: as the usual exit, which cannot write either
            pass
    os._exit(status & 0xFF)
