"""Training-time filtering by score files, without rewriting shards.

    loader = wdsfilter.loader("shards/", scores="scores/", min_scores={"clip_score": 0.28})
    loader = wdsfilter.loader("shards/", scores="scores/", min_clip=0.28)          # the same
    loader = wdsfilter.loader("shards/", scores="scores/", min_clip=0.28, max_ocr_area=0.2)
    loader = wdsfilter.loader("shards/", scores="scores/", max_scores={"ocr_area": 0.2})
    loader = wdsfilter.loader("shards/", scores="scores/", **json.load(open("train/thresholds.json")))

The stage joins each sample with the score files of a `wdsfilter score` run by key. A shard's
table is read lazily, when the shard's first sample arrives (one shard at a time per worker, so
memory does not grow with the dataset). A sample is kept by the one rule of the scoring run and
`wdsfilter filter` (runfolder.keep_reason): samples with no score row, a failed or rejected row, or
no value for a rule's column (the scorer could not score them) are dropped and counted
`no_score`, also with no rule at all, and a rejected row by its reason (`rejected: corrupt_image`,
never decoded here);
samples under a minimum, over a maximum or of another text value (`equal=`) are dropped and counted
`filtered_by_score`, and with dedup=True the duplicates and eval matches `wdsfilter dedup` marked
as `duplicate` and `eval_match`. A score file that cannot be read (damaged since the loader was
built) counts its shard's samples `no_score`, with the reason, instead of failing the training
loop. Both counts land in the loader's Tally like every other drop, so `loader.stats` shows them and the starvation watchdog sees them.
A score file damaged since its marker was written is not used; a local shard that changed since it
was scored (its marker records its size and modification time) is refused when the loader is built,
and so is a folder that points outside itself (wdsfilter/runfolder/layout.py). Moved data: a shard
is matched by the URL the scoring run was given, its absolute path, then its file name; the
loader never reads a source shard the folder names, only the shards it was given.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, Iterator, Optional, Tuple

from .core.errors import ConfigError
from .core.markers import MARKER
from .runfolder import DamagedRunFolder, ScoreRun, keep_reason, source_changed
from .runfolder.tables import read_table, table_stem
from .storage.shards import is_local, local_path, shard_stem
from .core.selection import Selection
from .core.tally import Tally
from .runfolder.dedup import DedupMarks
from .runfolder.shares import check_selection, loader_selection
from .core.publish import published

STAGE = "score_filter"


class ScoreFilter:
    """Picklable webdataset stage (see the module docstring)."""

    def __init__(self, scores_dir: str, selection: Selection, tally: Optional[Tally] = None, storage_options=None):
        """selection: the rules with their shares resolved (runfolder/shares.loader_selection)."""
        if not scores_dir:
            raise ConfigError("score filtering needs scores=DIR (the --out folder of `wdsfilter score`)")
        if not isinstance(selection, Selection):
            raise ConfigError(f"ScoreFilter takes a wdsfilter.Selection (score_filter() takes min_scores=, ...), got "
                              f"{type(selection).__name__}")
        if selection.shares:
            raise ConfigError("resolve the shares first (runfolder/shares.loader_selection)")
        self.scores_dir = scores_dir
        self.selection = selection
        self.rules = selection.row_rules()  # judged by the one keep rule, in order
        self.tally = tally if tally is not None else Tally(name="score_filter")
        # a folder in a bucket (s3://...) is read from a local copy; the options are not kept
        self.by_url, self.by_stem, run = self._index(storage_options)
        self._check_columns(run)
        self._url: Optional[str] = None
        self._table: Optional[Dict[str, Tuple]] = None
        self._why = ""
        self.dedup = None
        if selection.dedup:  # `wdsfilter dedup`'s verdicts, the rule `wdsfilter filter --dedup` applies too
            self.dedup = DedupMarks(run.folder, [(s.name, s.score_file) for s in run.shards])
        self._dropped: Dict[str, str] = {}

    # -- index of score files -----------------------------------------------------------------
    def _index(self, storage_options=None):
        """url/stem -> score file, from the one reader of a run folder (runfolder.ScoreRun): a
        folder that is not a finished run, or points outside itself, is a ConfigError here, when
        the loader is built. A marker's source path is only used where the run's own record names
        it; a shard is otherwise matched by the URL the run was given, then by its file name."""
        run = ScoreRun.open(self.scores_dir, storage_options=storage_options)
        by_url: Dict[str, str] = {}
        by_stem: Dict[str, Optional[str]] = {}
        changed = []
        for shard in run.shards:
            path, url = shard.score_file, shard.listed_url
            if shard.trusted and is_local(shard.url) and os.path.exists(local_path(shard.url)) \
                    and source_changed(shard.url, shard.source):
                changed.append(url)
            by_url[url] = path
            if shard.trusted:
                by_url[shard.url] = path
            if is_local(url):
                by_url[os.path.abspath(url)] = path
            stem = shard_stem(url)
            by_stem[stem] = None if stem in by_stem and by_stem[stem] != path else path  # None: ambiguous
        if changed:  # its samples are joined by key with scores of other bytes: refused before training
            raise ConfigError(f"{len(changed)} shard(s) changed since they were scored (size or modification time "
                              f"differ from the completion marker in {self.scores_dir}): {', '.join(changed[:3])}"
                              f"{' ...' if len(changed) > 3 else ''}; score them again (wdsfilter score ... --resume)")
        return by_url, by_stem, run

    def _check_columns(self, run: ScoreRun) -> None:
        """Every rule's column is a column of the run, of its kind (as `wdsfilter filter` checks)."""
        check_selection(self.selection, run)

    def score_file(self, url: str) -> Optional[str]:
        if url in self.by_url:
            return self.by_url[url]
        if published(url) in self.by_url:  # markers name a shard published (publish.py)
            return self.by_url[published(url)]
        if is_local(url) and os.path.abspath(url) in self.by_url:
            return self.by_url[os.path.abspath(url)]
        return self.by_stem.get(shard_stem(url))

    def _load(self, url: str) -> None:
        """The shard's table, {key: (status, reason, threshold values...)}; None when it has no
        score file, or one damaged since the loader was built (its samples are counted no_score)."""
        self._url, self._table, self._why = url, None, f"no score file for this shard in {self.scores_dir}"
        self._dropped = {}
        path = self.score_file(url)
        if path is None:
            return
        columns = ["status", "reason", *self.selection.columns()]
        try:
            t = read_table(path, ["key"] + columns)
            dropped = self.dedup.dropped(table_stem(path)) if self.dedup is not None else {}
        except (DamagedRunFolder, ConfigError) as e:  # never an exception into the training loop: no scores
            self._why = str(e)
            return
        table: Dict[str, Tuple] = {}
        for i, key in enumerate(t["key"]):
            if key not in table:  # a key repeated in one shard (a half-sample): its first row
                table[key] = tuple(t[c][i] if c in t else None for c in columns)
        self._table = table
        self._dropped = {key: reason for key, reason in dropped.values()}

    # -- the stage ---------------------------------------------------------------------------------
    def __call__(self, data: Iterable[dict]) -> Iterator[dict]:
        columns = ["status", "reason", *self.selection.columns()]
        for sample in data:
            if MARKER in sample:
                yield sample
                continue
            url, key = sample.get("__url__", ""), sample.get("__key__", "")
            if url != self._url:
                self._load(url)
            values = None if self._table is None else self._table.get(key)
            if values is None:
                why = self._why if self._table is None else f"no row for this key in {self.scores_dir}"
                self.tally.drop("no_score", STAGE, url, key, why)
                continue
            row = dict(zip(columns, values))
            drop = keep_reason(row, self.rules)
            if drop is not None:
                self.tally.drop(*_drop_counted(drop, row), STAGE, url, key, drop.explain(row))
                continue
            if key in self._dropped:  # "duplicate" or "eval_match"
                self.tally.drop(self._dropped[key], STAGE, url, key, f"marked by `wdsfilter dedup {self.scores_dir}`")
                continue
            yield sample

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_url=None, _table=None, _dropped={})  # each worker reads the tables it needs
        return state


def _drop_counted(drop, row: dict) -> tuple:
    """(the reason a dropped sample is counted under): a row the scoring run rejected by that
    reason, as keep_reason words it (`rejected: corrupt_image`: a problem of the data, not a missing
    score), a row without a score `no_score`, a rule's drop `filtered_by_score`."""
    if row.get("status") == "rejected":
        return (drop.reason,)
    return ("no_score" if drop.no_score else "filtered_by_score",)


def score_filter(scores_dir: str, min_scores: Optional[Dict[str, float]] = None, tally: Optional[Tally] = None,
                 max_scores: Optional[Dict[str, float]] = None, dedup: bool = False, storage_options=None,
                 **rules) -> ScoreFilter:
    """A stage dropping samples without scores, under `min_scores` or over `max_scores` (column ->
    bound), and by the other rules of a wdsfilter.Selection's keywords (equal=, top_shares=, ...,
    the shares resolved here); drops are counted in `tally` (pass the pipeline's, as wdsfilter.loader does)."""
    selection = Selection.from_keywords(min_scores=min_scores, max_scores=max_scores, dedup=dedup, **rules)
    return ScoreFilter(scores_dir, loader_selection(scores_dir, selection, storage_options), tally, storage_options)
