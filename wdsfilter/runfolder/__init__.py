"""The scoring run folder: what `wdsfilter score --out FOLDER` leaves on disk, with one owner.

    FOLDER/
      .lock.json               the folder's lease (lease.py): which run may write it; every
                               write is fenced by it
      run.json                 what produced the outputs (scorers, options, thresholds, keys):
                               `--resume` refuses other settings; run_id, which every marker
                               names (a marker naming another vouches for nothing)
      shards.json              the run's shards (url, name, the absolute path a local one was read
                               from): the run's own record of its sources; shards without a marker
                               are named as unfinished. The one file that keeps each URL as given,
                               password or presigned signature included (0600); every other file
                               names a shard as publish.published shows it
      scores/<name>.parquet    one score table per shard (or .jsonl), rows in the shard's order
      done/<name>.json         the completion marker (`Marker`), written last, after the shard's
                               outputs are in place: output sizes, the source shard's path, size
                               and modification time
      embeddings/              --save-embeddings in clip-retrieval's layout (embeddings.py)
      failures/<name>.parquet  the shard's failure ledger, written before its marker; failures.parquet
                               the ledger merged at the end of a run (score/ledger.py, failures.py)
      run.yaml                 the run as a recipe (score/recipe.py): `score --config` replays it
      dedup/                   what `wdsfilter dedup` marked (dedup.py reads it)
      summary.json, histograms.png, report.html, thresholds.json

Modules, one job each, below score/ and filtering/ (no torch):

    tables.py   score table I/O (write_table, read_table, read_batches, ...) over FORMATS, format_for
                (the one place a suffix decides a format), DamagedRunFolder; tableformat.py the
                interface, parquet.py and jsonl.py the formats
    layout.py   the names, the Marker and ListedShard records, what a folder may point at
                (score files inside it, sources its own record names), outputs_intact,
                source_changed
    reader.py   ScoreRun: the one reader (`wdsfilter filter`, the loader's score filter)
    keep.py     keep_reason: is a row kept (the scoring run, filter and the loader)
    judge.py    a run's rows judged by keep_reason against resolved thresholds and counted
                (FilterResult): `wdsfilter filter` and the run's report (wdsfilter/report/)
    failures.py the failure ledger's files as read (score/ledger.py writes them)
    dedup.py    dedup/: its reader and the one drop rule of `filter --dedup` and the loader
    lease.py    who may write a folder: the lease, its heartbeat and the fence of every write
                (score, filter --write-shards and dedup take it; a per-shard claim is the same)
    bucket.py   a run folder in a bucket: its lease, staging copy and mirror

The writer side (`--resume`/`--overwrite` checks, marking shards done) is score/resume.py's RunState,
which names its files through layout.py.
"""
from .keep import KEPT_STATUSES, Drop, keep_reason
from .layout import (DONE, RUN_JSON, SCORES, SHARDS_FILE, ListedShard, Marker, outputs_intact, shard_names,
                     source_changed, source_state)
from .reader import ScoredShard, ScoreRun
from .tables import DamagedRunFolder

__all__ = ["DONE", "RUN_JSON", "SCORES", "SHARDS_FILE", "KEPT_STATUSES", "Drop", "keep_reason", "ListedShard",
           "Marker", "outputs_intact", "shard_names", "source_changed", "source_state", "ScoredShard", "ScoreRun",
           "DamagedRunFolder"]
