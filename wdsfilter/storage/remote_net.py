"""Why a store or web server could not be reached, named as what it is: the host name not resolved,
the connection refused, no answer in time, a TLS failure. Told apart from an object that is
missing or forbidden (which a server answered), so a network failure is never reported as "does
not exist ... upload it".

A host whose name does not resolve, or that refuses the connection or does not answer it, fails
at once (`check_reachable`: one TCP connection before any client is asked; botocore, gcsfs and
huggingface_hub would each retry it for seconds to a minute, printing their own tracebacks).
"""
from __future__ import annotations

import errno
import os
import sys
import threading
import time
from typing import Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ..core.urls import redact_url

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
DEFAULT_HOSTS = {"s3": "s3.amazonaws.com", "gs": "storage.googleapis.com", "gcs": "storage.googleapis.com",
                 "hf": "huggingface.co"}


class RemoteUnreachable(OSError):
    """The store or server could not be reached; `why` says how, in words that do not name the
    object (the same for every shard behind that host)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def unreachable(e: BaseException) -> Optional[str]:
    """How `e` says the endpoint could not be reached, or None when it is another failure (an
    answer from the server: missing, forbidden, an error status)."""
    seen = set()
    host = None
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if host is None and getattr(e, "host", None):
            port = getattr(e, "port", None)
            host = f"{e.host}:{port}" if port else e.host
        name = type(e).__name__
        if _instance(e, "socket", "gaierror") or name == "ClientConnectorDNSError":
            return f"cannot resolve host {host.rpartition(':')[0] or host!r}" if host else \
                "cannot resolve the host name"
        if _instance(e, "ssl", "SSLError") or name in ("ClientConnectorCertificateError", "ClientSSLError", "SSLError"):
            return f"TLS failure ({_short(e)})"
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return f"connection refused by {host}" if host else "connection refused"
        if isinstance(e, TimeoutError) or "Timeout" in name:  # (socket.timeout is TimeoutError)
            return "timed out (no answer)"
        if isinstance(e, OSError) and e.errno in _UNREACHABLE:
            return f"network unreachable ({_short(e)})"
        kwargs = getattr(e, "kwargs", None)  # botocore's EndpointConnectionError keeps its cause there
        inner = kwargs.get("error") if isinstance(kwargs, dict) else None
        e = getattr(e, "os_error", None) or inner or e.__cause__ or e.__context__
    return None


def _instance(e: BaseException, module: str, name: str) -> bool:
    """isinstance(e, module.name) without importing the module (socket and ssl cost ~7 ms, more
    than the rest of a local `filter --dry-run`'s imports of ours): an error of a module not
    imported cannot have been raised."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(e, getattr(loaded, name))


_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN}


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:120] or type(e).__name__


def endpoint_host(url: str, storage_options: Optional[Mapping] = None) -> Optional[str]:
    """The host a request for `url` goes to first: a web URL's own, else the store's endpoint
    (storage options, the environment a user points at a mirror or emulator, or the service's)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("http", "https"):
        return urlsplit(url).hostname
    if scheme not in DEFAULT_HOSTS:
        return None
    given = _endpoint_url(url, storage_options)
    return urlsplit(given if "://" in given else "http://" + given).hostname if given else DEFAULT_HOSTS[scheme]


_reached: Dict[Tuple[str, int], float] = {}  # (host, port) -> when it last answered a connection
_unresolved: Dict[str, Tuple[float, str]] = {}  # host -> (when, why its name did not resolve)
_lock = threading.Lock()
# Seconds a name that did not resolve is believed not to (a resolver with no network can take
# seconds to say so, for each shard); a refused or unanswered connection is asked again each time.
UNRESOLVED_KEPT = 10.0


def endpoint(url: str, storage_options: Optional[Mapping] = None) -> Optional[Tuple[str, int]]:
    """(host, port) a request for `url` goes to first."""
    host = endpoint_host(url, storage_options)
    if not host:
        return None
    scheme = url.split("://", 1)[0].lower()
    raw = url if scheme in ("http", "https") else _endpoint_url(url, storage_options)
    parts = urlsplit(raw if "://" in (raw or "") else ("http://" + raw) if raw else "https://" + host)
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or (80 if parts.scheme == "http" else 443)


def _endpoint_url(url: str, storage_options: Optional[Mapping]) -> Optional[str]:
    """The endpoint URL named for a store (not the service's default), as endpoint_host reads it."""
    scheme = url.split("://", 1)[0].lower()
    options = storage_options or {}
    client = options.get("client_kwargs")
    given = options.get("endpoint_url") or (client.get("endpoint_url") if isinstance(client, Mapping) else None)
    env = {"s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), "gs": ("STORAGE_EMULATOR_HOST",),
           "gcs": ("STORAGE_EMULATOR_HOST",), "hf": ("HF_ENDPOINT",)}.get(scheme, ())
    if scheme == "hf":
        given = options.get("endpoint")
    for name in env:
        given = given or os.environ.get(name)
    return str(given) if given else None


def check_reachable(url: str, shown: str, storage_options: Optional[Mapping] = None,
                    timeout: Optional[float] = None) -> None:
    """Raises RemoteUnreachable when the host `url` is read from has no address, refuses the
    connection or does not answer it within `timeout` (one connection, not a request: the clients
    would retry each for seconds to a minute, botocore and gcsfs printing their own tracebacks). A
    host that answered once is not asked again in this process; a name that did not resolve is
    believed for UNRESOLVED_KEPT seconds. Skipped behind a proxy (the proxy resolves and connects,
    not this machine)."""
    where = endpoint(url, storage_options)
    if where is None or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return
    now = time.monotonic()
    with _lock:
        if where in _reached:
            return
        unresolved = _unresolved.get(where[0])
    cached = unresolved[1] if unresolved and now - unresolved[0] < UNRESOLVED_KEPT else None
    why = cached or _connect(where, timeout)
    with _lock:
        if why is None:
            _reached[where] = now
        elif cached is None and why.startswith("cannot resolve"):
            _unresolved[where[0]] = (now, why)
    if why:
        raise RemoteUnreachable(f"{shown}: cannot be reached: {why}; check the URL or endpoint and the network", why)


def _connect(where: Tuple[str, int], timeout: Optional[float]) -> Optional[str]:
    """Why a TCP connection to (host, port) cannot be made, or None when it can."""
    import socket
    host, port = where
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve host {host!r} ({e.strerror or e})"
    except (OSError, UnicodeError):
        return None  # not the resolver's answer: the client says what is wrong
    last = None
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout or 60.0)
                sock.connect(address)
                return None
        except TimeoutError:
            last = f"timed out (no answer to a connection in {timeout or 60.0:g}s from {host}:{port})"
        except ConnectionRefusedError:
            last = f"connection refused by {host}:{port}"
        except OSError as e:
            last = f"network unreachable ({_short(e)})" if e.errno in _UNREACHABLE else None
    return last


def reach_failure(e: BaseException, shown: str) -> Optional[RemoteUnreachable]:
    """`e` as a RemoteUnreachable naming `shown`, when it is a network failure."""
    if isinstance(e, RemoteUnreachable):
        return e
    why = unreachable(e)
    if why is None:
        return None
    return RemoteUnreachable(f"{shown}: cannot be reached: {why}; check the URL or endpoint and the network", why)


def access_reason(e: BaseException, url: str) -> Optional[Tuple[str, str]]:
    """(kind, reason) when `e` is why a remote object cannot be opened for a reason of access that
    holds for every object behind the same door: the store not reached ("remote_unreachable") or
    refused / no credentials ("remote_access_denied"); None for anything else (a missing object,
    a read that failed). `reason` does not name the object, so two shards can be compared."""
    if isinstance(e, RemoteUnreachable):
        return "remote_unreachable", e.why
    if isinstance(e, PermissionError):
        return "remote_access_denied", str(e).replace(redact_url(url), "").lstrip(": ")
    return None
