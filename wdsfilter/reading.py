"""Stage 1 of every pipeline: shard URLs -> tar members -> samples (dicts of extension -> bytes).

Built on webdataset's stage protocol (generators curried by `pipelinefilter`) rather than its tar
iterator, so every problem is attributed to a shard and a member and counted, never raised into
the training loop: a truncated tar keeps the samples before the break, and members of one key a
few members apart are merged instead of becoming two half-samples.
"""
from __future__ import annotations

import tarfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from .config import StageConfig
from .errors import UnsafeInputError
from .naming import split_name
from .shards import open_shard
from .tally import Tally

# Extensions whose default webdataset decoders execute code (pickle, torch.load).
UNSAFE_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "mp", "msgpack", "ten", "joblib", "npz"})
STAGE = "read"


def is_unsafe_ext(ext: str) -> bool:
    return ext.rsplit(".", 1)[-1] in UNSAFE_EXTS


@dataclass
class ShardEnd:
    """Marker after the last member of a shard; `error` is set when the shard broke off."""

    url: str
    members: int
    error: Optional[str] = None
    # Where it broke: the member being read, or the last member read before a cut header ("" when
    # no member header could be read). The validator names it in its truncated_tar finding.
    member: str = ""


class _EndAwareTarInfo(tarfile.TarInfo):
    """Python's tarfile ends iteration silently when a shard is cut at or inside a header; this
    records how the archive ended so a cut shard is reported instead of looking complete."""

    @classmethod
    def fromtarfile(cls, tar):
        try:
            return super().fromtarfile(tar)
        except tarfile.EOFHeaderError:
            tar.wds_end = "end-of-archive"
            raise
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError) as e:
            tar.wds_end = f"cut at a member header ({e})"
            raise
        except tarfile.InvalidHeaderError as e:  # tarfile ends there too, as if the shard were complete
            tar.wds_end = f"corrupt member header at byte {tar.offset} ({e})"
            raise


def _data_after_end(tar) -> Optional[int]:
    """Byte offset of the end-of-archive block if non-zero data follows it, else None. A zeroed
    block inside a shard, or a second tar appended to it, reads to tarfile as the end of the
    archive; only the rest of the stream tells (usually a few KB of zero padding)."""
    end = tar.offset
    while True:
        chunk = tar.fileobj.read(1 << 20)
        if not chunk:
            return None
        if chunk.count(0) != len(chunk):
            return end


def iter_tar(stream, url: str) -> Iterator["dict | ShardEnd"]:
    """Yield {"fname", "data", "__url__"} for each regular member, then a ShardEnd."""
    count = 0
    current = ""
    try:
        tar = tarfile.open(fileobj=stream, mode="r|*", tarinfo=_EndAwareTarInfo)
        for info in tar:
            current = info.name
            if not info.isreg():
                continue
            data = tar.extractfile(info).read()
            count += 1
            yield {"fname": info.name, "data": data, "__url__": url}
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
            yield ShardEnd(url, count, f"ReadError: tar {end} after member {last or '(none)'}", last)
            return
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        yield ShardEnd(url, count, f"{type(e).__name__}: {e} at member {current or '(header)'}", current)
        return
    yield ShardEnd(url, count)


def tar_members(src: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator["dict | ShardEnd"]:
    """dict(url=...) -> members of each shard, ending each shard with a ShardEnd marker."""
    for item in src:
        url = item["url"]
        try:
            stream = open_shard(url, cfg.allow_pipe, cfg.allow_remote)
        except UnsafeInputError:
            raise
        except OSError as e:
            tally.shard_opened(url)
            tally.drop("unreadable_shard", STAGE, url, "", f"{e}; check the path and permissions")
            continue
        tally.shard_opened(url)
        try:
            yield from iter_tar(stream, url)
        finally:
            try:
                stream.close()
            except OSError as e:  # a pipe: command or download that failed: its read error is counted already
                tally.note("shard_command_failed", STAGE, url, "", f"{e}; check the command or URL")


def group_samples(members: Iterable["dict | ShardEnd"], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    """Members -> samples {"__key__", "__url__", ext: bytes, ...}, extensions lower-cased.

    Holds up to cfg.group_window open samples so that non-adjacent members of one key are merged
    (counted as `nonadjacent_key`); a key that comes back after its sample left the window is a
    half-sample, counted the same way, and the select stage drops it with the reason it lacks.
    """
    window = cfg.group_window
    rekey = cfg.rekey
    allow_unsafe = cfg.allow_unsafe
    open_samples: "OrderedDict[str, dict]" = OrderedDict()
    emitted: set = set()
    last_key = None
    for m in members:
        if isinstance(m, ShardEnd):
            for sample in open_samples.values():
                tally.sample_read()
                yield sample
            open_samples.clear()
            emitted.clear()
            last_key = None
            if m.error:
                tally.drop("truncated_tar", STAGE, m.url, "",
                           f"{m.error}; {m.members} member(s) read before the break were kept. "
                           f"Re-create or re-download this shard")
            if cfg.emit_rejects:
                yield {"__marker__": "shard_end", "__url__": m.url, "__key__": "",
                       "members": m.members, "error": m.error}
            continue
        fname, url = m["fname"], m["__url__"]
        key, ext = split_name(fname, rekey)
        if key is None:
            tally.note("no_extension", STAGE, url, fname, "member has no extension or is a dotfile; ignored")
            continue
        lext = ext.lower()
        sample = open_samples.get(key)
        if sample is None:
            if key in emitted:
                tally.note("nonadjacent_key", STAGE, url, fname,
                           f"key {key!r} came back after its sample was complete; it makes a half-sample")
            sample = {"__key__": key, "__url__": url}
            open_samples[key] = sample
            if len(open_samples) > window:
                _, done = open_samples.popitem(last=False)
                emitted.add(done["__key__"])
                tally.sample_read()
                yield done
        elif key != last_key:
            tally.note("nonadjacent_key", STAGE, url, fname, f"members of key {key!r} are not adjacent; merged")
        last_key = key
        if lext in sample:
            tally.note("duplicate_member", STAGE, url, fname, "duplicate member name; the first was kept")
            continue
        if not m["data"]:
            tally.note("empty_member", STAGE, url, fname, "zero-byte member ignored")
            continue
        if not allow_unsafe and lext.rsplit(".", 1)[-1] in UNSAFE_EXTS:
            tally.note("unsafe_member", STAGE, url, fname, "pickle/torch payload not loaded")
            continue
        sample[lext] = m["data"]
    for sample in open_samples.values():
        tally.sample_read()
        yield sample
