"""The output folder of a `wdsfilter score` run, read back without any model (both engines write
the same layout, see wdsfilter/score/resume.py):

    run.json                 the scoring settings (stage options: caption/image key, rekey, ...)
    scores/<name>.parquet    one table per shard (or .jsonl), rows in the shard's sample order
    done/<name>.json         completion marker: the shard's URL (`source`: where it was read) and its
                             score file

Only shards with a marker count: a shard still being scored has no complete table. A score file
whose size is not the one its marker recorded is damaged and does not count either; neither do
the shards of the run (shards.json) that have no marker (failed, or not scored yet): they are
counted as `unfinished`, so the result says the folder is incomplete.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence

from ..errors import ConfigError
from ..score.outputs import table_columns

BATCH_ROWS = 65536  # rows read at a time: memory stays flat however large a score file is


@dataclass(frozen=True)
class ScoredShard:
    url: str  # the source shard, where the scoring run read it (a local one by its absolute path)
    name: str  # its output name (score file stem)
    score_file: str
    source: Optional[dict] = None  # what the marker recorded of a local source shard (resume.source_changed)


@dataclass
class ScoreRun:
    folder: str
    shards: List[ScoredShard]
    columns: List[str]  # every column of the score files, base fields first
    stage: Dict = field(default_factory=dict)  # run.json's stage options
    unfinished: List[str] = field(default_factory=list)  # shards of the run without a usable score file

    @classmethod
    def open(cls, folder: str) -> "ScoreRun":
        done = os.path.join(folder, "done")
        if not os.path.exists(folder):
            raise ConfigError(f"score folder {folder} does not exist; pass the --out folder of a `wdsfilter score` run")
        if not os.path.isdir(folder):
            raise ConfigError(f"{folder} is a file, not a score folder; pass the --out folder of a `wdsfilter score` "
                              f"run")
        if not os.path.isdir(done):
            raise ConfigError(f"{folder} holds no completed score files (no done/ folder); pass the --out folder "
                              f"of a `wdsfilter score` run")
        from ..score.resume import SHARDS_FILE, outputs_intact, source_path
        shards: List[ScoredShard] = []
        unfinished: List[str] = []
        for name in sorted(f for f in os.listdir(done) if f.endswith(".json") and not f.startswith(".")):
            try:
                with open(os.path.join(done, name)) as f:
                    info = json.load(f)
            except (OSError, ValueError):
                info = {}
            path = _find_score_file(folder, info.get("score_file") or "")
            if path is None or not outputs_intact(info, folder, [path]):
                unfinished.append(info.get("url") or name[:-5])
                continue
            shards.append(ScoredShard(url=source_path(info), name=info.get("name") or name[:-5], score_file=path,
                                      source=info.get("source")))
        listed = os.path.join(folder, SHARDS_FILE)
        if os.path.exists(listed):
            with open(listed) as f:
                marked = {s.name for s in shards} | {n[:-5] for n in os.listdir(done) if n.endswith(".json")}
                unfinished += [s["url"] for s in json.load(f)["shards"] if s["name"] not in marked]
        if not shards:
            raise ConfigError(f"{folder} holds no completed score files (done/ is empty); finish or --resume the "
                              f"scoring run first")
        settings: Dict = {}
        run_json = os.path.join(folder, "run.json")
        if os.path.exists(run_json):
            with open(run_json) as f:
                settings = json.load(f)
        return cls(folder=folder, shards=shards, columns=table_columns([s.score_file for s in shards], settings.get("scorers")),
                   stage=settings.get("stage") or {}, unfinished=unfinished)

    def check_columns(self, wanted: Sequence[str], what: str) -> None:
        missing = [c for c in wanted if c not in self.columns]
        if missing:
            raise ConfigError(f"{what} on {', '.join(missing)}, which the score files in {self.folder} do not have; "
                              f"their columns: {', '.join(self.columns)}")

    def numeric_columns(self) -> List[str]:
        """Score columns holding numbers (not the base fields, lists or flags)."""
        from ..score.outputs import BASE_FIELDS
        if not self.shards[0].score_file.endswith(".parquet"):
            return [c for c in self.columns if c not in BASE_FIELDS and _jsonl_numeric(self.shards, c)]
        import pyarrow as pa
        import pyarrow.parquet as pq
        schema = pq.read_schema(self.shards[0].score_file)
        return [c for c in self.columns if c not in BASE_FIELDS
                and (pa.types.is_floating(schema.field(c).type) or pa.types.is_integer(schema.field(c).type))]

    def batches(self, columns: Sequence[str]) -> Iterator[tuple]:
        """(shard, {column: list of values}) per batch of rows, over every finished shard in order."""
        for shard in self.shards:
            for batch in read_batches(shard.score_file, columns):
                yield shard, batch


def _find_score_file(folder: str, recorded: str) -> Optional[str]:
    # The folder may have been moved since the run: then the file is beside the marker.
    for path in (recorded, os.path.join(folder, "scores", os.path.basename(recorded))):
        if path and os.path.exists(path):
            return path
    return None


def _jsonl_numeric(shards: Sequence[ScoredShard], column: str) -> bool:
    for shard in shards:
        for batch in read_batches(shard.score_file, [column]):
            for v in batch[column]:
                if v is not None:
                    return isinstance(v, (int, float)) and not isinstance(v, bool)
    return False


def read_batches(path: str, columns: Sequence[str], rows: int = BATCH_ROWS) -> Iterator[Dict[str, list]]:
    """One score file, `rows` rows at a time, as {column: values}; a column the file lacks is None."""
    columns = list(dict.fromkeys(columns))
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path)
        present = [c for c in columns if c in pf.schema_arrow.names]
        for batch in pf.iter_batches(batch_size=rows, columns=present):
            data = batch.to_pydict()
            n = batch.num_rows
            yield {c: data[c] if c in data else [None] * n for c in columns}
        return
    chunk: List[dict] = []
    with open(path) as f:
        for line in f:
            if line.strip():
                chunk.append(json.loads(line))
            if len(chunk) >= rows:
                yield {c: [r.get(c) for r in chunk] for c in columns}
                chunk = []
    if chunk:
        yield {c: [r.get(c) for r in chunk] for c in columns}


def read_numbers(path: str, column: str, rows: int = BATCH_ROWS):
    """One numeric column of a score file as float64 numpy arrays, `rows` at a time, missing
    values (null, NaN) left out."""
    import numpy as np
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        pf = pq.ParquetFile(path)
        if column not in pf.schema_arrow.names:
            return
        for batch in pf.iter_batches(batch_size=rows, columns=[column], use_threads=False):
            # nulls come out as NaN (no pyarrow.compute cast: its dispatch costs more than the copy)
            values = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.float64)
            missing = np.isnan(values)
            yield values[~missing] if missing.any() else values
        return
    for batch in read_batches(path, [column], rows):
        values = np.array([v for v in batch[column] if isinstance(v, (int, float)) and not isinstance(v, bool)],
                          dtype=np.float64)
        yield values[~np.isnan(values)]
