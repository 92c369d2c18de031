"""S3's plain read path through botocore itself: listing a prefix, one object's HEAD, one streaming
GET, a small object read whole. botocore is what s3fs runs on (through aiobotocore); without the
asyncio stack a command imports 0.14 s of a core instead of s3fs's 0.36 s (aiohttp's connector
builds SSL contexts at import, aiobotocore imports httpx), a read needs no event-loop thread, and
botocore's service model is parsed once per process (one data loader for every session). Clients
made before a fork (validate's pool: validate/runner.pool_context) are used by the forked workers,
each with connections of its own, instead of the 0.26 s of CPU each worker spent on s3fs's two
aiobotocore clients. docs/dev.md has the measurements.

Used only where it reads exactly what s3fs would: storage options among OPTIONS (the rest, and any
fsspec configuration for s3, keep s3fs), a key without `?`. The same AWS chain (botocore's own:
environment, AWS_ENDPOINT_URL, profiles, instance roles), the same errors (botocore's ClientError
carries the status remote_errors reads; a missing object is a FileNotFoundError, a refused one a
PermissionError, as s3fs translates them). Reads are sent with botocore's retries off (RemoteShard
retries them, resumed at the byte reached); HEAD and listing keep botocore's own."""
from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import threading
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

# storage options read here as s3fs reads them; any other keeps s3fs
OPTIONS = frozenset({"endpoint_url", "key", "secret", "token", "anon", "profile", "client_kwargs"})
CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})
NO_ANSWER_SECONDS = 60.0  # botocore's own timeouts where the options give none

_clients: Dict[tuple, object] = {}
_loaders: Dict[Optional[str], object] = {}  # data_path -> botocore's loader, service models parsed once
_lock = threading.Lock()
_dropped_at_exit: list = []


def _after_fork_in_child() -> None:
    """A forked worker keeps its parent's clients (no service model parsed, no SSL context built:
    OpenSSL's locks, taken by another thread of the parent at the fork, would never be released in
    the child) but not their connections, which the parent goes on using: each pool is emptied (the
    child's copies of the sockets closed; the parent's stay open) and fills again with its own."""
    global _lock
    _lock = threading.Lock()  # a lock held by another thread at the fork would never be released
    for found in _clients.values():
        try:
            found.close()
        except Exception:  # noqa: BLE001 - a pool that cannot be emptied is left: it is the child's copy
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def serves(url: str, storage_options: Optional[Mapping] = None) -> bool:
    """Whether `url` is read here (an s3:// object or prefix whose options botocore takes as s3fs
    does, botocore installed), not through s3fs."""
    if not url.lower().startswith("s3://") or "?" in url:
        return False
    options = storage_options or {}
    client_kwargs = options.get("client_kwargs") or {}
    if set(options) - OPTIONS or not isinstance(client_kwargs, Mapping) or set(client_kwargs) - CLIENT_KWARGS:
        return False
    if _fsspec_configures_s3():
        return False
    try:  # the remote extra installed (s3fs brings botocore): else its one-line error, as for any store
        return importlib.util.find_spec("s3fs") is not None and importlib.util.find_spec("botocore") is not None
    except (ImportError, ValueError):
        return False


def _fsspec_configures_s3() -> bool:
    """fsspec's configuration for s3 (storage_defaults, FSSPEC_S3_* variables, a config folder's
    files), which s3fs would apply: its reads stay with s3fs."""
    if any(name.startswith("FSSPEC_S3") for name in os.environ):
        return True
    config = sys.modules.get("fsspec.config")
    if config is not None and config.conf.get("s3"):
        return True
    folder = os.environ.get("FSSPEC_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "fsspec")
    try:
        return any(name.endswith((".json", ".ini")) for name in os.listdir(folder))
    except OSError:
        return False


def split(url: str) -> Tuple[str, str]:
    """s3://bucket/key -> (bucket, key)."""
    bucket, _, key = url[len("s3://"):].partition("/")
    return bucket, key


def client(storage_options: Optional[Mapping] = None, reads: bool = False, timeout: Optional[float] = None):
    """This process's botocore S3 client for these options: `reads` without botocore's retries
    (RemoteShard's own), else botocore's defaults (HEAD, listing). One per options and AWS
    environment (a test or a user that changes AWS_* gets a new one), inherited by forked workers
    without its connections (_after_fork_in_child)."""
    options = dict(storage_options or {})
    timeout = timeout or NO_ANSWER_SECONDS  # a listing's (no timeout given) and a HEAD's default: one client
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    key = (reads, timeout, repr(sorted(options.items())), env)
    with _lock:
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = _make_client(options, reads, timeout)
        return found


def warm(urls, storage_options: Optional[Mapping], timeout: Optional[float]) -> None:
    """Before a fork: the clients that read `urls` (those read here), made in this process for its
    workers to inherit. A client that cannot be made (no credentials, an unknown profile) is left
    to each shard's own error."""
    if any(serves(url, storage_options) for url in urls):
        for reads in (False, True):
            try:
                client(storage_options, reads=reads, timeout=timeout)
            except Exception:  # noqa: BLE001 - reported per shard, as without this
                pass


def clear_clients() -> None:
    with _lock:
        _clients.clear()


def _drop_all() -> None:
    _clients.clear()
    _loaders.clear()


def _make_client(options: dict, reads: bool, timeout: float):
    if not _dropped_at_exit:
        # botocore's clients and parsed service model (~57,000 objects) are let go at exit, before
        # the interpreter's last collections, which otherwise walk them all (0.1 s of each command's end)
        _dropped_at_exit.append(atexit.register(_drop_all))
    import botocore.config
    import botocore.loaders
    import botocore.session
    session = botocore.session.Session(profile=options.get("profile"))
    data_path = session.get_config_variable("data_path")
    loader = _loaders.get(data_path)
    if loader is None:
        loader = _loaders[data_path] = botocore.loaders.create_loader(data_path)
    session.register_component("data_loader", loader)
    client_kwargs = dict(options.get("client_kwargs") or {})
    config = {"connect_timeout": timeout,
              # a read's stall is the transfer floor's to judge (remote_pace.py): the socket waits longer
              "read_timeout": max(NO_ANSWER_SECONDS, 2 * timeout) if reads else timeout}
    if reads:
        config["retries"] = {"total_max_attempts": 1}
    if options.get("anon"):
        from botocore import UNSIGNED
        config["signature_version"] = UNSIGNED
    return session.create_client(
        "s3", endpoint_url=options.get("endpoint_url") or client_kwargs.get("endpoint_url"),
        region_name=client_kwargs.get("region_name"), aws_access_key_id=options.get("key"),
        aws_secret_access_key=options.get("secret"), aws_session_token=options.get("token"),
        config=botocore.config.Config(**config))


def translated(e: BaseException, what: str) -> BaseException:
    """botocore's error as s3fs translates it: a missing object or bucket FileNotFoundError, a
    refusal PermissionError, any other answer an OSError (the ClientError kept as the cause, whose
    status and Retry-After remote_errors reads); a failure with no answer (no connection, no
    credentials) as it is."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return e
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchKey", "NoSuchBucket", "NotFound") or status == 404:
        error: BaseException = FileNotFoundError(what)
    elif code in ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status in (401, 403):
        error = PermissionError(f"{code or 'HTTP ' + str(status)}: access denied")
    else:
        message = str(response.get("Error", {}).get("Message", "")) or type(e).__name__
        error = OSError(f"{code}: {message}" if code else message)
    error.__cause__ = e
    return error


class Objects:
    """The objects of one set of storage options, as RemoteShard asks a filesystem for them (info,
    invalidate_cache): its S3 reads are `stream`s, sent from a thread of RemoteShard's."""
    async_impl = False
    loop = None

    def __init__(self, storage_options: Optional[Mapping], timeout: Optional[float]):
        self.storage_options, self.timeout = dict(storage_options or {}), timeout

    def info(self, url: str) -> dict:
        """The HEAD, within `timeout` in all (botocore's own retries included): a server that takes
        the connection and never answers holds no shard for minutes."""
        if not self.timeout:
            return info(url, self.storage_options)
        # The client is made here, not in the thread: a fork (a validate pool) while another thread
        # builds an SSL context leaves OpenSSL's lock taken in the child, whose next context waits forever.
        client(self.storage_options, timeout=self.timeout)
        box: list = []
        done = threading.Event()

        def run():
            try:
                box.append((True, info(url, self.storage_options, self.timeout)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))
            done.set()
        threading.Thread(target=run, name="wdsfilter-s3-head", daemon=True).start()
        if not done.wait(self.timeout):
            raise TimeoutError(f"no answer in {self.timeout:g}s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def invalidate_cache(self, url: str) -> None:
        pass  # nothing is cached: each info() is a HEAD

    def stream(self, url: str, start: int, etag: Optional[str], chunk: int, count) -> Iterator[bytes]:
        """The GET's chunks (remote_s3.stream), to be sent from another thread: its client is made
        in this one (see info)."""
        client(self.storage_options, reads=True, timeout=self.timeout)
        return stream(url, start, etag, chunk, count, self.storage_options, self.timeout)


def info(url: str, storage_options: Optional[Mapping] = None, timeout: Optional[float] = None) -> dict:
    """The object's HEAD as s3fs's info() gives it: size, ETag, VersionId where the bucket keeps versions."""
    bucket, key = split(url)
    try:
        head = client(storage_options, timeout=timeout).head_object(Bucket=bucket, Key=key)
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        raise translated(e, url) from None
    found = {"name": f"{bucket}/{key}", "size": head.get("ContentLength"), "type": "file",
             "ETag": head.get("ETag"), "LastModified": head.get("LastModified")}
    if head.get("VersionId"):
        found["VersionId"] = head["VersionId"]
    return found


def list_prefix(url: str, storage_options: Optional[Mapping] = None, timeout: Optional[float] = None) -> List[str]:
    """Every object under a prefix (s3://bucket/set/ or s3://bucket/set: the objects in set/, however
    deep, as s3fs's find), as bucket/key paths; [] for a missing bucket."""
    bucket, key = split(url)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    found: List[str] = []
    try:
        pages = client(storage_options, timeout=timeout).get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=prefix):
            found.extend(f"{bucket}/{item['Key']}" for item in page.get("Contents", ()) if not item["Key"].endswith("/"))
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        raise translated(e, url) from None
    return found


def bucket_exists(bucket: str, storage_options: Optional[Mapping] = None) -> bool:
    try:
        client(storage_options).head_bucket(Bucket=bucket)
        return True
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        error = translated(e, bucket)
        if isinstance(error, FileNotFoundError):
            return False
        raise error from None


def read_whole(url: str, storage_options: Optional[Mapping] = None, limit: int = 64 << 20,
               timeout: Optional[float] = None) -> Optional[bytes]:
    """A small object's bytes (at most `limit`), or None when there is none."""
    bucket, key = split(url)
    try:
        body = client(storage_options, timeout=timeout).get_object(Bucket=bucket, Key=key)["Body"]
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        error = translated(e, url)
        if isinstance(error, FileNotFoundError):
            return None
        raise error from None
    try:
        return body.read(limit)
    finally:
        body.close()


def stream(url: str, start: int, etag: Optional[str], chunk: int, count,
           storage_options: Optional[Mapping] = None, timeout: Optional[float] = None) -> Iterator[bytes]:
    """One GET of the object from byte `start` to its end, of the version with this ETag (S3
    answers 412 once it is replaced: its versions are never spliced), its body as it arrives in
    chunks of at most `chunk` bytes, each counted (`count`) as it comes off the network."""
    bucket, key = split(url)
    kw = {"IfMatch": etag} if etag else {}
    try:
        response = client(storage_options, reads=True, timeout=timeout).get_object(
            Bucket=bucket, Key=key, Range=f"bytes={start}-", **kw)
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        raise translated(e, url) from None
    raw = response["Body"]._raw_stream  # urllib3's response: read1 hands over what has arrived
    read = (lambda: raw.read1(chunk, decode_content=False)) if hasattr(raw, "read1") else \
        (lambda: raw.read(min(chunk, 64 << 10), decode_content=False))
    ended = False
    try:
        while True:
            data = read()
            if not data:
                ended = True
                return
            count(len(data))
            yield data
    finally:
        if ended:
            raw.release_conn()  # read to its end: the connection serves the next request
        else:
            raw.close()  # abandoned mid-body: the connection is not reused
