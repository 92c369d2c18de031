"""The remote shard reader: one object streamed with a bounded read-ahead, resumed at the byte
reached after a failure, never two versions spliced (see remote.py for the URLs, options and
credentials, docs/remote.md for the behaviour)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import random
import threading
import time
from collections import deque
from typing import Callable, Mapping, Optional, Sequence, Tuple

from .remote import (RemoteOptions, credential_source, filesystem, is_fsspec_url, missing_credentials, no_credentials,
                     scheme_of)
from .remote_errors import (MAX_RETRY_AFTER, ObjectChanged, RangeIgnored, RemoteReadError, classify, describe,
                            status_of, strip_text)
from .remote_net import check_reachable, endpoint_host, reach_failure, access_reason
from .remote_pace import NOTHING, Pace, SlowRead
from . import remote_s3
from .remote_version import Identity, Prefix
from ..core.urls import redact_url


def open_remote(url: str, options: Optional[RemoteOptions] = None,
                on_retry: Optional[Callable[[str], None]] = None) -> "RemoteShard":
    """A binary stream of a remote shard. A missing or forbidden object raises FileNotFoundError
    or PermissionError (naming the credential source); a missing extra raises ConfigError."""
    options = options or RemoteOptions()
    if remote_s3.serves(url, options.storage_options):  # botocore itself: no asyncio stack (remote_s3.py)
        fs, path = remote_s3.Objects(options.storage_options, options.answer_seconds), url
    else:
        fs, path = filesystem(url, options.storage_options)
    # a host with no address, or that refuses or ignores a connection, fails at once
    check_reachable(url, redact_url(url), options.storage_options, options.answer_seconds)
    return RemoteShard(url, fs, path, options, on_retry)


def common_access_failure(urls: Sequence[str], options) -> Optional[Tuple[str, str, int]]:
    """(kind, reason, shards) when no remote shard of `urls` can be opened, all for one reason of
    access (access_reason), else None. Each shard is opened (a HEAD) until one opens or fails
    otherwise: one request when the first opens. Shards behind a host already found unreachable
    are not asked again (an unanswered host would cost the answer timeout each time)."""
    if not urls or not all(is_fsspec_url(u) for u in urls):
        return None
    common, dead_hosts = None, set()
    for url in urls:
        host = endpoint_host(url, options.storage_options)
        if common is not None and common[0] == "remote_unreachable" and host in dead_hosts:
            continue
        try:
            open_remote(url, options).close()
            return None
        except Exception as e:  # noqa: BLE001 - sorted by access_reason
            reason = access_reason(e, url)
        if reason is None or (common is not None and reason != common):
            return None
        common = reason
        dead_hosts.add(host)
    return (*common, len(urls))


def _version(info: Mapping) -> Tuple:
    """What identifies one version of an object in each store's `info()`."""
    for name in ("ETag", "etag", "generation", "VersionId", "blob_id", "Last-Modified"):
        if info.get(name):
            return (info.get("size"), name, str(info[name]))
    lfs = info.get("lfs") or {}
    return (info.get("size"), "sha256", lfs.get("sha256")) if lfs.get("sha256") else (info.get("size"),)


def _getter(url: str, fs, options: RemoteOptions):
    """The filesystem that sends an S3 shard's GETs: one whose botocore and s3fs retries are off,
    because RemoteShard retries them itself (resumed at the byte reached, counted in
    remote_retries, Retry-After honoured); botocore would retry a 503 or a 429 unseen, from the
    start of its range, ignoring Retry-After. Listing and HEAD keep the store's own retries."""
    if scheme_of(url) != "s3" or isinstance(fs, remote_s3.Objects):  # Objects' reads are sent without retries
        return fs
    storage = dict(options.storage_options)
    storage["config_kwargs"] = dict(storage.get("config_kwargs") or {}, retries={"total_max_attempts": 1})
    getter = filesystem(url, storage)[0]  # fsspec's instance for these options: the reads' own
    getter.retries = 1  # s3fs's loop (a class attribute, not an option)
    return getter


class RemoteShard:
    """A read-only stream of one remote object: ranged reads, `readahead` in flight, retried in place."""

    def __init__(self, url: str, fs, path: str, options: RemoteOptions, on_retry=None):
        self.url, self.fs, self.path, self.options = url, fs, path, options
        self.shown = redact_url(url)
        self.on_retry = on_retry
        self.retries = 0
        self.closed = False
        self.pace = Pace(options.speed_limit, options.speed_seconds, options.idle_seconds)
        info = self._info(refresh=False)
        self.size = info.get("size")
        # A web server that gives no size cannot be read in ranges: one plain stream, not resumed
        # (a failure fails the shard; its end cannot be told from a transfer cut short).
        self._stream = fs.open(path, "rb", block_size=0) if self.size is None else None
        self.version = _version(info)
        self.etag = info.get("ETag") or info.get("etag")
        # gs://: each ranged read asks for this generation (`generation=`), and is sent by us (_gcs_range)
        self.generation = info.get("generation") if scheme_of(url) in ("gs", "gcs") else None
        # hf://: each ranged read is our own GET of the file's resolve URL (_hf_range)
        self.hf_url = fs.url(path) if scheme_of(url) == "hf" else None
        self.kind = "s3" if scheme_of(url) == "s3" else "http" if scheme_of(url) in ("http", "https") else "other"
        # http(s): every response is checked to be of the version opened (remote_version.py); with
        # no strong validator, a read is resumed from byte 0, the bytes already read compared.
        self.identity = Identity(self.shown, info) if self.kind == "http" else None
        self.prefix = Prefix(self.shown) if self.kind == "http" else None
        self.get_fs = _getter(url, fs, options)
        # S3 and HTTP: one GET from the byte reached to the end, its body handed over in chunks
        # through a bounded queue (readahead * block_bytes); after a failure, a new GET from the
        # byte reached. Others (gs://, hf://): ranged reads of block_bytes, readahead in flight.
        self._feed = None  # a _Feed, or a _ThreadFeed (remote_s3)
        self.pos = 0              # bytes handed to the reader
        self._next = 0            # first byte not yet asked for
        self._pending: deque = deque()  # [start, end, future]
        self._block = b""
        self._offset = 0          # position inside _block
        self._failures = 0        # failed reads in a row
        self._spent = 0           # failed reads of this object in all (retry_budget)

    @property
    def proven(self) -> bool:
        """Whether every read is tied to the version opened by a validator the store checks (an
        ETag, a generation): False for a web server without a strong validator, whose reads are
        proven by reading again from byte 0 (and which cannot jump back)."""
        return self.identity is None or self.identity.proven

    def digest(self) -> Optional[str]:
        """The SHA-256 of the whole object, read here from byte 0 to its end (the rest is read
        through first); None where it is not tracked (a proven store: its version says it)."""
        if self.prefix is None or self.proven:
            return None
        while self.read(1 << 20):
            pass
        if self.prefix.end != self.size:
            raise RemoteReadError(f"{self.shown}: read to its end, {self.prefix.end:,} of {self.size:,} bytes in one "
                                  f"run from byte 0; its version cannot be told")
        return self.prefix.digest()

    # -- the stream interface tar readers use ------------------------------------------------
    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        start = self._offset
        if 0 < n <= len(self._block) - start:  # inside the chunk in hand: a tar reader's every header and member
            self._offset = start + n
            self.pos += n
            return self._block[start:start + n]
        if self.closed:
            raise ValueError("read of a closed shard stream")
        if self._stream is not None:
            try:
                data = self._stream.read(-1 if n is None else n)
            except Exception as e:  # noqa: BLE001 - any failure of the plain stream fails the shard
                raise RemoteReadError(f"{self.shown}: {describe(e)} at byte {self.pos:,} (the server gives no size, so "
                              f"the read cannot resume)") from None
            self.pos += len(data)
            return data
        if n is None or n < 0:
            n = self.size - self.pos
        parts = []
        while n > 0:
            if self._offset >= len(self._block):
                if self.pos >= self.size:
                    break
                self._block, self._offset = (self._next_chunk() if self.kind != "other" else self._next_block()), 0
                if not self._block:
                    break
            take = self._block[self._offset:self._offset + n]
            self._offset += len(take)
            self.pos += len(take)
            n -= len(take)
            parts.append(take)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def peek(self, n: int = 1) -> bytes:
        """Bytes ahead without consuming them (at least one unless at the end): the compression
        sniffing reads the first bytes this way."""
        if self._stream is None and self._offset >= len(self._block) and self.pos < self.size:
            self._block, self._offset = (self._next_chunk() if self.kind != "other" else self._next_block()), 0
        if self._stream is not None:
            return b""
        return self._block[self._offset:self._offset + max(n, 1)]

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        """Moves the read position (sort-shard copies members in key order): inside the chunk in
        hand for free; elsewhere the next read asks from there (a new GET, or ranged blocks)."""
        if self._stream is None and whence in (0, 1, 2):
            target = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        else:
            raise OSError(f"{self.shown}: cannot seek (the server gives no size)")
        if not 0 <= target <= self.size:
            raise ValueError(f"seek to {target:,} outside {self.shown} ({self.size:,} bytes)")
        ahead = target - self.pos
        if 0 <= ahead <= len(self._block) - self._offset:
            self._offset += ahead
            self.pos = target
            return target
        if not self.proven:  # no validator to tie a jump to: forward by reading through, never back
            if ahead < 0:
                raise OSError(f"{self.shown}: cannot go back to byte {target:,} (the server gives no validator to "
                              f"tie a new read to the version read so far)")
            while self.pos < target and self.read(min(target - self.pos, 1 << 20)):
                pass
            return self.pos
        self._drop_feed()
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()
        self._block, self._offset = b"", 0
        self.pos = self._next = target
        return target

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._feed is not None:
                self._feed.cancel()
                self._feed = None
            for _, _, fut in self._pending:
                fut.cancel()
            self._pending.clear()
            self._block = b""
            if self._stream is not None:
                self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one streaming GET, resumed at the byte reached ------------------------------------------
    def _next_chunk(self) -> bytes:
        while True:
            if self._feed is None:
                self._feed = self._open_feed()
            try:
                item = self.pace.wait(self._feed.get)
            except SlowRead as e:
                self._drop_feed()
                self._failed(self.pos, e)
                continue
            if item is _END:
                if self.pos >= self.size:
                    return b""
                self._drop_feed()  # a short read: the answer ended before the object did
                self._failed(self.pos, OSError(f"short read: the answer ended at byte {self.pos:,} of {self.size:,}"))
                continue
            if isinstance(item, BaseException):
                self._drop_feed()
                self._stream_failed(item)
                continue
            if self.pos + len(item) > self.size:
                item = item[:self.size - self.pos]  # never past the size the shard was opened at
            if self.prefix is not None:
                self.prefix.add(self.pos, item)
            self._failures = 0
            return item

    def _open_feed(self):
        """A streaming GET from the byte reached (an S3 or web object). A web object whose first
        answer gave no strong validator is asked again from byte 0: the bytes already read must
        come again (remote_version.Prefix) before the rest is handed over."""
        chunk_bytes = min(self.options.block_bytes, 1 << 20)
        depth = max(1, self.options.block_bytes * self.options.readahead // chunk_bytes)
        self.pace.restart()
        if isinstance(self.get_fs, remote_s3.Objects):
            return _ThreadFeed(self.get_fs.stream(self.path, self.pos, self.etag, chunk_bytes, self.pace.add), depth)
        if self.kind == "s3":
            chunks = _s3_stream(self.get_fs, self.path, self.pos, self.etag, chunk_bytes, self.pace.add)
        else:
            again = self.prefix.checker() if self.pos and not self.proven else None
            if again is not None and again.end != self.pos:
                raise RemoteReadError(f"{self.shown}: cannot resume at byte {self.pos:,}: the server gives no "
                                      f"validator, and the bytes before it were not all read here")
            chunks = _http_stream(self.get_fs, self.path, self.pos, self.identity, self.pace.add, again)
        return _Feed(self.get_fs.loop, chunks, depth)

    def _stream_failed(self, item: BaseException) -> None:
        """A failure the streaming GET handed over: the shard fails (the object changed, it is
        gone or forbidden, an error not worth a retry), or the read is asked again."""
        if isinstance(item, ObjectChanged):
            raise ObjectChanged(str(item)) from None
        if classify(item)[0]:
            raise ObjectChanged(f"{self.shown} changed while it was read (at byte {self.pos:,} of "
                                f"{self.size:,}: its ETag is no longer {self.etag}); its versions are never "
                                f"mixed: read it again") from None
        if isinstance(item, (FileNotFoundError, PermissionError)):
            raise RemoteReadError(f"{self.shown}: {describe(item)} at byte {self.pos:,}") from None
        changed, retryable, wait = classify(item)
        if not retryable:
            raise RemoteReadError(f"{self.shown}: {describe(item)} at byte {self.pos:,} of {self.size:,}") from None
        self._failed(self.pos, item, wait)

    def _drop_feed(self) -> None:
        if self._feed is not None:
            self._feed.cancel()
            self._feed = None

    # -- blocks --------------------------------------------------------------------------------
    def _fill(self) -> None:
        while len(self._pending) < self.options.readahead and self._next < self.size:
            start, end = self._next, min(self._next + self.options.block_bytes, self.size)
            self._pending.append([start, end, self._submit(start, end)])
            self._next = end

    def _next_block(self) -> bytes:
        while True:
            self._fill()
            start, end, fut = self._pending[0]
            try:
                data = self.pace.wait(Pace.result_of(fut))
                if not data:
                    raise OSError(f"short read: no bytes for {start}-{end - 1}")
            except SlowRead as e:
                fut.cancel()
                self._failed(start, e)
                self.pace.restart()
                self._pending[0][2] = self._submit(start, end)
                continue
            except ObjectChanged:
                raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,} of {self.size:,}: "
                                    f"its ETag is no longer {self.etag}); its versions are never mixed: read it "
                                    f"again") from None
            except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                raise RemoteReadError(f"{self.shown}: {describe(e)} at byte {start:,}") from None
            except Exception as e:  # noqa: BLE001 - sorted by _retryable; the rest fails the shard
                changed, retryable, wait = classify(e)
                if changed:
                    raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,} of "
                                        f"{self.size:,}); its versions are never mixed: read it again") from None
                if not retryable:
                    raise RemoteReadError(f"{self.shown}: {describe(e)} at byte {start:,} of {self.size:,}") from None
                self._failed(start, e, wait)
                self.pace.restart()
                self._pending[0][2] = self._submit(start, end)
                continue
            self._pending.popleft()
            if len(data) < end - start:  # a short read: keep what came, ask for the rest first
                self._pending.appendleft([start + len(data), end, self._submit(start + len(data), end)])
            self._failures = 0
            if not self._pending and self._next >= self.size and self.kind == "other":
                self._check_version()
            return data

    def _failed(self, start: int, error: BaseException, retry_after: Optional[float] = None) -> None:
        """One failed read: the shard fails after `attempts` in a row, or once the object has used
        its retry budget (bytes received do not renew it: a server that sends a byte then resets
        cannot keep a read going); else wait and go on (the caller asks again from `start`)."""
        self._failures += 1
        self._spent += 1
        what = str(error) if isinstance(error, SlowRead) else describe(error)
        where = f"at byte {start:,} of {self.size:,}; {self.pace.seen()}"
        if self._failures >= self.options.attempts:
            raise RemoteReadError(f"{self.shown}: gave up after {self._failures} failed reads in a row "
                                  f"(remote_attempts) {where}; last error: {what}")
        if self._spent > self.options.retry_budget:
            raise RemoteReadError(f"{self.shown}: gave up after {self._spent} failed reads of this object "
                                  f"(--remote-retry-budget {self.options.retry_budget}: retries in all, which bytes "
                                  f"received do not renew) {where}; last error: {what}")
        delay = min(self.options.max_backoff_seconds, self.options.backoff_seconds * 2 ** (self._failures - 1))
        delay *= random.uniform(0.5, 1.0)  # jitter: many readers do not come back at once
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
        self.retries += 1
        if self.on_retry is not None:
            self.on_retry(f"{self.shown}: {what} at byte {start:,}; retry {self._spent} of {self.options.retry_budget} "
                          f"({self._failures} in a row, at most {self.options.attempts - 1}) in {delay:.2f}s")
        time.sleep(delay)
        self._check_version()

    def _check_version(self) -> None:
        try:
            info = self._info(refresh=True)
        except FileNotFoundError:
            raise ObjectChanged(f"{self.shown} was deleted while it was read") from None
        except OSError:
            return  # the store is still failing: the next read says so
        if _version(info) != self.version:
            raise ObjectChanged(f"{self.shown} changed while it was read (size or version differs: "
                                f"{self.version[0]} -> {info.get('size')} bytes); its versions are never "
                                f"mixed: read it again")

    def _info(self, refresh: bool) -> dict:
        try:
            if refresh:
                self.fs.invalidate_cache(self.path)
            return _bounded_info(self.fs, self.path, self.options.answer_seconds)
        except Exception as e:  # noqa: BLE001 - sorted: unreachable, missing, forbidden, other
            raise _open_failure(e, self.url, self.shown, self.options.storage_options) from None

    def _submit(self, start: int, end: int) -> concurrent.futures.Future:
        loop, count = getattr(self.fs, "loop", None), self.pace.add
        if self.generation is not None:
            return asyncio.run_coroutine_threadsafe(_gcs_range(self.fs, self.path, start, end, self.generation, count),
                                                    loop)
        if getattr(self.fs, "async_impl", False) and loop is not None:
            return asyncio.run_coroutine_threadsafe(_counted(self.fs._cat_file(self.path, start=start, end=end), count),
                                                    loop)
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():  # a synchronous filesystem (hf://): one daemon thread per ranged read
            if not fut.set_running_or_notify_cancel():
                return
            try:
                if self.hf_url:
                    fut.set_result(_hf_range(self.fs, self.hf_url, start, end, count))
                else:
                    data = self.fs.cat_file(self.path, start=start, end=end)
                    count(len(data))
                    fut.set_result(data)
            except BaseException as e:  # noqa: BLE001 - handed to the reader
                fut.set_exception(e)
        threading.Thread(target=run, name="wdsfilter-remote-read", daemon=True).start()
        return fut


def _bounded_info(fs, path: str, seconds: Optional[float]) -> dict:
    """fs.info(path), for an async filesystem within `seconds` (a server that takes the connection
    and never answers would hold a HEAD for aiohttp's 5 minutes, at every retry)."""
    loop = getattr(fs, "loop", None)
    if not seconds or not getattr(fs, "async_impl", False) or loop is None:
        return fs.info(path)
    fut = asyncio.run_coroutine_threadsafe(fs._info(path), loop)
    try:
        return fut.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise TimeoutError(f"no answer in {seconds:g}s") from None


def _open_failure(e: BaseException, url: str, shown: str, storage_options) -> OSError:
    """Why an object could not be looked up, as the error validate and score sort by its type: the
    store not reached (RemoteUnreachable), missing (FileNotFoundError), forbidden or no credentials
    (PermissionError), else OSError."""
    reach = reach_failure(e, shown)
    if reach is not None:
        return reach
    if no_credentials(e):  # a shard that cannot be read with no credentials: "access denied"
        return PermissionError(f"{shown}: {missing_credentials(url, storage_options)}")
    status = status_of(e)
    source = credential_source(url, storage_options)
    if isinstance(e, PermissionError) or status in (401, 403):
        what = f"HTTP {status}" if status in (401, 403) and not isinstance(e, PermissionError) else strip_text(str(e))
        return PermissionError(f"{shown}: access denied ({what}); credentials: {source}")
    if isinstance(e, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"{shown} does not exist (credentials: {source})")
    return OSError(f"{shown}: {describe(e)}")


_END = object()


class _Feed:
    """One streaming GET on fsspec's event loop, its chunks handed to the reading thread through an
    asyncio queue of `depth` chunks (the bounded read-ahead: the GET waits while it is full)."""

    def __init__(self, loop, chunks, depth: int):
        self.loop = loop
        self.queue = asyncio.run_coroutine_threadsafe(_make_queue(depth), loop).result()
        self.task = asyncio.run_coroutine_threadsafe(self._pump(chunks), loop)
        self._waiting: Optional[concurrent.futures.Future] = None

    async def _pump(self, chunks) -> None:
        try:
            async for chunk in chunks:
                await self.queue.put(chunk)
            await self.queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the reader, which sorts it
            await self.queue.put(e)

    def get(self, timeout: float):
        """The next chunk (or _END, or the failure), NOTHING when none came within `timeout`: the
        request for it is kept for the next call (cancelled, it could lose a chunk it had taken)."""
        fut = self._waiting or asyncio.run_coroutine_threadsafe(self.queue.get(), self.loop)
        done, _ = concurrent.futures.wait([fut], timeout)
        if not done:
            self._waiting = fut
            return NOTHING
        self._waiting = None
        return fut.result()

    def cancel(self) -> None:
        self.task.cancel()
        if self._waiting is not None:
            self._waiting.cancel()


class _ThreadFeed:
    """One streaming GET sent by a thread of its own (botocore's blocking client, remote_s3.py), its
    chunks handed over through a queue of `depth` chunks (the bounded read-ahead: the thread waits
    while it is full). Cancelled, the thread stops at its next chunk and closes the connection."""

    def __init__(self, chunks, depth: int):
        self.queue: queue.Queue = queue.Queue(depth)
        self.cancelled = threading.Event()
        threading.Thread(target=self._pump, args=(chunks,), name="wdsfilter-s3-read", daemon=True).start()

    def _pump(self, chunks) -> None:
        try:
            for chunk in chunks:
                if not self._put(chunk):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the reader, which sorts it
            self._put(e)
        finally:
            chunks.close()

    def _put(self, item) -> bool:
        while not self.cancelled.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def get(self, timeout: float):
        """The next chunk (or _END, or the failure), NOTHING when none came within `timeout`."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return NOTHING

    def cancel(self) -> None:
        self.cancelled.set()


async def _make_queue(depth: int) -> asyncio.Queue:
    return asyncio.Queue(maxsize=depth)


async def _s3_stream(fs, path: str, start: int, etag: Optional[str], chunk: int, count):
    bucket, key, version = fs.split_path(path)
    kw = {"IfMatch": etag} if etag else {}
    if version:
        kw["VersionId"] = version
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-", **kw)
    body = resp["Body"]
    try:
        while True:
            data = await body.read(chunk)
            if not data:
                return
            count(len(data))
            yield data
    finally:
        body.close()


@contextlib.asynccontextmanager
async def _ranged_get(fs, url: str, start: int, identity: Identity):
    """fsspec's http session, one GET from byte `start` to the end: the response once it is shown
    to be that range of the version the shard was opened at (remote_version.Identity), which an
    honest server is also asked to refuse otherwise (If-Match, If-Unmodified-Since: 412)."""
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-"
    headers.update(identity.conditions(start))
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status == 412:
            raise ObjectChanged(f"{identity.shown} changed while it was read (at byte {start:,}: HTTP 412, the server "
                                f"refused the version read so far); its versions are never mixed: read it again")
        if r.status >= 400:
            r.raise_for_status()
        identity.check(r.status, r.headers, start)
        yield r


async def _http_stream(fs, url: str, start: int, identity: Identity, count, again=None):
    """One GET of a web object from `start`, or, `again` (remote_version._Again), from byte 0: the
    bytes already read are compared, the rest handed over."""
    async with _ranged_get(fs, url, 0 if again is not None else start, identity) as r:
        while True:  # what has arrived (at most aiohttp's buffer): a break loses no byte received
            data = await r.content.readany()
            if not data:
                return
            count(len(data))
            if again is not None:
                data = again.take(data)
                if not data:
                    continue
            yield data


async def _counted(coro, count) -> bytes:
    data = await coro
    count(len(data))
    return data


async def _read_up_to(content, want: int, count) -> bytes:
    """At most `want` bytes of an aiohttp response body, as they come (fewer: it ended early)."""
    parts, got = [], 0
    while got < want:
        chunk = await content.read(min(want - got, 1 << 20))
        if not chunk:
            break
        count(len(chunk))
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


async def _gcs_range(fs, path: str, start: int, end: int, generation, count) -> bytes:
    """gcsfs's session and credentials, our own ranged GET of one generation of a GCS object (the
    one the shard was opened at: `generation=`), so two versions are never spliced: once the object
    is replaced or deleted that generation is gone (HTTP 404; a versioned bucket still serves it).
    Not gcsfs's _cat_file: its own retry loop (6 tries, 1 to 32 s apart, from the start of the
    range) would retry unseen, uncounted in remote_retries and deaf to Retry-After; here every
    failure comes back to RemoteShard, which retries it."""
    await fs._set_session()
    url = fs.url(path, generation=generation)
    headers = fs._get_headers({"Range": f"bytes={start}-{end - 1}"})
    async with fs.session.get(url, headers=headers, params=fs._get_params({}),
                              timeout=fs.requests_timeout) as r:
        if r.status in (404, 412):
            raise ObjectChanged(f"HTTP {r.status}: generation {generation} of the object is no longer there "
                                f"(replaced or deleted)")
        if r.status in (401, 403):
            raise PermissionError(f"HTTP {r.status}: access denied")
        if r.status >= 400:
            r.raise_for_status()  # ClientResponseError: its status and headers (Retry-After) are read
        if r.status != 206 and start != 0:
            raise RangeIgnored(f"the server ignored the Range request (HTTP {r.status}), so a read cannot resume "
                               f"there")
        return await _read_up_to(r.content, end - start, count)


def _hf_range(fs, url: str, start: int, end: int, count) -> bytes:
    """huggingface_hub's HTTP session and headers (HF_TOKEN as a bearer token), our own ranged GET
    of a file's `resolve` URL (redirects followed, as to the Hub's CDN). Not HfFileSystem's
    cat_file: its buffered file reads ahead past the range asked for, and huggingface_hub's
    http_backoff retries a broken connection, a 5xx or a 429 unseen, from the start; here every
    failure comes back to RemoteShard, which retries it (counted, Retry-After honoured)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status
    headers = {**fs._api._build_hf_headers(), "Range": f"bytes={start}-{end - 1}"}
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
        if r.status_code >= 400:
            r.read()
            hf_raise_for_status(r)  # HfHubHTTPError: its response's status and Retry-After are read
        if r.status_code != 206 and start != 0:
            raise RangeIgnored(f"the server ignored the Range request (HTTP {r.status_code}), so a read cannot "
                               f"resume there")
        want, parts, got = end - start, [], 0
        for chunk in r.iter_bytes():
            parts.append(chunk[:want - got])
            got += len(parts[-1])
            count(len(chunk))
            if got >= want:
                break
        return b"".join(parts)
