"""Why a store or web server could not be reached, named as what it is: the host name not resolved,
the connection refused, no answer in time, a TLS failure. Told apart from an object that is
missing or forbidden (which a server answered), so a network failure is never reported as "does
not exist ... upload it".

A host name that does not resolve fails at once (`check_resolvable`, before any client is asked:
botocore, gcsfs and huggingface_hub would each retry it for seconds to a minute, printing their
own tracebacks), and the answer is remembered for the process.
"""
from __future__ import annotations

import errno
import os
import socket
import ssl
import threading
from typing import Dict, Mapping, Optional
from urllib.parse import urlsplit

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
        host = host or getattr(e, "host", None)
        name = type(e).__name__
        if isinstance(e, socket.gaierror) or name == "ClientConnectorDNSError":
            return f"cannot resolve host {host!r}" if host else "cannot resolve the host name"
        if isinstance(e, ssl.SSLError) or name in ("ClientConnectorCertificateError", "ClientSSLError", "SSLError"):
            return f"TLS failure ({_short(e)})"
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return f"connection refused by {host}" if host else "connection refused"
        if isinstance(e, (TimeoutError, socket.timeout)) or "Timeout" in name:
            return "timed out (no answer)"
        if isinstance(e, OSError) and e.errno in _UNREACHABLE:
            return f"network unreachable ({_short(e)})"
        kwargs = getattr(e, "kwargs", None)  # botocore's EndpointConnectionError keeps its cause there
        inner = kwargs.get("error") if isinstance(kwargs, dict) else None
        e = getattr(e, "os_error", None) or inner or e.__cause__ or e.__context__
    return None


_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN}


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:120] or type(e).__name__


def endpoint_host(url: str, storage_options: Optional[Mapping] = None) -> Optional[str]:
    """The host a request for `url` goes to first: a web URL's own, else the store's endpoint
    (storage options, the environment a user points at a mirror or emulator, or the service's)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    options = storage_options or {}
    if scheme in ("http", "https"):
        return urlsplit(url).hostname
    client = options.get("client_kwargs")
    endpoint = options.get("endpoint_url") or (client.get("endpoint_url") if isinstance(client, Mapping) else None)
    if scheme == "s3":
        endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    elif scheme in ("gs", "gcs"):
        endpoint = endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
    elif scheme == "hf":
        endpoint = options.get("endpoint") or os.environ.get("HF_ENDPOINT")
    else:
        return None
    if endpoint:
        endpoint = str(endpoint)
        return urlsplit(endpoint if "://" in endpoint else "http://" + endpoint).hostname
    return DEFAULT_HOSTS.get(scheme)


_resolved: Dict[str, Optional[str]] = {}  # host -> why it does not resolve (None: it does)
_lock = threading.Lock()


def check_resolvable(url: str, shown: str, storage_options: Optional[Mapping] = None) -> None:
    """Raises RemoteUnreachable when the host `url` is read from has no address; once per host
    and process. Skipped behind a proxy (the proxy resolves the name, not this machine)."""
    host = endpoint_host(url, storage_options)
    if not host or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return
    with _lock:
        known = host in _resolved
        why = _resolved.get(host)
    if not known:
        try:
            socket.getaddrinfo(host, None)
            why = None
        except socket.gaierror as e:
            why = f"cannot resolve host {host!r} ({e.strerror or e})"
        except (OSError, UnicodeError):
            why = None  # not the resolver's answer: the client says what is wrong
        with _lock:
            _resolved[host] = why
    if why:
        raise RemoteUnreachable(f"{shown}: cannot be reached: {why}; check the URL or endpoint and the network",
                                why)


def reach_failure(e: BaseException, shown: str) -> Optional[RemoteUnreachable]:
    """`e` as a RemoteUnreachable naming `shown`, when it is a network failure."""
    if isinstance(e, RemoteUnreachable):
        return e
    why = unreachable(e)
    if why is None:
        return None
    return RemoteUnreachable(f"{shown}: cannot be reached: {why}; check the URL or endpoint and the network", why)
