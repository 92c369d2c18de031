"""Which shards to read, and opening them safely.

Accepts folders (searched recursively), globs, brace patterns (`shards-{000..099}.tar`), `.tar`,
`.tar.gz`/`.tgz`, locally and in object stores (`s3://bucket/prefix/`, `gs://b/train-*.tar`: listed
and read by remote.py). `pipe:` URLs run shell commands: refused unless the user allows them.
Remote URLs are read when the user names them; allow_remote=False (`--no-remote`) forbids them.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import stat
import threading
import time
from typing import IO, List, Mapping, Optional, Sequence, Tuple, Union

import braceexpand

from ..core.errors import ConfigError, UnsafeInputError, RunError, Terminated
from .remote import is_fsspec_url, list_shards, redact_url
from .remote_options import RemoteOptions
from .remote_read import common_access_failure, open_remote
from .shardurls import (REMOTE_SCHEMES, SHARD_SUFFIXES, absolute_url, is_local, is_pipe, is_remote,  # noqa: F401
                        local_path, shard_stem, split_suffix, web_path)  # what a URL is: their home

# A brace pattern naming more shards than this is a mistake (x-{0..99999999}.tar): refused before
# it is expanded, since braceexpand materialises every range it multiplies.
MAX_BRACE_URLS = 1_000_000


def runs_command(url: str) -> bool:
    """A pipe: command, or a remote URL webdataset fetches with a command (ais://): read once only."""
    return is_pipe(url) or (is_remote(url) and not is_fsspec_url(url))


def _check_allowed(url: str, allow_pipe: bool, allow_remote: bool) -> None:
    if is_pipe(url) and not allow_pipe:
        raise UnsafeInputError(f"refusing {url!r}: pipe: URLs run shell commands. Pass allow_pipe=True "
                               f"(--allow-pipe) if you trust this command.")
    if is_remote(url) and not allow_remote:
        raise UnsafeInputError(f"refusing {redact_url(url)!r}: network reads are forbidden here (allow_remote=False, "
                               f"--no-remote); drop that option to read remote shards.")


check_allowed = _check_allowed  # the one rule, for inputs named by a file (a score folder's sources)


def expand_urls(paths: Union[str, Sequence[str]], allow_pipe: bool = False, allow_remote: bool = True,
                storage_options: Optional[Mapping] = None) -> List[str]:
    """Turn user input into an ordered list of shard URLs; raises ConfigError when none is found
    (a remote prefix or glob that lists nothing, a missing bucket: before any work)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [os.fspath(paths)]
    urls: List[str] = []
    for entry in paths:
        entry = os.fspath(entry)
        if "{" in entry:
            _check_brace_count(entry)
        for item in braceexpand.braceexpand(entry) if "{" in entry else [entry]:
            urls.extend(_expand_one(item, allow_pipe, allow_remote, storage_options))
    if not urls:
        raise ConfigError(f"no shards found in {list(paths)!r}; expected folders, globs, brace patterns "
                          f"or files ending in {', '.join(SHARD_SUFFIXES)}")
    return urls


def unique_urls(urls: Sequence[str]):
    """(urls without repeats, in order; the repeats). Local paths are compared by their real path,
    so `x.tar`, `./x.tar`, `file:x.tar` and a folder that holds it are one shard. Training may list
    a shard twice on purpose (to upsample it); scoring must not: two readers of one shard would
    write its outputs twice."""
    seen, unique, repeats = set(), [], []
    for url in urls:
        ident = os.path.realpath(local_path(url)) if is_local(url) else url
        if ident in seen:
            repeats.append(url)
        else:
            seen.add(ident)
            unique.append(url)
    return unique, repeats


def _check_brace_count(pattern: str) -> None:
    try:
        n = brace_count(pattern)
    except braceexpand.UnbalancedBracesError as e:
        raise ConfigError(f"{pattern!r}: {e}") from None
    if n > MAX_BRACE_URLS:
        raise ConfigError(f"brace pattern {pattern!r} names {n:,} shards (more than {MAX_BRACE_URLS:,}); "
                          f"check the range, e.g. shards-{{000000..000099}}.tar")


def brace_count(pattern: str) -> int:
    """How many names braceexpand would make of `pattern`, counted without making them (its own
    grammar: ranges {a..b..step}, sequences {x,y}, nesting, backslash escapes)."""
    total, start = 1, 0
    tokens, depth = _brace_tokens(pattern)
    if depth != 0:
        raise braceexpand.UnbalancedBracesError(f"Unbalanced braces: '{pattern}'")
    for pos, c, level in tokens:
        if level == 0 and c == "{":
            start = pos
        elif level == 0 and c == "}":
            expr = pattern[start + 1:pos]
            n = _expression_count(expr)
            total *= brace_count(expr) if n is None else n
    return total


def _expression_count(expr: str):
    m = braceexpand.int_range_re.match(expr)
    if m:
        a, b, step = int(m.group(1)), int(m.group(2)), abs(int(m.group(3) or 1)) or 1
        return abs(b - a) // step + 1
    m = braceexpand.char_range_re.match(expr)
    if m:
        alphabet = braceexpand.alphabet
        a, b, step = alphabet.index(m.group(1)), alphabet.index(m.group(2)), abs(int(m.group(3) or 1)) or 1
        return abs(b - a) // step + 1
    tokens, depth = _brace_tokens(expr)
    commas = [pos for pos, c, level in tokens if c == "," and level == 0]
    if depth != 0 or not commas:
        return None  # not a sequence: braceexpand keeps the braces and expands inside
    bounds = [-1] + commas + [len(expr)]
    return sum(brace_count(expr[a + 1:b]) for a, b in zip(bounds, bounds[1:]))


def _brace_tokens(text: str) -> Tuple[List[Tuple[int, str, int]], int]:
    """Each unescaped brace and comma of `text` as (position, character, nesting level outside it:
    0 for a top-level pair and its commas), and the nesting left open at the end (0 when balanced)."""
    tokens, pos, depth = [], 0, 0
    while pos < len(text):
        c = text[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "}":
            depth -= 1
        if c in "{},":
            tokens.append((pos, c, depth))
        if c == "{":
            depth += 1
        pos += 1
    return tokens, depth


def _on_disk(path: str) -> str:
    """A path found on disk, written so that it can never read as a URL: a file named
    `pipe:touch x;.tar` is a file, not a shell command."""
    if path.startswith(("pipe:", "file:")) or is_remote(path):
        return os.path.join(".", path)
    return path


def shown_url(url: str) -> str:
    """A shard as it may be shown or published: a remote URL without its user:password@ and query
    (remote.redact_url); a local path (whose name may hold a `?`) as it is."""
    if not is_remote(url):
        return url
    return redact_url(url)


def refuse_unreachable(urls: Sequence[str], cfg) -> None:
    """Before any work: when no shard can be opened, all for one reason of access (the store not
    reached, access refused or no credentials: remote_net.common_access_failure), one line instead
    of a report of N identical failures: ConfigError (exit 2) for access, RunError (exit 3) when
    the store could not be reached. cfg: the StageConfig."""
    if not cfg.allow_remote or not urls or not all(is_remote(u) for u in urls):
        return
    if not all(is_fsspec_url(u) for u in urls):
        return
    found = common_access_failure(urls, cfg.remote_options())
    if found is None:
        return
    kind, reason, n = found
    every = f"none of the {n} shard(s) could be opened" if n > 1 else "the shard could not be opened"
    example = f" (e.g. {shown_url(urls[0])})" if n > 1 else f": {shown_url(urls[0])}"
    if kind == "remote_unreachable":
        raise RunError(f"{every}{example}: cannot be reached: {reason}; check the URL or endpoint and the network")
    raise ConfigError(f"{every}{example}: {reason}")


def _expand_one(item: str, allow_pipe: bool, allow_remote: bool, storage_options=None) -> List[str]:
    if is_pipe(item) or is_remote(item):
        _check_allowed(item, allow_pipe, allow_remote)
        path = web_path(item)
        if path != item and path.endswith(SHARD_SUFFIXES) and not any(c in path for c in "*?["):
            return [item]  # a signed URL of one shard: its query's `?`, `*`, `[` are no glob
        if is_fsspec_url(item):
            return list_shards(item, SHARD_SUFFIXES, storage_options)
        return [item]
    item = local_path(item)
    if os.path.isdir(item):
        found = []
        for root, dirs, files in os.walk(item):
            dirs.sort()
            found.extend(_on_disk(os.path.join(root, f)) for f in sorted(files) if f.endswith(SHARD_SUFFIXES))
        return found
    if os.path.isfile(item):  # a file named "laion [part 1].tar" is that file, not a pattern
        return [item]
    if any(c in item for c in "*?["):
        return sorted(_on_disk(p) for p in glob.glob(item, recursive=True) if os.path.isfile(p))
    if not os.path.exists(item):
        raise ConfigError(f"shard {item!r} does not exist")
    return [item]


def open_shard(url: str, allow_pipe: bool = False, allow_remote: bool = True,
               idle_seconds: float = 0.0, remote=None, on_retry=None) -> IO[bytes]:
    """A binary stream of the shard. Local files are opened directly; s3://, gs://, hf://, http(s)://
    through remote.py (ranged reads resumed after a failure; `remote`: its RemoteOptions, `on_retry`
    told of each retry); pipe: commands through webdataset.
    idle_seconds: a pipe: command or remote read that sends nothing for that long while it is being
    read is killed (IdleGuard) or retried, so its shard fails instead of hanging the run; 0 = never."""
    _check_allowed(url, allow_pipe, allow_remote)
    if is_remote(url):
        if is_fsspec_url(url):
            options = remote or RemoteOptions()
            if options.idle_seconds != idle_seconds and remote is None:
                options = dataclasses.replace(options, idle_seconds=idle_seconds)
            return open_remote(url, options, on_retry)
    if is_pipe(url) or is_remote(url):
        from webdataset.gopen import gopen
        stream = gopen(url, "rb")
        if idle_seconds and getattr(stream, "proc", None) is not None:
            IdleGuard(stream, idle_seconds)
        return stream
    path = local_path(url)
    mode = os.stat(path).st_mode  # follows links
    if not stat.S_ISREG(mode):
        # Opening a FIFO blocks until a writer comes; /dev/zero never ends (its zeros read as the
        # end of a tar, and the padding after it is read to the end): both hung validate.
        what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise OSError(f"{path} is {what}, not a regular file; a shard is a tar file")
    return open(path, "rb", buffering=1 << 20)


class IdleGuard:
    """Kills a shard's command (and the processes it started) when one read of its output waits
    longer than `seconds`. Only time spent waiting inside a read counts: a consumer that is slow
    to ask for more (a long training step, a full queue) never trips it. The read then ends, the
    command's exit status (killed) fails the shard, and `stream.stalled` says why."""

    def __init__(self, stream, seconds: float):
        self.stream, self.seconds = stream, seconds
        self.waiting_since: Optional[float] = None
        stream.stalled = None
        read = stream.read

        def guarded_read(*args, **kw):
            self.waiting_since = time.monotonic()
            try:
                return read(*args, **kw)
            finally:
                self.waiting_since = None
        stream.read = guarded_read
        threading.Thread(target=self._watch, name="wdsfilter-idle-guard", daemon=True).start()

    def _watch(self) -> None:
        proc, step = self.stream.proc, min(1.0, self.seconds / 4)
        while proc.poll() is None:
            time.sleep(step)
            since = self.waiting_since
            if since is not None and time.monotonic() - since > self.seconds:
                self.stream.stalled = (f"it sent nothing for {self.seconds:g}s (stream_idle_seconds) and was "
                                       f"killed; check the command or URL")
                kill_command(proc)
                return


def _descendants(pid: int) -> List[int]:
    """The processes started by `pid`, however deep (a shell's pipeline)."""
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_command(proc) -> None:
    """Kill a shard's command and every process it started (a shell's pipeline, gsutil's workers).
    The command first (its children listed before): killed after its children, a shell's `wait`
    returns 0 and the shell could exit 0 before its own kill (under load it did), and the status
    then hid a stall."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def close_shard(stream) -> None:
    """Close a shard's stream; a pipe: command or download that exited non-zero raises OSError,
    whatever its status. webdataset lets 141 (killed by SIGPIPE) and curl's 23 (write error) pass:
    the statuses of a reader that stopped early. wdsfilter reads every shard to its end, so there
    they mean the command failed; and where it stopped early itself (at a broken tar), the shard
    was not read to its end either.
    Closed while Ctrl-C or SIGTERM (Terminated) unwinds, the command is killed first: closing
    waits for it to exit (for hours, webdataset's timeout), and a command left running (gsutil
    cat of a big object) outlived the run."""
    import sys
    proc = getattr(stream, "proc", None)
    if proc is not None and proc.poll() is None and isinstance(sys.exc_info()[1], (KeyboardInterrupt, Terminated)):
        kill_command(proc)
    stream.close()
    status = getattr(stream, "status", None)
    if status not in (None, 0):
        raise OSError(f"exit status {status}")
    if getattr(stream, "stalled", None):  # killed by IdleGuard, whatever status its kill left
        raise OSError(stream.stalled)
