"""The writer side of a scoring run folder (its layout, records and reader: wdsfilter/runfolder/):
output names per shard, completion markers, the --resume/--overwrite checks.

A shard is done only when its marker exists, the files it names exist with the sizes the marker
recorded (a score file cut short or replaced is not trusted), and a local source shard has the
size and modification time it had when it was scored (a shard re-created under the same name is
scored again). Everything is written
to a temporary name and renamed, so a run killed with SIGKILL leaves complete files or
temporaries, never half files; --resume deletes the temporaries and re-scores every shard without
a marker from its start, so no sample is lost or written twice.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Callable, Iterable, List, Optional, Sequence

from ..storage.atomic import check_guards, remove_temporaries, write_json
from ..core.errors import ConfigError
from ..core.publish import published
from ..runfolder import layout
from ..runfolder.layout import Marker, output_sizes, outputs_intact, shard_names, source_changed, source_state
from ..runfolder.tables import DamagedRunFolder, table_name
from ..storage.shards import split_suffix
from .config import ScoreConfig
from ..runfolder.embeddings import folders as embedding_folders
from .ledger import MERGED as LEDGER_FILE, folder as ledger_folder
from ..runfolder.lease import Conflict

def _normalise(obj):
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


class RunState:
    def __init__(self, cfg: ScoreConfig, urls: Sequence[str], identity: Optional[dict] = None,
                 size_of: Callable[[str], int] = os.path.getsize, run_record=None):
        """Paths and markers at once; with `identity`, also open() the folder. Without it, the
        folder is only checked (check_folder), so that happens before any model is resolved,
        and open(identity) follows once the scorers are known. run_record: run.json as a
        record of the folder (runfolder/lease.record_at): a joined run's worker (`--join`), which
        creates it or joins the run it names."""
        self.cfg = cfg
        self.urls = list(urls)
        self.names = shard_names(self.urls)
        self.out = cfg.out
        self.scores_dir = os.path.join(cfg.out, layout.SCORES)
        self.done_dir = os.path.join(cfg.out, layout.DONE)
        self.identity: Optional[dict] = None
        self.writable = not cfg.dry_run
        self.resumed_from_markers = 0
        # (staging folder, URL) of a --write-shards in a bucket: markers name the URL (runfolder/bucket.RemoteRunFolder)
        self.shown_write_shards: Optional[tuple] = None
        # a marker's files' sizes: a bucket's run folder resumed keeps finished shards' files in the
        # bucket, their sizes known (runfolder/bucket.RemoteRunFolder.sizes)
        self.size_of = size_of
        # the lease's fence (runfolder/lease.Fence): write_shard installs it where a Ray worker writes
        self.fence = None
        self.run_record = run_record
        self.created = False  # a joined run's worker that made run.json (it writes shards.json and run.yaml)
        self.run_json_version: Optional[str] = None  # of the run.json it created (a bucket's)
        self.writer: Optional[str] = None  # a joined run's worker: its token, in each marker and score file
        # the folder's run: a marker counts only where it names it (layout.vouches); --resume keeps
        # the recorded one, a new run or --overwrite makes one in _prepare
        self.run_id = self._recorded_run_id() if cfg.resume or cfg.retry_failed else None
        if identity is None:
            self.check_folder()
        else:
            self.open(identity)

    def open(self, identity: dict) -> None:
        """Check the folder against `identity` (--resume), clear it (--overwrite), create it and
        write run.json."""
        self.identity = _normalise(identity)
        if self.run_record is not None:
            self._join()
        else:
            self._prepare()

    # -- paths ----------------------------------------------------------------------------------
    def score_path(self, url: str) -> str:
        return os.path.join(self.scores_dir, table_name(self.names[url], self.cfg.format))

    def marker_path(self, url: str) -> str:
        return layout.marker_path(self.out, self.names[url])

    def filtered_path(self, url: str) -> Optional[str]:
        """The filtered copy of the shard; None where none is written (resharded at the end instead)."""
        if not self.cfg.copies_shards:
            return None
        return os.path.join(self.cfg.write_shards, self.names[url] + split_suffix(url)[1])

    # -- checks -----------------------------------------------------------------------------------
    def _existing_markers(self) -> List[str]:
        if not os.path.isdir(self.done_dir):
            return []
        return [f for f in os.listdir(self.done_dir) if f.endswith(".json") and not f.startswith(".")]

    def check_folder(self) -> None:
        """The checks that need no scorer: a previous run here needs --resume or --overwrite."""
        markers = self._existing_markers()
        if os.path.exists(os.path.join(self.out, layout.RUN_JSON)):
            if not self.cfg.resume and (markers or self._score_files()) and not self.cfg.overwrite:
                raise self._taken(len(markers))
        elif markers and not self.cfg.overwrite:
            raise ConfigError(f"{self.out} holds completion markers but no run.json; use another --out or --overwrite")

    def _taken(self, n_markers: int) -> ConfigError:
        return ConfigError(f"{self.out} already holds a scoring run ({n_markers} shard(s) done). "
                           f"Pass --resume to continue it, --overwrite to start over, or another --out")

    def _recorded_run_id(self) -> Optional[str]:
        try:
            data = layout.read_json(self.out, os.path.join(self.out, layout.RUN_JSON), {})
        except (ConfigError, DamagedRunFolder):  # said by check_folder or _prepare
            return None
        run_id = data.get(layout.RUN_ID) if isinstance(data, dict) else None
        return run_id if isinstance(run_id, str) else None

    def _prepare(self) -> None:
        run_json = os.path.join(self.out, layout.RUN_JSON)
        markers = self._existing_markers()
        self.run_id = os.urandom(8).hex()
        joined = None  # a joined run's shard list (`--join`): kept by a resume
        if os.path.exists(run_json):
            previous = layout.read_json(self.out, run_json, {})  # not JSON: a ConfigError naming it
            if self.cfg.resume and isinstance(previous, dict):  # the run it continues: its markers count
                self.run_id = previous.pop(layout.RUN_ID, None)
                joined = previous.pop(layout.JOINED, None)
            if self.cfg.resume:
                details = self._differences(previous)
                if details:
                    raise ConfigError(f"--resume: {self.out} was written with other settings ({details}). "
                                      f"Resume with the same settings, or use another --out")
            elif markers or self._score_files():
                if not self.cfg.overwrite:
                    raise self._taken(len(markers))
                if self.writable:
                    self._clear()
        elif markers and not self.cfg.overwrite:
            raise ConfigError(f"{self.out} holds completion markers but no run.json; use another --out or --overwrite")
        elif markers and self.writable:
            self._clear()
        if not self.writable:
            return
        os.makedirs(self.scores_dir, exist_ok=True)
        os.makedirs(self.done_dir, exist_ok=True)
        if self.cfg.write_shards:
            os.makedirs(self.cfg.write_shards, exist_ok=True)
        self._remove_temporaries()
        write_json(run_json, {**self.identity, **({layout.RUN_ID: self.run_id} if self.run_id else {}),
                              **({layout.JOINED: joined} if joined else {})}, fsync=True)
        layout.write_shard_list(self.out, self.urls, self.names, self._earlier_shards())

    def _differences(self, previous: dict) -> str:
        """The settings `previous` (a run.json less its run_id) records otherwise than this run: ''
        when none."""
        diff = sorted(k for k in set(previous) | set(self.identity) if previous.get(k) != self.identity.get(k))
        return "; ".join(f"{k}: was {previous.get(k)!r}, now {self.identity.get(k)!r}" for k in diff)

    def _join(self) -> None:
        """A joined run's worker (`--join`): run.json is created where there is none (atomically:
        of the workers that start at once, one makes it), else the run it names is joined, with
        the same settings and the same shards or not at all (a ConfigError naming what differs,
        before any work). The run's other files are the creator's to write (shards.json, run.yaml)."""
        self.run_id = os.urandom(8).hex()
        body = {**self.identity, layout.RUN_ID: self.run_id, layout.JOINED: layout.shard_list_digest(self.urls)}
        data = (json.dumps(_normalise(body), indent=1) + "\n").encode()
        try:
            if self.writable:
                self.run_json_version = self.run_record.create(data)
                self.created = True
        except Conflict:
            pass
        if not self.created:
            previous, _ = self.run_record.read()
            if previous is None:
                if not self.writable:
                    self.run_id = None
                    return
                raise ConfigError(f"{self.out}: run.json was there, then gone: another program is clearing the folder")
            self._check_joined(dict(previous))
        if not self.writable:
            return
        os.makedirs(self.scores_dir, exist_ok=True)
        os.makedirs(self.done_dir, exist_ok=True)
        if self.cfg.write_shards:
            os.makedirs(self.cfg.write_shards, exist_ok=True)
        run_json = os.path.join(self.out, layout.RUN_JSON)
        if self.created and not os.path.exists(run_json):  # a bucket's staging copy: the object's bytes
            with open(run_json, "wb") as f:
                f.write(data)
        if self.created:
            layout.write_shard_list(self.out, self.urls, self.names)

    def _check_joined(self, previous: dict) -> None:
        self.run_id = previous.pop(layout.RUN_ID, None)
        listed = previous.pop(layout.JOINED, None)
        details = self._differences(previous)
        if details:
            raise ConfigError(f"--join: {self.out} holds a run with other settings ({details}); every worker of a "
                              f"run gives the same settings (its run.json), or use another --out")
        mine = layout.shard_list_digest(self.urls)
        if listed is None:  # a run started without --join: its shards.json lists them
            known = layout.read_shard_list(self.out) or []
            listed = layout.shard_list_digest([s.url for s in known])
        if listed != mine:
            raise ConfigError(f"--join: shards: this worker was given {mine['shards']} shard(s), the run in "
                              f"{self.out} has {listed.get('shards') if isinstance(listed, dict) else '?'} (another "
                              f"list); every worker of a run is given the same shards")

    def _earlier_shards(self) -> List[layout.ListedShard]:
        """The shards of the runs this one resumes that have a marker (a resume over fewer
        shards): shards.json keeps naming their sources, so `wdsfilter filter` still reads them."""
        if not self.cfg.resume:
            return []
        try:
            listed = layout.read_shard_list(self.out) or []
        except ConfigError:  # damaged: this run's shards are what it records
            return []
        have = set(layout.marker_names(self.out))
        return [s for s in listed if s.name in have]

    def _score_files(self) -> List[str]:
        if not os.path.isdir(self.scores_dir):
            return []
        return [f for f in os.listdir(self.scores_dir) if not f.startswith(".")]

    def _clear(self) -> None:
        check_guards(self.out)  # the folder is still this run's
        for folder in (self.done_dir, self.scores_dir, *embedding_folders(self.out), ledger_folder(self.out)):
            if os.path.isdir(folder):
                for f in os.listdir(folder):
                    os.remove(os.path.join(folder, f))
        if os.path.exists(os.path.join(self.out, LEDGER_FILE)):  # the previous run's merged ledger
            os.remove(os.path.join(self.out, LEDGER_FILE))

    def _remove_temporaries(self) -> None:
        """Temporaries of a killed run (atomic.temporary_path) are never complete: delete them."""
        for folder in (self.scores_dir, self.done_dir, self.out, self.cfg.write_shards,
                       *embedding_folders(self.out), ledger_folder(self.out)):
            remove_temporaries(folder)

    # -- markers ----------------------------------------------------------------------------------
    def _marker(self, url: str) -> Optional[Marker]:
        """The shard's marker; None when there is none, or it is damaged or names another URL."""
        try:
            marker = layout.read_marker(self.out, self.names[url])
        except (OSError, DamagedRunFolder):
            return None
        return marker if marker.url in (url, published(url)) else None  # written published (publish.py)

    def _outputs(self, url: str, embeddings: Iterable[str], failures: Optional[str] = None) -> List[str]:
        """The files a marker vouches for; `failures`: the shard's failure ledger file, relative to
        --out (markers written before the ledger name none)."""
        paths = [self.score_path(url)] + ([self.filtered_path(url)] if self.cfg.copies_shards else [])
        return paths + [os.path.join(self.out, p) for p in [*(embeddings or []), *([failures] if failures else [])]]

    def _changed(self, url: str, marker: Marker) -> bool:
        """The source shard is not what was scored: its size or modification time differ."""
        return source_changed(url, marker.source)

    def is_done(self, url: str) -> bool:
        marker = self._marker(url)
        return (marker is not None and layout.vouches(marker, self.run_id)
                and outputs_intact(marker, self.out, self._outputs(url, marker.embeddings, marker.failures),
                                   self.size_of)
                and layout.written_by(marker, self.score_path(url))
                and not self._changed(url, marker))

    def scored_rows(self) -> int:
        """Rows of status `scored` in the shards done (their markers' counts): the run's earlier
        successes, which a --retry-failed of only failing samples builds on (backoff.Backoff)."""
        done = (self._marker(u) for u in self.urls if self.is_done(u))
        return sum(int(m.status.get("scored", 0)) for m in done if m is not None)

    def pending(self) -> List[str]:
        if not self.cfg.resume:
            return list(self.urls)
        todo = [u for u in self.urls if not self.is_done(u)]
        changed = [u for u in todo if (info := self._marker(u)) is not None and self._changed(u, info)]
        if changed:
            logging.getLogger("wdsfilter").warning(
                f"{len(changed)} shard(s) changed since they were scored (size or modification time), scored "
                f"again: {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}")
        self.resumed_from_markers = len(self.urls) - len(todo)
        return todo

    def mark_done(self, url: str, info: dict, source: Optional[str] = None) -> None:
        """The completion marker, written last. `source`: where the shard was read (a Ray worker
        reads an absolute path); a local one's size and modification time are recorded, and so are
        the sizes of the outputs, so --resume trusts neither a changed shard nor a damaged output."""
        name = self.names[url]
        known = {k: v for k, v in info.items() if k in Marker.__dataclass_fields__}
        marker = Marker(**known, url=url, name=name, score_file=f"{layout.SCORES}/{table_name(name, self.cfg.format)}",
                        filtered_shard=self._shown(self.filtered_path(url)), source=source_state(source or url),
                        run_id=self.run_id,
                        sizes=output_sizes(self.out, self._outputs(url, info.get("embeddings"), info.get("failures"))),
                        extra={**{k: v for k, v in info.items() if k not in Marker.__dataclass_fields__},
                               **({layout.WRITER: self.writer} if self.writer else {})})
        if self.writer and layout.create_marker(self.out, marker):  # a joined run's: created only where none is
            return
        layout.write_marker(self.out, marker)  # (a joined run's worker: over a stray one, while its claim holds)

    def _shown(self, path: Optional[str]) -> Optional[str]:
        if path and self.shown_write_shards and path.startswith(self.shown_write_shards[0] + os.sep):
            return self.shown_write_shards[1] + "/" + os.path.relpath(path, self.shown_write_shards[0])
        return path

    def done_score_files(self) -> List[str]:
        return [self.score_path(u) for u in self.urls if self.is_done(u)]

    def cut_shards(self) -> List[dict]:
        """Done shards that were scored up to a break in their tar (url, reason), this run's and
        those of the runs it resumed: the summary lists every one, not only this run's."""
        cut = []
        for url in self.urls:
            marker = self._marker(url) if self.is_done(url) else None
            if marker and marker.error:
                cut.append({"url": url, "reason": marker.error})
        return cut
