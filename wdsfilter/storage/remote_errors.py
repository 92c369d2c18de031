"""The errors of reading and writing remote objects, and how a client's error is judged, one rule
for every remote module (remote.py, remote_read.py, remote_version.py, the run folder's mirror):
its HTTP status (`status_of`), whether the read may be retried and after how long (`classify`,
`Retry-After` honoured up to MAX_RETRY_AFTER), and its text as it may be shown (`describe`: short,
URLs redacted)."""
from __future__ import annotations

import time
from typing import Optional, Tuple

from ..core.urls import redact_text

MAX_RETRY_AFTER = 300.0  # a server asking for longer than this is waited on no longer


class RemoteReadError(OSError):
    """A remote shard's read that failed for good (retries exhausted, an error not worth a retry):
    the store's failure, not the tar's; it names the URL, the byte reached and the last error."""


class ObjectChanged(RemoteReadError):
    """The object is not the version the shard was opened at: its bytes are never spliced."""


class RangeIgnored(OSError):
    """A server that answers a Range request with the whole object: a read cannot resume there."""


class RemoteOutputError(OSError):
    """An output in an object store that cannot be written."""


def strip_text(text: str) -> str:
    """A client's error text, short, its URLs redacted (aiohttp's "url='https://...?X-Amz-Signature=...'",
    fsspec's FileNotFoundError(url)): no signature or password reaches a message."""
    return " ".join(redact_text(text).split())[:300]


def status_of(e: BaseException) -> Optional[int]:
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


def retry_after(e: BaseException) -> Optional[float]:
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
                    try:
                        from email.utils import parsedate_to_datetime  # a date in Retry-After: rare
                        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
                    except (TypeError, ValueError):
                        return None
        e = e.__cause__ or e.__context__
    return None


def classify(e: BaseException) -> Tuple[bool, bool, Optional[float]]:
    """(the object changed, the read may be retried, seconds the server asked to wait)."""
    status = status_of(e)
    text = str(e)
    if isinstance(e, RangeIgnored):
        return False, False, None
    if status == 412 or "PreconditionFailed" in text:
        return True, False, None
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return False, False, None
    return False, True, retry_after(e)


def describe(e: BaseException) -> str:
    status = status_of(e)
    text = strip_text(str(e)) or type(e).__name__
    return f"{type(e).__name__}: {text}" + (f" (HTTP {status})" if status and str(status) not in text else "")
