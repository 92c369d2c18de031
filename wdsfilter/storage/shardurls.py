"""What a shard URL is, from its text alone: a local path (or `file:PATH`), a `pipe:` command or a
remote URL, and the shard's name. No I/O and no client: the run folder's readers (`wdsfilter
filter`) ask these without importing shards.py's openers (asyncio and the remote reader, a tenth
of a dry run's start: tools/bench_filter.py). shards.py re-exports every name."""
from __future__ import annotations

import os
from typing import Tuple

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
REMOTE_SCHEMES = ("http://", "https://", "s3://", "gs://", "gcs://", "hf://", "ais://")


def is_pipe(url: str) -> bool:
    return url.startswith("pipe:")


def is_remote(url: str) -> bool:
    return url.startswith(REMOTE_SCHEMES)


def is_local(url: str) -> bool:
    """A path on this machine (or file:PATH), not a pipe: command or a remote URL."""
    return not (is_pipe(url) or is_remote(url))


def web_path(url: str) -> str:
    """An http(s) URL without its query string (a presigned URL's signature): the part that names
    the object, where its shard suffix is, and the only part that could hold a glob. Other URLs
    and paths are returned as they are."""
    return url.split("?", 1)[0] if url.lower().startswith(("http://", "https://")) else url


def split_suffix(url: str) -> Tuple[str, str]:
    """'a/b/00.tar.gz' -> ('00', '.tar.gz'): the shard's file name and its shard suffix ('.tar'
    when it has none of SHARD_SUFFIXES). The stem names a shard's outputs (score file, marker,
    stats file, filtered copy)."""
    base = os.path.basename(web_path(url).rstrip("/"))
    for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
        if base.endswith(suffix):
            return base[: -len(suffix)], suffix
    return base, ".tar"


def shard_stem(url: str) -> str:
    return split_suffix(url)[0]


def local_path(url: str) -> str:
    """A local shard's path (without a `file:` prefix); pipe: and remote URLs are returned as is."""
    return url[len("file:"):] if url.startswith("file:") else url


def absolute_url(url: str) -> str:
    """A local shard as an absolute path (what a Ray worker elsewhere, or `wdsfilter filter` run
    from another folder, can open); pipe: and remote URLs unchanged."""
    return os.path.abspath(local_path(url)) if is_local(url) else url
