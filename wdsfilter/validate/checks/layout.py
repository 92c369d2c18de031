"""Checks across shards, run in the parent on the small per-shard results.

key_across_shards  the last key of a shard is the first key of the next shard in the same folder
too_few_shards     fewer shards than readers (ranks x loader workers): webdataset splits shards by
                   rank then by worker, so a reader with no shard yields nothing and DDP hangs
uneven_shards      a shard whose sample count is far from the median (the last shard of a folder
                   is allowed to be smaller: it is usually the remainder; empty shards are
                   empty_shard warnings of their own and left out)
"""
from __future__ import annotations

import os
import statistics
from typing import List, Optional, Sequence

from ..findings import Finding


def _same_folder(a: str, b: str) -> bool:
    return os.path.dirname(a) == os.path.dirname(b)


def key_across_shards(results: Sequence) -> None:
    """Adds key_across_shards findings to the later shard of each split, and releases the
    missing_caption/missing_image findings that a split does not explain."""
    n = len(results)
    continues = [False] * n  # continues[i]: shard i's last key goes on in shard i+1
    for i in range(n - 1):
        a, b = results[i], results[i + 1]
        if a.last_key is not None and a.last_key == b.first_key and _same_folder(a.shard, b.shard):
            continues[i] = True
            b.add([Finding("key_across_shards", b.shard, b.first_member, b.first_key,
                           f"key {b.first_key!r} ends {os.path.basename(a.shard)} (member {a.last_member}) and goes "
                           f"on here: readers see two half-samples and drop both. Write each sample inside one shard")])
    for i, r in enumerate(results):
        from_prev = i > 0 and continues[i - 1]
        to_next = continues[i]
        one_sample = r.first_key == r.last_key
        r.release(head=not (from_prev or (to_next and one_sample)), tail=not to_next)


def readers_without_shard(shards: int, ranks: int, workers: int) -> int:
    """How many (rank, worker) readers get no shard from split_by_node then split_by_worker."""
    return sum(max(0, workers - len(range(rank, shards, ranks))) for rank in range(ranks))


def too_few_shards(shards: int, ranks: Optional[int], workers: Optional[int]) -> List[Finding]:
    if ranks is None and workers is None:
        return []
    ranks, workers = ranks or 1, workers or 1
    empty = readers_without_shard(shards, ranks, workers)
    if not empty:
        return []
    return [Finding("too_few_shards", "", "", "",
                    f"{shards} shard(s) for {ranks} rank(s) x {workers} loader worker(s) = {ranks * workers} readers: "
                    f"{empty} reader(s) get no shard, yield nothing and DDP hangs at the first collective. "
                    f"Write at least {ranks * workers} shards (a multiple of it keeps ranks even), or use fewer workers")]


def uneven_shards(results: Sequence, ratio: float) -> None:
    """Adds uneven_shards findings to the shards concerned."""
    readable = [r for r in results if not r.error and r.samples]  # empty shards have their own warning
    if len(readable) < 2:
        return
    median = statistics.median(r.samples for r in readable)
    for i, r in enumerate(readable):
        last_of_folder = i + 1 == len(readable) or not _same_folder(r.shard, readable[i + 1].shard)
        low = r.samples * ratio < median and not last_of_folder
        high = r.samples > median * ratio
        if low or high:
            r.add([Finding("uneven_shards", r.shard, "", "",
                           f"{r.samples} samples where the median shard has {median:g} "
                           f"(more than {ratio:g}x {'fewer' if low else 'more'}); ranks that read it finish "
                           f"{'early' if low else 'late'}")])


def layout_stats(results: Sequence, ranks: Optional[int], workers: Optional[int]) -> dict:
    counts = [r.samples for r in results if not r.error]
    stats = {"shards": len(results), "ranks": ranks, "loader_workers": workers,
             "samples_min": min(counts) if counts else None,
             "samples_median": statistics.median(counts) if counts else None,
             "samples_max": max(counts) if counts else None}
    if ranks is not None or workers is not None:
        r, w = ranks or 1, workers or 1
        stats.update(readers=r * w, readers_without_shard=readers_without_shard(len(results), r, w))
    return stats
