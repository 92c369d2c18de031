"""Which version of a web object (http(s)://) a read is of, proven on every response: the rule
that no shard is ever spliced from two versions of an object.

A web server may give an ETag, or only a Last-Modified date, or nothing; it may ignore the
`If-Match` a resumed read sends. So a resumed read is not trusted because it was asked to be
conditional: each response is compared with the first one (its ETag, its Last-Modified, its size
from Content-Range or Content-Length), and a difference is `ObjectChanged`: the shard fails, never
spliced. Where the first response carries no strong validator (no ETag or only a weak `W/` one,
and a Last-Modified less than a second older than the response's Date, which a replacement in the
same second would keep), a read is not resumed mid-object at all: it is asked again from byte 0
and the bytes already handed to the reader are compared, by their SHA-256, with the bytes that
come again (`Prefix`); only the same bytes let it go on.
"""
from __future__ import annotations

import hashlib
import re
from typing import Mapping, Optional

from .remote_errors import ObjectChanged, RangeIgnored

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)


class Identity:
    """The version of one web object a shard is read at: the validators its first response gave
    (compared with the HEAD's that opened it), checked again on every later response."""

    def __init__(self, shown: str, info: Mapping):
        self.shown = shown
        self.size: Optional[int] = info.get("size")
        self.etag: Optional[str] = info.get("ETag")
        self.modified: Optional[str] = info.get("Last-Modified")
        self.seen = False          # a first response was checked and its validators adopted
        # the validators prove a version, so a read may resume (or jump) mid-object: a strong ETag
        # as the HEAD gave it; a Last-Modified needs the Date of a response to be judged
        self.proven = _strong(self.etag, None, None)

    def conditions(self, start: int) -> dict:
        """The request headers that ask an honest server to refuse another version (412)."""
        if self.etag and not self.etag.startswith("W/"):  # If-Match compares strong ETags only
            return {"If-Match": self.etag}
        if start and self.proven and self.modified:
            return {"If-Unmodified-Since": self.modified}
        return {}

    def check(self, status: int, headers: Mapping, start: int) -> None:
        """A response to a GET from byte `start`: raises ObjectChanged unless it is of this
        version, RangeIgnored when it is not the range asked for."""
        got = self._extent(status, headers, start)
        if got is not None and self.size is not None and got != self.size:
            raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,}): its size is now {got:,} "
                                f"bytes, was {self.size:,}; its versions are never mixed: read it again")
        for name, held in (("ETag", self.etag), ("Last-Modified", self.modified)):
            value = headers.get(name)
            if held is not None and value != held:
                now = f"is now {value}" if value is not None else "is no longer given"
                raise ObjectChanged(f"{self.shown} changed while it was read (at byte {start:,}): its {name} {now}, "
                                    f"was {held}; its versions are never mixed: read it again")
        if not self.seen:  # the first response: what it gives (and the HEAD did not) is the identity
            self.etag = self.etag or headers.get("ETag")
            self.modified = self.modified or headers.get("Last-Modified")
            self.proven = _strong(self.etag, self.modified, headers.get("Date"))
            self.seen = True

    def _extent(self, status: int, headers: Mapping, start: int) -> Optional[int]:
        """The object's size the response states (None: not stated), checked to be the range asked."""
        if status == 206:
            m = _CONTENT_RANGE.match(headers.get("Content-Range") or "")
            if m is None or int(m.group(1)) != start:
                raise RangeIgnored(f"{self.shown}: asked for bytes from {start:,}, the server answered "
                                   f"{headers.get('Content-Range')!r}; a read cannot resume there")
            return None if m.group(3) == "*" else int(m.group(3))
        if start:
            raise RangeIgnored(f"the server ignored the Range request (HTTP {status}), so a read cannot resume "
                               f"there; serve it with Range support")
        length = headers.get("Content-Length")
        return int(length) if length and length.isdigit() and not headers.get("Content-Encoding") else None


def _strong(etag: Optional[str], modified: Optional[str], date: Optional[str]) -> bool:
    """RFC 9110 8.8.1-2: a strong ETag proves a version; a Last-Modified only when it is at least a
    second older than the response's Date (a replacement within that second keeps the date)."""
    if etag and not etag.startswith("W/"):
        return True
    if not modified or not date:
        return False
    try:
        from email.utils import parsedate_to_datetime  # (email's package costs a start-up)
        return (parsedate_to_datetime(date) - parsedate_to_datetime(modified)).total_seconds() >= 1
    except (TypeError, ValueError):
        return False


class Prefix:
    """The SHA-256 of the bytes handed to the reader, from byte 0 on: what a read asked again from
    byte 0 must give again before it may go on (an object with no strong validator)."""

    def __init__(self, shown: str):
        self.shown = shown
        self.hash = hashlib.sha256()
        self.end = 0               # bytes hashed, from byte 0

    def add(self, start: int, data: bytes) -> None:
        if start == self.end and data:
            self.hash.update(data)
            self.end += len(data)

    def checker(self) -> "_Again":
        return _Again(self.shown, self.end, self.hash.digest())

    def digest(self) -> str:
        return self.hash.hexdigest()


class _Again:
    """Bytes read again from byte 0, compared with what the reader was handed up to `end`."""

    def __init__(self, shown: str, end: int, digest: bytes):
        self.shown, self.left, self.end, self.digest = shown, end, end, digest
        self.hash = hashlib.sha256()

    def take(self, data: bytes) -> bytes:
        """The part of `data` past the bytes already handed over (raises ObjectChanged once those
        differ from the first read's)."""
        if not self.left:
            return data
        head, data = data[:self.left], data[self.left:]
        self.hash.update(head)
        self.left -= len(head)
        if not self.left and self.hash.digest() != self.digest:
            raise ObjectChanged(f"{self.shown} changed while it was read: read again from byte 0 (the server gives "
                                f"no validator to resume by), its first {self.end:,} bytes differ from those already "
                                f"read; its versions are never mixed: read it again")
        return data
