"""Shards in object stores and on web servers (s3://, gs://, hf://, http(s)://), through fsspec.

Here: which URLs are remote, their fsspec filesystem, storage options, credential sources named
without values, listing prefixes and globs, the errors, and writing whole objects. The reader
(`RemoteShard`, remote_read.py) streams an object with a bounded read-ahead and resumes inside the
shard when a read fails (a Range request from the byte reached, exponential backoff with jitter,
`Retry-After` honoured, at most `attempts` failures in a row and `retry_budget` in all, a transfer
floor: remote_pace.py); every read is tied to the version seen when the shard was opened (a web
server's answers checked against the first: remote_version.py), so two versions of an object are
never spliced: the shard fails. A store that cannot be reached is named so (remote_net.py).

Credentials and endpoints come the standard way (the AWS chain with `AWS_ENDPOINT_URL`, Google's
application default credentials, `HF_TOKEN`) or from `storage_options` (`--storage-option
KEY=VALUE`), which are handed to the fsspec filesystem and never written anywhere.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import ConfigError, require, RunError, OutputError
from .remote_options import RemoteOptions, parse_storage_options, redact_options  # noqa: F401 - the options' home
from .remote_errors import (MAX_RETRY_AFTER, ObjectChanged, RangeIgnored, RemoteOutputError,  # noqa: F401
                            RemoteReadError, describe, status_of, strip_text)
from ..core.urls import redact_url
from .remote_net import check_reachable, reach_failure
from . import remote_fork, remote_s3

remote_fork.install()  # before any fork: a worker never unregisters its parent's sockets

INSTALL = "pip install 'wdsfilter[remote]'"
# scheme -> (the module that serves it, the fsspec protocol)
SCHEMES: Dict[str, Tuple[str, str]] = {
    "s3": ("s3fs", "s3"), "gs": ("gcsfs", "gs"), "gcs": ("gcsfs", "gs"),
    "hf": ("huggingface_hub", "hf"), "http": ("aiohttp", "http"), "https": ("aiohttp", "https"),
}
FSSPEC_SCHEMES = tuple(f"{s}://" for s in SCHEMES)


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
        if protocol == "gs" and _gcs_emulator(storage_options):
            fs = _gcs_emulated(storage_options)
        elif protocol == "hf":
            fs = fsspec.filesystem(protocol, **_hf_options(storage_options))
        else:
            fs = fsspec.filesystem(protocol, **dict(storage_options or {}))
    except TypeError as e:  # an unknown --storage-option: named without its value
        raise ConfigError(f"{scheme}://: a storage option was not accepted ({strip_text(str(e))}); "
                          f"options given: {sorted(storage_options or {})}") from None
    path = url if protocol in ("http", "https") else fs._strip_protocol(url)
    return fs, path


def _gcs_emulator(storage_options: Optional[Mapping]) -> Optional[str]:
    """The GCS emulator's address (STORAGE_EMULATOR_HOST, or an endpoint_url storage option), or
    None for Google's own service."""
    endpoint = (storage_options or {}).get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    return None if endpoint in (None, "", "default") or "googleapis.com" in str(endpoint) else str(endpoint)


def _gcs_emulated(storage_options: Optional[Mapping]):
    """gcsfs's filesystem for an emulator (fake-gcs-server, gcp-storage-emulator). Two differences
    from Google's service: gcsfs's default class asks Google's storage control API (gRPC, its own
    address) for each bucket's layout, which an emulator does not serve (60 s of retries per
    bucket, not cached): the core class is used; and no credentials are looked up unless given
    (`token=`), as Google's client does for STORAGE_EMULATOR_HOST (the lookup would ask a cloud
    metadata server)."""
    import fsspec.config
    from gcsfs.core import GCSFileSystem
    options = dict(storage_options or {})
    if "token" not in options and "token" not in (fsspec.config.conf.get("gs") or {}):
        options["token"] = "anon"
    return GCSFileSystem(**options)


def _hf_options(storage_options: Optional[Mapping]) -> Dict:
    """HfFileSystem's options: HF_ENDPOINT (a mirror, a private Hub) read when the filesystem is
    made, not only when huggingface_hub was first imported (which another library may have done
    before the variable was set). HF_TOKEN is read by huggingface_hub at each request."""
    options = dict(storage_options or {})
    if not options.get("endpoint") and os.environ.get("HF_ENDPOINT"):
        options["endpoint"] = os.environ["HF_ENDPOINT"].rstrip("/")
    return options


@contextmanager
def storage_defaults(options: Optional[Mapping], urls: Sequence[str] = ()) -> Iterator[None]:
    """While the block runs, `options` are the defaults (fsspec's own config, which explicit
    options override) of the filesystems of `urls`' schemes, or of every object store (s3, gs, hf)
    when none is remote: for a command whose remote reads and writes are made in many places
    (`wdsfilter filter`: the score folder, its sources, the report). Held in memory only, like
    every storage option."""
    if not options:
        yield
        return
    import fsspec.config
    conf = fsspec.config.conf
    named = {SCHEMES[scheme_of(u)][1] for u in urls if u and is_fsspec_url(u)}
    saved = {p: conf.get(p) for p in named or ("s3", "gs", "hf")}
    try:
        for proto in saved:
            conf[proto] = {**(saved[proto] or {}), **dict(options)}
        yield
    finally:
        for proto, value in saved.items():
            if value is None:
                conf.pop(proto, None)
            else:
                conf[proto] = value


def credential_source(url: str, storage_options: Optional[Mapping] = None) -> str:
    """Which credentials a request for `url` used, in words (never their values). Read from the
    options and the environment only: asking the chain itself could reach an instance endpoint."""
    scheme = scheme_of(url)
    opts = storage_options or _defaults(scheme)
    given = sorted(k for k in opts if k in ("key", "secret", "token", "anon", "profile", "credentials", "client_kwargs"))
    if given:
        return f"storage options ({', '.join(given)})"
    env = os.environ
    if scheme == "s3":
        if env.get("AWS_ACCESS_KEY_ID"):
            return "the environment (AWS_ACCESS_KEY_ID)"
        if env.get("AWS_PROFILE"):
            return f"the AWS profile {env['AWS_PROFILE']!r}"
        if _nonempty(env.get("AWS_SHARED_CREDENTIALS_FILE", os.path.expanduser("~/.aws/credentials"))):
            return "the shared AWS credentials file (default profile)"
        return "the AWS default chain (no key in the environment or files: an instance role, or none)"
    if scheme in ("gs", "gcs"):
        if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
            return "GOOGLE_APPLICATION_CREDENTIALS"
        return "Google application default credentials (gcloud auth application-default login), or none"
    if scheme == "hf":
        return "HF_TOKEN" if env.get("HF_TOKEN") else "the Hugging Face login cache (huggingface-cli login), or none"
    return "none (plain HTTP; headers through storage options)"


def _defaults(scheme: str) -> Mapping:
    """The storage options in force for `scheme` without explicit ones (storage_defaults above)."""
    try:
        import fsspec.config
    except ImportError:
        return {}
    return fsspec.config.conf.get(SCHEMES.get(scheme, ("", ""))[1]) or {}


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0  # /dev/null (credentials turned off) holds none
    except OSError:
        return False


def no_credentials(e: BaseException) -> bool:
    """The client found no credentials at all (botocore's NoCredentialsError, PartialCredentialsError
    and ProfileNotFound, google-auth's DefaultCredentialsError): told apart from a refusal."""
    return type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError", "ProfileNotFound",
                                "DefaultCredentialsError")


def missing_credentials(url: str, storage_options: Optional[Mapping] = None) -> str:
    """What to say when no credentials were found for `url` (never a value: there is none)."""
    how = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or --storage-option key=... "
                 "--storage-option secret=... (anon=true for a public bucket)",
           "gs": "GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login` (token=anon for a "
                 "public bucket)",
           "hf": "HF_TOKEN or `huggingface-cli login`"}.get(SCHEMES.get(scheme_of(url), ("", ""))[1], "--storage-option")
    return f"no credentials were found (looked in: {credential_source(url, storage_options)}); set {how}"


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
    botocore = not magic and remote_s3.serves(url, storage_options)  # a prefix of S3's: botocore itself
    fs, path = (None, url) if botocore else filesystem(url, storage_options)
    try:
        found = _listing(fs, path, url, shown, magic, storage_options)
    except PermissionError as e:
        raise ConfigError(f"{shown}: listing is forbidden ({strip_text(str(e))}); credentials: "
                          f"{credential_source(url, storage_options)}") from None
    except FileNotFoundError:
        found = []
    except OSError as e:
        if status_of(e) in (401, 403):  # huggingface_hub's HTTP errors are OSErrors, not PermissionErrors
            raise ConfigError(f"{shown}: listing is forbidden (HTTP {status_of(e)}); credentials: "
                              f"{credential_source(url, storage_options)}") from None
        raise ConfigError(f"{shown}: cannot be listed: {type(e).__name__}: {strip_text(str(e))}") from None
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        if no_credentials(e):
            raise ConfigError(f"{shown}: cannot be listed: {missing_credentials(url, storage_options)}") from None
        raise
    if isinstance(found, dict):
        found = list(found)
    shards = sorted(p for p in found if p.endswith(tuple(suffixes)))
    if not shards:
        why = _bucket_missing_why(url, storage_options) if fs is None else _missing_why(fs, path, scheme)
        raise ConfigError(f"no shards found at {shown}: {why}; expected objects "
                          f"ending in {', '.join(suffixes)}")
    return [f"{scheme}://{p}" for p in shards]


def _listing(fs, path: str, url: str, shown: str, magic: bool, storage_options) -> list:
    """The objects a prefix or glob names; a store that cannot be reached is a RunError (exit 3)
    in one line: the run cannot start."""
    try:
        check_reachable(url, shown, storage_options)
        if fs is None:
            return remote_s3.list_prefix(url, storage_options)
        return fs.glob(path) if magic else fs.find(path.rstrip("/") + ("/" if url.endswith("/") else ""))
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        reach = reach_failure(e, shown)
        if reach is None:
            raise
        raise RunError(f"{shown} cannot be listed: {str(reach).partition(': ')[2]}") from None


def _missing_why(fs, path: str, scheme: str) -> str:
    if scheme == "hf":
        return _hf_missing_why(fs, path)
    root = path.split("/", 1)[0]
    try:
        if scheme in ("s3", "gs", "gcs") and not fs.exists(root):
            return f"the bucket {root!r} does not exist"
    except OSError as e:
        return f"the bucket {root!r} cannot be read ({type(e).__name__})"
    return "the prefix is empty or matches nothing"


def _bucket_missing_why(url: str, storage_options) -> str:
    bucket = remote_s3.split(url)[0]
    try:
        if not remote_s3.bucket_exists(bucket, storage_options):
            return f"the bucket {bucket!r} does not exist"
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        return f"the bucket {bucket!r} cannot be read ({type(e).__name__})"
    return "the prefix is empty or matches nothing"


def _hf_missing_why(fs, path: str) -> str:
    try:
        fs.resolve_path(path)
    except FileNotFoundError as e:
        return f"{strip_text(str(e))} (credentials: {credential_source('hf://' + path)})"
    except (OSError, ValueError, NotImplementedError) as e:
        return f"hf://{path} cannot be read ({type(e).__name__}: {strip_text(str(e))})"
    return "the prefix is empty or matches nothing"


# -- writing ----------------------------------------------------------------------------------
def check_output_url(url: str, option: str, storage_options: Optional[Mapping] = None) -> None:
    """Before any work: the bucket of an output URL exists and these credentials may list it (a
    write cannot be tried without leaving an object behind). Raises OutputError (exit 2)."""
    scheme = scheme_of(url)
    if scheme in ("http", "https"):
        raise OutputError(f"{option} {redact_url(url)}: a web server cannot be written to; use s3:// or gs://")
    if scheme == "hf":
        raise OutputError(f"{option} {redact_url(url)}: {HUB_NOT_WRITTEN}; write locally or to a bucket, then "
                          f"upload with `huggingface-cli upload`")
    fs, path = filesystem(url, storage_options)
    root = path.split("/", 1)[0]
    shown = f"{option} {redact_url(url)}"
    try:
        if not fs.exists(root):  # False also when the lookup is refused (s3fs): info() says which
            fs.info(root)
            raise FileNotFoundError(root)
    except FileNotFoundError:
        raise OutputError(f"{shown}: the bucket {root!r} does not exist (credentials: "
                          f"{credential_source(url, storage_options)})") from None
    except PermissionError as e:
        raise OutputError(f"{shown}: access denied for writing: the bucket {root!r} cannot even be looked up "
                          f"({strip_text(str(e))}); credentials: {credential_source(url, storage_options)}") from None
    except OSError as e:
        raise OutputError(f"{shown}: cannot be reached: {type(e).__name__}: {strip_text(str(e))}") from None
    except Exception as e:  # noqa: BLE001 - botocore's errors are no OSError
        if no_credentials(e):
            raise OutputError(f"{shown}: cannot be written: {missing_credentials(url, storage_options)}") from None
        raise


HUB_NOT_WRITTEN = ("the Hugging Face Hub is not written to directly (every object would be a commit, and it has "
                   "no conditional put for a run's lock)")


def refuse_hub_run_folder(url: str) -> None:
    """A run folder on the Hub (hf://) used in place: `filter`, `dedup` and the loader's scores=
    write into the folder or take its lock. ConfigError (exit 2) saying to download it."""
    if scheme_of(url) == "hf":
        raise ConfigError(f"{redact_url(url)}: a run folder on the Hub is not used in place ({HUB_NOT_WRITTEN}); "
                          f"download it (huggingface-cli download ORG/NAME --repo-type dataset --local-dir DIR) "
                          f"and pass DIR")


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
        raise RemoteOutputError(f"writing {redact_url(url)} failed: {write_failure(e, url, storage_options)}") from None
    return url


def write_failure(e: BaseException, url: str, storage_options: Optional[Mapping] = None) -> str:
    """Why a write to `url` failed, in words; a refusal or no credentials names the credential
    source (never a value)."""
    if no_credentials(e):
        return missing_credentials(url, storage_options)
    if isinstance(e, PermissionError) or status_of(e) in (401, 403):
        return f"access denied for writing ({describe(e)}); credentials: {credential_source(url, storage_options)}"
    return describe(e)


def _discard(f) -> None:
    try:
        f.discard()  # s3fs: abort the multipart upload; gcsfs: cancel the resumable upload
    except Exception:  # noqa: BLE001 - nothing was committed either way
        pass
    f.closed = True  # close() would upload what was buffered


def read_object(url: str, storage_options: Optional[Mapping] = None, limit: int = 64 << 20,
                seconds: Optional[float] = None) -> Optional[bytes]:
    """A small object's bytes (a sizes.json, a lock), or None when there is none. Within `seconds`
    (default: RemoteOptions' answer_seconds) or a TimeoutError: a server that takes the connection
    and never answers held the read for the client's own timeouts (aiohttp's: 5 minutes)."""
    seconds = RemoteOptions().answer_seconds if seconds is None else seconds
    if remote_s3.serves(url, storage_options):  # botocore itself; its client made here, not in _within's thread
        remote_s3.client(storage_options, timeout=seconds)

        def read() -> Optional[bytes]:
            try:
                return remote_s3.read_whole(url, storage_options, limit, seconds)
            except Exception as e:  # noqa: BLE001 - botocore's failures without an answer are no OSError
                if isinstance(e, OSError) or no_credentials(e):
                    raise
                raise OSError(describe(e)) from e  # a store not reached: cannot be read, as s3fs says it
    else:
        fs, path = filesystem(url, storage_options)

        def read() -> Optional[bytes]:
            with fs.open(path, "rb") as f:
                return f.read(limit)
    try:
        if not seconds:
            return read()
        return _within(read, seconds, redact_url(url))
    except FileNotFoundError:
        return None


def _within(call, seconds: float, shown: str):
    """call() in a daemon thread, its result or exception, or a TimeoutError after `seconds` (the
    thread is left to the client's own timeout: a blocking read cannot be interrupted)."""
    import concurrent.futures
    import threading
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run():
        try:
            future.set_result(call())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            future.set_exception(e)
    threading.Thread(target=run, name="wdsfilter-read-object", daemon=True).start()
    try:
        return future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"{shown}: no answer in {seconds:g}s") from None
