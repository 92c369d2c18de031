"""Progress of a long run on stderr, as tqdm users expect it, on a terminal and in a log.

On a terminal: one line redrawn in place (`\\r`), with a bar, done/total, elapsed<ETA and the rate.
Elsewhere (CI logs, a file, a pipe): a plain line every `interval` seconds and one at the end,
never a `\\r`, so a log holds readable lines instead of hundreds of frames on one line.

The total is in samples where it is known beforehand (sizes.json beside the shards:
shardstats.sizes_samples), else the
share done is the shards' (`parts`). The rate is always `<unit>/s` (tqdm flips to `s/<unit>` when
it falls under one, and its unit text read `s/ samples`). A background thread redraws the line
every second, so the elapsed time moves while a slow batch is scored.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional
from .errors import ConfigError

BAR_WIDTH = 20
LOG_INTERVAL = 10.0  # seconds between lines in a log
MIN_REDRAW = 0.1  # seconds between redraws on a terminal (tqdm's mininterval)


def clock(seconds: Optional[float]) -> str:
    """0:07, 1:02:03 (tqdm's form); '?' when unknown."""
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate_text(count: float, seconds: float, unit: str) -> str:
    rate = count / seconds if seconds > 0 else 0.0
    return f"{rate:.1f} {unit}/s" if rate < 100 else f"{rate:.0f} {unit}/s"


class Progress:
    """done/total of a run in `unit` (samples, shards), and of its `parts` (shards) when given.

    tty: draw in place (default: whether `file` is a terminal). interval: seconds between lines
    in a log (0: a line at every update, which the tests use). extra(): more text for the line
    (rates of other units)."""

    def __init__(self, desc: str, unit: str, total: Optional[int] = None, parts: Optional[int] = None,
                 part_unit: str = "shards", file=None, tty: Optional[bool] = None,
                 interval: float = LOG_INTERVAL, extra=None):
        self.desc, self.unit, self.total, self.parts, self.part_unit = desc, unit, total, parts, part_unit
        self.file = file or sys.stderr
        self.tty = _isatty(self.file) if tty is None else tty
        self.interval = interval
        self.extra = extra
        self.n = self.parts_done = 0
        self.started = time.monotonic()
        self.last_line = 0.0
        self.lock = threading.Lock()
        self.closed = False
        self.stop = threading.Event()
        self.thread = None
        tick = 1.0 if self.tty else interval
        if tick > 0:
            self.thread = threading.Thread(target=self._tick, args=(tick,), name="wdsfilter-progress", daemon=True)
            self.thread.start()
        self._draw(force=True)

    # -- counting ------------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        with self.lock:  # counted from reader threads too (filter's score files)
            self.n += n
        self._draw()

    def part_done(self, n: int = 1) -> None:
        with self.lock:
            self.parts_done += n
        self._draw()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.closed:
            return
        self._draw(force=True)
        with self.lock:
            if self.tty and not self.closed:
                try:
                    self.file.write("\n")
                    self.file.flush()
                except (OSError, ValueError):
                    pass
            self.closed = True

    # -- the line --------------------------------------------------------------------------------
    def fraction(self) -> Optional[float]:
        if self.total:
            return min(1.0, self.n / self.total)
        if self.parts:
            return min(1.0, self.parts_done / self.parts)
        return None

    def line(self, now: Optional[float] = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self.started
        share = self.fraction()
        eta = elapsed * (1 - share) / share if share else None
        done = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        parts = f", {self.part_unit} {self.parts_done}/{self.parts}" if self.parts else ""
        extra = f", {self.extra()}" if self.extra else ""
        rate = rate_text(self.n, elapsed, self.unit)
        if self.tty:
            bar = ""
            if share is not None:
                filled = int(share * BAR_WIDTH)
                bar = f"{share * 100:3.0f}%|{'#' * filled}{' ' * (BAR_WIDTH - filled)}| "
            return f"{self.desc}: {bar}{done} [{clock(elapsed)}<{clock(eta)}, {rate}{parts}{extra}]"
        percent = f" ({share * 100:.0f}%)" if share is not None else ""
        return (f"{self.desc}: {done}{percent}{parts}, {rate}{extra}, elapsed {clock(elapsed)}, "
                f"ETA {clock(eta)}")

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        with self.lock:
            if self.closed:
                return
            if not force and now - self.last_line < (MIN_REDRAW if self.tty else self.interval):
                return
            self.last_line = now
            text = self.line(now)
            try:
                self.file.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
                self.file.flush()
            except (OSError, ValueError):  # stderr closed or gone (a pipe whose reader left): no progress then
                self.closed = True

    def _tick(self, seconds: float) -> None:
        while not self.stop.wait(seconds):
            self._draw(force=True)


# filter's and dedup's default: their passes often take a second, and a log or a script's stderr
# gets no lines it did not ask for
TERMINAL_ONLY = "on when stderr is a terminal; in a log only when given; off with -q"


def progress_option(default: str):
    """--progress/--no-progress of a long command; `default` says when it is on unless given
    (read the flag with `progress_on`)."""
    import click
    return click.option("--progress/--no-progress", default=None,
                        help=f"Progress on stderr: a bar on a terminal, a line every 10 s in a log [default: {default}].")


def progress_on(progress: Optional[bool], level: int, terminal_only: bool = False) -> bool:
    """Whether a command draws its progress: --progress/--no-progress as given (None: not given;
    then on, or only where stderr is a terminal: `terminal_only`); `level` from `verbosity`: -q
    (0) turns it off whatever the flag."""
    if level == 0 or progress is False:
        return False
    return bool(progress) or not terminal_only or _isatty(sys.stderr)


class Passes:
    """A command's passes, a progress line each (filter's): `start` opens one (None when progress
    is off), `end` draws its last line; leaving the `with` block ends any still open (an error)."""

    def __init__(self, enabled: bool):
        self.enabled, self.open = enabled, []

    def start(self, desc: str, unit: str, **counts) -> Optional[Progress]:
        if not self.enabled:
            return None
        self.open.append(Progress(desc, unit, **counts))
        return self.open[-1]

    def end(self, line: Optional[Progress]) -> None:
        if line is not None and line in self.open:
            self.open.remove(line)
            line.close()

    def __enter__(self) -> "Passes":
        return self

    def __exit__(self, *exc) -> None:
        while self.open:
            self.end(self.open[-1])


def _isatty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def verbosity_options(quiet: str, verbose: str):
    """-q/--quiet and -v/--verbose, the same flags on every command (each says what they change
    there); read them with `verbosity`."""
    import click

    def options(command):
        command = click.option("--verbose", "-v", "verbose", is_flag=True, help=verbose)(command)
        return click.option("--quiet", "-q", "quiet", is_flag=True, help=quiet)(command)
    return options


def verbosity(quiet: bool, verbose: bool) -> int:
    """0 (-q), 1 (default) or 2 (-v)."""
    if quiet and verbose:
        raise ConfigError("-q/--quiet and -v/--verbose exclude each other; pass one")
    return 0 if quiet else 2 if verbose else 1


class OwnRecords:
    """A logging filter: only wdsfilter's own records (logger "wdsfilter" and below) reach the
    terminal. A library's (gcsfs's "out of retries" with its traceback, botocore's, google-auth's,
    huggingface_hub's) say in their words what wdsfilter then says in one line; --debug shows them."""

    def filter(self, record) -> bool:
        return record.name == "wdsfilter" or record.name.startswith("wdsfilter.")


def library_logs_off(debug: Optional[bool] = None) -> None:
    """Keep libraries' log lines off the terminal unless --debug (or WDSFILTER_DEBUG=1): the
    OwnRecords filter on every handler of the root logger and on logging's last resort (which
    prints a record when no handler was set). Called by every command when it starts, and again
    by one that sets up its own root handler (score); idempotent."""
    import logging
    if debug is None:
        import click
        ctx = click.get_current_context(silent=True)
        debug = bool(ctx and ctx.find_root().meta.get("wdsfilter.debug")) or \
            os.environ.get("WDSFILTER_DEBUG", "") not in ("", "0")
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is None:
            continue
        for f in [f for f in handler.filters if isinstance(f, OwnRecords)]:
            handler.removeFilter(f)
        if not debug:
            handler.addFilter(OwnRecords())
