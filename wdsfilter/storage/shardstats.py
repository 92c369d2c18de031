"""The files that sit beside shards so that training tools accept the folder, for every command
that writes them (`wdsfilter filter --write-shards`, `wdsfilter score --write-shards`,
`wdsfilter validate --stats-dir`: its own stats content, this module's sizes.json):

    OUT/{stem}_stats.json   per shard (00000.tar -> 00000_stats.json, img2dataset's naming):
                            successes (samples, the field DataComp's resharder reads), members,
                            bytes, sources ({source shard: samples taken from it})
    OUT/sizes.json          {shard file name: samples}: open_clip's get_dataset_size sums it;
                            without it open_clip refuses the folder unless told the sample count

sizes.json is merged, never overwritten blindly: the entries given are set, the others kept (a
shard written again, say rescored by --resume, updates its own entry only). Shards may finish in
several processes at once (Ray tasks), so the read-merge-write holds an exclusive lock on the
folder; the file itself is replaced atomically, so a reader sees the old table or the new one.
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator, Optional

from ..core.errors import OutputError
from ..core.urls import redact_url
from .atomic import write_json
from .remote import read_object
from .shardurls import is_local, is_remote, local_path, shard_stem
from .writing import write_text_atomic

SIZES = "sizes.json"
STATS_SUFFIX = "_stats.json"


def stats_path(folder: str, shard_file: str) -> str:
    return os.path.join(folder, f"{shard_stem(shard_file)}{STATS_SUFFIX}")


def vouches_for_shards(name: str) -> bool:
    """A file that counts the shards beside it: a shard's `_stats.json`, `sizes.json` (a mirror
    uploads them after the shards)."""
    return name == SIZES or name.endswith(STATS_SUFFIX)


def write_stats_file(path: str, data: dict, storage_options=None) -> str:
    """The one writer of a `{stem}_stats.json` (the written shards', validate's): JSON, whole or
    not at all, in a local folder or as one object of an s3://, gs:// URL. Text that holds lone
    surrogates (member names that are not UTF-8) is escaped by the caller."""
    return write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n",
                             storage_options)


def write_shard_stats(folder: str, shard_file: str, samples: int, members: int, sources: Dict[str, int],
                      size: Optional[int] = None, fields: Optional[Dict[str, int]] = None) -> str:
    """Write `{stem}_stats.json` of the shard `folder/shard_file` (written and closed already).
    fields: {member extension: samples that have it} (filter's shards: the dataset card's features)."""
    path = os.path.join(folder, shard_file)
    return write_stats_file(stats_path(folder, shard_file),
                            {"successes": samples, "members": members,
                             "bytes": os.path.getsize(path) if size is None else size, "sources": sources,
                             **({"fields": fields} if fields is not None else {})})


@contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY)  # flock on the folder itself: no lock file left behind
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_sizes(folder: str, storage_options=None, seconds: Optional[float] = None) -> Dict[str, int]:
    """The table in `folder`/sizes.json, a local folder or an s3://, gs:// URL's; {} when there is
    none, it cannot be read or it is not a JSON object. The one reader of sizes.json (`seconds`:
    the remote read's bound, remote.read_object's)."""
    try:
        return _sizes_table(folder, storage_options, seconds)
    except OSError:
        return {}


def _sizes_table(folder: str, storage_options=None, seconds: Optional[float] = None) -> Dict[str, int]:
    """As read_sizes, but a sizes.json that is there and cannot be read (a store that does not
    answer, access denied) raises its OSError: a writer must not take it for none and put back
    only its own entries."""
    try:
        if is_remote(folder):
            raw = read_object(folder.rstrip("/") + "/" + SIZES, storage_options, seconds=seconds)
            data = json.loads(raw) if raw is not None else {}
        else:
            with open(os.path.join(folder, SIZES), "rb") as f:
                data = json.load(f)
    except FileNotFoundError:
        return {}
    except ValueError:  # not JSON: nothing in it to keep
        return {}
    return data if isinstance(data, dict) else {}


def _readable_sizes(folder: str, storage_options=None, seconds: Optional[float] = None) -> Dict[str, int]:
    try:
        return _sizes_table(folder, storage_options, seconds)
    except OSError as e:
        where = redact_url(folder.rstrip("/") + "/" + SIZES) if is_remote(folder) else os.path.join(folder, SIZES)
        raise OutputError(f"{where} could not be read ({e}); it is left as it was rather than replaced by this "
                          f"run's entries alone: check the store or the file's permissions and run again") from None


def sizes_samples(urls: Iterable[str]) -> Optional[int]:
    """The samples of local shards `urls` by the sizes.json beside them (open_clip's and
    img2dataset's table, written by validate --stats-dir and --write-shards), or None unless every
    shard is listed with a count (a whole number, not negative, as open_clip's int() reads it)."""
    tables: Dict[str, Dict[str, int]] = {}
    total = 0
    for url in urls:
        if not is_local(url):
            return None
        folder, name = os.path.split(os.path.abspath(local_path(url)))
        if folder not in tables:
            tables[folder] = read_sizes(folder)
        count = tables[folder].get(name)
        if isinstance(count, bool) or not isinstance(count, (int, str)):
            return None
        try:
            count = int(count)
        except ValueError:
            return None
        if count < 0:
            return None
        total += count
    return total


def update_sizes(folder: str, entries: Dict[str, Optional[int]], storage_options=None,
                 seconds: Optional[float] = None) -> Dict[str, int]:
    """Set `entries` ({shard file name: samples}) in `folder`/sizes.json, keeping the other
    entries (None: remove that entry); returns the whole table. The one writer of sizes.json.
    `folder` may be an s3://, gs:// URL: an object store has no folder lock, so the object is read,
    merged and put whole (the last writer wins). A sizes.json that is there and cannot be read is
    left as it is: an OutputError says so (merged with nothing, the other entries would be lost)."""
    if is_remote(folder):
        table = {k: v for k, v in {**_readable_sizes(folder, storage_options, seconds), **entries}.items()
                 if v is not None}
        write_stats_file(folder.rstrip("/") + "/" + SIZES, table, storage_options)
        return table
    with _folder_lock(folder):
        table = {k: v for k, v in {**_readable_sizes(folder), **entries}.items() if v is not None}
        write_json(os.path.join(folder, SIZES), dict(sorted(table.items())), fsync=True)
    return table
