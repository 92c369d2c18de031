"""Shards in parallel: one process per job, each shard read once, results streamed to the parent.

Results are small (ShardResult holds no sample bytes), so the parent's memory does not grow with
shard size. A worker that dies (a decoder crashing on hostile bytes) does not lose the run: the
shards it took down are checked again one per fresh process, and a shard that still kills its
process is reported as unreadable.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, List, Optional, Sequence, Tuple

from ..core.errors import Terminated
from ..storage.shards import kill_command
from .findings import Finding
from .options import ValidateOptions
from .shard_check import ShardResult, check_shard
from ..storage.remote import SCHEMES, scheme_of


STRAGGLER_SECONDS = 30.0  # after Ctrl-C or SIGTERM, how long a worker may take to stop its shard


def run_checks(urls: Sequence[str], options: ValidateOptions) -> Iterator[Tuple[int, ShardResult]]:
    """(index in urls, result) as shards finish, in any order."""
    jobs = min(options.jobs or 1, len(urls))
    if jobs <= 1:
        for i, url in enumerate(urls):
            yield i, check_shard(url, options)
        return
    retry: List[int] = []
    pool = ProcessPoolExecutor(jobs, mp_context=pool_context(urls))
    futures: dict = {}
    try:
        for i, url in enumerate(urls):
            futures[pool.submit(check_shard, url, options)] = i
        for future in as_completed(futures):
            try:
                yield futures[future], future.result()
            except BrokenProcessPool:
                retry.append(futures[future])
    except BaseException as e:
        # Ctrl-C, SIGTERM or a caller that stopped reading: the shards still queued are never
        # started (leaving the pool's `with` waited for every one of them to be checked). Each
        # future is cancelled here: shutdown(cancel_futures=True) leaves that to the pool's
        # thread, which skips it once the pool object is gone (as it is when the error unwinds).
        for future in futures:
            future.cancel()
        processes = list((getattr(pool, "_processes", None) or {}).values())
        if isinstance(e, Terminated):
            # SIGTERM reached this process only: the workers are interrupted as by Ctrl-C, so each
            # stops its shard and kills the shard's command (shards.close_shard) before exiting
            # (the interpreter's exit waits for them).
            for process in processes:
                try:
                    os.kill(process.pid, signal.SIGINT)
                except OSError:
                    pass
        pool.shutdown(wait=False)
        if isinstance(e, (KeyboardInterrupt, Terminated)):
            _stop_stragglers(processes)
        raise
    pool.shutdown(wait=True)
    for i in sorted(retry):
        yield i, _isolated(urls[i], options)


def pool_context(urls: Sequence[str]):
    """The workers' start method, with what each of them would import first already imported: the
    shard check and, for remote shards, the client stack (fsspec and s3fs with aiobotocore, gcsfs,
    huggingface_hub or aiohttp: ~1 s of one core each for s3). Forked workers inherit this process's
    imports; a forkserver (Python 3.14's default) is given them to preload. Imported in each worker
    instead, they cost every worker that import again, in parallel on the cores the shards need, and
    this process once more for the sizes.json check after the pool. A client stack that will not
    import is left to the worker's own error (one line naming the shard and the install)."""
    context = multiprocessing.get_context()
    modules = [f"{__package__}.shard_check"] + client_modules(urls)
    method = context.get_start_method()
    if method == "forkserver":
        context.set_forkserver_preload(modules)
    elif method == "fork":
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    return context


def client_modules(urls: Sequence[str]) -> List[str]:
    """The modules that read these URLs' schemes (remote.SCHEMES), with fsspec; none for local shards."""
    modules = sorted({SCHEMES[scheme][0] for scheme in map(scheme_of, urls) if scheme in SCHEMES})
    return ["fsspec", *modules] if modules else []


def _stop_stragglers(processes, seconds: Optional[float] = None) -> None:
    """Workers still running STRAGGLER_SECONDS after an interrupt (one the interrupt did not stop:
    it came where the worker could not act on it, or the worker ignores it) are killed with the
    commands they started: the interpreter's exit would otherwise wait for them without end."""
    deadline = time.monotonic() + (STRAGGLER_SECONDS if seconds is None else seconds)
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            kill_command(process)


def _isolated(url: str, options: ValidateOptions) -> ShardResult:
    with ProcessPoolExecutor(1, mp_context=pool_context([url])) as pool:
        try:
            return pool.submit(check_shard, url, options).result()
        except BrokenProcessPool:
            result = ShardResult(url, error="the checking process died")
            result.add([Finding("unreadable_tar", url, "", "",
                                "reading this shard killed the checking process (a decoder crashed on its "
                                "bytes); training on it would crash the loader the same way. Re-create the shard")])
            return result
