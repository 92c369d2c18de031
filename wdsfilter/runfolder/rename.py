"""Copying a kept sample's members into a written shard: as stored (headers and bytes), or with
`filter --unique-keys` under a new key.

Shards whose writer numbers samples per shard (000000, 000001, ... in every shard) give two
output samples the same key once resharded: webdataset, open_clip and HF datasets then take them
for one sample, or refuse the shard. With --unique-keys, output sample j (in the order written)
is key `j` as nine digits or more (000000000, 000000001, ...: unique in the shards of one filter
run, sorted as written, no dot for a key split to trip on); each member gets a new header with
that name (its extension, size, mode, time and owner kept) before its bytes, copied unchanged.
The sample keeps where it came from in its .json: `source_key` and `source_shard` are added to a
JSON object (its other fields, img2dataset's `key`, `url` and `uid` included, are kept); a sample
without a .json gets one holding just these two; a .json that is not a JSON object is copied as
it is (nothing can be added to it).
"""
from __future__ import annotations

import json
import tarfile
from typing import List, Optional, Tuple

from ..core.errors import RunError
from ..core.specs import split_name
from ..storage.tars import TAR_BLOCK as BLOCK, Headers, MemberCut, copy_range
from ..storage.remote import redact_url

JSON_LIMIT = 16 << 20  # a .json bigger than this is copied as it is (never read whole)


class ReshardError(RunError):
    """A source shard does not match its score file any more: the run cannot go on."""


def copy_renamed(src, headers: Headers, ranges: List[Tuple[int, int]], rekey: str, new_key: str, old_key: str,
                 url: str, out) -> Tuple[int, int]:
    """One sample's members under `new_key`, its .json told the old key and shard; (members, bytes)."""
    origin = {"source_key": old_key, "source_shard": redact_url(url)}
    written, members, has_json, first = 0, 0, False, None
    for start, _ in ranges:
        info = headers.at(start)
        if info.issparse():
            raise ReshardError(f"member {info.name!r} of {origin['source_shard']} is a sparse file, which --unique-keys cannot rename; "
                               f"write the shards without --unique-keys")
        ext = split_name(info.name, rekey)[1] or ""
        first = first or info
        name = f"{new_key}.{ext}"
        if ext.lower() == "json":
            has_json = True
            if info.size <= JSON_LIMIT:
                data = _read(src, info.size)
                written += _add(out, name, _with_origin(data, origin), info)
                members += 1
                continue
        written += _add_header(out, name, info.size, info)
        written += copy_range(src, info.offset_data, info.offset_data + info.size, out)
        written += _pad(out, info.size)
        members += 1
    if not has_json:
        written += _add(out, f"{new_key}.json", _json_bytes(origin), first)
        members += 1
    return members, written


def _with_origin(data: bytes, origin: dict) -> bytes:
    try:
        meta = json.loads(data)
    except ValueError:
        return data
    if not isinstance(meta, dict):
        return data
    return _json_bytes({**meta, **origin})


def _json_bytes(value) -> bytes:
    """UTF-8 JSON; text that is not valid Unicode (a lone surrogate: a caption cut inside an
    emoji's escape pair) is written as its \\u escape, as the source had it."""
    try:
        return json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value).encode()


def _read(src, size: int) -> bytes:
    data = src.read(size)
    if len(data) != size:
        raise MemberCut(f"the source ends {size - len(data):,} bytes into a member of {size:,}")
    return data


def _add(out, name: str, data: bytes, like: Optional[tarfile.TarInfo]) -> int:
    n = _add_header(out, name, len(data), like)
    out.write(data)
    return n + len(data) + _pad(out, len(data))


def _add_header(out, name: str, size: int, like: Optional[tarfile.TarInfo]) -> int:
    info = tarfile.TarInfo(name)
    info.size = size
    if like is not None:  # the member's own mode, time and owner
        info.mode, info.mtime = like.mode, like.mtime  # a fractional time kept (a pax header)
        info.uid, info.gid, info.uname, info.gname = like.uid, like.gid, like.uname, like.gname
    buf = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")  # ustar where it fits
    out.write(buf)
    return len(buf)


def _pad(out, size: int) -> int:
    pad = -size % BLOCK
    out.write(b"\0" * pad)
    return pad

