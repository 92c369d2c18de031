"""New shards of exactly N kept samples each, members copied byte for byte from the sources.

    OUT/shard-000000.tar, shard-000001.tar, ...   N samples each, the last may be short
    OUT/shard-000000_stats.json                   per shard: successes (samples), members, bytes, sources
    OUT/sizes.json                                {shard file: samples}, written last
    OUT/filter_run.json                           what the shards were made from (for resuming: the
                                                  thresholds, the score files' sizes and times) and
                                                  the files this run writes (all --overwrite removes)

Each member is copied with its own tar headers (long-name and pax headers included), so names,
bytes, modes, times and member order within a sample are the source's. A pax global header
before a source's first member is not carried over (it would apply to other sources' members).

Kept sample j goes to shard j // N, decided from the score files alone; a shard is written to a
temporary, fsynced, renamed, then its _stats.json is written. A run killed at any point leaves
whole shards (with their stats) and temporaries; running again deletes the temporaries, skips
whole shards (and the sources only they need) and writes the rest: the same bytes, nothing lost
or doubled.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from ..errors import ConfigError, RunError
from ..atomic import write_json as _atomic_json
from ..runfolder import source_changed
from ..score.shardwriter import BLOCK, RECORD, _local_copy, member_ranges, tar_opener
from ..shards import is_pipe, is_remote
from ..shardstats import SIZES, stats_path, update_sizes, write_shard_stats
from ..writing import atomic_path

RUN_FILE = "filter_run.json"
COPY_CHUNK = 1 << 20


class ReshardError(RunError):
    """A source shard does not match its score file any more: the run cannot go on."""


@dataclass
class Source:
    url: str
    keys: List[str]  # kept keys, in the shard's order, each once
    recorded: Optional[dict] = None  # the local shard's size and mtime when it was scored (its marker)


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}.tar"


class Resharder:
    def __init__(self, out: str, per_shard: int, prefix: str = "shard", rekey: str = "first-dot",
                 allow_pipe: bool = False, allow_remote: bool = False, idle_seconds: float = 0.0):
        if per_shard < 1:
            raise ConfigError(f"--samples-per-shard must be >= 1, got {per_shard}")
        self.out, self.per_shard, self.prefix, self.rekey = out, per_shard, prefix, rekey
        self.allow_pipe, self.allow_remote = allow_pipe, allow_remote
        self.idle_seconds = idle_seconds
        self.planned: List[str] = []

    def lock(self):
        """One filter run per output folder (the lock `score` takes on its --out): two runs at
        once would delete each other's temporaries and merge their sizes.json. A folder in a
        bucket: its lock object, and the run writes a staging copy uploaded as it goes."""
        from ..remote import is_fsspec_url
        from ..score.outlock import OutputLock
        if is_fsspec_url(self.out):
            return self._remote()
        return OutputLock(self.out, command="filter", option="--write-shards")

    @contextlib.contextmanager
    def _remote(self):
        from ..score.outlock import RemoteRunFolder
        url = self.out
        remote = RemoteRunFolder(url, command="filter", option="--write-shards")  # pulled: resume, ownership
        try:
            self.out = remote.local
            remote.start()
            yield self
            remote.sync()  # every shard in the bucket before the run reports success
        except ConfigError as e:  # "OUT already holds ...": the bucket's name, not the staging copy's
            raise type(e)(remote.public(str(e))) from None
        finally:
            self.out = url
            remote.release()

    # -- run state --------------------------------------------------------------------------------
    def prepare(self, identity: dict, overwrite: bool, kept: int) -> int:
        """Check that OUT holds this same run, or nothing of ours, or (with overwrite) another run
        of ours; returns the shards already whole. Call under OUT's lock (lock()). `kept`: the
        samples to write, so the files this run will write are known before the first one is.

        Nothing is deleted that `wdsfilter filter` did not write: --overwrite removes the files
        the earlier run's filter_run.json lists, and a file this run would write that it does not
        list (the folder's own shards, named like ours) is refused, never replaced."""
        os.makedirs(self.out, exist_ok=True)
        run_file = os.path.join(self.out, RUN_FILE)
        identity = json.loads(json.dumps(identity, sort_keys=True))
        previous, owned = self._previous(run_file)
        planned = self.planned_files(kept)
        foreign = sorted(f for f in planned if f not in owned and os.path.lexists(os.path.join(self.out, f)))
        if foreign:
            raise ConfigError(f"{self.out} already holds {foreign[0]}{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}"
                              f", which `wdsfilter filter` did not write there (its {RUN_FILE} does not list it); "
                              f"nothing is replaced that filter did not write: write the shards to another folder "
                              f"(or another --prefix)")
        if previous is not None and previous != identity:
            if not overwrite:
                diff = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
                why = (" (the score files changed since they were written: a shard was scored again)"
                       if diff == ["score_files"] else "")
                raise ConfigError(f"{self.out} holds shards filtered with other settings ({', '.join(diff)} differ)"
                                  f"{why}; pass --overwrite to replace them, or another folder")
            self._clear(owned)
            owned = set()
        for f in os.listdir(self.out):  # a killed run's temporaries are never whole
            if f.startswith(".") and ".tmp-" in f:
                os.remove(os.path.join(self.out, f))
        # Listed before the first is written: a run killed half-way still owns what it wrote.
        _atomic_json(run_file, {"identity": identity, "files": sorted(set(planned) | owned)})
        self.planned = planned
        return len(self._whole())

    @staticmethod
    def _previous(run_file: str):
        """(the earlier run's identity or None, the file names it lists as written). A file of an
        older version (the identity alone) or a damaged one vouches for no file."""
        if not os.path.exists(run_file):
            return None, set()
        try:
            with open(run_file) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict):
            raise ConfigError(f"{run_file} is damaged (not a JSON object); it says which files `wdsfilter filter` "
                              f"wrote there, so nothing can be replaced: write the shards to another folder")
        if not isinstance(data.get("identity"), dict) or not isinstance(data.get("files"), list):
            return data.get("identity", data), set()
        # Plain names in OUT only: a hand-edited list cannot point anywhere else.
        owned = {f for f in data["files"] if isinstance(f, str) and f == os.path.basename(f) and f not in ("", ".", "..")
                 and f != RUN_FILE}
        return data["identity"], owned

    def planned_files(self, kept: int) -> List[str]:
        names = [SIZES]
        for t in range(-(-kept // self.per_shard)):
            name = shard_name(self.prefix, t)
            names += [name, os.path.basename(stats_path(self.out, name))]
        return names

    def _clear(self, names: Iterable[str]) -> None:
        for f in names:
            path = os.path.join(self.out, f)
            if os.path.lexists(path) and not os.path.isdir(path):
                os.remove(path)

    def _whole(self) -> set:
        whole = set()
        for t in range(len(self.planned) // 2):
            name = shard_name(self.prefix, t)
            if os.path.exists(os.path.join(self.out, name)) and os.path.exists(stats_path(self.out, name)):
                whole.add(t)
        return whole

    # -- writing ----------------------------------------------------------------------------------
    def write(self, sources: Iterable[Source]) -> Dict[str, int]:
        """Write every shard not yet whole; returns sizes.json's table."""
        whole = self._whole()
        n = self.per_shard
        pos = 0
        current: Optional[_OpenShard] = None
        for source in sources:
            count = len(source.keys)
            touched = range(pos // n, (pos + count - 1) // n + 1) if count else range(0)
            if any(t not in whole for t in touched):
                for j, members in zip(range(pos, pos + count), self._samples(source)):
                    t = j // n
                    if t in whole:
                        continue
                    if current is None or current.index != t:
                        if current is not None:
                            current.close()
                        current = _OpenShard(self.out, self.prefix, t)
                    current.add(source.url, members)
            pos += count
        if current is not None:
            current.close()
        sizes = {shard_name(self.prefix, t): min(n, pos - t * n) for t in range(-(-pos // n))}
        update_sizes(self.out, sizes)
        return sizes

    def _samples(self, source: Source):
        """Per kept key, in order: a reader of its members' byte ranges [(start, end)]."""
        url = source.url
        path = url[len("file:"):] if url.startswith("file:") else url
        fetched = None
        if is_pipe(url) or is_remote(url):
            fetched = path = _local_copy(url, self.allow_pipe, self.allow_remote, self.out, self.idle_seconds)
        elif not os.path.exists(path):
            raise ReshardError(f"source shard {url} is missing: it was scored but can no longer be read; "
                               f"restore it or score again without it")
        elif source_changed(url, source.recorded):
            raise ReshardError(f"source shard {url} changed since it was scored (its size or modification time "
                               f"differ from its completion marker's): its samples may not be the ones scored; "
                               f"score it again (--resume does)")
        try:
            _, ranges = member_ranges(path, self.rekey)
            # A key's first run of adjacent members is its sample (the loader judges the key by it);
            # a later run of the same key is not copied.
            groups: Dict[str, List[Tuple[int, int]]] = {}
            last, first_run = None, False
            for start, end, key in ranges:
                if key != last:
                    first_run = key not in groups
                    if first_run:
                        groups[key] = []
                if first_run:
                    groups[key].append((start, end))
                last = key
            missing = [k for k in source.keys if k not in groups]
            if missing:
                raise ReshardError(f"source shard {url} has no member with key {missing[0]!r} although its score "
                                   f"file keeps it ({len(missing)} such key(s)): the shard changed after scoring; "
                                   f"score it again")
            opener = tar_opener(path)
            with opener(path, "rb") as src:
                for key in sorted(source.keys, key=lambda k: groups[k][0][0]):
                    yield _Member(src, groups[key])
        finally:
            if fetched and os.path.exists(fetched):
                os.remove(fetched)


class _Member:
    """The byte ranges of one sample's members in an open source."""

    def __init__(self, src, ranges: List[Tuple[int, int]]):
        self.src, self.ranges = src, ranges

    def copy_to(self, out) -> Tuple[int, int]:
        written = 0
        for start, end in self.ranges:
            if self.src.tell() != start:
                self.src.seek(start)
            left = end - start
            while left:
                data = self.src.read(min(left, COPY_CHUNK))
                if not data:
                    raise ReshardError("a source shard ended inside a member it held when it was scored")
                out.write(data)
                left -= len(data)
                written += len(data)
        return len(self.ranges), written


class _OpenShard:
    def __init__(self, folder: str, prefix: str, index: int):
        self.folder, self.prefix, self.index = folder, prefix, index
        self.path = os.path.join(folder, shard_name(prefix, index))
        self._temporary = atomic_path(self.path)  # renamed into place by close()
        self.file = open(self._temporary.__enter__(), "wb")
        self.samples = self.members = self.bytes = 0
        self.sources: Dict[str, int] = {}

    def add(self, url: str, sample: _Member) -> None:
        members, written = sample.copy_to(self.file)
        self.samples += 1
        self.members += members
        self.bytes += written
        self.sources[url] = self.sources.get(url, 0) + 1

    def close(self) -> None:
        end = 2 * BLOCK + (-(self.bytes + 2 * BLOCK)) % RECORD  # end-of-archive blocks, padded to a record
        self.file.write(b"\0" * end)
        self.file.flush()
        os.fsync(self.file.fileno())  # whole on disk before the stats file says so
        self.file.close()
        self._temporary.__exit__(None, None, None)
        write_shard_stats(self.folder, os.path.basename(self.path), self.samples, self.members, self.sources)
