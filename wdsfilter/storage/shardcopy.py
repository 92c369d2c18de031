"""Filtered shards: the kept samples of a shard, copied byte for byte from the source tar.

Nothing is re-encoded or re-serialised: once a shard's scores are complete, the source tar is
indexed (tarfile gives each member's header offset, long-name and pax headers included, and its
data offset) and the byte ranges of the members of kept keys are copied, headers included, into a
temporary file that is renamed into place. Bytes before the first member (a pax global header)
are kept too. A compressed shard (gzip, bz2, xz) is read through its decompressor, since the
offsets are in the tar inside it, and written in the same compression.

A source in an object store or on a web server (s3://, gs://, hf://, http(s)://) is streamed
twice, front to back, with the remote reader's bounded read-ahead: once to index its members,
once to copy them (`streamed_source`). No temporary copy, no whole shard in memory; both reads
must see one version of the object. A pipe: source is still copied to a temporary first (its
command is not run twice).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterable, Tuple

from .atomic import atomic_path
from .shards import close_shard, is_local, local_path, open_shard
from .decompress import compression, open_layers
from .tars import COPY_CHUNK, OPENERS, Forward, copy_range, member_ranges, tar_end, tar_opener
from .remote import is_fsspec_url, ObjectChanged, redact_url


def streams(url: str) -> bool:
    """Is `url` a source the writers stream (twice, front to back) rather than copy to a temporary?"""
    return is_fsspec_url(url)


@contextlib.contextmanager
def streamed_source(url: str, rekey: str, allow_remote: bool = True, idle_seconds: float = 0.0, remote=None,
                    exts: bool = False):
    """A remote source, read twice with bounded memory and no temporary file: the first read
    indexes its members, the second is yielded, decompressed and seekable forward, as
    (its compression or None, offset of the first member, member_ranges(exts=exts), stream). Both reads must
    see one version of the object: an index of one and the bytes of another are never mixed."""
    changed = (f"{redact_url(url)} changed between its two reads (its index, then its copy); its versions are never "
               f"mixed: write it again")
    first = open_shard(url, False, allow_remote, idle_seconds, remote=remote)
    try:
        kind = compression(first.peek(6)[:6])
        preamble_end, ranges = member_ranges(first, rekey, exts=exts)
        # a web server with no strong validator: both reads are read whole and their bytes compared
        version, digest = first.version, first.digest()
    finally:
        first.close()
    second = open_shard(url, False, allow_remote, idle_seconds, remote=remote)
    try:
        if second.version != version:
            raise ObjectChanged(changed)
        yield kind, preamble_end, ranges, Forward(open_layers(second, cap=1 << 62))
        if digest is not None and second.digest() != digest:
            raise ObjectChanged(changed)
    finally:
        second.close()


def local_copy(url: str, allow_pipe: bool, allow_remote: bool, folder: str, idle_seconds: float = 0.0,
                remote=None) -> str:
    # ".<...>.tmp-" like every temporary: a killed run's leftovers are removed by the next run.
    # Read again through the idle guard, as the first read was: a command that hangs is killed.
    # remote: the run's RemoteOptions (storage options, retries) for an s3://, gs://, hf:// source.
    fd, tmp = tempfile.mkstemp(prefix=".source.tmp-", suffix=".tar", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            src = open_shard(url, allow_pipe, allow_remote, idle_seconds, remote=remote)
            try:
                shutil.copyfileobj(src, out, 1 << 20)
            finally:
                try:
                    close_shard(src)
                except OSError as e:
                    stalled = getattr(src, "stalled", None)
                    raise OSError(f"{url}, read again: {stalled}" if stalled else f"{url}, read again: {e}") from None
    except BaseException:
        os.remove(tmp)
        raise
    return tmp


def write_filtered(url: str, keep: Iterable[str], dest: str, rekey: str = "first-dot",
                   allow_pipe: bool = False, allow_remote: bool = True, idle_seconds: float = 0.0,
                   remote=None) -> dict:
    """Write the members of kept keys of shard `url` to `dest` atomically; returns counts.
    idle_seconds: a pipe: command or download read again that sends nothing that long is killed;
    remote: the run's RemoteOptions for an s3://, gs://, hf:// source."""
    keep = set(keep)
    source, fetched = local_path(url), None
    if not is_local(url) and not streams(url):
        folder = os.path.dirname(os.path.abspath(dest))
        fetched = source = local_copy(url, allow_pipe, allow_remote, folder, idle_seconds, remote)
    try:
        with atomic_path(dest) as tmp:
            if streams(url):
                with streamed_source(url, rekey, allow_remote, idle_seconds, remote) as (kind, first, ranges, src), \
                        OPENERS.get(kind, open)(tmp, "wb") as out:
                    members, samples = _copy_ranges(src, out, first, ranges, keep)
            else:
                members, samples = _copy_kept(source, tmp, keep, rekey)
            if samples < len(keep):  # read again, the shard no longer holds every kept sample
                raise OSError(f"the shard, read again for its filtered copy, holds {samples} of its {len(keep)} kept "
                              f"sample(s): it changed (or was cut) since it was scored")
        return {"members": members, "samples": samples, "bytes": os.path.getsize(dest)}
    finally:
        if fetched and os.path.exists(fetched):
            os.remove(fetched)


def _copy_kept(source: str, dest: str, keep: set, rekey: str) -> Tuple[int, int]:
    """Copy the preamble and the members of kept keys; returns (members, samples) written."""
    preamble_end, ranges = member_ranges(source, rekey)
    opener = tar_opener(source)
    with opener(source, "rb") as src, opener(dest, "wb") as out:
        return _copy_ranges(src, out, preamble_end, ranges, keep)


def _copy_ranges(src, out, preamble_end: int, ranges, keep: set) -> Tuple[int, int]:
    """The preamble and the members of kept keys from `src` (read in tar order) to `out`."""
    members = samples = 0
    seen_keys = set()
    pos = 0
    written = 0
    if preamble_end:
        head = src.read(preamble_end)
        pos += len(head)
        if len(head) == preamble_end:
            out.write(head)
            written += len(head)
    last = len(ranges) - 1
    for i, (start, end, key) in enumerate(ranges):
        if key not in keep:
            continue
        if start > pos:  # skip what is not kept (a decompressor reads through it)
            src.seek(start)
            pos = start
        # Copied a chunk at a time: memory bounded whatever the member's size. A member the index
        # found another header after is whole (unless the source changed: EOFError, the write
        # fails); only the last one may be cut short, so it goes through a spooled copy that is
        # written out once its length is known: nothing half-copied reaches the shard.
        if i < last:
            try:
                pos += copy_range(src, start, end, out)
            except EOFError as e:
                raise OSError(f"the shard, read again for its filtered copy, ends inside the member at byte "
                              f"{start:,} ({e}): it changed since it was scored") from None
        else:
            with tempfile.SpooledTemporaryFile(max_size=4 * COPY_CHUNK) as held:
                try:
                    pos += copy_range(src, start, end, held)
                except EOFError:
                    break  # the shard ends inside this member: it was not kept by the reader either
                held.seek(0)
                shutil.copyfileobj(held, out, COPY_CHUNK)
        written += end - start
        members += 1
        if key not in seen_keys:
            seen_keys.add(key)
            samples += 1
    out.write(tar_end(written))
    return members, samples
