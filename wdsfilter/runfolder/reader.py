"""A scoring run folder read back without any model: the one reader of `wdsfilter filter`, the
loader's score filter (`wdsfilter.loader(scores=...)`) and the run's report.

Only shards with a marker count: a shard still being scored has no complete table. A score file
whose size is not the one its marker recorded is damaged and does not count either; neither do a
damaged marker's shard and the shards of the run (shards.json) that have no marker (failed, or not
scored yet): they are `unfinished`, so the result says the folder is incomplete. What the folder
may point at is decided in layout.py.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

from ..core.errors import ConfigError, UnsafeInputError
from . import layout
from ..core.thresholds import is_number
from .tables import BASE_FIELDS, NUMERIC_TYPES, DamagedRunFolder, format_for, read_batches, table_columns
from ..storage.remote import is_fsspec_url, redact_url
from ..storage.shardurls import is_pipe, is_remote


PERMISSIONS = ("allow_pipe", "allow_remote")


@dataclass(frozen=True)
class ScoredShard:
    url: str  # the source shard, where it is read (layout.trusted_source), else as the run named it
    name: str  # its output name (score file stem)
    score_file: str  # FOLDER/scores/<name>.<ext>
    source: Optional[dict] = None  # what the marker recorded of a local source shard (layout.source_changed)
    listed_url: str = ""  # the shard's URL as the scoring run was given it
    trusted: bool = True  # the run's own record names `url` (else it is never read)
    rows: int = 0  # the rows its marker counted (0: not recorded); the file's footer has the true count


@dataclass
class ScoreRun:
    folder: str
    shards: List[ScoredShard]
    columns: List[str]  # every column of the score files, base fields first
    stage: Dict = field(default_factory=dict)  # run.json's stage options, less its permissions
    unfinished: List[str] = field(default_factory=list)  # shards of the run without a usable score file
    scorers: List[dict] = field(default_factory=list)  # run.json's scorers

    @classmethod
    def open(cls, folder: str, source_root: Optional[str] = None, storage_options=None) -> "ScoreRun":
        """Read the folder's record (ConfigError when it is not a finished score folder, or
        points outside itself). source_root: where the source shards are now (layout.py). A
        folder in a bucket (s3://...) is read from its local copy, brought up to date
        (remote_out.pulled), by the same rules."""
        if is_fsspec_url(folder):
            from .remote_out import pulled  # (a bucket's client side: not imported for a local folder)
            folder = pulled(folder, storage_options)
        if not os.path.exists(folder):
            raise ConfigError(f"score folder {folder} does not exist; pass the --out folder of a `wdsfilter score` run")
        if not os.path.isdir(folder):
            raise ConfigError(f"{folder} is a file, not a score folder; pass the --out folder of a `wdsfilter score` "
                              f"run")
        if source_root is not None and not os.path.isdir(source_root):
            raise ConfigError(f"--source-root {source_root} is not a folder; pass the folder that holds the source "
                              f"shards now")
        confine = layout.Confinement(folder)  # one folder's rule, each directory resolved once
        done = confine(os.path.join(folder, layout.DONE))
        if not os.path.isdir(done):
            raise ConfigError(f"{folder} holds no completed score files (no done/ folder); pass the --out folder "
                              f"of a `wdsfilter score` run")
        confine(os.path.join(folder, layout.SCORES))
        settings = layout.read_run_json(folder)
        record = layout.read_shard_list(folder)
        listed = None if record is None else {s.name: s for s in record}
        shards: List[ScoredShard] = []
        unfinished: List[str] = []
        names = layout.marker_names(folder)
        for name in names:
            try:
                marker = layout.read_marker(folder, name, confine)
            except (DamagedRunFolder, FileNotFoundError):  # vouches for nothing: its shard is unfinished
                unfinished.append(listed[name].url if listed and name in listed else name)
                continue
            path = layout.score_file(folder, marker, confine)
            if not layout.vouches(marker, settings.get(layout.RUN_ID)) or not layout.written_by(marker, path) \
                    or not layout.outputs_intact(marker, folder, [path]):  # another run's or worker's, missing, damaged
                unfinished.append(marker.url)
                continue
            source = layout.trusted_source(marker, listed, source_root)
            shards.append(ScoredShard(url=source or marker.url, name=name, score_file=path, source=marker.source,
                                      listed_url=marker.url, trusted=source is not None, rows=marker.rows))
        unfinished += [s.url for s in record or () if s.name not in set(names)]
        if not shards:
            raise ConfigError(f"{folder} holds no completed score files (done/ is empty); finish or --resume the "
                              f"scoring run first")
        scorers = settings.get("scorers") or []
        # Permissions come from the command line, never from a folder: the run's allow_pipe and
        # allow_remote do not let `filter` run a command or fetch a URL the folder names.
        stage = {k: v for k, v in (settings.get("stage") or {}).items() if k not in PERMISSIONS}
        return cls(folder=folder, shards=shards, columns=table_columns([s.score_file for s in shards], scorers),
                   stage=stage, unfinished=unfinished, scorers=scorers)

    def require_sources(self) -> None:
        """Before any source shard is read (new shards, the report's thumbnails): every one is
        named by the run's own record, else a ConfigError naming the marker."""
        for s in self.shards:
            if not s.trusted:
                raise ConfigError(
                    f"{layout.marker_path(self.folder, s.name)} names the source shard {s.url}, which the run's "
                    f"own record ({layout.SHARDS_FILE}) does not list; a run folder cannot point outside what it "
                    f"recorded. Pass --source-root DIR (the folder holding the source shards now), or --no-report "
                    f"to count only")

    def check_columns(self, wanted: Sequence[str], what: str) -> None:
        missing = [c for c in wanted if c not in self.columns]
        if missing:
            raise ConfigError(f"{what} on {', '.join(missing)}, which the score files in {self.folder} do not have; "
                              f"their columns: {', '.join(self.columns)}")

    def numeric_columns(self, columns: Optional[Sequence[str]] = None) -> List[str]:
        """Score columns (of `columns`, default all) holding numbers in every score file (not the
        base fields, lists or flags). A JSON Lines column is numeric when it holds a number and
        no flag, list or object (a string in it counts as no value, keep.py)."""
        scores = [c for c in columns or self.columns if c in self.columns and c not in BASE_FIELDS]
        if not format_for(self.shards[0].score_file).columnar:  # no column types: the rows say
            return [c for c in scores if _numeric_in_rows(self.shards, c)]
        ok = set(scores)
        for s in self.shards:
            types = format_for(s.score_file).columns(s.score_file)
            ok = {c for c in ok if c not in types or types[c] in NUMERIC_TYPES}
        return [c for c in scores if c in ok]

    def batches(self, columns: Sequence[str]) -> Iterator[tuple]:
        """(shard, {column: list of values}) per batch of rows, over every finished shard in order."""
        for shard in self.shards:
            for batch in read_batches(shard.score_file, columns):
                yield shard, batch


def _numeric_in_rows(shards: Sequence[ScoredShard], column: str) -> bool:
    for shard in shards:
        for batch in read_batches(shard.score_file, [column]):
            for v in batch[column]:
                if v is None or isinstance(v, str):
                    continue
                return is_number(v)
    return False


def check_sources(urls: Sequence[str], allow_pipe: bool, allow_remote: bool, scores_dir: str) -> None:
    """Permissions come from this command line, never from the folder (a folder is input, handed
    over or edited like a shard): a source shard that is a `pipe:` command or a remote URL is read
    again only when this very call allows it (--allow-pipe, --allow-remote: a folder could
    otherwise make filter run any command or fetch any URL it names). Raises UnsafeInputError
    (exit 2) naming the first refused source, before anything is read."""
    refused = [u for u in urls if (is_pipe(u) and not allow_pipe) or (is_remote(u) and not allow_remote)]
    if refused:
        first = refused[0]
        flag = ("--allow-pipe (allow_pipe=True: it runs that command)" if is_pipe(first)
                else "--allow-remote (allow_remote=True)")
        raise UnsafeInputError(f"the score folder {scores_dir} names {len(refused)} source shard(s) that would be "
                               f"read again for --write-shards or the report, such as {redact_url(first)!r}; a "
                               f"folder never grants that: pass {flag} if you trust it, or --no-report and no "
                               f"--write-shards to count only")
