"""`wdsfilter dedup RUN_DIR`: duplicate groups of a scoring run's rows, one survivor each, and the
rows that match eval images; written to RUN_DIR/dedup/ (marks.py). No model is loaded, except the
run's CLIP for `--eval` with the semantic kind (the eval images must be embedded by the same
model): the hash columns and saved embeddings of the scoring pass are all it reads.

    from wdsfilter.dedup import dedup
    result = dedup("scores/", kinds=["exact", "near"], evals=["imagenet-val/"])
    print(result.format_text())
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..errors import ConfigError
from .groups import KINDS, build_groups
from ..runfolder.dedup import FOLDER, SUMMARY, score_file_state

NEAR_BITS = 5           # docs/dedup.md: re-encodes, resizes and PNG<->JPEG measured at <= 4 bits, distinct photos >= 16
SEMANTIC_THRESHOLD = 0.95  # cosine; SemDeDup's eps = 1 - cosine, 0.05
LARGEST = 10


@dataclass
class DedupResult:
    run_dir: str
    kinds: List[str]
    rows: int = 0
    shards: int = 0
    unfinished: List[str] = field(default_factory=list)
    groups: int = 0
    per_kind: Dict[str, int] = field(default_factory=dict)  # groups per group kind ("exact+near"): adds up to groups
    rows_per_kind: Dict[str, int] = field(default_factory=dict)  # rows in groups per closest link
    duplicates: int = 0       # rows that are not their group's survivor
    eval_images: int = 0
    eval_unreadable: List[str] = field(default_factory=list)
    eval_matches: Dict[str, int] = field(default_factory=dict)
    largest: List[dict] = field(default_factory=list)
    seconds: Dict[str, float] = field(default_factory=dict)
    folder: str = ""

    def format_text(self, verbose: bool = False) -> str:
        """The counts; verbose (-v): every one of the largest groups with its members, and the
        seconds each step took."""
        lines = [f"{self.rows} rows in {self.shards} finished shard(s) of {self.run_dir}; kinds: {', '.join(self.kinds)}"]
        if self.unfinished:
            lines.append(f"  INCOMPLETE: {len(self.unfinished)} shard(s) of the run have no complete score file and "
                         f"were left out: {', '.join(self.unfinished[:3])}")
        # Each group counted once, under the kinds of its rows, so the counts add up to the total.
        by_kind = ", ".join(f"{n} {k}" for k, n in self.per_kind.items()) or "none"
        lines.append(f"  {self.groups} duplicate group(s), by the kinds of their rows: {by_kind}")
        if self.rows_per_kind:
            in_groups = sum(self.rows_per_kind.values())
            lines.append(f"  {in_groups} row(s) in groups, by their closest link: "
                         + ", ".join(f"{n} {k}" for k, n in self.rows_per_kind.items()))
        lines.append(f"  {self.duplicates} row(s) are duplicates of a survivor, {self.rows - self.duplicates} kept")
        if self.eval_images or self.eval_unreadable:
            matched = ", ".join(f"{n} {k}" for k, n in self.eval_matches.items()) or "none"
            lines.append(f"  eval: {self.eval_images} image(s) compared; rows matching one: {matched}")
            for line in self.eval_unreadable[:5]:
                lines.append(f"    not read: {line}")
        shown = 3 if not verbose else len(self.largest)
        for g in self.largest[:shown]:
            members = g["members"] if verbose else g["members"][:3]
            lines.append(f"  largest: group {g['group']} ({g['size']} rows, {g['kind']}): "
                         + ", ".join(f"{m['shard']}/{m['key']}" + (" (survivor)" if verbose and m.get("survivor") else "")
                                     for m in members))
        if verbose and self.seconds:
            lines.append("  seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in self.seconds.items()))
        lines.append(f"  written: {self.folder} (use `wdsfilter filter {self.run_dir} --dedup`)")
        return "\n".join(lines)


def dedup(run_dir: str, kinds: Sequence[str] = (), near_bits: int = NEAR_BITS,
          semantic_threshold: float = SEMANTIC_THRESHOLD, evals: Sequence[str] = (),
          echo: Optional[Callable[[str], None]] = None, storage_options=None) -> DedupResult:
    """Group duplicates of the kinds asked (default: every kind the run has data for), choose the
    survivors, mark eval matches, write RUN_DIR/dedup/. Returns the counts. A run folder in a
    bucket (s3://...) is pulled into a staging copy under its lock object, as `score --out`
    does (score/outlock.py), deduped there, and its dedup/ uploaded whole before this returns."""
    from ..remote import is_fsspec_url
    _check_options(kinds, near_bits, semantic_threshold)  # before a bucket's folder is locked and pulled
    if is_fsspec_url(run_dir):
        return _dedup_in_bucket(run_dir, storage_options, dict(kinds=kinds, near_bits=near_bits,
                                                               semantic_threshold=semantic_threshold,
                                                               evals=evals, echo=echo))
    return _dedup(run_dir, kinds, near_bits, semantic_threshold, evals, echo)


def _dedup_in_bucket(url: str, storage_options, options: dict) -> DedupResult:
    from ..remote import filesystem, redact_url
    from ..runfolder.layout import RUN_JSON
    from ..remote import refuse_hub_run_folder
    from ..score.outlock import RemoteRunFolder
    refuse_hub_run_folder(url)  # before the folder is read
    fs, path = filesystem(url, storage_options)
    if not fs.exists(path.rstrip("/") + "/" + RUN_JSON):  # before the lock object is written there
        raise ConfigError(f"{redact_url(url)} holds no scoring run ({RUN_JSON} is missing); give the --out of a "
                          f"`wdsfilter score` run")
    staged = RemoteRunFolder(url, storage_options, command="dedup", option="RUN_DIR")
    try:
        staged.start()
        result = _dedup(staged.local, **options)
        for name in (SUMMARY, "report.html"):  # they name the bucket's folder, not the staging copy
            staged.publish_text(os.path.join(staged.local, FOLDER, name))
        staged.sync()  # RUN_DIR/dedup/ in the bucket before the command reports it
    except ConfigError as e:
        raise type(e)(staged.public(str(e))) from None
    finally:
        staged.release()
    result.run_dir, result.folder = url.rstrip("/"), staged.public(result.folder)
    return result


def _check_options(kinds: Sequence[str], near_bits: int, semantic_threshold: float) -> None:
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ConfigError(f"unknown dedup kind(s) {unknown}; choose from {', '.join(KINDS)}")
    if isinstance(near_bits, bool) or not isinstance(near_bits, int) or not 0 <= near_bits <= 32:
        raise ConfigError(f"near distance must be a number of bits from 0 to 32, got {near_bits!r}")
    if not -1.0 <= float(semantic_threshold) <= 1.0:
        raise ConfigError(f"semantic threshold is a cosine in [-1, 1], got {semantic_threshold!r}")


def _dedup(run_dir: str, kinds: Sequence[str], near_bits: int, semantic_threshold: float, evals: Sequence[str],
           echo: Optional[Callable[[str], None]]) -> DedupResult:
    from . import source
    echo = echo or (lambda line: None)
    t0 = time.perf_counter()
    rows = source.load_rows(run_dir, want_hashes=True)
    if kinds:
        kinds = list(dict.fromkeys(kinds))
        if {"exact", "near"} & set(kinds):
            source.require_hashes(rows, " and ".join(k for k in kinds if k != "semantic"))
    else:  # every kind the run has the data for
        kinds = (["exact", "near"] if rows.phash is not None else []) + \
                (["semantic"] if source.has_embeddings(run_dir) else [])
        if not kinds:
            raise ConfigError(f"{run_dir} has neither hashes nor embeddings to dedup by; {source.HASH_HINT}, "
                              f"or add --save-embeddings for semantic dedup")
    if evals and rows.phash is None:
        raise ConfigError(f"--eval matching needs the run's hashes; {source.HASH_HINT}")
    result = DedupResult(run_dir=run_dir, kinds=list(kinds), rows=rows.count, shards=len(rows.shards),
                         unfinished=rows.unfinished)
    result.seconds["read"] = time.perf_counter() - t0
    pairs = {}
    if "exact" in kinds:
        from .hashindex import exact_pairs
        pairs["exact"] = exact_pairs(rows.sha, np.flatnonzero(rows.has_sha))
    if "near" in kinds:
        from .hashindex import near_pairs
        t = time.perf_counter()
        pairs["near"] = near_pairs(rows.phash, np.flatnonzero(rows.has_phash), near_bits)
        result.seconds["near"] = time.perf_counter() - t
    clusters = 0
    if "semantic" in kinds:
        from .semantic import semantic_pairs
        t = time.perf_counter()
        a, b, clusters = semantic_pairs(source.embeddings(rows), float(semantic_threshold), seconds=result.seconds)
        pairs["semantic"] = (a, b)
        result.seconds["semantic"] = time.perf_counter() - t
    groups = build_groups(rows.count, pairs, rows.clip)
    result.groups = len(groups.sizes)
    result.per_kind = groups.per_kind
    result.rows_per_kind = groups.rows_per_kind
    result.duplicates = int((~groups.survivor).sum())
    matches = np.full(rows.count, None, dtype=object)
    if evals:
        from .evalset import read_eval
        ev = read_eval(evals)
        result.eval_images, result.eval_unreadable = len(ev.names), ev.unreadable
        result.eval_matches = _match_eval(rows, ev, near_bits, matches)
        if "semantic" in kinds and ev.names:  # the one step that loads a model: the run's CLIP
            n = _match_eval_semantic(run_dir, rows, ev, evals, float(semantic_threshold), matches)
            if n:
                result.eval_matches["semantic"] = n
        echo(f"eval: {len(ev.names)} image(s) read from {', '.join(evals)}")
    result.largest = _largest(rows, groups)
    result.folder = _write(rows, groups, matches, result, dict(near_bits=near_bits, semantic_threshold=semantic_threshold,
                                                                kinds=list(kinds), clusters=clusters, evals=list(evals)))
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _match_eval(rows, ev, near_bits: int, matches: np.ndarray) -> Dict[str, int]:
    """Mark each row matching an eval image "KIND:NAME" (exact before near); counts per kind."""
    from .hashindex import near_cross
    counts: Dict[str, int] = {}
    if not ev.names:
        return counts
    sha = ev.sha_array()
    by_sha = {(int(h), int(lo)): name for (h, lo), name in zip(sha, ev.names)}
    hit = np.flatnonzero(rows.has_sha & np.isin(rows.sha[:, 0], sha[:, 0]))
    for r in hit:
        name = by_sha.get((int(rows.sha[r, 0]), int(rows.sha[r, 1])))
        if name is not None:
            matches[r] = f"exact:{name}"
            counts["exact"] = counts.get("exact", 0) + 1
    candidates = np.flatnonzero(rows.has_phash)
    table = np.array(ev.phash, dtype=np.int64).view(np.uint64)
    for i, j in near_cross(rows.phash[candidates].view(np.uint64), table, near_bits):
        for r, e in zip(candidates[i], j):
            if matches[r] is None:
                matches[r] = f"near:{ev.names[e]}"
                counts["near"] = counts.get("near", 0) + 1
    return counts


def _match_eval_semantic(run_dir, rows, ev, evals, threshold: float, matches: np.ndarray) -> int:
    """Mark rows (not matched yet) whose saved image embedding has cosine >= threshold with an
    eval image embedded by the run's own CLIP model; how many."""
    from . import source
    from .evalset import clip_of_run, embed_eval
    emb = source.embeddings(rows)
    evec = embed_eval(clip_of_run(run_dir), evals, ev.names)
    marked = 0
    for start, block in emb.blocks(emb.mapped()):
        sims = block @ evec.T
        best = sims.argmax(axis=1)
        for v in np.flatnonzero(sims[np.arange(len(block)), best] >= threshold):
            r = emb.rows[start + v]
            if matches[r] is None:
                matches[r] = f"semantic:{ev.names[best[v]]}"
                marked += 1
    return marked


def _largest(rows, groups) -> List[dict]:
    """The LARGEST biggest groups, each with up to 8 members (shard, key read later, index)."""
    if not len(groups.sizes):
        return []
    top = np.argsort(-groups.sizes, kind="stable")[:LARGEST]
    out = []
    for g in top:
        members = np.flatnonzero(groups.group == g)[:8]
        shard = rows.shard_of(members)
        out.append({"group": int(g), "size": int(groups.sizes[g]), "kind": groups.group_kind[g],
                    "members": [{"shard": rows.shards[s].name, "index": int(rows.index[m]), "row": int(m),
                                 "survivor": bool(groups.survivor[m])} for m, s in zip(members, shard)]})
    return out


def _write(rows, groups, matches, result: DedupResult, settings: dict) -> str:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..runfolder.tables import read_batches
    from ..writing import atomic_path, write_text_atomic
    from ..runfolder.layout import confined
    folder = confined(rows.folder, os.path.join(rows.folder, FOLDER))  # never written through a link out
    os.makedirs(folder, exist_ok=True)
    keys_of = {}
    wanted = {m["row"] for g in result.largest for m in g["members"]}
    for s, shard in enumerate(rows.shards):
        lo, hi = int(rows.starts[s]), int(rows.starts[s + 1])
        keys = [k for batch in read_batches(shard.score_file, ["key"]) for k in batch["key"]]
        for r in wanted:
            if lo <= r < hi:
                keys_of[r] = keys[r - lo]
        g = groups.group[lo:hi]
        kind = groups.kind[lo:hi]
        table = pa.table({
            "key": pa.array(keys, pa.string()),
            "index": pa.array(rows.index[lo:hi], pa.int64()),
            "group": pa.array(g, pa.int64(), mask=g < 0),
            "kind": pa.array([KINDS[k] if k >= 0 else None for k in kind.tolist()], pa.string()),
            "survivor": pa.array(groups.survivor[lo:hi], pa.bool_()),
            "eval_match": pa.array(matches[lo:hi].tolist(), pa.string())})
        with atomic_path(os.path.join(folder, shard.name + ".parquet")) as tmp:
            pq.write_table(table, tmp)
    for g in result.largest:
        for m in g["members"]:
            m["key"] = keys_of.get(m.pop("row"))
    summary = {"settings": settings, "rows": result.rows, "groups": result.groups, "per_kind": result.per_kind,
               "rows_per_kind": result.rows_per_kind,
               "duplicates": result.duplicates, "eval_images": result.eval_images,
               "eval_unreadable": result.eval_unreadable, "eval_matches": result.eval_matches,
               "largest": result.largest, "unfinished": result.unfinished,
               "shards": {s.name: score_file_state(s.score_file) for s in rows.shards}}
    write_text_atomic(os.path.join(folder, SUMMARY), json.dumps(summary, indent=1))
    from ..report.dedup import write_report
    matched = [{"shard": rows.shards[s].name, "key": key, "eval_match": m}
               for s, key, m in _matched_rows(rows, matches)]
    write_report(folder, json.loads(json.dumps(summary)), {s.name: s.url for s in rows.shards}, matched, rows.stage)
    return folder


def _matched_rows(rows, matches):
    """(shard number, key, match) of the first eval-matched rows (keys read from their score files)."""
    from ..runfolder.tables import read_batches
    from ..report.dedup import MAX_MATCHES
    hit = np.flatnonzero(matches != None)[:MAX_MATCHES]  # noqa: E711 -- elementwise over an object array
    if not len(hit):
        return []
    out = []
    for s in np.unique(rows.shard_of(hit)):
        lo = int(rows.starts[s])
        keys = [k for batch in read_batches(rows.shards[s].score_file, ["key"]) for k in batch["key"]]
        out += [(int(s), keys[r - lo], matches[r]) for r in hit[rows.shard_of(hit) == s]]
    return out
