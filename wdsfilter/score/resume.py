"""Run state on disk: output names per shard, per-shard completion markers, resume checks.

Layout of --out DIR:
    run.json                 what produced the outputs (scorers, options, thresholds, keys)
    scores/<shard>.parquet   one score table per shard (or .jsonl)
    done/<shard>.json        completion marker, written last, after the shard's outputs are in place
    summary.json, histograms.png

A shard is done only when its marker exists and the files it names exist. Everything is written
to a temporary name and renamed, so a run killed with SIGKILL leaves complete files or
temporaries, never half files; --resume deletes the temporaries and re-scores every shard without
a marker from its start, so no sample is lost or written twice.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence

from ..errors import ConfigError
from .config import ScoreConfig
from .outputs import EXTENSIONS

SUFFIXES = (".tar.gz", ".tgz", ".tar")


def split_suffix(url: str):
    base = os.path.basename(url.rstrip("/"))
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)], suffix
    return base, ".tar"


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


def _atomic_json(path: str, data) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:  # a full disk: no half marker left behind
        if os.path.exists(tmp):
            os.remove(tmp)


def _normalise(obj):
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


class RunState:
    def __init__(self, cfg: ScoreConfig, urls: Sequence[str], identity: dict):
        self.cfg = cfg
        self.urls = list(urls)
        self.names = shard_names(self.urls)
        self.out = cfg.out
        self.scores_dir = os.path.join(cfg.out, "scores")
        self.done_dir = os.path.join(cfg.out, "done")
        self.ext = EXTENSIONS[cfg.format]
        self.identity = _normalise(identity)
        self.writable = not cfg.dry_run
        self.resumed_from_markers = 0
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
                    raise ConfigError(f"{self.out} already holds a scoring run ({len(markers)} shard(s) done). "
                                      f"Pass --resume to continue it, --overwrite to start over, or another --out")
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
        _atomic_json(run_json, self.identity)

    def _score_files(self) -> List[str]:
        if not os.path.isdir(self.scores_dir):
            return []
        return [f for f in os.listdir(self.scores_dir) if not f.startswith(".")]

    def _clear(self) -> None:
        for folder in (self.done_dir, self.scores_dir, os.path.join(self.out, "embeddings")):
            if os.path.isdir(folder):
                for f in os.listdir(folder):
                    os.remove(os.path.join(folder, f))

    def _remove_temporaries(self) -> None:
        """Temporaries of a killed run (`.<name>.tmp-<pid>`) are never complete: delete them."""
        for folder in (self.scores_dir, self.done_dir, self.out, self.cfg.write_shards,
                       os.path.join(self.out, "embeddings")):
            if folder and os.path.isdir(folder):
                for f in os.listdir(folder):
                    if f.startswith(".") and ".tmp-" in f:
                        os.remove(os.path.join(folder, f))

    # -- markers ----------------------------------------------------------------------------------
    def is_done(self, url: str) -> bool:
        marker = self.marker_path(url)
        if not os.path.exists(marker):
            return False
        try:
            with open(marker) as f:
                info = json.load(f)
        except (OSError, ValueError):
            return False
        paths = [self.score_path(url)] + ([self.filtered_path(url)] if self.cfg.write_shards else [])
        return info.get("url") == url and all(os.path.exists(p) for p in paths)

    def pending(self) -> List[str]:
        if not self.cfg.resume:
            return list(self.urls)
        todo = [u for u in self.urls if not self.is_done(u)]
        self.resumed_from_markers = len(self.urls) - len(todo)
        return todo

    def mark_done(self, url: str, info: dict) -> None:
        data = dict(info, url=url, name=self.names[url], score_file=self.score_path(url),
                    filtered_shard=self.filtered_path(url))
        _atomic_json(self.marker_path(url), data)

    def done_score_files(self) -> List[str]:
        return [self.score_path(u) for u in self.urls if self.is_done(u)]
