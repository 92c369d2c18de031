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
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import Terminated
from ..storage.shards import kill_command
from .findings import Finding
from .options import ValidateOptions
from .shard_check import ShardResult, check_shard
from ..storage import remote_s3
from ..storage.remote import SCHEMES, scheme_of
from ..storage.remote_options import RemoteOptions


STRAGGLER_SECONDS = 30.0  # after Ctrl-C or SIGTERM, how long a worker may take to stop its shard


def run_checks(urls: Sequence[str], options: ValidateOptions) -> Iterator[Tuple[int, ShardResult]]:
    """(index in urls, result) as shards finish, in any order."""
    jobs = min(options.jobs or 1, len(urls))
    if jobs <= 1:
        for i, url in enumerate(urls):
            yield i, check_shard(url, options)
        return
    retry: List[int] = []
    pool = ProcessPoolExecutor(jobs, mp_context=pool_context(urls, options.stage.remote_options()))
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


def pool_context(urls: Sequence[str], remote: Optional[RemoteOptions] = None):
    """The workers' start method, with what each of them would import first already imported: the
    shard check and, for remote shards, the client stack (botocore for S3 where storage/remote_s3.py
    reads it, else fsspec and s3fs with aiobotocore, gcsfs, huggingface_hub or aiohttp: ~1 s of one
    core each for s3fs). Forked workers inherit this process's imports, and remote_s3's botocore
    clients, made here (their connections not: remote_s3); a forkserver (Python 3.14's default) is
    given the imports to preload. Imported in each worker
    instead, they cost every worker that import again, in parallel on the cores the shards need, and
    this process once more for the sizes.json check after the pool. A client stack that will not
    import is left to the worker's own error (one line naming the shard and the install)."""
    context = multiprocessing.get_context()
    storage_options = remote.storage_options if remote is not None else None
    modules = [f"{__package__}.shard_check"] + client_modules(urls, storage_options)
    method = context.get_start_method()
    if method == "forkserver":
        context.set_forkserver_preload(modules)
    elif method == "fork":
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass
        remote_s3.warm(urls, storage_options, (remote or RemoteOptions()).answer_seconds)
    return context


def client_modules(urls: Sequence[str], storage_options: Optional[Mapping] = None) -> List[str]:
    """The modules that read these URLs: botocore for S3 objects remote_s3 reads, else their
    scheme's (remote.SCHEMES) with fsspec; none for local shards."""
    direct = sorted({"botocore.session" for url in urls if remote_s3.serves(url, storage_options)})
    modules = sorted({SCHEMES[scheme_of(url)][0] for url in urls
                      if scheme_of(url) in SCHEMES and not remote_s3.serves(url, storage_options)})
    return direct + (["fsspec", *modules] if modules else [])


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
    with ProcessPoolExecutor(1, mp_context=pool_context([url], options.stage.remote_options())) as pool:
        try:
            return pool.submit(check_shard, url, options).result()
        except BrokenProcessPool:
            result = ShardResult(url, error="the checking process died")
            result.add([Finding("unreadable_tar", url, "", "",
                                "reading this shard killed the checking process (a decoder crashed on its "
                                "bytes); training on it would crash the loader the same way. Re-create the shard")])
            return result
