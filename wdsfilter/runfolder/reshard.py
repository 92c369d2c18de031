"""New shards of exactly N kept samples each, members copied byte for byte from the sources: the
one resharder of `filter --write-shards` and of `score --write-shards --samples-per-shard` (at
the run's end, `reshard_run`), so the two write the same bytes from the same rows.

    OUT/shard-000000.tar, shard-000001.tar, ...   N samples each, the last may be short
    OUT/shard-000000_stats.json                   per shard: successes (samples), members, bytes, sources
    OUT/sizes.json                                {shard file: samples}, written last
    OUT/README.md                                 the dataset card HF datasets loads OUT by (hfcard.py)
    OUT/report.html                               filter's report (unless --report puts it elsewhere)
    OUT/filter_run.json                           what the shards were made from (for resuming: the
                                                  thresholds, the score files' sizes and times) and
                                                  the files this run writes (all --overwrite removes)

Each member is copied with its own tar headers (long-name and pax headers included), so names,
bytes, modes, times and member order within a sample are the source's. A pax global header
before a source's first member is not carried over (it would apply to other sources' members).

Sources are taken in order, or `--interleave` at a time in turn; with `--unique-keys` sample j
is renamed j (rename.py). Kept sample j goes to shard j // N, decided from the score files
alone; a shard is written to a temporary, fsynced, renamed, then its _stats.json is written. A run killed at any point leaves
whole shards (with their stats) and temporaries; running again deletes the temporaries, skips
whole shards (and the sources only they need) and writes the rest: the same bytes, nothing lost
or doubled.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..core.errors import ConfigError
from ..storage.atomic import write_json as _atomic_json
from .layout import source_changed
from .names import CARD, FILTER_RUN as RUN_FILE, REPORT, THRESHOLDS  # noqa: F401 - apply's too
from .dedup import score_file_state
from .judge import FilterResult, count_run, judge_shard
from .reader import ScoredShard, ScoreRun
from ..storage.remote import redact_url, is_fsspec_url
from ..storage.shardcopy import local_copy, streamed_source, streams
from ..storage.shards import is_pipe, is_remote
from ..storage.shardstats import SIZES, stats_path, update_sizes, write_shard_stats
from ..storage.tars import Headers, MemberCut, copy_range, member_ranges, tar_end, tar_opener
from ..storage.writing import atomic_path
from .hfcard import write_card
from .rename import ReshardError, copy_renamed
from .lease import Lease
from .bucket import RemoteRunFolder



@dataclass
class Source:
    url: str
    keys: List[str]  # kept keys, in the shard's order, each once
    recorded: Optional[dict] = None  # the local shard's size and mtime when it was scored (its marker)


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}.tar"


class Resharder:
    def __init__(self, out: str, per_shard: int, prefix: str = "shard", rekey: str = "first-dot",
                 allow_pipe: bool = False, allow_remote: bool = False, idle_seconds: float = 0.0,
                 echo: Optional[Callable[[str], None]] = None, unique_keys: bool = False, interleave: int = 0,
                 writes_report: bool = True, progress=None):
        if per_shard < 1:
            raise ConfigError(f"--samples-per-shard must be >= 1, got {per_shard}")
        if interleave < 0:
            raise ConfigError(f"--interleave must be >= 0 (source shards taken in turn), got {interleave}")
        self.unique_keys = unique_keys  # output sample j is key f"{j:09d}" (rename.py)
        self.interleave = interleave  # >= 2: round robin over that many source shards at a time
        self.out, self.per_shard, self.prefix, self.rekey = out, per_shard, prefix, rekey
        self.allow_pipe, self.allow_remote = allow_pipe, allow_remote
        self.idle_seconds = idle_seconds
        self.echo = echo  # told of each shard written (filter -v)
        self.planned: List[str] = []
        # report.html is ours only when the run's report goes to OUT (not --report elsewhere, not
        # --no-report): a user's own file of that name is otherwise neither refused nor deleted
        self.writes_report = writes_report
        self.progress = progress  # a progress.Progress of the samples (parts: the shards), or None

    def layout(self) -> dict:
        """What the written shards depend on beyond the kept keys and N (filter_run.json's
        identity): left out at their defaults, so a folder written before they existed resumes."""
        return {**({"unique_keys": True} if self.unique_keys else {}),
                **({"interleave": self.interleave} if self.interleave > 1 else {})}

    def lock(self):
        """One filter run per output folder (the lock `score` takes on its --out): two runs at
        once would delete each other's temporaries and merge their sizes.json. A folder in a
        bucket: its lock object, and the run writes a staging copy uploaded as it goes."""
        if is_fsspec_url(self.out):
            return self._remote()
        return self._local()

    @contextlib.contextmanager
    def _local(self):
        """OUT's lease (runfolder/lease.py); every write into OUT fenced by it."""
        with Lease(self.out, command="filter", option="--write-shards") as lease:
            lease.guard([self.out])
            yield self

    @contextlib.contextmanager
    def _remote(self):
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
    def prepare(self, identity: dict, overwrite: bool, kept: int, replace_own: bool = False) -> int:
        """Check that OUT holds this same run, or nothing of ours, or (with overwrite) another run
        of ours; returns the shards already whole. Call under OUT's lock (lock()). `kept`: the
        samples to write, so the files this run will write are known before the first one is.
        replace_own: another reshard of the same score folder is replaced without overwrite (a
        scoring run's own, written again at the end of a resumed run).

        Nothing is deleted that `wdsfilter filter` did not write: --overwrite removes the files
        the earlier run's filter_run.json lists, and a file this run would write that it does not
        list (the folder's own shards, named like ours) is refused, never replaced."""
        os.makedirs(self.out, exist_ok=True)
        run_file = os.path.join(self.out, RUN_FILE)
        identity = json.loads(json.dumps(identity, sort_keys=True))
        previous, owned = self._previous(run_file)
        planned = self.planned_files(kept)
        # A README.md of the user's own is kept (a dataset card they wrote), and none is written.
        self.card = not (CARD not in owned and os.path.lexists(os.path.join(self.out, CARD)))
        if not self.card:
            planned.remove(CARD)
        foreign = sorted(f for f in planned if f not in owned and os.path.lexists(os.path.join(self.out, f)))
        if foreign:
            raise ConfigError(f"{self.out} already holds {foreign[0]}{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}"
                              f", which `wdsfilter filter` did not write there (its {RUN_FILE} does not list it); "
                              f"nothing is replaced that filter did not write: write the shards to another folder "
                              f"(or another --prefix)")
        if previous is not None and previous != identity:
            if not overwrite and not (replace_own and previous.get("scores") == identity.get("scores")):
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
        names = [SIZES, CARD, THRESHOLDS] + ([REPORT] if self.writes_report else [])
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
        for t in range(self._shards()):
            name = shard_name(self.prefix, t)
            if os.path.exists(os.path.join(self.out, name)) and os.path.exists(stats_path(self.out, name)):
                whole.add(t)
        return whole

    def _shards(self) -> int:
        return sum(1 for f in self.planned if f.endswith(".tar"))

    # -- writing ----------------------------------------------------------------------------------
    def write(self, sources: Iterable[Source]) -> Dict[str, int]:
        """Write every shard not yet whole; returns sizes.json's table. Sources are taken in
        order, or in turn within groups of `interleave`: either way the order (and so the
        shard of each sample) follows from the kept keys alone, and a resumed run skips a group
        whose shards are all whole."""
        whole = self._whole()
        n = self.per_shard
        pos = 0
        current: Optional[_OpenShard] = None
        tick = self.progress.update if self.progress is not None else (lambda count=1: None)
        if self.progress is not None:
            self.progress.part_done(len(whole))
        try:
            for group in self._groups(sources):
                count = sum(len(source.keys) for source in group)
                touched = range(pos // n, (pos + count - 1) // n + 1) if count else range(0)
                if not any(t not in whole for t in touched):
                    tick(count)  # already whole: counted as done
                else:
                    for j, (source, sample) in zip(range(pos, pos + count), self._in_turn(group)):
                        t = j // n
                        if t not in whole:
                            if current is None or current.index != t:
                                if current is not None:
                                    self._close(current)
                                current = _OpenShard(self.out, self.prefix, t)
                            current.add(source.url, sample, f"{j:09d}" if self.unique_keys else None)
                        tick()
                pos += count
        except BaseException:
            if current is not None:  # closed and its temporary removed now, not when collected
                current.abort()
            raise
        if current is not None:
            self._close(current)
        sizes = {shard_name(self.prefix, t): min(n, pos - t * n) for t in range(-(-pos // n))}
        update_sizes(self.out, sizes)
        if self.card:
            write_card(self.out, self.prefix, [stats_path(self.out, name) for name in sizes])
        return sizes

    def _groups(self, sources: Iterable[Source]) -> Iterator[List[Source]]:
        """The sources one at a time, or `interleave` at a time (their key lists only in memory)."""
        it = iter(sources)
        while True:
            group = list(islice(it, max(1, self.interleave)))
            if not group:
                return
            yield group

    def _in_turn(self, group: List[Source]) -> Iterator[tuple]:
        """(source, sample) of a group: one sample of each source in turn until all are done
        (one source: its samples in order). Each source stays open while the group is written."""
        readers = [(source, self._samples(source)) for source in group]
        while readers:
            for reader in list(readers):
                sample = next(reader[1], None)
                if sample is None:
                    readers.remove(reader)
                else:
                    yield reader[0], sample

    def _close(self, shard: "_OpenShard") -> None:
        shard.close()
        if self.progress is not None:
            self.progress.part_done()
        if self.echo is not None:
            self.echo(f"wrote {shard.path}: {shard.samples} samples from {len(shard.sources)} source shard(s)")

    def _samples(self, source: Source):
        """Per kept key, in order: a reader of its members' byte ranges [(start, end, extension)]. A
        remote source is streamed (shardcopy.streamed_source: no temporary copy)."""
        url = source.url
        if streams(url):
            with streamed_source(url, self.rekey, self.allow_remote, self.idle_seconds, exts=True) as \
                    (_, _, ranges, src):
                yield from self._members(source, ranges, src)
            return
        path = url[len("file:"):] if url.startswith("file:") else url
        fetched = None
        if is_pipe(url) or is_remote(url):
            fetched = path = local_copy(url, self.allow_pipe, self.allow_remote, self.out, self.idle_seconds)
        elif not os.path.exists(path):
            raise ReshardError(f"source shard {url} is missing: it was scored but can no longer be read; "
                               f"restore it or score again without it")
        elif source_changed(url, source.recorded):
            raise ReshardError(f"source shard {url} changed since it was scored (its size or modification time "
                               f"differ from its completion marker's): its samples may not be the ones scored; "
                               f"score it again (--resume does)")
        try:
            _, ranges = member_ranges(path, self.rekey, exts=True)
            with tar_opener(path)(path, "rb") as src:
                yield from self._members(source, ranges, src)
        finally:
            if fetched and os.path.exists(fetched):
                os.remove(fetched)

    def _members(self, source: Source, ranges, src):
        """The kept keys' members of `src` (read forward), in tar order."""
        # A key's first run of adjacent members is its sample (the loader judges the key by it);
        # a later run of the same key is not copied.
        groups: Dict[str, List[Tuple[int, int, str]]] = {}
        last, first_run = None, False
        for start, end, key, ext in ranges:
            if key != last:
                first_run = key not in groups
                if first_run:
                    groups[key] = []
            if first_run:
                groups[key].append((start, end, ext))
            last = key
        missing = [k for k in source.keys if k not in groups]
        if missing:
            raise ReshardError(f"source shard {redact_url(source.url)} has no member with key {missing[0]!r} although its score "
                               f"file keeps it ({len(missing)} such key(s)): the shard changed after scoring; "
                               f"score it again")
        headers = Headers(src) if self.unique_keys else None
        for key in sorted(source.keys, key=lambda k: groups[k][0][0]):
            yield _Member(src, groups[key], key, self.rekey, headers)


def made_from(out: str) -> Optional[str]:
    """The score folder the shards in OUT were resharded from (filter_run.json's identity), or None."""
    previous, _ = Resharder._previous(os.path.join(out, RUN_FILE))
    return previous.get("scores") if isinstance(previous, dict) else None


def kept_keys(shard: ScoredShard, thresholds: Sequence, marks=None) -> List[str]:
    """The keys a shard's score file keeps by the rules (runfolder/judge.py), in the file's order."""
    dropped = marks.dropped(shard.name) if marks is not None else None
    return [row["key"] for row, reason in judge_shard(shard, thresholds, dropped=dropped) if reason is None]


def count_kept(run: ScoreRun, thresholds: Sequence, marks=None) -> int:
    """How many rows of the run the rules keep (count_run, the counts filter prints)."""
    result = FilterResult(scores_dir=run.folder, thresholds=list(thresholds))
    result.counts = [{"kept": 0, "dropped": 0, "no_score": 0} for _ in thresholds]
    count_run(run, thresholds, None, marks, result)
    return result.kept


def identity(run: ScoreRun, scores_dir: str, thresholds: Sequence, marks, writer: Resharder) -> dict:
    """What the shards in OUT are made from (filter_run.json): the same for `filter RUN
    --write-shards OUT` and `score --out RUN --write-shards OUT --samples-per-shard N` over the
    same rows and rules, so either finds the other's shards whole."""
    return {"scores": scores_dir if is_fsspec_url(scores_dir) else os.path.abspath(scores_dir),
            "thresholds": [[t.column, t.minimum, t.value] if t.numeric else [t.column, "equal", list(t.bound.values)]
                           for t in thresholds],
            **({"dedup": marks.summary.get("settings")} if marks is not None else {}),
            "samples_per_shard": writer.per_shard, "prefix": writer.prefix, **writer.layout(),
            "sources": [redact_url(s.url) for s in run.shards],  # OUT is published: no password
            # what the rows were: a shard scored again (score --resume) is other data
            "score_files": [_file_state(s.score_file) for s in run.shards]}


def _file_state(path: str) -> list:
    # what the file holds, not when it was written: a bucket's score folder is read through a local
    # copy whose times are the copy's (another machine, a fresh cache); the dedup's rule for a copy
    state = score_file_state(path)
    return [os.path.basename(path), state["bytes"], state["sha256"]]


def reshard_run(run: ScoreRun, scores_dir: str, thresholds: Sequence, marks, writer: Resharder, *,
                overwrite: bool = False, replace_own: bool = False, kept: Optional[int] = None,
                echo: Optional[Callable[[str], None]] = None, shown: Optional[str] = None,
                progress: Optional[Callable[[int], object]] = None) -> Dict[str, int]:
    """The kept samples of every finished shard of `run` (the rows `thresholds` and `marks` keep)
    into new shards of N in writer.out; returns sizes.json's table. Call under OUT's lock (or the
    scoring run's lease, which fences writes into OUT). kept: the count, when the caller has it;
    progress(kept): the progress line of the samples written, or None."""
    kept = count_kept(run, thresholds, marks) if kept is None else kept
    whole = writer.prepare(identity(run, scores_dir, thresholds, marks, writer), overwrite, kept, replace_own)
    if whole and echo is not None:
        echo(f"resume: {whole} shard(s) in {shown or writer.out} are already whole")
    if progress is not None:
        writer.progress = progress(kept)
    sources = (Source(s.url, kept_keys(s, thresholds, marks), s.source) for s in run.shards)
    return writer.write(sources)


class _Member:
    """The byte ranges of one sample's members in an open source: (start, end, extension)."""

    def __init__(self, src, ranges: List[Tuple[int, int, str]], key: str, rekey: str, headers=None):
        self.src, self.ranges, self.key, self.rekey, self.headers = src, ranges, key, rekey, headers

    @property
    def fields(self) -> List[str]:
        """The sample's member extensions (the dataset card's columns); a json is added by --unique-keys."""
        exts = [ext for _, _, ext in self.ranges]
        return exts + ["json"] if self.headers is not None and "json" not in (e.lower() for e in exts) else exts

    def copy_to(self, out, new_key: Optional[str] = None, url: str = "") -> Tuple[int, int]:
        """Copy the members, as stored, or renamed to `new_key` (rename.py); (members, bytes written)."""
        try:
            if new_key is not None:
                return copy_renamed(self.src, self.headers, [(s, e) for s, e, _ in self.ranges], self.rekey, new_key,
                                    self.key, url, out)
            written = 0
            for start, end, _ in self.ranges:
                written += copy_range(self.src, start, end, out)
            return len(self.ranges), written
        except MemberCut:
            raise ReshardError(f"source shard {redact_url(url)} ends inside a member of sample {self.key!r}, which its score "
                               f"file keeps: the shard was cut or changed since it was scored; restore it, or "
                               f"score it again") from None


class _OpenShard:
    def __init__(self, folder: str, prefix: str, index: int):
        self.folder, self.prefix, self.index = folder, prefix, index
        self.path = os.path.join(folder, shard_name(prefix, index))
        self._temporary = atomic_path(self.path)  # renamed into place by close()
        self.file = open(self._temporary.__enter__(), "wb")
        self.samples = self.members = self.bytes = 0
        self.sources: Dict[str, int] = {}
        self.fields: Dict[str, int] = {}  # member extension -> samples that have it (the dataset card)
        self._finished = False  # closed (renamed into place) or aborted (removed)

    def add(self, url: str, sample: _Member, new_key: Optional[str] = None) -> None:
        members, written = sample.copy_to(self.file, new_key, url)
        self.samples += 1
        self.members += members
        self.bytes += written
        shown = redact_url(url)  # _stats.json is published with the shards: no password, no signed query
        self.sources[shown] = self.sources.get(shown, 0) + 1
        for field in dict.fromkeys(sample.fields):
            self.fields[field] = self.fields.get(field, 0) + 1

    def abort(self) -> None:
        """The run failed while this shard was open: close it and remove its temporary (once)."""
        if self._finished:
            return
        self._finished = True
        self.file.close()
        self._temporary.__exit__(RuntimeError, RuntimeError("reshard failed"), None)

    def close(self) -> None:
        try:
            self.file.write(tar_end(self.bytes))
            self.file.flush()
            os.fsync(self.file.fileno())  # whole on disk before the stats file says so
        except BaseException:
            self.abort()
            raise
        self._finished = True
        self.file.close()
        self._temporary.__exit__(None, None, None)
        write_shard_stats(self.folder, os.path.basename(self.path), self.samples, self.members, self.sources,
                          fields=self.fields)
