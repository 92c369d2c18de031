"""Faults of a scoring run, sorted once: which ones cost a sample, which ones stop a model worker
or the run, and the one-line messages they give.

    a shard not read to its end      the shard fails: no outputs, no marker; --resume reads it again
    out of memory (CUDA, host, cuBLAS/cuDNN allocation)   the back-off halves the batch
    a sticky device error            the model worker stops; the run fails (exit 3); unfinished
                                     shards get no marker, so --resume scores them again
    a full disk (ENOSPC, EDQUOT)     the run stops at once (exit 3); nothing half-written is marked
                                     done; --resume after freeing space completes it
    a decode worker that dies        the same (exit 3), in one line naming it

Sticky errors are the ones after which the CUDA context is unusable (every later kernel fails
the same way, so scoring on would turn every later sample into a `failed` row and mark the shards
done): those the CUDA runtime documents so (illegal address, device-side assert, launch failure
and launch timeout, illegal instruction, misaligned address, invalid program counter, address
space, uncorrectable ECC or NVLink error), a GPU that fell off the bus, CUDA's "unknown error"
(usually a hardware fault, an Xid in the kernel log), and the cuBLAS /
cuDNN status errors that PyTorch raises when a kernel launch failed. Their allocation failures
are not sticky: they are out-of-memory and go to the back-off.
"""
from __future__ import annotations

import errno
import re
import time
from typing import Optional

from ..core.errors import RunError


class RunFailedError(RunError):
    """The run cannot go on (a dead device, a full disk). Exit code 3; --resume continues it."""


class DeviceFailedError(RunFailedError):
    """A model worker's device is in an unusable state (a sticky CUDA error)."""


class DiskFullError(RunFailedError):
    """An output could not be written for lack of space."""


# Allocation failures reported by cuBLAS/cuDNN (and PyTorch's wording of them): out of memory.
_ALLOC_FAILED = re.compile(r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|NOT_ENOUGH_WORKSPACE|"
                           r"CUDNN_STATUS_INTERNAL_ERROR.*(?:memory|workspace)|"
                           r"cudnn.*(?:failed to allocate|insufficient workspace)", re.IGNORECASE)
# After these the CUDA context is broken for good (CUDA's own "sticky" errors, and the library
# status errors of a failed launch).
_STICKY = re.compile(r"illegal memory access|device-side assert|fallen off the bus|unspecified launch failure|"
                     r"misaligned address|illegal instruction|uncorrectable ECC error|uncorrectable NVLink error|"
                     r"launch timed out and was terminated|invalid program counter|"
                     r"not supported on global/shared address space|CUDA error: unknown error|"
                     r"CUDA error: (?:an? )?(?:illegal|unspecified|launch failure|hardware stack error)|"
                     r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|cuDNN error", re.IGNORECASE)


def is_alloc_failure(exc: BaseException) -> bool:
    """A cuBLAS/cuDNN allocation failure: memory ran out inside the library."""
    return isinstance(exc, RuntimeError) and bool(_ALLOC_FAILED.search(str(exc)))


def sticky_device_error(exc: BaseException) -> Optional[str]:
    """The message of a sticky device error, else None (out-of-memory is never sticky)."""
    if not isinstance(exc, RuntimeError) or is_alloc_failure(exc) or "out of memory" in str(exc).lower():
        return None
    text = str(exc)
    match = _STICKY.search(text)
    if match is None:
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{type(exc).__name__}: {first[:300]}"


def device_failed(device: str, message: str) -> DeviceFailedError:
    return DeviceFailedError(
        f"the device {device} failed with a sticky error ({message}); its model worker stopped. Shards it "
        f"had not finished have no marker: fix or swap the device, then run again with --resume")


def decode_worker_died(exc: BaseException) -> Optional[RunFailedError]:
    """The run's error for a DataLoader decode worker that died (PyTorch raises a RuntimeError
    naming its pid; the host's OOM killer is the usual cause), else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "DataLoader worker" not in text:
        return None
    # torch's words: "DataLoader worker (pid 123) exited unexpectedly with exit code 137. Details
    # are lost ..." or "... (pid 123) is killed by signal: Killed."; the advice after it is not ours.
    found = re.search(r"\(pids?\(?s?\)? ([^)]*)\) (exited unexpectedly with exit code -?\d+|is killed by signal: [^.]*)", text)
    what = f"pid {found.group(1)} {found.group(2).replace('exited unexpectedly', 'exited')}" if found else text.split(". ")[0]
    return _decode_worker_failure(what)


def dead_decode_worker(workers, error: BaseException) -> Optional[RunFailedError]:
    """The run's error when one of these decode worker processes has died: a chunk it was sending
    is cut (the main process reads an EOF or a reset connection), and that is what explains it.
    After such a cut the worker may still be exiting: it is given a few seconds to be seen dead."""
    deadline = time.monotonic() + (5.0 if isinstance(error, (EOFError, ConnectionError)) else 0.0)
    while True:
        for w in workers:
            if w.exitcode not in (None, 0):
                return _decode_worker_failure(f"pid {w.pid} exited with exit code {w.exitcode}")
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _decode_worker_failure(what: str) -> RunFailedError:
    return RunFailedError(f"a decode worker died ({what}; out of host memory?). Shards it had not finished "
                          f"have no marker: run again with --resume")


def is_disk_full(exc: BaseException) -> bool:
    if not isinstance(exc, OSError):
        return False
    # pyarrow's write errors carry the errno in their text only
    return exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(exc) \
        or "Disk quota exceeded" in str(exc)


def disk_full(exc: OSError, what: str) -> DiskFullError:
    where = f" ({exc.filename})" if exc.filename else ""
    return DiskFullError(f"no space left on the device writing {what}{where}. Nothing incomplete was marked "
                         f"done and no temporary file is left; free space, then run again with --resume")


def read_failed_reason(message: str) -> str:
    """The summary's reason for a shard that was not read to its end."""
    return f"not read to its end ({message}); no marker: --resume reads it again"
