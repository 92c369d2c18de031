"""Stage 1 of every pipeline: shard URLs -> tar members -> samples (dicts of extension -> bytes).

Built on webdataset's stage protocol (generators curried by `pipelinefilter`) rather than its tar
iterator, so every problem is attributed to a shard and a member and counted, never raised into
the training loop: a truncated tar keeps the samples before the break, and members of one key a
few members apart are merged instead of becoming two half-samples.
"""
from __future__ import annotations

import gzip
import io
import lzma
import tarfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Tuple

from .config import StageConfig
from ..storage.decompress import open_layers
from ..core.errors import DataError, UnsafeInputError
from ..core.markers import shard_end_marker
from .members import MemberCaps, gunzip_member, is_unsafe_ext
from ..storage.shards import close_shard, is_local, is_pipe, open_shard
from ..core.specs import key_digest, reserved_ext, split_name
from ..storage.tars import ShardTarInfo
from ..storage.tarsubset import ONLY_KEYS, subset_stream
from ..core.tally import Tally

STAGE = "read"
# Skipped members whose absence explains a sample's drop (the select decision names them); an
# empty or unsafe member is reported with the member and leaves the sample's usual reason.
EXPLAINING_SKIPS = frozenset({"oversized_member", "special_member", "corrupt_member"})
_CHUNK = 1 << 20  # members past this are read (or streamed past) in chunks of this size


@dataclass
class TarEnd:
    """The tar reader's last item of a shard (iter_tar): how many members it read, and where the tar
    broke off (`error`). group_samples turns it into the stream's shard_end marker (core.markers)."""

    url: str
    members: int
    error: Optional[str] = None
    # Where it broke: the member being read, or the last member read before a cut header ("" when
    # no member header could be read). The validator names it in its truncated_tar finding.
    member: str = ""
    # Set when the stream itself failed (a read error, a pipe: command or download that exited
    # with an error, even after sending a whole tar): the shard was not read to its end, so a run
    # must not mark it done. A tar cut inside a file that was read to its end is `error` only.
    failed: Optional[str] = None

    @property
    def not_a_tar(self) -> bool:
        """It broke before the first member header: no tar at all (a git-lfs pointer, an HTML
        error page), as opposed to a tar cut short, even at its first member."""
        return bool(self.error) and not self.members and not self.member


def _data_after_end(tar) -> Optional[int]:
    """Byte offset of the end-of-archive block if non-zero data follows it, else None. A zeroed
    block inside a shard, or a second tar appended to it, reads to tarfile as the end of the
    archive; only the rest of the stream tells (usually a few KB of zero padding). Bytes that do
    not decompress (an error page appended to a .tar.gz) are no tar data a reader would see: every
    member was read, as the validator's fast path says too (tar_reader._after_end)."""
    end = tar.offset
    while True:
        try:
            chunk = tar.fileobj.read(1 << 20)
        except (OSError, EOFError, zlib.error, lzma.LZMAError):
            return None
        if not chunk:
            return None
        if chunk.count(0) != len(chunk):
            return end


def _special(info: tarfile.TarInfo) -> Optional[str]:
    """What a member that is neither a file nor a directory is, in words (None for directories)."""
    if info.issym():
        return f"a symbolic link to {info.linkname!r}"
    if info.islnk():
        return f"a hard link to {info.linkname!r}"
    if info.ischr() or info.isblk():
        return "a device file"
    if info.isfifo():
        return "a FIFO (named pipe)"
    return None


def special_member(fname: str, what: str, url: str) -> dict:
    """The item a reader yields for a link, device or FIFO member: named, with no bytes."""
    return {"fname": fname, "data": b"", "__url__": url,
            "__skip__": ("special_member", f"member is {what}, not a file: tar readers (webdataset too) do not "
                                           f"follow it, so the sample has no bytes for it. Store the file itself")}


def oversized_member(fname: str, why: str, url: str) -> dict:
    """The item a reader yields for a member over its byte cap (streamed past, never read)."""
    return {"fname": fname, "data": b"", "__url__": url, "__skip__": ("oversized_member", why)}


def _read_data(tar, info, tick) -> bytes:
    """A member's bytes. Large ones are read in chunks into one buffer: tarfile's own read joins
    copies of the data and would hold it three times at its peak."""
    if info.issparse():
        return tar.extractfile(info).read()
    src, buf, left = tar.fileobj, io.BytesIO(), info.size
    while left:
        chunk = src.read(min(left, _CHUNK))
        if not chunk:
            raise tarfile.ReadError(_cut(info, left))
        buf.write(chunk)
        left -= len(chunk)
        if tick is not None:
            tick(info.name)
    return buf.getvalue()


def _cut(info, left: int) -> str:
    return (f"unexpected end of data: the member declares {info.size:,} bytes and the data ends after "
            f"{info.size - left:,} (the tar is cut short, or its size field is corrupt)")


def _stream_past(tar, info, tick) -> None:
    """Read past a member's data without keeping it (an over-cap member). A sparse member's size
    is its expanded size; what the archive stores is less (tarfile knows where its data ends)."""
    src, left = tar.fileobj, (tar.offset - info.offset_data) if info.issparse() else info.size
    while left:
        chunk = src.read(min(left, _CHUNK))
        if not chunk:
            raise tarfile.ReadError(_cut(info, left))
        left -= len(chunk)
        if tick is not None:
            tick(info.name)


def iter_tar(stream, url: str, caps: Optional[MemberCaps] = None,
             tick: Optional[Callable[[str], None]] = None) -> Iterator["dict | TarEnd"]:
    """Yield {"fname", "data", "__url__"} for each regular member, then a TarEnd. A member over
    its cap in `caps`, and a link, device or FIFO member, comes with no bytes and a "__skip__"
    (reason, message). `tick(member)` is called as reading goes on (the stages' watchdog)."""
    count = 0
    current = ""
    try:
        mode = "r|*"
        if caps is not None:  # decompressed here, behind the cap: the tar inside must be plain
            stream, mode = open_layers(stream, caps.decompressed), "r|"
        tar = tarfile.open(fileobj=stream, mode=mode, tarinfo=ShardTarInfo)
        for info in tar:
            current = info.name
            if tick is not None:
                tick(current)
            if not info.isreg():
                what = _special(info)
                if what:
                    yield special_member(info.name, what, url)
                tar.members = []
                continue
            size = info.size
            why = caps.over(info.name, size) if caps is not None and size > caps.floor else None
            if why:
                _stream_past(tar, info, tick)
                data = None
            elif size <= _CHUNK:  # the common case, inline: it runs for every member
                data = tar.extractfile(info).read()
            else:
                data = _read_data(tar, info, tick)
            count += 1
            yield oversized_member(info.name, why, url) if why else {"fname": info.name, "data": data, "__url__": url}
            tar.members = []  # streaming: don't keep every TarInfo of a huge shard
        current = ""
        end = getattr(tar, "wds_end", "end-of-archive")
        if end == "end-of-archive":
            at = _data_after_end(tar)
            if at is not None:
                end = (f"end-of-archive block at byte {at} is followed by more data (a zeroed block inside the "
                       f"shard, or a second tar appended to it: re-create the shard; members after it are not read)")
        if end != "end-of-archive":
            last = info.name if count else ""
            yield TarEnd(url, count, f"ReadError: tar {end} after member {last or '(none)'}", last)
            return
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as e:
        message = f"{type(e).__name__}: {e} at member {current or '(header)'}"
        # An OSError is the stream's (gzip's BadGzipFile is bad bytes in a file read to its end).
        stream_failed = isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile)
        yield TarEnd(url, count, message, current, failed=message if stream_failed else None)
        return
    yield TarEnd(url, count)


def _close_failure(url: str, stream, e: OSError) -> str:
    """A real message for a shard stream that fails when closed (a pipe: command's exit status)."""
    status = getattr(stream, "status", None)
    if getattr(stream, "stalled", None):
        return f"the command or download of the shard stalled: {stream.stalled}"
    if is_pipe(url) and status is not None:
        return f"the command {url[5:]!r} exited with status {status}; check the command"
    return f"{type(e).__name__}: {e or 'closing the stream failed'}; check the command or URL"


def tar_members(src: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator["dict | TarEnd"]:
    """dict(url=...) -> members of each shard, ending each shard with a TarEnd marker."""
    caps = MemberCaps(cfg)
    for item in src:
        url = item["url"]
        try:
            stream = open_shard(url, cfg.allow_pipe, cfg.allow_remote, cfg.stream_idle_seconds, cfg.remote_options(),
                                on_retry=lambda message, url=url: tally.note("remote_retries", STAGE, url, "", message))
        except UnsafeInputError:
            raise
        except OSError as e:
            tally.shard_opened(url)
            tally.drop("unreadable_shard", STAGE, url, "", f"{e}; check the path and permissions")
            continue
        if item.get(ONLY_KEYS) is not None and is_local(url):  # only some samples: read by offsets
            stream = subset_stream(stream, item[ONLY_KEYS], cfg.rekey)
        tally.shard_opened(url)
        tick = tally.ticker(url)
        end = None
        abandoned = False
        try:
            for item in iter_tar(stream, url, caps, tick):
                if isinstance(item, TarEnd):
                    end = item  # held until the stream is closed: closing reports a failed command
                else:
                    yield item
        except GeneratorExit:  # the consumer stopped mid-shard (an epoch's end): the command's
            abandoned = True   # SIGPIPE is ours, not its failure
            raise
        finally:
            try:
                close_shard(stream)
            except OSError as e:  # a pipe: command or download that failed (after sending a whole tar, too)
                if abandoned:
                    return
                tally.note("shard_command_failed", STAGE, url, "", _close_failure(url, stream, e))
                if end is not None and (not end.failed or getattr(stream, "stalled", None)):
                    end.failed = getattr(stream, "stalled", None) or f"{type(e).__name__}: {e}"
        if end is not None:
            if end.error and not end.failed and not end.not_a_tar and not is_local(url):
                # A local file cut short reads the same again; a stream cut short may be a transfer
                # that broke off without an error (a download with no length that ends early).
                end.failed = (f"{end.error}; a pipe: command or download whose tar breaks off may have been cut "
                              f"in transfer")
            yield end


def screen_member(m: dict, lext: str, caps: MemberCaps, allow_unsafe: bool) -> Tuple[str, Optional[Tuple[str, str]]]:
    """(extension the sample keeps the member under, None), or (extension, (reason, message)) for
    a member that is not used: empty, unsafe, over its cap, a link, or a .gz that does not open.
    A .gz member is opened here, as webdataset's decoder opens it, within its kind's cap: its
    content replaces m["data"] and it is kept under its plain extension (`txt.gz` -> `txt`)."""
    skip = m.get("__skip__")
    if skip is not None:
        return lext, skip
    data = m["data"]
    if not data:
        return lext, ("empty_member", "zero-byte member ignored")
    if not allow_unsafe and is_unsafe_ext(lext):
        return lext, ("unsafe_member", "pickle/torch payload not loaded")
    if lext.endswith(".gz"):
        plain = lext[:-3]
        try:
            data = m["data"] = gunzip_member(data, caps.limit(caps.kind(plain)), m["fname"])
        except DataError as e:
            return plain, (e.reason, str(e)[len(e.reason) + 2:])
        if not data:
            return plain, ("empty_member", "the .gz member decompresses to zero bytes; ignored")
        return plain, None
    return lext, None


OVERSIZED = "__oversized__"  # a sample past max_sample_bytes: emptied, dropped by the select stage


def _empty(sample: dict, why: str) -> None:
    """Let go of a sample's bytes, keeping its member names (the select stage tells dotted
    basenames, the common cause, from one sample that is just too big)."""
    for ext in sample:
        if not ext.startswith("__"):
            sample[ext] = b""
    sample[OVERSIZED] = why


def _count_broken_shard(end: TarEnd, tally: Tally) -> None:
    if end.not_a_tar:
        tally.drop("unreadable_shard", STAGE, end.url, end.member,
                   f"{end.error}; no member could be read. Is it a tar (a git-lfs pointer file, an "
                   f"HTML error page)? Re-create or re-download it")
    elif end.error:
        tally.drop("truncated_tar", STAGE, end.url, end.member,
                   f"{end.error}; {end.members} member(s) read before the break were kept. "
                   f"Re-create or re-download this shard")


def _member_key(fname: str, url: str, rekey: str, tally: Tally):
    """(key, lower-cased extension) of a member name, or (None, None) for a name that is no
    sample's member (counted)."""
    key, ext = split_name(fname, rekey)
    if key is None:
        tally.note("no_extension", STAGE, url, fname, "member has no extension or is a dotfile; ignored")
        return None, None
    lext = ext.lower()
    reserved = reserved_ext(lext)
    if reserved:
        tally.note("reserved_extension", STAGE, url, fname, reserved)
        return None, None
    return key, lext


def _add_member(sample: dict, m: dict, lext: str, caps: MemberCaps, allow_unsafe: bool, tally: Tally):
    """The member's bytes put into its sample and returned; None where it is not used (screened
    out, a duplicate name, or its sample already emptied: named, not held)."""
    url, fname = m["__url__"], m["fname"]
    screened = m.get("__screened__")
    lext, skip = screened if screened is not None else screen_member(m, lext, caps, allow_unsafe)
    if skip is not None:
        if screened is None:
            tally.note(skip[0], STAGE, url, fname, skip[1])
        if skip[0] in EXPLAINING_SKIPS:
            sample.setdefault("__skipped__", {})[lext] = skip[0]
        return None
    if lext in sample:
        tally.note("duplicate_member", STAGE, url, fname, "duplicate member name; the first was kept")
        return None
    if OVERSIZED in sample:  # emptied: its members are named, not held
        sample[lext] = b""
        return None
    data = sample[lext] = m["data"]
    return data


def group_samples(members: Iterable["dict | TarEnd"], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    """Members -> samples {"__key__", "__url__", ext: bytes, ...}, extensions lower-cased.

    Holds up to cfg.group_window open samples (and cfg.group_bytes of their members) so that
    non-adjacent members of one key are merged (counted as `nonadjacent_key`); a key that comes
    back after its sample left the window is a half-sample, counted the same way, and the select
    stage drops it with the reason it lacks. A member that is not used (screen_member) is counted
    with its reason; an over-cap, link or broken .gz member is listed in the sample's
    "__skipped__" {extension: reason}, so the select stage gives that reason when it was needed.
    Members a caller has screened already carry "__screened__" (the validator's checks do).
    """
    window = cfg.group_window
    budget = cfg.group_bytes
    sample_cap = cfg.sample_bytes
    rekey = cfg.rekey
    allow_unsafe = cfg.allow_unsafe
    caps = MemberCaps(cfg)
    open_samples: "OrderedDict[str, dict]" = OrderedDict()
    held: dict = {}  # key -> bytes its open sample holds
    held_total = 0
    emitted: set = set()  # digests of the keys whose sample is complete (specs.key_digest)
    last_key = None
    for m in members:
        if isinstance(m, TarEnd):
            for sample in open_samples.values():
                tally.sample_read()
                yield sample
            open_samples.clear()
            held.clear()
            held_total = 0
            emitted.clear()
            last_key = None
            _count_broken_shard(m, tally)
            if cfg.emit_rejects:
                yield shard_end_marker(m.url, m.members, m.error, m.failed, m.not_a_tar)
            continue
        fname, url = m["fname"], m["__url__"]
        key, lext = _member_key(fname, url, rekey, tally)
        if key is None:
            continue
        sample = open_samples.get(key)
        if sample is None:
            if key_digest(key) in emitted:
                tally.note("nonadjacent_key", STAGE, url, fname,
                           f"key {key!r} came back after its sample was complete; it makes a half-sample")
            sample = {"__key__": key, "__url__": url}
            open_samples[key] = sample
            if len(open_samples) > window:
                done_key, done = open_samples.popitem(last=False)
                held_total -= held.pop(done_key, 0)
                emitted.add(key_digest(done_key))
                tally.sample_read()
                yield done
        elif key != last_key:
            tally.note("nonadjacent_key", STAGE, url, fname, f"members of key {key!r} are not adjacent; merged")
        last_key = key
        data = _add_member(sample, m, lext, caps, allow_unsafe, tally)
        if data is None:
            continue
        size = len(data) if isinstance(data, (bytes, bytearray)) else 0
        if size:
            held[key] = held.get(key, 0) + size
            held_total += size
            if held[key] > sample_cap:
                held_total -= held.pop(key)
                _empty(sample, f"the members of key {key!r} add up past max_sample_bytes={sample_cap:,} at "
                               f"member {fname}; the sample is dropped")
            while held_total > budget and next(iter(open_samples)) != key:  # never the one being filled
                done_key, done = open_samples.popitem(last=False)
                held_total -= held.pop(done_key, 0)
                emitted.add(key_digest(done_key))
                tally.sample_read()
                yield done
    for sample in open_samples.values():
        tally.sample_read()
        yield sample
