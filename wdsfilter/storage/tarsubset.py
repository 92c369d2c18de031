"""Reading only some samples of a local tar shard, by their members' offsets (`wdsfilter score
--retry-failed`: a few failed samples of a big shard).

A shard-list stage (`ReadOnly`) marks a shard's item with the keys wanted; the reader
(reading.tar_members) then opens `subset_stream(file, keys)` instead of the whole file: the
member headers are walked with seeks (the data of other members is never read), and the stream
is the wanted members' blocks, extended headers (GNU long names, pax) included, in their order,
then an end-of-archive. Everything after it (the tar reader, its caps and checks, the stages)
reads it as it reads any tar. A file that cannot be walked so (compressed, cut short, a header
that does not parse) is read whole: the stage after decoding that drops the other samples
(score.ledger.OnlyKeys) keeps the result the same, only slower.
"""
from __future__ import annotations

import io
import tarfile
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

from ..core.specs import split_name
from .tars import ShardTarInfo

ONLY_KEYS = "only_keys"  # a shard item's field: the keys whose members are read
_END = b"\0" * 1024  # a tar's end-of-archive: two zero blocks


class ReadOnly:
    """Picklable shard-list stage: {"url"} items of the shards in `keys` ({url: keys}) get
    ONLY_KEYS; the reader reads only those samples' members where the shard is a local file."""

    def __init__(self, keys: Dict[str, Iterable[str]]):
        self.keys: Dict[str, FrozenSet[str]] = {url: frozenset(k) for url, k in keys.items()}

    def __call__(self, src):
        for item in src:
            keys = self.keys.get(item.get("url"))
            yield item if keys is None else dict(item, **{ONLY_KEYS: keys})


def member_spans(f, keys: FrozenSet[str], rekey: str) -> Optional[List[Tuple[int, int]]]:
    """(start, end) byte ranges of the members of `keys` in the seekable plain tar `f`; None
    when it cannot be walked by seeks, or when a wanted key comes back after other members: the
    subset would put its members side by side, where the reader would group them otherwise
    (then it is read whole)."""
    spans: List[Tuple[int, int]] = []
    seen, last = set(), None
    try:
        tar = tarfile.open(fileobj=f, mode="r:", tarinfo=ShardTarInfo)  # plain tar only; seeks past data
        for info in tar:
            key = split_name(info.name, rekey)[0]
            if key in keys:
                if key != last and key in seen:
                    return None  # a returning key: its grouping depends on what lies between
                seen.add(key)
                end = info.offset_data + (-(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE if info.isreg()
                                          else 0)
                spans.append((info.offset, end))
            last = key
            tar.members = []  # only the spans are kept, not every header of a big shard
        if getattr(tar, "wds_end", "end-of-archive") != "end-of-archive":
            return None  # cut short or a corrupt header: the whole read reports it as it should
    except (tarfile.TarError, OSError, EOFError, ValueError):
        return None
    return spans


class SubsetStream(io.RawIOBase):
    """The bytes of `spans` of `f`, then an end-of-archive; closing it closes `f`."""

    def __init__(self, f, spans: List[Tuple[int, int]]):
        self.f, self.spans, self.at, self.pos = f, list(spans), 0, spans[0][0] if spans else 0
        self.tail = _END

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self.at < len(self.spans) and self.pos >= self.spans[self.at][1]:
            self.at += 1
            if self.at < len(self.spans):
                self.pos = self.spans[self.at][0]
        if self.at < len(self.spans):
            self.f.seek(self.pos)
            data = self.f.read(min(len(b), self.spans[self.at][1] - self.pos))
            if not data:
                raise OSError(f"the shard ended inside a member at byte {self.pos}")
            self.pos += len(data)
        else:
            data, self.tail = self.tail[:len(b)], self.tail[len(b):]
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.f.close()
        super().close()


def subset_stream(f, keys: FrozenSet[str], rekey: str):
    """A stream of only the members of `keys` of the open local shard `f`, or `f` itself, from
    its start, when it cannot be walked by seeks."""
    spans = member_spans(f, keys, rekey)
    f.seek(0)
    if spans is None:
        return f
    return io.BufferedReader(SubsetStream(f, spans), buffer_size=1 << 20)
