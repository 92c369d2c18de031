"""The validator's fast path over a local shard's members (plain or gzip-compressed tar).

Python's tarfile (behind reading.iter_tar, which the stages use) spends more time per member on
header parsing than the validator's checks take; here an ordinary header is parsed with a few
slices. Only the ordinary is handled: regular files, directories and links, GNU long names and
pax path/size records. Anything else (a sparse member, a base-256 size, a shard cut short, ...)
raises Unusual, and check_shard reads the shard again through
reading.iter_tar, so what is reported on an unusual shard is exactly what the stages see.

One thing is reported here that tarfile passes over in silence: a shard whose archive ends early
(a corrupt member header, or an end-of-archive block followed by more data: a hole of zeros from a
failed copy, or two tars concatenated). tarfile stops there as if the shard were complete; the
members after it are lost to training, so the validator says so.

Yields the same items as reading.iter_tar: {"fname", "data", "__url__"} per regular member, then
a reading.TarEnd. Members over their byte cap (members.MemberCaps) and link, device and FIFO
members come as the stages' reader gives them: no bytes, a "__skip__" reason. A member whose
declared size runs past the end of the file is never allocated (Unusual: iter_tar reports it).
"""
from __future__ import annotations

import os
import zlib
from zlib import adler32
from typing import IO, Iterator, Optional, Tuple

from ..stream.members import MemberCaps
from ..storage.decompress import DecompressionCapError, open_layers
from ..stream.reading import TarEnd, oversized_member, special_member
from ..storage.tars import MAX_EXTENDED_HEADER, MAX_NAME
from ..storage.remote import RemoteReadError

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos: tarfile skips no data
_SPECIAL = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a device file", b"4": "a device file",
            b"6": "a FIFO (named pipe)"}
_SKIP_CHUNK = 1 << 20
_PAX_IGNORED = {"mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment", "mode"}


class Unusual(Exception):
    """The shard needs tarfile's full treatment (reading.iter_tar)."""


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # base-256 (sizes over 8 GiB)
        raise Unusual("base-256 number")
    try:
        value = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise Unusual("malformed number") from None
    if value < 0:  # "-1": read(-1) would read the rest of the shard into memory
        raise Unusual("negative number")
    return value


def _byte_sum(buf: bytes) -> int:
    """sum(buf) for a 512-byte block at C speed: adler32's low half is 1 + the byte sum mod 65521,
    exact for 256 bytes (at most 65280)."""
    return (adler32(buf[:256]) & 0xFFFF) + (adler32(buf[256:]) & 0xFFFF) - 2


def _checksum_ok(buf: bytes) -> bool:
    try:
        stored = int(buf[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    unsigned = 256 + _byte_sum(buf) - sum(buf[148:156])
    if stored == unsigned:
        return True
    signed = 256 + sum(b - 256 if b > 127 else b for b in buf[:148] + buf[156:])  # rare: old writers
    return stored == signed


def _pax(data: bytes) -> dict:
    """pax records ("%d %s=%s\\n") -> {keyword: value} for the keywords that change a member's
    name or size; Unusual for those this reader does not follow."""
    found, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        try:
            space = data.index(b" ", pos)
            length = int(data[pos:space])
        except ValueError:
            raise Unusual("malformed pax record") from None
        if length <= space - pos:
            raise Unusual("malformed pax record")
        keyword, _, value = data[space + 1:pos + length - 1].partition(b"=")
        key = keyword.decode("utf-8", "surrogateescape")
        if key in ("path", "size", "linkpath"):
            found[key] = value.decode("utf-8", "surrogateescape")
        elif key not in _PAX_IGNORED and not key.startswith(("SCHILY.", "LIBARCHIVE.")):
            raise Unusual(f"pax keyword {key}")
        pos += length
    return found


def _file_size(stream: IO[bytes]) -> Optional[int]:
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        size = getattr(stream, "size", None)  # a remote shard (remote.RemoteShard): the object's size
        return size if isinstance(size, int) else None


def iter_members(stream: IO[bytes], url: str, caps: Optional[MemberCaps] = None) -> Iterator["dict | TarEnd"]:
    try:
        import lzma
        opened = open_layers(stream, caps.decompressed if caps else 1 << 62)
        size = _file_size(stream) if opened is stream else None  # known for a plain file or object only
        yield from _members(opened, url, caps, size)  # no wrapper per member: _members counts what it yields
    except RemoteReadError as e:  # opening it failed, before any member
        yield _remote_failed(url, e, 0, "")
    except (OSError, EOFError, zlib.error, lzma.LZMAError, DecompressionCapError) as e:  # iter_tar words it
        raise Unusual(str(e)) from None


def _remote_failed(url: str, error: RemoteReadError, items: int, name: str) -> TarEnd:
    """The store failed for good, not the tar (reading it again would not help): the shard ends
    after the `items` items yielded, the last one `name`."""
    message = f"{type(error).__name__}: {error} at member {name or '(header)'}"
    return TarEnd(url, items, message, name, failed=message)


def _members(f: IO[bytes], url: str, caps: Optional[MemberCaps], file_size: Optional[int]) -> Iterator["dict | TarEnd"]:
    read = f.read
    count, offset, last = 0, 0, ""
    items, named = 0, ""  # the items yielded and the last one's name: where a remote read failed
    try:
        while True:
            header, offset = _header(read, offset)
            if header is _END:
                yield _end(f, url, count, offset, last)
                return
            if header is _CORRUPT:
                yield TarEnd(url, count, _corrupt_header_text(offset, last), last)
                return
            kind, name, link, size, blocks = header
            if kind in _REGULAR:
                if file_size is not None and offset + size > file_size:
                    raise Unusual("declared size past the end of the file")  # never allocated; iter_tar words it
                why = caps.over(name, size) if caps is not None and size > caps.floor else None
                if why:
                    _skip(f, blocks)
                    item = oversized_member(name, why, url)
                else:
                    data = read(size)
                    pad = blocks - size
                    if len(data) < size or (pad and len(read(pad)) < pad):
                        raise Unusual("cut in member data")  # iter_tar names the member in the stages' words
                    item = {"fname": name, "data": data, "__url__": url}
                offset += blocks
                count += 1
                last = named = name
                items += 1
                yield item
            elif kind in _NO_DATA:
                last = name
                if kind in _SPECIAL:
                    what = _SPECIAL[kind] + (f" to {link!r}" if kind in (b"1", b"2") else "")
                    items += 1
                    named = name
                    yield special_member(name, what, url)
            else:
                raise Unusual(f"member type {kind!r}")
    except RemoteReadError as e:
        yield _remote_failed(url, e, items, named)


# What _header() finds instead of a member: the end-of-archive block, a header with a bad checksum.
_END, _CORRUPT = "end", "corrupt"


def _header(read, offset: int):
    """The next member header at byte `offset`, its extended headers (GNU long name, pax path and
    size) applied: ((kind, name, link, size, padded size), the offset after it); or (_END or
    _CORRUPT, the offset of that block). Unusual for what tarfile has to read."""
    long_name = pax = None
    while True:
        buf = read(BLOCK)
        if len(buf) < BLOCK:
            raise Unusual("cut at a member header")  # iter_tar says it in the stages' words
        if buf == _ZERO:
            if long_name is not None or pax is not None:
                raise Unusual("end of archive after an extended header")
            return _END, offset
        if not _checksum_ok(buf):
            if offset == 0:
                raise Unusual("not a tar")  # tarfile: ReadError, the shard is unreadable
            return _CORRUPT, offset
        kind = buf[156:157]
        size = _number(buf[124:136])
        blocks = -(-size // BLOCK) * BLOCK
        offset += BLOCK
        if kind in (b"L", b"x", b"g"):
            if size > MAX_EXTENDED_HEADER:
                raise Unusual("huge extended header")  # iter_tar reports the damage
            data = read(blocks)
            if len(data) < blocks:
                raise Unusual("cut in an extended header")
            offset += blocks
            data = data[:size]
            if kind == b"L":
                if long_name is not None or pax is not None:
                    raise Unusual("stacked extended headers")
                long_name = _name(data)
            elif kind == b"x":
                if pax is not None or long_name is not None:
                    raise Unusual("stacked extended headers")
                pax = _pax(data)
            elif _pax(data):
                raise Unusual("global pax path/size")
            continue
        if kind == b"K":
            raise Unusual("GNU long link")
        name = _name(buf[0:100])
        if buf[345:346] != b"\0" and buf[257:263] == b"ustar\x00":
            # A ustar prefix. Only a POSIX ustar header has one (as reading.ShardTarInfo reads
            # them): in an old-GNU header the same bytes are times (GNU tar -g fills them).
            name = _name(buf[345:500]) + "/" + name
        if long_name is not None:
            name = long_name
        link = _name(buf[157:257])
        if pax is not None:
            link = pax.get("linkpath", link)
            if "path" in pax:
                name = pax["path"].rstrip("/")
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise Unusual("pax size") from None
                if size < 0:
                    raise Unusual("negative pax size")
                blocks = -(-size // BLOCK) * BLOCK
        if len(name) > MAX_NAME:
            raise Unusual("name too long")  # iter_tar reports the damage
        if kind == b"\0" and name.endswith("/"):
            kind = b"5"  # old V7 directories
        return (kind, name, link, size, blocks), offset


def _corrupt_header_text(offset: int, last: str) -> str:
    return (f"ReadError: the member header at byte {offset} (after member {last or '(none)'}) is corrupt (bad "
            f"checksum); tar readers stop there as if the shard ended and lose every member after it")


def _skip(f: IO[bytes], n: int) -> None:
    """Move past n bytes of member data without keeping them (an over-cap member)."""
    if hasattr(f, "seekable") and f.seekable():
        f.seek(n, 1)  # the caller checked the file holds them
        return
    while n:
        chunk = f.read(min(n, _SKIP_CHUNK))
        if not chunk:
            raise Unusual("cut in member data")
        n -= len(chunk)


def _end(f: IO[bytes], url: str, count: int, offset: int, last: str) -> TarEnd:
    """At the first end-of-archive block (at `offset`): the rest must be zeros (the second block,
    then padding to the record size), or readers lose what follows."""
    rest, first = _after_end(f)
    if first is None:
        return TarEnd(url, count, None, "")
    return TarEnd(url, count, f"ReadError: the tar ends at byte {offset} (after member {last or '(none)'}) but "
                                f"{rest - first} more byte(s) of data follow from byte {offset + BLOCK + first}: tar "
                                f"readers stop at the end-of-archive block and lose them (a hole of zeros from a "
                                f"failed copy, or tars concatenated?)", last)


def _after_end(f: IO[bytes]) -> Tuple[int, Optional[int]]:
    """(bytes after the first end-of-archive block, where the first nonzero one is among them or
    None): read to the end of the file."""
    rest = 0
    first = None
    while True:
        try:
            chunk = f.read(1 << 20)
        except (OSError, EOFError):
            break  # what follows the archive is unreadable: readers never look at it
        if not chunk:
            break
        if first is None and chunk.count(0) != len(chunk):
            first = rest + len(chunk) - len(chunk.lstrip(b"\0"))
        rest += len(chunk)
    return rest, first
