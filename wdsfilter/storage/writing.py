"""Output files: checked before any work starts, and written whole or not at all.

check_output_file / check_output_dir raise OutputError (a usage error, exit 2) for an output that
cannot be written, so a long run never fails at its very end for a typo in --output.
atomic_path / write_text_atomic write a temporary file in the output's folder (named like
every temporary, `.<name>.tmp-<pid>`) and rename it over the output: a reader never sees half a
file, and a failed write leaves the previous file as it was.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Sequence

from . import atomic
from ..core.errors import ConfigError, OutputError
from .shardurls import is_local, local_path
from .remote import check_output_url, is_fsspec_url, write_object
from ..core.publish import redact_text


def _existing_parent(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return parent


def _probe(folder: str) -> Optional[str]:
    """Why no file can be created in `folder`, or None. A real file is created and removed:
    os.access answers yes for root in /proc or on a read-only mount, and the run then failed at
    its end (exit 3) instead of before any work. Named like every temporary, so a probe left by a
    kill at this instant is removed by the next run."""
    import tempfile
    try:
        fd, path = tempfile.mkstemp(prefix=".wdsfilter-probe.tmp-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    try:
        os.remove(path)
    except OSError:
        pass
    return None


def check_output_file(path: str, option: str, storage_options=None) -> None:
    """The file can be created or replaced (its folder is created when missing); an s3://, gs://
    URL: its bucket exists and can be listed (remote.check_output_url)."""
    if _is_url(path):
        return check_output_url(path, option, storage_options)
    if os.path.isdir(path):
        raise OutputError(f"{option} {path!r} is a folder; give a file name")
    if os.path.exists(path):
        try:  # opened for writing without a byte changed: the file itself must take writes
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError as e:
            raise OutputError(f"{option} {path!r} exists and is not writable ({e.strerror})") from None
    _check_parent(path, option, "write")


def check_output_dir(path: str, option: str, storage_options=None) -> None:
    """The folder exists and is writable, or can be created (a URL: as check_output_file)."""
    if _is_url(path):
        return check_output_url(path, option, storage_options)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise OutputError(f"{option} {path!r} is a file, not a folder")
        why = _probe(path)
        if why:
            raise OutputError(f"{option} {path!r} is not writable ({why})")
        return
    _check_parent(path, option, "create it")


def _check_parent(path: str, option: str, doing: str) -> None:
    """The nearest existing folder above `path` takes new files (`doing` says what for)."""
    parent = _existing_parent(path)
    if not os.path.isdir(parent):
        raise OutputError(f"{option} {path!r}: {parent!r} is a file, not a folder")
    why = _probe(parent)
    if why:
        raise OutputError(f"{option} {path!r}: cannot {doing} in {parent!r} ({why})")


def refuse_writing_into_inputs(write_shards: Optional[str], urls: Sequence[str]) -> None:
    """--write-shards into a folder that holds input shards (of `score`, or the sources of the score
    folder `filter` reads) would replace or delete input shards named like the written ones: the
    dropped samples gone for good, its img2dataset stats overwritten. Refused before anything is
    read or written."""
    if not write_shards:
        return
    target = os.path.realpath(write_shards)
    for url in urls:
        if is_local(url) and os.path.dirname(os.path.realpath(local_path(url))) == target:
            raise ConfigError(f"--write-shards {write_shards} is the folder of the input shard {url}: the filtered "
                              f"shards could overwrite the shards they are read from. Write them to another folder")


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temporary path in path's folder; renamed to path when the block succeeds,
    removed when it raises."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic.atomic_path(path) as tmp:  # the one tmp-then-rename write (atomic.py)
        yield tmp


def _is_url(path: str) -> bool:
    return is_fsspec_url(path)


def write_text_atomic(path: str, text: str, storage_options=None) -> str:
    """Write UTF-8 text whole or not at all (an s3://, gs:// URL: one object, remote.write_object).
    Text that holds lone surrogates (member names that are not UTF-8, decoded with
    surrogateescape) must be escaped before it gets here. Every URL in it is written without its
    secrets (publish.redact_text): reports, stats files, run.yaml."""
    data = redact_text(text).encode("utf-8")  # fails before the temporary exists, never half-way through it
    if _is_url(path):
        return write_object(path, data, storage_options)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


