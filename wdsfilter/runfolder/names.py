"""Every file and folder of a scoring run folder, and of the folder `wdsfilter filter --write-shards`
writes, named once (the run folder's drawing: runfolder/__init__.py). A module builds a path from
these names, never from a string of its own.

The files beside written shards, sizes.json and `{stem}_stats.json`, are named by shardstats.py
(their one reader and writer) and only re-exported here.
"""
from ..storage.shardstats import SIZES, STATS_SUFFIX

# -- a scoring run folder (`wdsfilter score --out OUT`) ---------------------------------------------------
LEASE = ".lock.json"  # who may write the folder (lease.py)
GUARD = ".lock"  # on a disk: the POSIX lock under which the lease record is compared and replaced (lease.py)
WORKERS = "workers"  # workers/<token>.json: the leases of `score --join` workers (claims.py)
CLAIMS = "claims"  # claims/<shard>.json: which joined worker scores a shard (claims.py)
FINISH = ".finish.json"  # the claim of a joined run's end-of-run work (claims.py)
RUN_JSON = "run.json"  # the run's identity (score/resume.py writes it)
SHARDS_FILE = "shards.json"  # the run's shards, the one file with each URL as given
RECIPE_FILE = "run.yaml"  # the run as a recipe (score/recipe.py writes it, runyaml.py reads its paths)
SCORES = "scores"  # scores/<shard>.parquet|.jsonl
DONE = "done"  # done/<shard>.json, the completion markers, written last
FAILURES = "failures"  # failures/<shard>.parquet, the failure ledger per shard
FAILURES_MERGED = "failures.parquet"  # the ledger merged at the end of a run
EMBEDDINGS = "embeddings"  # --save-embeddings, clip-retrieval's layout below it (embeddings.py)
EMBEDDING_PARTS = {"img": "img_emb", "txt": "text_emb"}  # a scorer's part -> clip-retrieval's subfolder
EMBEDDING_METADATA = "metadata"
SUMMARY = "summary.json"  # the run's summary (score/summary.py)
HISTOGRAMS = "histograms.png"
REPORT = "report.html"  # the run's report; also beside filter's shards, and dedup/'s
THRESHOLDS = "thresholds.json"  # the resolved selection as the loader's keyword arguments
FILTER_REPORT = "filter_report.html"  # `filter --save` without --write-shards
DEDUP = "dedup"  # what `wdsfilter dedup` marked (dedup.py reads it)
DEDUP_SUMMARY = "summary.json"  # dedup/summary.json
DEDUP_WORK = "tmp"  # dedup/tmp/, dedup's working files

# the run's own records, which a bucket's staging copy pulls and keeps (bucket.py)
STATE_FILES = (RUN_JSON, SHARDS_FILE, RECIPE_FILE)
STATE_FOLDERS = (DONE, FAILURES, DEDUP)

# -- the folder `wdsfilter filter --write-shards OUT` writes (runfolder/reshard.py) -----------------------
FILTER_RUN = "filter_run.json"  # what filter wrote there, so a rerun replaces only its own files
CARD = "README.md"  # the dataset card (runfolder/hfcard.py)

__all__ = ["RECIPE_FILE", "SIZES", "STATS_SUFFIX", "LEASE", "GUARD", "WORKERS", "CLAIMS", "FINISH", "RUN_JSON", "SHARDS_FILE", "SCORES", "DONE", "FAILURES",
           "FAILURES_MERGED", "EMBEDDINGS", "EMBEDDING_PARTS", "EMBEDDING_METADATA", "SUMMARY", "HISTOGRAMS",
           "REPORT", "THRESHOLDS", "FILTER_REPORT", "DEDUP", "DEDUP_SUMMARY", "DEDUP_WORK", "STATE_FILES",
           "STATE_FOLDERS", "FILTER_RUN", "CARD"]
