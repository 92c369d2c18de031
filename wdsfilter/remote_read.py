"""The remote shard reader: one object streamed with a bounded read-ahead, resumed at the byte
reached after a failure, never two versions spliced (see remote.py for the URLs, options and
credentials, docs/remote.md for the behaviour)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
import time
from collections import deque
from typing import Mapping, Optional, Tuple

from .remote import (MAX_RETRY_AFTER, ObjectChanged, RangeIgnored, RemoteOptions, RemoteReadError, _classify,
                     _describe, _status, _strip, credential_source, filesystem, missing_credentials, no_credentials,
                     redact_url, scheme_of)


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
    if scheme_of(url) != "s3":
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
        self.get_fs = _getter(url, fs, options)
        # S3 and HTTP: one GET from the byte reached to the end, its body handed over in chunks
        # through a bounded queue (readahead * block_bytes); after a failure, a new GET from the
        # byte reached. Others (gs://, hf://): ranged reads of block_bytes, readahead in flight.
        self._feed: Optional[_Feed] = None
        self.pos = 0              # bytes handed to the reader
        self._next = 0            # first byte not yet asked for
        self._pending: deque = deque()  # [start, end, future]
        self._block = b""
        self._offset = 0          # position inside _block
        self._failures = 0        # failed reads in a row

    # -- the stream interface tar readers use ------------------------------------------------
    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read of a closed shard stream")
        if self._stream is not None:
            try:
                data = self._stream.read(-1 if n is None else n)
            except Exception as e:  # noqa: BLE001 - any failure of the plain stream fails the shard
                raise RemoteReadError(f"{self.shown}: {_describe(e)} at byte {self.pos:,} (the server gives no size, so "
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
        chunk_bytes = min(self.options.block_bytes, 1 << 20)
        while True:
            if self._feed is None:
                opener = _s3_stream if self.kind == "s3" else _http_stream
                depth = max(1, self.options.block_bytes * self.options.readahead // chunk_bytes)
                self._feed = _Feed(self.get_fs.loop, opener(self.get_fs, self.path, self.pos, self.etag, chunk_bytes),
                                   depth)
            try:
                item = self._feed.get(self.options.idle_seconds or None)
            except concurrent.futures.TimeoutError:
                self._drop_feed()
                self._failed(self.pos, TimeoutError(f"no bytes for {self.options.idle_seconds:g}s (stream_idle_seconds)"))
                continue
            if item is _END:
                if self.pos >= self.size:
                    return b""
                self._drop_feed()  # a short read: the answer ended before the object did
                self._failed(self.pos, OSError(f"short read: the answer ended at byte {self.pos:,} of {self.size:,}"))
                continue
            if isinstance(item, BaseException):
                self._drop_feed()
                if isinstance(item, ObjectChanged) or _classify(item)[0]:
                    raise ObjectChanged(f"{self.shown} changed while it was read (at byte {self.pos:,} of "
                                        f"{self.size:,}: its ETag is no longer {self.etag}); its versions are never "
                                        f"mixed: read it again") from None
                if isinstance(item, (FileNotFoundError, PermissionError)):
                    raise RemoteReadError(f"{self.shown}: {_describe(item)} at byte {self.pos:,}") from None
                changed, retryable, wait = _classify(item)
                if not retryable:
                    raise RemoteReadError(f"{self.shown}: {_describe(item)} at byte {self.pos:,} of {self.size:,}") from None
                self._failed(self.pos, item, wait)
                continue
            if self.pos + len(item) > self.size:
                item = item[:self.size - self.pos]  # never past the size the shard was opened at
            self._failures = 0
            return item

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
                data = fut.result(timeout=self.options.idle_seconds or None)
                if not data:
                    raise OSError(f"short read: no bytes for {start}-{end - 1}")
            except concurrent.futures.TimeoutError:
                fut.cancel()
                self._failed(start, TimeoutError(f"no bytes for {self.options.idle_seconds:g}s "
                                                 f"(stream_idle_seconds)"))
                self._pending[0][2] = self._submit(start, end)
                continue
            except ObjectChanged:
                raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,} of {self.size:,}: "
                                    f"its ETag is no longer {self.etag}); its versions are never mixed: read it "
                                    f"again") from None
            except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                raise RemoteReadError(f"{self.shown}: {_describe(e)} at byte {start:,}") from None
            except Exception as e:  # noqa: BLE001 - sorted by _retryable; the rest fails the shard
                changed, retryable, wait = _classify(e)
                if changed:
                    raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,} of "
                                        f"{self.size:,}); its versions are never mixed: read it again") from None
                if not retryable:
                    raise RemoteReadError(f"{self.shown}: {_describe(e)} at byte {start:,} of {self.size:,}") from None
                self._failed(start, e, wait)
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
        """One failed read: the shard fails after `attempts` in a row; else wait and go on (the
        caller asks for the same range again)."""
        self._failures += 1
        what = _describe(error)
        if self._failures >= self.options.attempts:
            raise RemoteReadError(f"{self.shown}: gave up after {self._failures} failed reads in a row at byte "
                          f"{start:,} of {self.size:,}; last error: {what}")
        delay = min(self.options.max_backoff_seconds, self.options.backoff_seconds * 2 ** (self._failures - 1))
        delay *= random.uniform(0.5, 1.0)  # jitter: many readers do not come back at once
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
        self.retries += 1
        if self.on_retry is not None:
            self.on_retry(f"{self.shown}: {what} at byte {start:,}; retry {self._failures} of "
                          f"{self.options.attempts - 1} in {delay:.2f}s")
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
            return self.fs.info(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.shown} does not exist (credentials: "
                                    f"{credential_source(self.url, self.options.storage_options)})") from None
        except PermissionError as e:
            raise PermissionError(f"{self.shown}: access denied ({_strip(str(e))}); credentials: "
                                  f"{credential_source(self.url, self.options.storage_options)}") from None
        except Exception as e:  # noqa: BLE001
            if no_credentials(e):  # a shard that cannot be read with no credentials: "access denied"
                raise PermissionError(f"{self.shown}: {missing_credentials(self.url, self.options.storage_options)}") \
                    from None
            status = _status(e)
            if status in (401, 403):
                raise PermissionError(f"{self.shown}: access denied (HTTP {status}); credentials: "
                                      f"{credential_source(self.url, self.options.storage_options)}") from None
            if status == 404:
                raise FileNotFoundError(f"{self.shown} does not exist (credentials: "
                                        f"{credential_source(self.url, self.options.storage_options)})") from None
            raise OSError(f"{self.shown}: {_describe(e)}") from None

    def _submit(self, start: int, end: int) -> concurrent.futures.Future:
        loop = getattr(self.fs, "loop", None)
        if self.kind == "s3":
            return asyncio.run_coroutine_threadsafe(_s3_range(self.get_fs, self.path, start, end, self.etag),
                                                    self.get_fs.loop)
        if self.kind == "http":
            return asyncio.run_coroutine_threadsafe(_http_range(self.fs, self.path, start, end, self.etag), loop)
        if self.generation is not None:
            return asyncio.run_coroutine_threadsafe(_gcs_range(self.fs, self.path, start, end, self.generation), loop)
        if getattr(self.fs, "async_impl", False) and loop is not None:
            return asyncio.run_coroutine_threadsafe(self.fs._cat_file(self.path, start=start, end=end), loop)
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():  # a synchronous filesystem (hf://): one daemon thread per ranged read
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(_hf_range(self.fs, self.hf_url, start, end) if self.hf_url
                               else self.fs.cat_file(self.path, start=start, end=end))
            except BaseException as e:  # noqa: BLE001 - handed to the reader
                fut.set_exception(e)
        threading.Thread(target=run, name="wdsfilter-remote-read", daemon=True).start()
        return fut


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

    def get(self, timeout: Optional[float]):
        fut = asyncio.run_coroutine_threadsafe(self.queue.get(), self.loop)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def cancel(self) -> None:
        self.task.cancel()


async def _make_queue(depth: int) -> asyncio.Queue:
    return asyncio.Queue(maxsize=depth)


async def _s3_stream(fs, path: str, start: int, etag: Optional[str], chunk: int):
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
            yield data
    finally:
        body.close()


@contextlib.asynccontextmanager
async def _ranged_get(fs, url: str, start: int, last: str, etag: Optional[str]):
    """fsspec's http session, one GET of bytes start..last ("": to the end), tied to `etag`: the
    response once its status says it is that range of that version."""
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{last}"
    if etag:
        headers["If-Match"] = etag
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status == 412:
            raise ObjectChanged(f"HTTP 412: the object's ETag is no longer {etag}")
        if r.status >= 400:
            r.raise_for_status()
        if r.status != 206 and start != 0:
            raise RangeIgnored(f"the server ignored the Range request (HTTP {r.status}), so a read cannot resume "
                               f"there; serve it with Range support")
        yield r


async def _http_stream(fs, url: str, start: int, etag: Optional[str], chunk: int):
    async with _ranged_get(fs, url, start, "", etag) as r:
        while True:  # what has arrived (at most aiohttp's buffer): a break loses no byte received
            data = await r.content.readany()
            if not data:
                return
            yield data


async def _s3_range(fs, path: str, start: int, end: int, etag: Optional[str]) -> bytes:
    bucket, key, version = fs.split_path(path)
    kw = {"IfMatch": etag} if etag else {}
    if version:
        kw["VersionId"] = version
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **kw)
    try:
        return await resp["Body"].read()
    finally:
        resp["Body"].close()


async def _read_up_to(content, want: int) -> bytes:
    """At most `want` bytes of an aiohttp response body, a MB at a time (fewer: it ended early)."""
    parts, got = [], 0
    while got < want:
        chunk = await content.read(min(want - got, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


async def _http_range(fs, url: str, start: int, end: int, etag: Optional[str]) -> bytes:
    """fsspec's http session, our own ranged GET: a server that ignores Range would otherwise send
    the whole object into memory; here at most the range is read."""
    async with _ranged_get(fs, url, start, str(end - 1), etag) as r:
        return await _read_up_to(r.content, end - start)


async def _gcs_range(fs, path: str, start: int, end: int, generation) -> bytes:
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
        return await _read_up_to(r.content, end - start)


def _hf_range(fs, url: str, start: int, end: int) -> bytes:
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
            if got >= want:
                break
        return b"".join(parts)
