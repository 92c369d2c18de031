"""Exact, near and semantic dedup and eval-set decontamination of a scoring run (docs/dedup.md).

    hashindex.py   exact (sha256) and near (phash, multi-index hashing) pairs, bucket by bucket
    spill.py       the working files under RUN_DIR/dedup/tmp: row columns, buckets sized to a budget
    semantic.py    cosine pairs of saved CLIP embeddings within k-means clusters (faiss)
    groups.py      pairs -> groups (a union-find), one survivor per group
    evalset.py     eval images hashed like training rows
    source.py      what is read of the run folder
    (../runfolder/dedup.py: RUN_DIR/dedup/ and the drop rule filter --dedup and the loader apply)
    find.py        `dedup()`, the command's work
    cli.py         `wdsfilter dedup`
"""
from __future__ import annotations


def __getattr__(name):
    if name in ("dedup", "DedupResult"):
        from . import find
        return getattr(find, name)
    if name in ("DedupMarks", "drop_reason"):
        from ..runfolder import dedup as marks
        return getattr(marks, name)
    raise AttributeError(name)
