"""Shards in parallel: one process per job, each shard read once, results streamed to the parent.

Results are small (ShardResult holds no sample bytes), so the parent's memory does not grow with
shard size. A worker that dies (a decoder crashing on hostile bytes) does not lose the run: the
shards it took down are checked again one per fresh process, and a shard that still kills its
process is reported as unreadable.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, List, Sequence, Tuple

from .findings import Finding
from .options import ValidateOptions
from .shard_check import ShardResult, check_shard


def run_checks(urls: Sequence[str], options: ValidateOptions) -> Iterator[Tuple[int, ShardResult]]:
    """(index in urls, result) as shards finish, in any order."""
    jobs = min(options.jobs or 1, len(urls))
    if jobs <= 1:
        for i, url in enumerate(urls):
            yield i, check_shard(url, options)
        return
    retry: List[int] = []
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context()) as pool:
        futures = {pool.submit(check_shard, url, options): i for i, url in enumerate(urls)}
        for future in as_completed(futures):
            try:
                yield futures[future], future.result()
            except BrokenProcessPool:
                retry.append(futures[future])
    for i in sorted(retry):
        yield i, _isolated(urls[i], options)


def _isolated(url: str, options: ValidateOptions) -> ShardResult:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context()) as pool:
        try:
            return pool.submit(check_shard, url, options).result()
        except BrokenProcessPool:
            result = ShardResult(url, error="the checking process died")
            result.add([Finding("unreadable_tar", url, "", "",
                                "reading this shard killed the checking process (a decoder crashed on its "
                                "bytes); training on it would crash the loader the same way. Re-create the shard")])
            return result
