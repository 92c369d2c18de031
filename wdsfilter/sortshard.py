"""`wdsfilter sort-shard IN OUT`: rewrite a shard with each sample's members next to each other
(`sort-shard IN... OUTDIR`: every shard of folders, globs or several files, each into OUTDIR
under its own name).

A shard written with `tar -cf x.tar *.txt *.json *.jpg`, or by archiving a folder in directory
order, scatters the members of one key through the tar; every reader (webdataset, open_clip,
wdsfilter's stages) then sees fragments, and the validator reports `scattered_key`. This writes
the same members, bytes and headers (names, modes, times) unchanged, ordered by key, then by
extension: what GNU `tar --sort=name` gives for ordinary names, and right for --rekey last-dot
names too, where sorting by name alone can split a key.

Memory: one pass over the headers keeps (key, name, offsets) per member, never member bytes or
headers; the copy then reads each member's bytes as stored (headers included) by its offsets, so
a sparse member is written as the input stores it. A compressed input is first decompressed to a
temporary file beside the output. The output appears only when complete (temporary, then rename).
A remote plain tar needs no temporary: one streamed read indexes it, a second copies its members
through the remote reader, jumping to each member (a new GET where the order jumps).
"""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from typing import List

import click

from .core import clihelp
from .core.errors import EXIT_CLEAN, EXIT_RUN_FAILED, EXIT_USAGE, ConfigError, OutputError, RunError
from .storage.decompress import compression
from .core.progress import verbosity, verbosity_options
from .storage.remote import redact_url, RemoteReadError, parse_storage_options
from .storage.shards import is_remote, open_shard, expand_urls
from .core.specs import REKEY_MODES, split_name
from .storage.tars import ShardTarInfo, copy_range, tar_end
from .storage.writing import atomic_path, check_output_file
from .stream.config import StageConfig


@dataclass
class SortResult:
    members: int
    keys: int
    moved: int   # members whose position changed
    skipped: int  # directories, links and other non-file members (readers skip them too)
    scattered: int = 0  # keys whose members were not next to each other in IN
    bytes: int = 0  # member bytes copied, headers included


def _plain_tar(src: str, folder: str) -> "tuple[str, bool]":
    """A seekable uncompressed tar of src: src itself, or a temporary decompressed copy."""
    with open(src, "rb") as f:
        head = f.read(6)
    opener = None
    if head[:2] == b"\x1f\x8b":
        import gzip as opener
    elif head[:3] == b"BZh":
        import bz2 as opener
    elif head.startswith(b"\xfd7zXZ\x00"):
        import lzma as opener
    if opener is None:
        return src, False
    fd, tmp = tempfile.mkstemp(prefix=".sort-shard.tmp-", suffix=".tar", dir=folder)
    with os.fdopen(fd, "wb") as out, opener.open(src, "rb") as data:
        shutil.copyfileobj(data, out, 1 << 20)
    return tmp, True


def sort_shard(src: str, dst: str, rekey: str = "first-dot", storage_options=None) -> SortResult:
    """Write `dst`: the members of `src` (a local path or an s3://, gs://, hf://, http(s):// URL)
    ordered by (key, extension). Raises ConfigError for a missing or unreadable input,
    OutputError for an output that cannot be written, and RunError (exit 3) when a remote IN's
    read fails or the object changes while it is read."""
    if rekey not in REKEY_MODES:
        raise ConfigError(f"rekey must be one of {REKEY_MODES}, got {rekey!r}")
    remote = is_remote(src)
    if not remote and not os.path.isfile(src):
        raise ConfigError(f"shard {src!r} does not exist or is not a file")
    check_output_file(dst, "OUT")
    if not remote and os.path.exists(dst) and os.path.samefile(src, dst):
        raise OutputError(f"OUT {dst!r} is the input shard; write the sorted shard to another file")
    folder = os.path.dirname(os.path.abspath(dst))
    os.makedirs(folder, exist_ok=True)
    if remote:
        done = _sort_remote(src, dst, rekey, storage_options)
        if done is not None:
            return done
    fetched = _fetch(src, folder, storage_options) if remote else None
    try:
        plain, temporary = _plain_tar(fetched or src, folder)
        try:
            return _rewrite(plain, dst, rekey, redact_url(src) if remote else src)
        finally:
            if temporary:
                os.remove(plain)
    finally:
        if fetched:
            os.remove(fetched)


def _open_remote(src: str, storage_options, jumps: bool = False):
    """jumps: a read that jumps from member to member: a read-ahead of one 1 MiB chunk, so that
    each jump abandons at most that much of the GET it leaves."""
    import dataclasses
    options = StageConfig(storage_options=dict(storage_options or {})).remote_options()
    if jumps:
        options = dataclasses.replace(options, readahead=1, block_bytes=min(options.block_bytes, 1 << 20))
    try:
        return open_shard(src, remote=options)
    except OSError as e:
        raise ConfigError(f"cannot read {redact_url(src)}: {e}") from None


def _sort_remote(src: str, dst: str, rekey: str, storage_options):
    """A remote plain tar, with no temporary: indexed by one streamed read, copied by a second
    (both at one version of the object). None for a compressed one (its offsets are inside the
    decompressed stream, which cannot jump back) and for a web object with no strong validator
    (a jump could land in another version): a temporary, _fetch."""
    first = _open_remote(src, storage_options)
    try:
        if compression(first.peek(6)[:6]) is not None or not first.proven:
            return None  # a web server with no strong validator: no jump can be tied to this version
        entries, skipped = _index(first, rekey, redact_url(src))
        version = first.version
    except RemoteReadError as e:
        raise RunError(f"reading {redact_url(src)} failed: {e}") from None
    finally:
        first.close()
    again = _open_remote(src, storage_options, jumps=True)
    try:
        if again.version != version:
            raise RunError(f"{redact_url(src)} changed between its two reads (its index, then its copy); run again")
        return _write(again, entries, skipped, dst, redact_url(src))
    except RemoteReadError as e:
        raise RunError(f"reading {redact_url(src)} failed: {e}") from None
    finally:
        again.close()


def _fetch(src: str, folder: str, storage_options) -> str:
    """A compressed remote IN, streamed (resumed after failures) into a temporary beside OUT: the
    copy reads members by their offsets inside the decompressed tar, in key order."""
    fd, tmp = tempfile.mkstemp(prefix=".sort-shard.tmp-", suffix=".tar", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            stream = _open_remote(src, storage_options)
            try:
                shutil.copyfileobj(stream, out, 1 << 20)
            except OSError as e:
                raise RunError(f"reading {redact_url(src)} failed: {e}") from None
            finally:
                stream.close()
    except BaseException:
        os.remove(tmp)
        raise
    return tmp


def _rewrite(plain: str, dst: str, rekey: str, src: str) -> SortResult:
    entries, skipped = _index(plain, rekey, src)
    with open(plain, "rb") as f:
        return _write(f, entries, skipped, dst, src)


def _index(plain, rekey: str, src: str):
    """(entries, skipped) of a tar file, or of a stream read front to back (a remote input).
    Names and offsets only: per member its sort key and the byte range of its headers and data
    (long-name, pax and sparse-map headers included). No TarInfo is kept: one holds its pax
    headers, and 1,500 members with a 1 MB pax comment each held 1.5 GB."""
    entries: List[tuple] = []
    skipped = 0
    try:
        with (tarfile.open(plain, "r:", tarinfo=ShardTarInfo) if isinstance(plain, str) else
              tarfile.open(fileobj=plain, mode="r|", tarinfo=ShardTarInfo)) as tar:
            for i, info in enumerate(tar):
                tar.members = []
                if not info.isreg():
                    skipped += 1
                    continue
                key, ext = split_name(info.name, rekey)
                # Members that are no part of a sample (no extension, dotfiles) keep their place at the end.
                # tar.offset: where tarfile found the next header, after the data as stored (a
                # sparse member's stored regions, not its expanded size).
                entries.append(((key is None, key or "", (ext or "").lower(), i), info.offset, tar.offset))
    except RemoteReadError:
        raise  # the store failed: not a tar's fault
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConfigError(f"cannot read {src!r} as a tar ({type(e).__name__}: {e}); "
                          f"run `wdsfilter validate {src}` to see what is wrong with it") from None
    return entries, skipped


def _write(f, entries: List[tuple], skipped: int, dst: str, src: str) -> SortResult:
    """dst: the members of `f` (a file, or a remote stream that jumps) in key order."""
    order = sorted(range(len(entries)), key=lambda j: entries[j][0])
    seen, scattered, last = set(), set(), None
    for (no_key, key, _, _), _, _ in entries:  # a key met again after another key's members
        if not no_key and key != last:
            (scattered if key in seen else seen).add(key)
        last = key
    moved = sum(1 for pos, j in enumerate(order) if pos != j)
    written = 0
    with atomic_path(dst) as tmp:
        # Each member's bytes as stored, headers included: names, modes, times and a sparse
        # member's map unchanged, and a sparse member costs what the input stores, not its
        # expanded size (an 8 GiB hole in a 13 KB tar).
        with (gzip.GzipFile(tmp, "wb", mtime=0) if dst.endswith((".tar.gz", ".tgz")) else open(tmp, "wb")) as out:
            for j in order:
                _, start, end = entries[j]
                try:
                    written += copy_range(f, start, end, out)
                except EOFError:
                    raise ConfigError(f"{src!r} ends inside a member; run `wdsfilter validate {src}` to see "
                                      f"what is wrong with it") from None
            out.write(tar_end(written))
    keys = len({e[0][1] for e in entries if not e[0][0]})
    return SortResult(members=len(entries), keys=keys, moved=moved, skipped=skipped, scattered=len(scattered),
                      bytes=written)


@clihelp.command("sort-shard", {"Input": ("rekey",), "Remote": ("storage_options",), "Run control": ("quiet", "verbose")},
                 (EXIT_CLEAN, EXIT_USAGE, EXIT_RUN_FAILED))
@click.argument("paths", metavar="IN... OUT", nargs=-1, required=True)
@click.option("--rekey", type=click.Choice(REKEY_MODES), default="first-dot", show_default=True,
              help="Member name -> key split, as for validate.")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="An fsspec storage option for a remote IN (endpoint_url=..., profile=...); repeatable.")
@verbosity_options(quiet="Say nothing when the shard is written (errors still go to stderr).",
                   verbose="Say more: the keys that were scattered through IN and the bytes copied.")
def sort_shard_command(paths, rekey, storage_options, quiet, verbose):
    """Rewrite shard IN as OUT with each sample's members next to each other (ordered by key);
    with several shards, or a folder or glob of them, OUT is a folder and each is written there
    under its own name.

    The fix for validate's scattered_key error (shards written by `tar -cf x.tar *.txt *.jpg` or in
    directory order). Member bytes and headers are copied unchanged; OUT ending in .tar.gz/.tgz is
    gzip-compressed. OUT appears only when complete."""
    if len(paths) < 2:
        raise click.UsageError("give the shard(s) to sort and where to write: IN OUT, or IN... OUTDIR")
    *sources, dst = paths
    level = verbosity(quiet, verbose)
    options = parse_storage_options(storage_options)
    one = len(sources) == 1 and (is_remote(sources[0]) or os.path.isfile(sources[0])) and not os.path.isdir(dst)
    if not one and dst.endswith((".tar", ".tar.gz", ".tgz")):
        raise click.UsageError(f"OUT {dst!r} names a shard file, but IN is several shards or a folder of them: "
                               f"give a folder to write them into")
    jobs = [(sources[0], dst)] if one else _into_folder(sources, dst, options)
    failed = []
    for src, out in jobs:
        try:
            result = sort_shard(src, out, rekey, options)
        except (ConfigError, RunError, OutputError) as e:
            if len(jobs) == 1:
                raise
            failed.append(redact_url(src))
            click.echo(f"wdsfilter sort-shard: {redact_url(src)}: {e}", err=True)
            continue
        if level >= 1:
            click.echo(f"wdsfilter sort-shard: wrote {out}: {result.members} member(s) of {result.keys} key(s), "
                       f"{result.moved} moved" + (f", {result.skipped} non-file member(s) left out" if result.skipped else ""))
        if level >= 2:
            click.echo(f"  {result.scattered} of {result.keys} key(s) had members scattered through {redact_url(src)}; "
                       f"{result.bytes} bytes of members (headers included) copied")
    if failed:
        raise RunError(f"{len(failed)} of {len(jobs)} shard(s) were not sorted (named above); the others are in {dst}")


def _into_folder(sources: List[str], folder: str, storage_options) -> List[tuple]:
    """(shard, OUTDIR/its file name) for every shard the sources name (folders, globs, files)."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"OUT {folder!r} is a file: with several shards, or a folder of them, OUT is the folder "
                          f"to write them into")
    urls = expand_urls(sources, allow_pipe=False, allow_remote=True, storage_options=storage_options)
    names = [os.path.basename(u.rstrip("/").split("?")[0]) for u in urls]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{len(twice)} shard name(s) occur in more than one input ({', '.join(twice[:3])}): each "
                          f"is written into {folder} under its own name; sort them into separate folders")
    return [(u, os.path.join(folder, n)) for u, n in zip(urls, names)]


sort_shard_cli = sort_shard_command  # the name wdsfilter.cli attaches
