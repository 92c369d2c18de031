"""Training-time filtering by score files, without rewriting shards.

    loader = wdsfilter.loader("shards/", scores="scores/", min_scores={"clip_score": 0.28})
    loader = wdsfilter.loader("shards/", scores="scores/", min_clip=0.28)          # the same
    loader = wdsfilter.loader("shards/", scores="scores/", min_clip=0.28, max_ocr_area=0.2)
    loader = wdsfilter.loader("shards/", scores="scores/", max_scores={"ocr_area": 0.2})

The stage joins each sample with the score files of a `wdsfilter score` run by key. A shard's
table is read lazily, when the shard's first sample arrives (one shard at a time per worker, so
memory does not grow with the dataset). Samples with no score row, or whose row has no value for
a threshold column (the scorer could not score them), are dropped and counted `no_score`; samples
under a minimum or over a maximum are dropped and counted `filtered_by_score`. Both counts land in the loader's
Tally like every other drop, so `loader.stats` shows them and the starvation watchdog sees them.
A score file damaged since its marker was written is not used; a local shard that changed since it
was scored (its marker records its size and modification time) is refused when the loader is built.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Dict, Iterable, Iterator, Optional, Tuple

from .errors import ConfigError
from .shards import is_local, local_path, shard_stem
from .markers import MARKER
from .tally import Tally
from .thresholds import Thresholds, is_missing

STAGE = "score_filter"


class ScoreFilter:
    """Picklable webdataset stage (see the module docstring)."""

    def __init__(self, scores_dir: str, min_scores: Dict[str, float], tally: Optional[Tally] = None,
                 max_scores: Optional[Dict[str, float]] = None, dedup: bool = False):
        if not scores_dir:
            raise ConfigError("score filtering needs scores=DIR (the --out folder of `wdsfilter score`)")
        self.scores_dir = scores_dir
        self.thresholds = Thresholds.build(min_scores, max_scores)
        self.tally = tally if tally is not None else Tally(name="score_filter")
        self.by_url, self.by_stem = self._index()
        self._check_columns()
        self.dedup = None
        if dedup:  # `wdsfilter dedup`'s verdicts, the rule `wdsfilter filter --dedup` applies too
            from .dedup.marks import DedupMarks
            files = sorted({p for p in self.by_url.values()})
            self.dedup = DedupMarks(scores_dir, [(_stem(p), p) for p in files])
        self._url: Optional[str] = None
        self._table: Optional[Dict[str, Tuple]] = None
        self._dropped: Dict[str, str] = {}

    # -- index of score files -----------------------------------------------------------------
    def _index(self):
        done = os.path.join(self.scores_dir, "done")
        if not os.path.isdir(done):
            raise ConfigError(f"{self.scores_dir} holds no completed score files (no done/ folder); pass the "
                              f"--out folder of a `wdsfilter score` run")
        by_url: Dict[str, str] = {}
        by_stem: Dict[str, Optional[str]] = {}
        changed = []
        from .score.resume import outputs_intact, source_changed, source_path
        for marker in sorted(glob.glob(os.path.join(done, "*.json"))):
            try:
                with open(marker) as f:
                    info = json.load(f)
            except (OSError, ValueError):  # a damaged marker vouches for nothing: its samples are no_score
                continue
            path = info.get("score_file") or ""
            if not os.path.isabs(path) and not os.path.exists(path):
                path = os.path.join(self.scores_dir, "scores", os.path.basename(path))
            if not os.path.exists(path):  # the folder was moved: look beside the marker
                path = os.path.join(self.scores_dir, "scores", os.path.basename(path))
            if not outputs_intact(info, self.scores_dir, [path]):  # missing, or damaged since it was written
                continue
            url, source = info.get("url", ""), source_path(info)  # source: where it was read (absolute)
            if is_local(source) and os.path.exists(local_path(source)) and source_changed(source, info.get("source")):
                changed.append(url)
            by_url[url] = by_url[source] = path
            if is_local(url):
                by_url[os.path.abspath(url)] = path
            stem = shard_stem(url)
            by_stem[stem] = None if stem in by_stem and by_stem[stem] != path else path  # None: ambiguous
        if not by_url:
            raise ConfigError(f"{self.scores_dir} holds no completed score files (done/ is empty); "
                              f"finish or --resume the scoring run first")
        if changed:  # its samples are joined by key with scores of other bytes: refused before training
            raise ConfigError(f"{len(changed)} shard(s) changed since they were scored (size or modification time "
                              f"differ from the completion marker in {self.scores_dir}): {', '.join(changed[:3])}"
                              f"{' ...' if len(changed) > 3 else ''}; score them again (wdsfilter score ... --resume)")
        return by_url, by_stem

    def _check_columns(self) -> None:
        from .score.outputs import table_columns
        run_json = os.path.join(self.scores_dir, "run.json")
        scorers = None
        if os.path.exists(run_json):
            with open(run_json) as f:
                scorers = json.load(f).get("scorers")
        columns = set(table_columns(sorted(set(self.by_url.values())), scorers))
        for name, bounds in (("min_scores", self.thresholds.minima), ("max_scores", self.thresholds.maxima)):
            missing = [c for c in bounds if c not in columns]
            if missing:
                raise ConfigError(f"{name} on {missing}, which the score files in {self.scores_dir} do not have; "
                                  f"their columns: {', '.join(sorted(columns))}")

    def score_file(self, url: str) -> Optional[str]:
        if url in self.by_url:
            return self.by_url[url]
        if is_local(url) and os.path.abspath(url) in self.by_url:
            return self.by_url[os.path.abspath(url)]
        return self.by_stem.get(shard_stem(url))

    def _load(self, url: str) -> None:
        from .score.outputs import read_table
        self._url = url
        self._dropped = {}
        path = self.score_file(url)
        if path is None:
            self._table = None
            return
        columns = self.thresholds.columns()
        t = read_table(path, ["key"] + columns)
        table: Dict[str, Tuple] = {}
        for i, key in enumerate(t["key"]):
            if key not in table:  # a key repeated in one shard (a half-sample): its first row
                table[key] = tuple(t[c][i] if c in t else None for c in columns)
        self._table = table
        if self.dedup is not None:
            self._dropped = {key: reason for key, reason in self.dedup.dropped(_stem(path)).values()}

    # -- the stage ---------------------------------------------------------------------------------
    def __call__(self, data: Iterable[dict]) -> Iterator[dict]:
        columns = self.thresholds.columns()
        for sample in data:
            if MARKER in sample:
                yield sample
                continue
            url, key = sample.get("__url__", ""), sample.get("__key__", "")
            if url != self._url:
                self._load(url)
            values = None if self._table is None else self._table.get(key)
            if values is None:
                why = "no score file for this shard" if self._table is None else "no row for this key"
                self.tally.drop("no_score", STAGE, url, key, f"{why} in {self.scores_dir}")
                continue
            if any(is_missing(v) for v in values):
                self.tally.drop("no_score", STAGE, url, key, "the scoring run could not score this sample")
                continue
            row = dict(zip(columns, values))
            outside = self.thresholds.first_failure(row)
            if outside is not None:
                self.tally.drop("filtered_by_score", STAGE, url, key, outside.explain(row[outside.column]))
                continue
            if key in self._dropped:  # "duplicate" or "eval_match"
                self.tally.drop(self._dropped[key], STAGE, url, key, f"marked by `wdsfilter dedup {self.scores_dir}`")
                continue
            yield sample

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_url=None, _table=None, _dropped={})  # each worker reads the tables it needs
        return state


def _stem(score_file: str) -> str:
    """A shard's output name: its score file's name without the extension."""
    name = os.path.basename(score_file)
    return name[:-len(".parquet")] if name.endswith(".parquet") else name.rsplit(".", 1)[0]


def score_filter(scores_dir: str, min_scores: Dict[str, float], tally: Optional[Tally] = None,
                 max_scores: Optional[Dict[str, float]] = None, dedup: bool = False) -> ScoreFilter:
    """A stage dropping samples without scores, under `min_scores` or over `max_scores` (column ->
    bound); drops are counted in `tally` (pass the pipeline's, as wdsfilter.loader does)."""
    return ScoreFilter(scores_dir, min_scores, tally, max_scores, dedup)
