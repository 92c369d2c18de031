"""Run state on disk: output names per shard, per-shard completion markers, resume checks.

Layout of --out DIR:
    run.json                 what produced the outputs (scorers, options, thresholds, keys)
    shards.json              the shards of the latest run (url, name): `wdsfilter filter` names those
                             without a marker (failed, or not scored yet) instead of leaving them out quietly
    scores/<shard>.parquet   one score table per shard (or .jsonl)
    done/<shard>.json        completion marker, written last, after the shard's outputs are in place
    summary.json, histograms.png

A shard is done only when its marker exists, the files it names exist with the sizes the marker
recorded (a score file cut short or replaced is not trusted), and a local source shard has the
size and modification time it had when it was scored (a shard re-created under the same name is
scored again). Everything is written
to a temporary name and renamed, so a run killed with SIGKILL leaves complete files or
temporaries, never half files; --resume deletes the temporaries and re-scores every shard without
a marker from its start, so no sample is lost or written twice.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Dict, Iterable, List, Optional, Sequence

from ..atomic import remove_temporaries, write_json
from ..errors import ConfigError
from ..shards import absolute_url, is_local, split_suffix
from .config import ScoreConfig
from .embeddings import folders as embedding_folders
from .ledger import MERGED as LEDGER_FILE, folder as ledger_folder
from .outputs import EXTENSIONS


def shard_names(urls: Sequence[str]) -> Dict[str, str]:
    """url -> output name: the shard's file name without its suffix; when two shards share one
    (a/00.tar, b/00.tar), each gets a short hash of its path too."""
    stems = {u: split_suffix(u)[0] for u in urls}
    counts: Dict[str, int] = {}
    for stem in stems.values():
        counts[stem] = counts.get(stem, 0) + 1
    names = {}
    for url, stem in stems.items():
        if counts[stem] > 1:
            stem = f"{stem}-{hashlib.sha1(os.path.abspath(url).encode()).hexdigest()[:8]}"
        names[url] = stem
    return names


SHARDS_FILE = "shards.json"


def source_state(url: str) -> Optional[dict]:
    """What a marker records of a local source shard: where it was read (its absolute path, so
    `wdsfilter filter` finds a shard named by a relative path from any folder), its size and
    modification time (None for a pipe: or remote shard: not checked)."""
    if not is_local(url):
        return None
    path = absolute_url(url)
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path}
    return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def source_path(info: dict) -> str:
    """Where a marker's shard is read again: its recorded absolute path, else its URL as given."""
    return (info.get("source") or {}).get("path") or info.get("url", "")


def source_changed(url: str, recorded: Optional[dict]) -> bool:
    """The local shard `url` is not the one a marker recorded (`recorded`: its source_state then):
    its size or its modification time differ; a time in whole seconds on either side (a shared
    filesystem that shows seconds only on another machine: a Ray worker recorded it) is compared
    to the second. False when nothing was recorded (a pipe: or remote shard, an older marker). The
    one test of "this shard changed since it was scored", for --resume, `wdsfilter filter` and the
    loader's score filter."""
    if not recorded or "bytes" not in recorded:
        return False
    now = source_state(url) or {}
    if now.get("bytes") != recorded["bytes"]:  # a different size, or gone
        return True
    a, b = now["mtime_ns"], int(recorded.get("mtime_ns", 0))
    second = 1_000_000_000
    if a % second == 0 or b % second == 0:
        return a // second != b // second
    return a != b


def output_sizes(out: str, paths: Iterable[str]) -> Dict[str, int]:
    """What a marker records of its shard's output files: size by path relative to `out`."""
    return {os.path.relpath(p, out): os.path.getsize(p) for p in paths}


def outputs_intact(info: dict, out: str, paths: Iterable[str]) -> bool:
    """Every path exists, with the size the marker `info` recorded for it (markers written before
    sizes were recorded have none: existence is all they vouch for). The one test of a marker's
    files, for --resume and for `wdsfilter filter`."""
    sizes = info.get("sizes") or {}
    for p in paths:
        try:
            size = os.path.getsize(p)
        except OSError:
            return False
        if sizes.get(os.path.relpath(p, out), size) != size:
            return False
    return True


def _normalise(obj):
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


class RunState:
    def __init__(self, cfg: ScoreConfig, urls: Sequence[str], identity: Optional[dict] = None):
        """Paths and markers at once; with `identity`, also open() the folder. Without it, the
        folder is only checked (check_folder), so that happens before any model is resolved,
        and open(identity) follows once the scorers are known."""
        self.cfg = cfg
        self.urls = list(urls)
        self.names = shard_names(self.urls)
        self.out = cfg.out
        self.scores_dir = os.path.join(cfg.out, "scores")
        self.done_dir = os.path.join(cfg.out, "done")
        self.ext = EXTENSIONS[cfg.format]
        self.identity: Optional[dict] = None
        self.writable = not cfg.dry_run
        self.resumed_from_markers = 0
        if identity is None:
            self.check_folder()
        else:
            self.open(identity)

    def open(self, identity: dict) -> None:
        """Check the folder against `identity` (--resume), clear it (--overwrite), create it and
        write run.json."""
        self.identity = _normalise(identity)
        self._prepare()

    # -- paths ----------------------------------------------------------------------------------
    def score_path(self, url: str) -> str:
        return os.path.join(self.scores_dir, self.names[url] + self.ext)

    def marker_path(self, url: str) -> str:
        return os.path.join(self.done_dir, self.names[url] + ".json")

    def filtered_path(self, url: str) -> Optional[str]:
        if not self.cfg.write_shards:
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
        if os.path.exists(os.path.join(self.out, "run.json")):
            if not self.cfg.resume and (markers or self._score_files()) and not self.cfg.overwrite:
                raise self._taken(len(markers))
        elif markers and not self.cfg.overwrite:
            raise ConfigError(f"{self.out} holds completion markers but no run.json; use another --out or --overwrite")

    def _taken(self, n_markers: int) -> ConfigError:
        return ConfigError(f"{self.out} already holds a scoring run ({n_markers} shard(s) done). "
                           f"Pass --resume to continue it, --overwrite to start over, or another --out")

    def _prepare(self) -> None:
        run_json = os.path.join(self.out, "run.json")
        markers = self._existing_markers()
        if os.path.exists(run_json):
            with open(run_json) as f:
                previous = json.load(f)
            if self.cfg.resume:
                diff = sorted(k for k in set(previous) | set(self.identity) if previous.get(k) != self.identity.get(k))
                if diff:
                    details = "; ".join(f"{k}: was {previous.get(k)!r}, now {self.identity.get(k)!r}" for k in diff)
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
        write_json(run_json, self.identity, fsync=True)
        write_json(os.path.join(self.out, SHARDS_FILE), {"shards": [{"url": u, "name": self.names[u]} for u in self.urls]})

    def _score_files(self) -> List[str]:
        if not os.path.isdir(self.scores_dir):
            return []
        return [f for f in os.listdir(self.scores_dir) if not f.startswith(".")]

    def _clear(self) -> None:
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
    def _marker(self, url: str) -> Optional[dict]:
        try:
            with open(self.marker_path(url)) as f:
                info = json.load(f)
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) and info.get("url") == url else None

    def _outputs(self, url: str, embeddings: Iterable[str], failures: Optional[str] = None) -> List[str]:
        """The files a marker vouches for; `failures`: the shard's failure ledger file, relative to
        --out (markers written before the ledger name none)."""
        paths = [self.score_path(url)] + ([self.filtered_path(url)] if self.cfg.write_shards else [])
        return paths + [os.path.join(self.out, p) for p in [*(embeddings or []), *([failures] if failures else [])]]

    def _changed(self, url: str, info: dict) -> bool:
        """The source shard is not what was scored: its size or modification time differ."""
        return source_changed(url, info.get("source"))

    def is_done(self, url: str) -> bool:
        info = self._marker(url)
        return (info is not None and outputs_intact(info, self.out, self._outputs(url, info.get("embeddings"),
                                                                                    info.get("failures")))
                and not self._changed(url, info))

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
        data = dict(info, url=url, name=self.names[url], score_file=self.score_path(url),
                    filtered_shard=self.filtered_path(url), source=source_state(source or url),
                    sizes=output_sizes(self.out, self._outputs(url, info.get("embeddings"), info.get("failures"))))
        write_json(self.marker_path(url), data, fsync=True)

    def done_score_files(self) -> List[str]:
        return [self.score_path(u) for u in self.urls if self.is_done(u)]

    def cut_shards(self) -> List[dict]:
        """Done shards that were scored up to a break in their tar (url, reason), this run's and
        those of the runs it resumed: the summary lists every one, not only this run's."""
        cut = []
        for url in self.urls:
            info = self._marker(url) if self.is_done(url) else None
            if info and info.get("error"):
                cut.append({"url": url, "reason": info["error"]})
        return cut
