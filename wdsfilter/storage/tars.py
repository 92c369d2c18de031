"""Tar files as every reader and writer here handles them, one rule each: how a member header is
parsed (`ShardTarInfo`: names as GNU tar reads them, extended headers and names bounded, how the
archive ended recorded), where the members of a shard lie (`member_ranges`), how a member is copied
as stored (`copy_range`, `Headers` for a copy under a new name) and how a written archive ends
(`tar_end`), and how a compressed shard is written the same in every run (`GzipNoName`).

The readers (reading.py, validate's tar_reader, tarsubset.py, the report's thumbnails) parse with
ShardTarInfo; the writers that copy members byte for byte (score's filtered shards, shardcopy.py;
filter's reshard; sort-shard) use the rest.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import struct
import tarfile
from typing import List, Tuple

from .decompress import compression
from .remote import RemoteReadError
from ..core.specs import split_name


class MemberCut(EOFError):
    """The source ends inside a member (or where a member header should be)."""


class ShardTarInfo(tarfile.TarInfo):
    """How every wdsfilter reader parses a tar header (tarfile.open(..., tarinfo=ShardTarInfo)):
    names as GNU tar reads them, extended headers bounded, and how the archive ended recorded.
    Python's tarfile ends iteration silently when a shard is cut at or inside a header; this
    records how the archive ended so a cut shard is reported instead of looking complete."""

    @classmethod
    def fromtarfile(cls, tar):
        try:
            info = super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.wds_end = "end-of-archive"
            raise
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError) as e:
            tar.wds_end = f"cut at a member header ({e})"
            raise
        except tarfile.InvalidHeaderError as e:  # tarfile ends there too, as if the shard were complete
            tar.wds_end = f"corrupt member header at byte {tar.offset} ({e})"
            raise
        if info.size < 0:  # from a pax size record; tarfile would read the member as if it were empty
            tar.wds_end = f"corrupt member header before byte {tar.offset} (negative size {info.size})"
            raise tarfile.InvalidHeaderError(f"negative size {info.size}")
        if len(info.name) > MAX_NAME:
            tar.wds_end = (f"corrupt member header before byte {tar.offset} (a name of {len(info.name):,} characters, "
                           f"over {MAX_NAME:,}: every reader keeps the keys of a shard, and a gzipped shard of "
                           f"such names is a memory bomb)")
            raise tarfile.InvalidHeaderError("name too long")
        return info

    @classmethod
    def frombuf(cls, buf, encoding, errors):
        """tarfile joins the ustar prefix field (bytes 345-500) to the name in any header. In an
        old-GNU header (GNU tar's default format, magic "ustar  ") those bytes are the access and
        change times, which `tar -g` (incremental backups) fills: the names would become
        "<atime>/./s0.jpg" and one sample's members would get different keys. GNU tar and bsdtar
        read a prefix only in a POSIX ustar header (magic "ustar\\0"); so does this."""
        info = _plain_file_header(cls, buf, encoding, errors)
        if info is not None:
            return info
        info = super().frombuf(buf, encoding, errors)
        if info.size < 0:  # tarfile reads "-1" in the size field; GNU tar: "out of off_t range"
            raise tarfile.InvalidHeaderError(f"negative size {info.size}")
        if buf[257:263] != b"ustar\x00" and buf[345:346] != b"\x00" and info.type not in tarfile.GNU_TYPES:
            name = tarfile.nts(buf[0:100], encoding, errors)
            info.name = name.rstrip("/") if info.isdir() else name
        return info

    # tarfile reads a long-name or pax header whole, whatever size it declares: a hostile one
    # (a few KB declaring gigabytes) would be read into memory. Real ones are a few hundred bytes.
    def _proc_gnulong(self, tar):
        _check_extended(self)
        return super()._proc_gnulong(tar)

    def _proc_pax(self, tar):
        _check_extended(self)
        return super()._proc_pax(tar)


# A regular file's header in the forms GNU tar, bsdtar, Python's tarfile and webdataset's writers
# give it (POSIX ustar or old GNU magic, octal numbers): parsed in one unpack, a third of the time of
# tarfile.frombuf, which is a third of reading a small member (each sample is a few). The result is
# frombuf's (with ShardTarInfo's prefix rule); any other header (another type, base-256 numbers,
# no magic, a checksum that does not match at once) is parsed the ordinary way, which names what
# is wrong with it. tests/test_tar_headers.py holds the two to the same result on real and damaged headers.
_HEADER = struct.Struct("100s8s8s8s12s12s8s1s100s8s32s32s8s8s155s12x")
_POSIX, _OLD_GNU = b"ustar\x0000", b"ustar  \x00"
_OCTAL = b"01234567 \x00"


def _plain_file_header(cls, buf: bytes, encoding: str, errors: str):
    """A `cls` (TarInfo) of the header `buf` as frombuf makes it, or None: parse it that way."""
    if len(buf) != tarfile.BLOCKSIZE:
        return None
    (name, mode, uid, gid, size, mtime, chksum, kind, linkname, magic, uname, gname, devmajor, devminor,
     prefix) = _HEADER.unpack(buf)
    if kind not in (tarfile.REGTYPE, tarfile.AREGTYPE) or magic not in (_POSIX, _OLD_GNU):
        return None
    numbers = (mode, uid, gid, size, mtime, chksum, devmajor, devminor)
    if b"".join(numbers).translate(None, _OCTAL):
        return None
    try:
        values = [int(field.split(b"\x00", 1)[0].strip() or b"0", 8) for field in numbers]
        texts = [field.split(b"\x00", 1)[0].decode(encoding, errors) for field in (name, linkname, uname, gname, prefix)]
    except (ValueError, LookupError):
        return None
    if values[5] != 256 + sum(buf) - sum(buf[148:156]):  # the unsigned sum (frombuf also takes a signed one)
        return None
    if kind == tarfile.AREGTYPE and texts[0].endswith("/"):
        return None  # an old (V7) directory
    info = cls()
    info.mode, info.uid, info.gid, info.size, info.mtime, info.chksum, info.devmajor, info.devminor = values
    info.name, info.linkname, info.uname, info.gname = texts[:4]
    info.type = kind
    if magic == _POSIX and texts[4]:
        info.name = texts[4] + "/" + info.name
    return info


MAX_EXTENDED_HEADER = 1 << 20
# Longest member name (PATH_MAX): the readers hold a shard's keys (duplicates, returning keys), and
# 1,000 names of 1 MB (GNU long names; 4.5 MB gzipped) took 2.4 GB to validate, 1 GB to read.
MAX_NAME = 4096


def _check_extended(info: tarfile.TarInfo) -> None:
    if info.size > MAX_EXTENDED_HEADER:
        raise tarfile.SubsequentHeaderError(f"an extended (long name or pax) header declares {info.size:,} bytes; "
                                            f"the tar is damaged")


# -- members copied as stored (sort-shard, the filtered shards, filter's shards) --------------------------
TAR_BLOCK = 512
TAR_RECORD = 20 * TAR_BLOCK  # tar's record size: archives are padded to a multiple of it
COPY_CHUNK = 1 << 20


def tar_end(written: int) -> bytes:
    """What ends a tar archive whose members (headers included) take `written` bytes: two zero
    blocks, padded to a whole record, as GNU tar and tarfile end theirs."""
    return b"\0" * (2 * TAR_BLOCK + (-(written + 2 * TAR_BLOCK)) % TAR_RECORD)


def copy_range(src, start: int, end: int, out) -> int:
    """Copy src[start:end] to `out` a chunk at a time (`src` moved to `start` first where it is
    elsewhere); returns the bytes copied. EOFError where `src` ends before `end`: the caller says
    which shard and member, and what to do (MemberCut is an EOFError)."""
    if src.tell() != start:
        src.seek(start)
    left = end - start
    while left:
        data = src.read(min(left, COPY_CHUNK))
        if not data:
            raise MemberCut(f"the source ends {left:,} bytes short of byte {end:,}")
        out.write(data)
        left -= len(data)
    return end - start


class Headers:
    """Member headers of an open source, parsed where a member starts (long names and pax
    headers included). Parsing only moves forward from where the copy is, so a compressed
    source is never decompressed again from its start."""

    def __init__(self, src):
        self.src = src
        self.tar = None

    def at(self, start: int) -> tarfile.TarInfo:
        if self.tar is None:  # opening reads the archive's first header (and a global pax header) from byte 0,
            if self.src.tell() != 0:  # before the first seek: a streamed source never goes back
                self.src.seek(0)
            self.tar = tarfile.open(fileobj=self.src, mode="r:", tarinfo=ShardTarInfo)
            first, self.tar.firstmember = self.tar.firstmember, None  # else next() hands it back again
            self.tar.members = []
            if first is not None and first.offset == start:
                return first
        if self.src.tell() != start:
            self.src.seek(start)
        self.tar.offset = start
        self.tar.members = []  # one header held at a time
        info = self.tar.next()
        if info is None:
            raise MemberCut(f"no member header at byte {start:,}: the shard ends there")
        return info


class GzipNoName(gzip.GzipFile):
    """A gzip file written the same in every run, as `gzip -n` writes it: no file name in the
    header (gzip.open would store the temporary's, `.x.tar.gz.tmp-PID`, which `gunzip -N`
    restores) and mtime 0 (not the time of writing), so a filtered copy of a shard has the same
    bytes whether written by one run or by a run resumed after a kill."""

    def __init__(self, path: str, mode: str):
        self._file = open(path, mode)
        super().__init__(filename="", mode=mode, fileobj=self._file, mtime=0)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._file.close()


OPENERS = {"gzip": GzipNoName, "bz2": bz2.open, "xz": lzma.open}


def tar_opener(path: str):
    """How to open the tar inside `path` (and its filtered copy) by its compression."""
    with open(path, "rb") as f:
        return OPENERS.get(compression(f.read(6)), open)


def member_ranges(path, rekey: str, exts: bool = False) -> Tuple[int, List[tuple]]:
    """(offset of the first member, [(start, end, key)] of each regular member), in tar order.
    start is the first header byte (long-name/pax headers included), end the padded data end.
    exts: (start, end, key, extension) instead (filter's dataset card).
    A shard cut short yields the members read before the break. `path`: a file, or a stream read
    front to back (a remote source; decompressed here), whose failed read is raised, not taken
    for the shard's end."""
    ranges: List[Tuple[int, int, str]] = []
    first = None
    streamed = not isinstance(path, (str, os.PathLike))
    try:
        with (tarfile.open(fileobj=path, mode="r|*", tarinfo=ShardTarInfo) if streamed else
              tarfile.open(path, "r:*", tarinfo=ShardTarInfo)) as tar:
            for info in tar:
                if streamed:
                    tar.members = []  # names and offsets only: a TarInfo holds its pax headers
                if first is None:
                    first = info.offset
                if not info.isreg():
                    continue
                key, ext = split_name(info.name, rekey)
                if key is None:
                    continue
                # where tarfile found the next header: a sparse member's size is its expanded size
                ranges.append((info.offset, tar.offset, key, ext) if exts else (info.offset, tar.offset, key))
    except RemoteReadError:
        raise  # the store failed (or the object changed): not a shard cut short
    except (tarfile.TarError, EOFError, OSError):
        pass  # a cut shard: keep what was indexed; the copy checks each range is complete
    return (first or 0), ranges


class Forward:
    """A stream read front to back whose seek() goes forward by reading through (a remote source
    behind its decompressor): the members are copied in tar order, so it never goes back."""

    def __init__(self, f):
        self.f, self.pos = f, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0 or offset < self.pos:
            raise OSError(f"a streamed source is read forward only (at byte {self.pos:,}, asked for {offset:,})")
        while self.pos < offset and self.read(min(offset - self.pos, COPY_CHUNK)):
            pass
        return self.pos
