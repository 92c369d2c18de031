"""Shards in object stores and on web servers (s3://, gs://, hf://, http(s)://), through fsspec.

One reader for every front door: `RemoteShard` streams an object in ranged reads of `block_bytes`,
at most `readahead` of them in flight (memory bounded by construction, never a temporary file),
and resumes inside the shard when a read fails: the failed range is asked again (a Range request
from the first byte not yet received) after an exponential backoff with jitter that honours
`Retry-After`, at most `attempts` times in a row. Every ranged read is tied to the version seen when
the shard was opened (`If-Match` on S3 and HTTP; for the others the version is checked again on
each retry and at the end), so two versions of an object are never spliced: the shard fails.

Credentials and endpoints come the standard way (the AWS chain with `AWS_ENDPOINT_URL`, Google's
application default credentials, `HF_TOKEN`) or from `storage_options` (`--storage-option
KEY=VALUE`), which are handed to the fsspec filesystem and never written anywhere.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigError, require

INSTALL = "pip install 'wdsfilter[remote]'"
# scheme -> (the module that serves it, the fsspec protocol)
SCHEMES: Dict[str, Tuple[str, str]] = {
    "s3": ("s3fs", "s3"), "gs": ("gcsfs", "gs"), "gcs": ("gcsfs", "gs"),
    "hf": ("huggingface_hub", "hf"), "http": ("aiohttp", "http"), "https": ("aiohttp", "https"),
}
FSSPEC_SCHEMES = tuple(f"{s}://" for s in SCHEMES)
MAX_RETRY_AFTER = 300.0  # a server asking for longer than this is waited on no longer


class RemoteReadError(OSError):
    """A remote shard's read that failed for good (retries exhausted, an error not worth a retry):
    the store's failure, not the tar's; it names the URL, the byte reached and the last error."""


class ObjectChanged(RemoteReadError):
    """The object is not the version the shard was opened at: its bytes are never spliced."""


class RangeIgnored(OSError):
    """A server that answers a Range request with the whole object: a read cannot resume there."""


@dataclass(frozen=True)
class RemoteOptions:
    """How remote shards are read. Picklable: it travels to decode workers and Ray tasks, which
    open their shards themselves."""
    storage_options: Mapping = field(default_factory=dict)
    attempts: int = 8              # failed reads in a row before the shard fails
    backoff_seconds: float = 0.5   # first wait; doubles each time, with jitter, up to max_backoff
    max_backoff_seconds: float = 30.0
    block_bytes: int = 8 << 20     # one ranged read
    readahead: int = 4             # ranged reads in flight (memory: readahead * block_bytes)
    idle_seconds: float = 600.0    # a read that sends nothing for this long is abandoned and retried; 0 = never

    def __post_init__(self):
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"remote_attempts must be >= 1, got {self.attempts!r}")
        if not isinstance(self.block_bytes, int) or self.block_bytes < 1:
            raise ConfigError(f"remote_block_bytes must be a positive number of bytes, got {self.block_bytes!r}")
        if not isinstance(self.readahead, int) or self.readahead < 1:
            raise ConfigError(f"remote_readahead must be >= 1, got {self.readahead!r}")


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_fsspec_url(url: str) -> bool:
    return scheme_of(url) in SCHEMES


def filesystem(url: str, storage_options: Optional[Mapping] = None):
    """(the fsspec filesystem serving `url`, the path it knows the object by). fsspec caches the
    instance per process and options, so every shard of a run shares one client."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise ConfigError(f"{redact_url(url)}: no remote reader for {scheme}:// (known: "
                          f"{', '.join(sorted(SCHEMES))})")
    module, protocol = SCHEMES[scheme]
    fsspec = require("fsspec", f"reading {scheme}:// shards", INSTALL)
    require(module, f"reading {scheme}:// shards", INSTALL)
    try:
        fs = fsspec.filesystem(protocol, **dict(storage_options or {}))
    except TypeError as e:  # an unknown --storage-option: named without its value
        raise ConfigError(f"{scheme}://: a storage option was not accepted ({_strip(str(e))}); "
                          f"options given: {sorted(storage_options or {})}") from None
    path = url if protocol in ("http", "https") else fs._strip_protocol(url)
    return fs, path


def parse_storage_options(items: Sequence[str]) -> Dict:
    """`--storage-option KEY=VALUE` (repeatable) -> fsspec storage options. VALUE is JSON when it
    parses (true, 3, {"a": 1}), text otherwise; a dotted KEY nests (client_kwargs.region_name=x)."""
    options: Dict = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--storage-option takes KEY=VALUE, got {key or item!r}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        node = options
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {key}: {p} is given both as a value and as a group")
        node[leaf] = parsed
    return options


def redact_options(options: Optional[Mapping]) -> Dict:
    """Storage options as they may be shown or written: the keys, never the values."""
    return {k: (redact_options(v) if isinstance(v, Mapping) else "<hidden>") for k, v in (options or {}).items()}


_USERINFO = re.compile(r"^([a-z0-9+.-]+://)[^/@]*@", re.I)


def redact_url(url: str) -> str:
    """A URL as it may be shown: no user:password@ and no query string (presigned signatures)."""
    url = _USERINFO.sub(r"\1<hidden>@", url)
    return url.split("?", 1)[0] + ("?<hidden>" if "?" in url else "")


def _strip(text: str) -> str:
    return " ".join(text.split())[:300]


def credential_source(url: str, storage_options: Optional[Mapping] = None) -> str:
    """Which credentials a request for `url` used, in words (never their values). Read from the
    options and the environment only: asking the chain itself could reach an instance endpoint."""
    opts = storage_options or {}
    scheme = scheme_of(url)
    given = sorted(k for k in opts if k in ("key", "secret", "token", "anon", "profile", "credentials", "client_kwargs"))
    if given:
        return f"storage options ({', '.join(given)})"
    env = os.environ
    if scheme == "s3":
        if env.get("AWS_ACCESS_KEY_ID"):
            return "the environment (AWS_ACCESS_KEY_ID)"
        if env.get("AWS_PROFILE"):
            return f"the AWS profile {env['AWS_PROFILE']!r}"
        if os.path.exists(env.get("AWS_SHARED_CREDENTIALS_FILE", os.path.expanduser("~/.aws/credentials"))):
            return "the shared AWS credentials file (default profile)"
        return "the AWS default chain (no key in the environment or files: an instance role, or none)"
    if scheme in ("gs", "gcs"):
        if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
            return "GOOGLE_APPLICATION_CREDENTIALS"
        return "Google application default credentials (gcloud auth application-default login), or none"
    if scheme == "hf":
        return "HF_TOKEN" if env.get("HF_TOKEN") else "the Hugging Face login cache (huggingface-cli login), or none"
    return "none (plain HTTP; headers through storage options)"


# -- listing ----------------------------------------------------------------------------------
def list_shards(url: str, suffixes: Sequence[str], storage_options: Optional[Mapping] = None) -> List[str]:
    """A remote URL -> shard URLs, like a local folder: an object named with a shard suffix is
    taken as is (opened, and reported if missing, when read); a prefix is listed recursively; a
    glob is matched. Name order. A prefix or glob that finds nothing, a missing bucket and a
    forbidden listing are ConfigErrors, raised before any work."""
    scheme = scheme_of(url)
    shown = redact_url(url)
    magic = any(c in url.split("://", 1)[1] for c in "*?[")
    if url.endswith(tuple(suffixes)) and not magic:
        return [url]
    if scheme in ("http", "https"):
        raise ConfigError(f"{shown}: a web server cannot be listed; name each shard (a brace pattern: "
                          f"https://host/shards-{{000..099}}.tar)")
    fs, path = filesystem(url, storage_options)
    try:
        found = fs.glob(path) if magic else fs.find(path.rstrip("/") + ("/" if url.endswith("/") else ""))
    except PermissionError as e:
        raise ConfigError(f"{shown}: listing is forbidden ({_strip(str(e))}); credentials: "
                          f"{credential_source(url, storage_options)}") from None
    except FileNotFoundError:
        found = []
    except OSError as e:
        raise ConfigError(f"{shown}: cannot be listed: {type(e).__name__}: {_strip(str(e))}") from None
    if isinstance(found, dict):
        found = list(found)
    shards = sorted(p for p in found if p.endswith(tuple(suffixes)))
    if not shards:
        raise ConfigError(f"no shards found at {shown}: {_missing_why(fs, path, scheme)}; expected objects "
                          f"ending in {', '.join(suffixes)}")
    return [f"{scheme}://{p}" for p in shards]


def _missing_why(fs, path: str, scheme: str) -> str:
    root = path.split("/", 1)[0]
    try:
        if scheme in ("s3", "gs", "gcs") and not fs.exists(root):
            return f"the bucket {root!r} does not exist"
    except OSError as e:
        return f"the bucket {root!r} cannot be read ({type(e).__name__})"
    return "the prefix is empty or matches nothing"


# -- reading ----------------------------------------------------------------------------------
def open_remote(url: str, options: Optional[RemoteOptions] = None,
                on_retry: Optional[Callable[[str], None]] = None) -> "RemoteShard":
    """A binary stream of a remote shard. A missing or forbidden object raises FileNotFoundError
    or PermissionError (naming the credential source); a missing extra raises ConfigError."""
    options = options or RemoteOptions()
    fs, path = filesystem(url, options.storage_options)
    return RemoteShard(url, fs, path, options, on_retry)


def _version(info: Mapping) -> Tuple:
    """What identifies one version of an object in each store's `info()`."""
    for name in ("ETag", "etag", "generation", "VersionId", "blob_id", "Last-Modified"):
        if info.get(name):
            return (info.get("size"), name, str(info[name]))
    lfs = info.get("lfs") or {}
    return (info.get("size"), "sha256", lfs.get("sha256")) if lfs.get("sha256") else (info.get("size"),)


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
        self.kind = "s3" if scheme_of(url) == "s3" else "http" if scheme_of(url) in ("http", "https") else "other"
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
                self._feed = _Feed(self.fs.loop, opener(self.fs, self.path, self.pos, self.etag, chunk_bytes), depth)
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
            return asyncio.run_coroutine_threadsafe(_s3_range(self.fs, self.path, start, end, self.etag), loop)
        if self.kind == "http":
            return asyncio.run_coroutine_threadsafe(_http_range(self.fs, self.path, start, end, self.etag), loop)
        if getattr(self.fs, "async_impl", False) and loop is not None:
            return asyncio.run_coroutine_threadsafe(self.fs._cat_file(self.path, start=start, end=end), loop)
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run():  # a synchronous filesystem (hf://): one daemon thread per ranged read
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(self.fs.cat_file(self.path, start=start, end=end))
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


async def _http_stream(fs, url: str, start: int, etag: Optional[str], chunk: int):
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-"
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


async def _http_range(fs, url: str, start: int, end: int, etag: Optional[str]) -> bytes:
    """fsspec's http session, our own ranged GET: a server that ignores Range would otherwise send
    the whole object into memory; here at most the range is read."""
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{end - 1}"
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
        want, parts, got = end - start, [], 0
        while got < want:
            chunk = await r.content.read(min(want - got, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)


def _status(e: BaseException) -> Optional[int]:
    """The HTTP status behind an error of aiohttp, botocore (through s3fs's translation) or requests."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        status = getattr(e, "status", None) or getattr(e, "status_code", None)
        if isinstance(status, int):
            return status
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        elif response is not None and isinstance(getattr(response, "status_code", None), int):
            return response.status_code
        e = e.__cause__ or e.__context__
    return None


def _retry_after(e: BaseException) -> Optional[float]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        headers = getattr(e, "headers", None)
        response = getattr(e, "response", None)
        if headers is None and isinstance(response, dict):
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders")
        elif headers is None and response is not None:
            headers = getattr(response, "headers", None)
        if headers:
            value = headers.get("Retry-After") or headers.get("retry-after")
            if value is not None:
                try:
                    return max(0.0, float(value))
                except ValueError:
                    from email.utils import parsedate_to_datetime
                    try:
                        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
                    except (TypeError, ValueError):
                        return None
        e = e.__cause__ or e.__context__
    return None


def _classify(e: BaseException) -> Tuple[bool, bool, Optional[float]]:
    """(the object changed, the read may be retried, seconds the server asked to wait)."""
    status = _status(e)
    text = str(e)
    if isinstance(e, RangeIgnored):
        return False, False, None
    if status == 412 or "PreconditionFailed" in text:
        return True, False, None
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return False, False, None
    return False, True, _retry_after(e)


def _describe(e: BaseException) -> str:
    status = _status(e)
    text = _strip(str(e)) or type(e).__name__
    return f"{type(e).__name__}: {text}" + (f" (HTTP {status})" if status and str(status) not in text else "")


# -- writing ----------------------------------------------------------------------------------
class RemoteOutputError(OSError):
    """An output in an object store that cannot be written."""


def check_output_url(url: str, option: str, storage_options: Optional[Mapping] = None) -> None:
    """Before any work: the bucket of an output URL exists and these credentials may list it (a
    write cannot be tried without leaving an object behind). Raises OutputError (exit 2)."""
    from .errors import OutputError
    scheme = scheme_of(url)
    if scheme in ("http", "https"):
        raise OutputError(f"{option} {redact_url(url)}: a web server cannot be written to; use s3://, gs:// or hf://")
    fs, path = filesystem(url, storage_options)
    root = path.split("/", 1)[0]
    try:
        if not fs.exists(root):
            raise OutputError(f"{option} {redact_url(url)}: the bucket {root!r} does not exist (credentials: "
                              f"{credential_source(url, storage_options)})")
    except PermissionError as e:
        raise OutputError(f"{option} {redact_url(url)}: access denied ({_strip(str(e))}); credentials: "
                          f"{credential_source(url, storage_options)}") from None
    except OSError as e:
        raise OutputError(f"{option} {redact_url(url)}: cannot be reached: {type(e).__name__}: {_strip(str(e))}") from None


def write_object(url: str, data: bytes, storage_options: Optional[Mapping] = None) -> str:
    """Write one object whole or not at all: fsspec uploads on close (a multipart upload is
    completed there); a failure before that aborts the upload, so the name never holds a part."""
    fs, path = filesystem(url, storage_options)
    f = fs.open(path, "wb")
    try:
        f.write(data)
    except BaseException:
        _discard(f)
        raise
    try:
        f.close()
    except Exception as e:  # noqa: BLE001 - the store's error, named without options
        _discard(f)
        raise RemoteOutputError(f"writing {redact_url(url)} failed: {_describe(e)}") from None
    return url


def _discard(f) -> None:
    try:
        f.discard()  # s3fs: abort the multipart upload; gcsfs: cancel the resumable upload
    except Exception:  # noqa: BLE001 - nothing was committed either way
        pass
    f.closed = True  # close() would upload what was buffered


def read_object(url: str, storage_options: Optional[Mapping] = None, limit: int = 64 << 20) -> Optional[bytes]:
    """A small object's bytes (a sizes.json, a lock), or None when there is none."""
    fs, path = filesystem(url, storage_options)
    try:
        with fs.open(path, "rb") as f:
            return f.read(limit)
    except FileNotFoundError:
        return None


def refuse_remote_folder(path: str, option: str) -> None:
    """Outputs that are folders of many files written as a run goes (score --out, --write-shards;
    filter --write-shards) are local only for now: refused at once (exit 2) instead of becoming a
    local folder named `s3:`. docs/remote.md says how such a folder will work remotely."""
    if path and is_fsspec_url(str(path)):
        raise ConfigError(f"{option} {redact_url(str(path))}: writing this folder to an object store is not supported "
                          f"yet; write it to a local folder and copy it (aws s3 sync DIR s3://...; gcloud storage "
                          f"rsync -r DIR gs://...). Reports and --stats-dir may be URLs")
