"""`wdsfilter dedup RUN_DIR`: duplicate groups of a scoring run's rows, one survivor each, and the
rows that match eval images; written to RUN_DIR/dedup/ (marks.py). No model is loaded, except the
run's CLIP for `--eval` with the semantic kind (the eval images must be embedded by the same
model): the hash columns and saved embeddings of the scoring pass are all it reads.

    from wdsfilter.dedup import dedup
    result = dedup("scores/", evals=["imagenet-val/"])            # exact and near (the default)
    result = dedup("scores/", kinds=["semantic"], semantic_threshold=0.97)   # opt-in, a cosine chosen for the model
    print(result.format_text())
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..core.errors import ConfigError
from .groups import KINDS, Groups, UnionFind
from .spill import MEMORY_MB
from ..runfolder.dedup import FOLDER, SUMMARY, marks_file, score_file_state
from ..runfolder.embeddings import has_image_vectors
from ..runfolder.names import REPORT
from ..storage.remote import is_fsspec_url, filesystem, redact_url, refuse_hub_run_folder
from ..runfolder.lease import Lease
from ..runfolder.layout import RUN_JSON, confined
from ..runfolder.bucket import RemoteRunFolder
from . import source
from .hashindex import exact_pass, near_pass, near_cross, HAS_PHASH, HAS_SHA
from .semantic import semantic_pairs, cosines_to
from .evalset import read_eval, clip_of_run, embed_eval
from ..report.sections.dedup import write_report, MAX_MATCHES
from .source import arrow_batches
from ..runfolder.tables import write_arrow
from ..storage.writing import write_text_atomic
from ..core.progress import Progress

NEAR_BITS = 5           # docs/dedup.md: re-encodes, resizes and PNG<->JPEG measured at <= 4 bits, distinct photos >= 16
# Semantic dedup has no default threshold: the cosine of two copies depends on the model (docs/dedup.md,
# "Choosing the semantic threshold"); --kind semantic asks for --semantic-threshold.
SEMANTIC_THRESHOLD = None
SEMANTIC_HOW = ("choose it for the run's model: start at 0.99, open RUN_DIR/dedup/report.html (each card shows its "
                "cosine to the survivor) and lower it while the semantic groups are still copies of one picture "
                "(docs/dedup.md, 'Choosing the semantic threshold')")
LARGEST = 10
SKIPPED_SHOWN = 10  # rows named of those semantic dedup skipped


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
    # rows semantic dedup left out, their embedding holding NaN or inf: how many, and the first few
    # ({"shard", "index", "key"}) by name
    semantic_skipped: int = 0
    semantic_skipped_rows: List[dict] = field(default_factory=list)
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
        if self.semantic_skipped:
            named = ", ".join(f"{m['shard']}/{m['key']}" for m in self.semantic_skipped_rows)
            lines.append(f"  semantic: {self.semantic_skipped} row(s) skipped, their image embedding holds NaN or inf "
                         f"(no cosine with any other; score them again): {named}"
                         f"{' ...' if self.semantic_skipped > len(self.semantic_skipped_rows) else ''}")
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
          semantic_threshold: Optional[float] = SEMANTIC_THRESHOLD, evals: Sequence[str] = (),
          echo: Optional[Callable[[str], None]] = None, storage_options=None,
          memory_mb: int = MEMORY_MB, progress: bool = False) -> DedupResult:
    """Group duplicates of the kinds asked (default: every kind the run has data for), choose the
    survivors, mark eval matches, write RUN_DIR/dedup/. Returns the counts. The exact and near
    passes work within `memory_mb` (records beyond it wait in RUN_DIR/dedup/tmp, removed at the
    end), plus 5 bytes a row and about 40 a group. A run folder in a
    bucket (s3://...) is pulled into a staging copy under its lock object, as `score --out`
    does (runfolder/bucket.py), deduped there, and its dedup/ uploaded whole before this returns.
    progress: progress lines on stderr (wdsfilter/progress.py): the rows read, then the passes
    (the CLI's default; off here)."""
    _check_options(kinds, near_bits, semantic_threshold, memory_mb)  # before a bucket's folder is locked and pulled
    if is_fsspec_url(run_dir):
        return _dedup_in_bucket(run_dir, storage_options, dict(kinds=kinds, near_bits=near_bits,
                                                               semantic_threshold=semantic_threshold,
                                                               evals=evals, echo=echo, memory_mb=memory_mb,
                                                               progress=progress))
    if not os.path.isdir(run_dir):  # said by the run folder's reader; no folder made for a lease
        return _dedup(run_dir, kinds, near_bits, semantic_threshold, evals, echo, memory_mb, progress)
    with Lease(run_dir, command="dedup", option="RUN_DIR") as lease:  # RUN_DIR/dedup/ is written under its lease
        lease.guard([run_dir])
        return _dedup(run_dir, kinds, near_bits, semantic_threshold, evals, echo, memory_mb, progress)


def _dedup_in_bucket(url: str, storage_options, options: dict) -> DedupResult:
    refuse_hub_run_folder(url)  # before the folder is read
    fs, path = filesystem(url, storage_options)
    if not fs.exists(path.rstrip("/") + "/" + RUN_JSON):  # before the lock object is written there
        raise ConfigError(f"{redact_url(url)} holds no scoring run ({RUN_JSON} is missing); give the --out of a "
                          f"`wdsfilter score` run")
    staged = RemoteRunFolder(url, storage_options, command="dedup", option="RUN_DIR")
    try:
        staged.start()
        result = _dedup(staged.local, **options)
        for name in (SUMMARY, REPORT):  # they name the bucket's folder, not the staging copy
            staged.publish_text(os.path.join(staged.local, FOLDER, name))
        staged.sync()  # RUN_DIR/dedup/ in the bucket before the command reports it
    except ConfigError as e:
        raise type(e)(staged.public(str(e))) from None
    finally:
        staged.release()
    result.run_dir, result.folder = url.rstrip("/"), staged.public(result.folder)
    return result


def _check_options(kinds: Sequence[str], near_bits: int, semantic_threshold: float, memory_mb: int = MEMORY_MB) -> None:
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ConfigError(f"unknown dedup kind(s) {unknown}; choose from {', '.join(KINDS)}")
    if isinstance(near_bits, bool) or not isinstance(near_bits, int) or not 0 <= near_bits <= 32:
        raise ConfigError(f"near distance must be a number of bits from 0 to 32, got {near_bits!r}")
    if "semantic" in kinds and semantic_threshold is None:
        raise ConfigError(f"--kind semantic needs --semantic-threshold COSINE: two copies' cosine depends on the CLIP "
                          f"model; {SEMANTIC_HOW}")
    if semantic_threshold is not None and not -1.0 <= float(semantic_threshold) <= 1.0:
        raise ConfigError(f"semantic threshold is a cosine in [-1, 1], got {semantic_threshold!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 16:
        raise ConfigError(f"the dedup memory budget is a number of MB, at least 16, got {memory_mb!r}")


def _dedup(run_dir: str, kinds: Sequence[str], near_bits: int, semantic_threshold: float, evals: Sequence[str],
           echo: Optional[Callable[[str], None]], memory_mb: int = MEMORY_MB, progress: bool = False) -> DedupResult:
    echo = echo or (lambda line: None)
    t0 = time.perf_counter()
    run = source.open_run(run_dir)
    kinds = _chosen_kinds(run, run_dir, kinds, evals)  # before any row is read
    rows = source.load_rows(run_dir, want_hashes=True, memory_mb=memory_mb, progress=progress, run=run)
    try:
        return _find(rows, run_dir, kinds, near_bits, semantic_threshold, evals, echo, t0, progress)
    finally:
        rows.space.close()


def _chosen_kinds(run, run_dir: str, kinds: Sequence[str], evals: Sequence[str]) -> List[str]:
    """The kinds asked (default: exact and near), once each; a ConfigError when the run lacks
    what they need (the hash columns), said before any row is read."""
    if kinds:
        kinds = list(dict.fromkeys(kinds))
        if {"exact", "near"} & set(kinds):
            source.require_hashes(run, run_dir, " and ".join(k for k in kinds if k != "semantic"))
    else:  # exact and near; semantic only when asked (its threshold depends on the model)
        if not source.hashed(run):
            more = (f"; its saved embeddings allow `--kind semantic --semantic-threshold COSINE` ({SEMANTIC_HOW})"
                    if has_image_vectors(run_dir) else ", or add --save-embeddings for semantic dedup")
            raise ConfigError(f"{run_dir} has no hashes to dedup by (exact and near, the default kinds); "
                              f"{source.HASH_HINT}{more}")
        kinds = ["exact", "near"]
    if evals and not source.hashed(run):
        raise ConfigError(f"--eval matching needs the run's hashes; {source.HASH_HINT}")
    if "semantic" in kinds:
        source.require_embeddings(run_dir)
    return kinds


class DedupPasses:
    """The passes of a dedup run after the rows are read: each one's seconds (result.seconds) and,
    when asked, one progress line of them (wdsfilter/progress.py), naming the pass running."""

    def __init__(self, names: Sequence[str], seconds: Dict[str, float], progress: bool):
        self.seconds, self.now = seconds, names[0]
        self.line = None
        if progress:
            self.line = Progress("dedup", "passes", total=len(names), extra=lambda: self.now)

    def run(self, name: str):
        import contextlib

        @contextlib.contextmanager
        def timed():
            self.now, t = name, time.perf_counter()
            yield
            self.seconds[name] = time.perf_counter() - t
            if self.line is not None:
                self.line.update()
        return timed()

    def close(self) -> None:
        if self.line is not None:
            self.line.close()


def _find(rows, run_dir: str, kinds: Sequence[str], near_bits: int, semantic_threshold: float, evals: Sequence[str],
          echo: Callable[[str], None], t0: float, progress: bool = False) -> DedupResult:
    result = DedupResult(run_dir=run_dir, kinds=list(kinds), rows=rows.count, shards=len(rows.shards),
                         unfinished=rows.unfinished)
    result.seconds["read"] = time.perf_counter() - t0
    passes = DedupPasses([*kinds, "groups", *(["eval"] if evals else []), "write"], result.seconds, progress)
    try:
        _passes(rows, run_dir, kinds, near_bits, semantic_threshold, evals, echo, result, passes)
        passes.now = "done"
    finally:
        passes.close()
    result.seconds["total"] = time.perf_counter() - t0
    return result


def _passes(rows, run_dir: str, kinds: Sequence[str], near_bits: int, semantic_threshold: float, evals: Sequence[str],
            echo: Callable[[str], None], result: DedupResult, passes: DedupPasses) -> None:
    """The kinds' passes, the groups, the eval matches and RUN_DIR/dedup/ written, into `result`."""
    # Pairs of each kind join the union-find as they are found (closest kind first), never kept.
    uf = UnionFind(rows.count)
    if "exact" in kinds:
        with passes.run("exact"):
            exact_pass(rows, rows.space, lambda a, b: uf.union(a, b, "exact"))
    if "near" in kinds:
        with passes.run("near"):
            near_pass(rows, rows.space, near_bits, lambda a, b: uf.union(a, b, "near"))
    clusters = 0
    if "semantic" in kinds:
        with passes.run("semantic"):
            skipped: List[int] = []
            a, b, clusters = semantic_pairs(source.embeddings(rows), float(semantic_threshold),
                                            seconds=result.seconds, skipped=skipped)
            result.semantic_skipped = len(skipped)
            result.semantic_skipped_rows = _named_rows(rows, skipped[:SKIPPED_SHOWN])
            uf.union(a, b, "semantic")
    with passes.run("groups"):
        chunk = rows.space.rows_per_chunk(64)
        groups = Groups(uf, rows.clip.read, chunk)
        result.groups = len(groups.sizes)
        result.per_kind = groups.per_kind
        result.rows_per_kind = groups.rows_per_kind
        result.duplicates = groups.duplicates
    matches: Dict[int, str] = {}  # row -> "KIND:EVAL_IMAGE"
    if evals:
        with passes.run("eval"):
            ev = read_eval(evals)
            result.eval_images, result.eval_unreadable = len(ev.names), ev.unreadable
            result.eval_matches = _match_eval(rows, ev, near_bits, matches, chunk)
            if "semantic" in kinds and ev.names:  # the one step that loads a model: the run's CLIP
                n = _match_eval_semantic(run_dir, rows, ev, evals, float(semantic_threshold), matches)
                if n:
                    result.eval_matches["semantic"] = n
        echo(f"eval: {len(ev.names)} image(s) read from {', '.join(evals)}")
    with passes.run("write"):
        result.largest = _largest(rows, groups, "semantic" in kinds)
        result.folder = _write(rows, groups, matches, result, dict(
            near_bits=near_bits, semantic_threshold=semantic_threshold, kinds=list(kinds), clusters=clusters,
            evals=list(evals)))


def _match_eval(rows, ev, near_bits: int, matches: Dict[int, str], chunk: int) -> Dict[str, int]:
    """Mark each row matching an eval image "KIND:NAME" (exact before near); counts per kind."""
    counts: Dict[str, int] = {}
    if not ev.names:
        return counts
    sha = ev.sha_array()
    by_sha = {(int(h), int(lo)): name for (h, lo), name in zip(sha, ev.names)}
    table = np.array(ev.phash, dtype=np.int64).view(np.uint64)
    for lo, digests in rows.sha.chunks(chunk):
        has = rows.has.read(lo, lo + len(digests))
        for r in np.flatnonzero((has & HAS_SHA).astype(bool) & np.isin(digests[:, 0], sha[:, 0])).tolist():
            name = by_sha.get((int(digests[r, 0]), int(digests[r, 1])))
            if name is not None:
                matches[lo + r] = f"exact:{name}"
                counts["exact"] = counts.get("exact", 0) + 1
        values = rows.phash.read(lo, lo + len(digests))
        candidates = np.flatnonzero(has & HAS_PHASH)
        for i, j in near_cross(values[candidates], table, near_bits):
            for r, e in zip((lo + candidates[i]).tolist(), j.tolist()):
                if r not in matches:
                    matches[r] = f"near:{ev.names[e]}"
                    counts["near"] = counts.get("near", 0) + 1
    return counts


def _match_eval_semantic(run_dir, rows, ev, evals, threshold: float, matches: Dict[int, str]) -> int:
    """Mark rows (not matched yet) whose saved image embedding has cosine >= threshold with an
    eval image embedded by the run's own CLIP model; how many."""
    emb = source.embeddings(rows)
    evec = embed_eval(clip_of_run(run_dir), evals, ev.names)
    marked = 0
    for start, block in emb.blocks(emb.mapped()):
        sims = block @ evec.T
        best = sims.argmax(axis=1)
        for v in np.flatnonzero(sims[np.arange(len(block)), best] >= threshold):
            r = int(emb.rows[start + v])
            if r not in matches:
                matches[r] = f"semantic:{ev.names[best[v]]}"
                marked += 1
    return marked


def _named_rows(rows, row_numbers: List[int]) -> List[dict]:
    """Rows by their shard's output name and index ({"shard", "index", "row"}; _write adds "key")."""
    numbers = np.array(row_numbers, dtype=np.int64)
    return [{"shard": rows.shards[s].name, "index": int(rows.index.read(m, m + 1)[0]), "row": m}
            for m, s in zip(numbers.tolist(), rows.shard_of(numbers).tolist())]


def _largest(rows, groups, semantic: bool = False) -> List[dict]:
    """The LARGEST biggest groups, each with up to 8 members (shard, key read later, index) and
    each member's distance to its survivor: phash bits, the image embeddings' cosine (semantic)."""
    if not len(groups.sizes):
        return []
    top = np.argsort(-groups.sizes, kind="stable")[:LARGEST]
    members = groups.members(top, 8)
    out = []
    for g in top.tolist():
        rows_of = np.array(members[g], dtype=np.int64)
        best = int(groups.best[g])
        out.append({"group": g, "size": int(groups.sizes[g]), "kind": groups.group_kind[g],
                    "members": [{"shard": rows.shards[s].name, "index": int(rows.index.read(m, m + 1)[0]), "row": m,
                                 "survivor": best == m}
                                for m, s in zip(rows_of.tolist(), rows.shard_of(rows_of).tolist())]})
        _distances(rows, best, out[-1]["members"], semantic)
    return out


def _distances(rows, best: int, members: List[dict], semantic: bool) -> None:
    """Each member's distance to the survivor `best`: "bits" (phash Hamming distance, where both
    have a phash) and "cosine" (of the saved image embeddings, for a semantic dedup)."""
    if rows.hashed:
        def phash_of(r):
            return int(rows.phash.read(r, r + 1)[0]) if rows.has.read(r, r + 1)[0] & HAS_PHASH else None
        kept = phash_of(best)
        for m in members:
            mine = phash_of(m["row"])
            if kept is not None and mine is not None:
                m["bits"] = bin(kept ^ mine).count("1")
    if semantic:
        found = cosines_to(source.embeddings(rows), best, [m["row"] for m in members])
        for m in members:
            if m["row"] in found:
                m["cosine"] = round(found[m["row"]], 4)


def _write(rows, groups, matches, result: DedupResult, settings: dict) -> str:
    import json

    import pyarrow as pa

    folder = confined(rows.folder, os.path.join(rows.folder, FOLDER))  # never written through a link out
    os.makedirs(folder, exist_ok=True)
    keys_of = {}
    wanted = {m["row"] for g in result.largest for m in g["members"]} | {m["row"] for m in result.semantic_skipped_rows}
    kind_names = pa.array(KINDS, pa.string())
    matched = np.array(sorted(matches), dtype=np.int64)
    for s, shard in enumerate(rows.shards):
        lo, hi = int(rows.starts[s]), int(rows.starts[s + 1])
        keys = _keys(shard.score_file)
        for r in wanted:
            if lo <= r < hi:
                keys_of[r] = keys[r - lo].as_py()
        g, kind, survivor = groups.rows(lo, hi)
        evals = None
        here = matched[np.searchsorted(matched, lo):np.searchsorted(matched, hi)].tolist()
        if here:
            evals = [None] * (hi - lo)
            for r in here:
                evals[r - lo] = matches[r]
        table = pa.table({
            "key": keys,
            "index": pa.array(rows.index.read(lo, hi), pa.int64()),
            "group": pa.array(g, pa.int64(), mask=g < 0),
            "kind": kind_names.take(pa.array(np.maximum(kind, 0), pa.int8(), mask=kind < 0)),
            "survivor": pa.array(survivor, pa.bool_()),
            "eval_match": pa.nulls(hi - lo, pa.string()) if evals is None else pa.array(evals, pa.string())})
        write_arrow(table, marks_file(folder, shard.name))
    for m in [m for g in result.largest for m in g["members"]] + result.semantic_skipped_rows:
        m["key"] = keys_of.get(m.pop("row"))
    summary = {"settings": settings, "rows": result.rows, "groups": result.groups, "per_kind": result.per_kind,
               "rows_per_kind": result.rows_per_kind,
               "duplicates": result.duplicates, "eval_images": result.eval_images,
               "eval_unreadable": result.eval_unreadable, "eval_matches": result.eval_matches,
               "largest": result.largest, "unfinished": result.unfinished,
               "semantic_skipped": {"rows": result.semantic_skipped, "first": result.semantic_skipped_rows},
               "shards": {s.name: score_file_state(s.score_file) for s in rows.shards}}
    write_text_atomic(os.path.join(folder, SUMMARY), json.dumps(summary, indent=1))
    matched = [{"shard": rows.shards[s].name, "key": key, "eval_match": m}
               for s, key, m in _matched_rows(rows, matches)]
    write_report(folder, json.loads(json.dumps(summary)), {s.name: s.url for s in rows.shards}, matched, rows.stage)
    return folder


def _keys(score_file: str):
    """A score file's key column, as one arrow string array (no Python object a row)."""
    import pyarrow as pa

    parts = [b["key"].cast(pa.string()) for b in arrow_batches(score_file, ["key"])]
    return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


def _matched_rows(rows, matches: Dict[int, str]):
    """(shard number, key, match) of the first eval-matched rows (keys read from their score files)."""
    hit = np.array(sorted(matches)[:MAX_MATCHES], dtype=np.int64)
    if not len(hit):
        return []
    out = []
    for s in np.unique(rows.shard_of(hit)).tolist():
        lo = int(rows.starts[s])
        keys = _keys(rows.shards[s].score_file)
        out += [(s, keys[r - lo].as_py(), matches[r]) for r in hit[rows.shard_of(hit) == s].tolist()]
    return out
