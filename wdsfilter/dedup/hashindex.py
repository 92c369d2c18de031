"""Exact and near duplicates from the hash scorer's columns, without comparing all pairs and in
a bounded working memory: records are spread over buckets on disk (spill.py) sized to the budget,
and each bucket is sorted and searched alone; pairs go straight to the union-find (groups.py).

exact: rows whose sha256 are equal, found by sorting a 128-bit prefix of each digest (16 bytes a
row; two different images share one with probability ~n^2 / 2^129: none in any dataset) within
buckets by the prefix's high bits.

near: rows whose phash differ in at most k bits. Identical hashes are collapsed first (the same
bucketed sort): a million copies of one placeholder image are one value, not 10^12 pairs. The
distinct values are then searched by multi-index hashing (Norouzi et al., 2012): the 64 bits are
cut into BANDS bands (21, 21 and 22 bits); two hashes within k bits agree within floor(k / BANDS)
bits on at least one band (pigeonhole), so probing, for each band, every bucket within that
radius of a value's band finds every pair (none is missed), and each candidate is checked on all
64 bits. One band at a time, the (value, row) records are spread over 2^p files by the band's top
p bits (p from the budget); a probe flips bits of the band, so a file is searched against itself
(flips of the low bits) and against the files its flipped top bits name: two files in memory at
a time. Within them a direct table over the low bits (a count and a start per value) finds each
probe's bucket; candidates are expanded and checked in blocks sized to the budget.
"""
from __future__ import annotations

from itertools import combinations
from typing import Callable, Iterator, List, Sequence, Tuple

import numpy as np
from .spill import Buckets, buckets_for, bucket_of, Workspace

HAS_SHA, HAS_PHASH = 1, 2  # a row's flags (RunRows.has): it has a valid sha256, a phash

BANDS = ((0, 21), (21, 21), (42, 22))  # (first bit, width) of each band
BLOCK = 1 << 20  # candidate pairs checked at a time (8 arrays of 8 bytes each: 64 MiB)
# Working bytes per record: a sort of (keys, row) with its order and boundaries; a band search of
# two buckets with their band values, orders and probe arrays.
SORT_BYTES, BAND_BYTES = 64, 160

Pairs = Callable[[np.ndarray, np.ndarray], None]
RECORD = np.dtype([("v", "<u8"), ("r", "<i8")])  # a hash value and its row


def hex_prefix(chars: np.ndarray, valid: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(n, 32) ASCII hex digits (the first 32 of each sha256 digest) -> ((n, 2) uint64 of their
    128 bits, as int(d[:16], 16) and int(d[16:32], 16) read them; which rows hold a valid one)."""
    lut = np.full(256, 255, dtype=np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        lut[c] = i
    for i, c in enumerate(b"ABCDEF"):
        lut[c] = 10 + i
    nib = lut[chars]
    valid = valid & (nib != 255).all(axis=1)
    raw = (nib[:, 0::2] << 4) | (nib[:, 1::2] & 15)
    out = np.ascontiguousarray(raw).view(">u8").astype(np.uint64)
    out[~valid] = 0
    return out.reshape(-1, 2), valid


def sha_prefix(digests: Sequence) -> np.ndarray:
    """Hex sha256 digests (None for a row without one) -> (n, 2) uint64 of their first 128 bits."""
    chars = np.array([(d or "")[:32].ljust(32, "-") for d in digests], dtype="S32").view(np.uint8)
    return hex_prefix(chars.reshape(-1, 32), np.ones(len(digests), dtype=bool))[0]


def first_rows(keys: List[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Per record, the smallest row among the records whose keys are all equal to its own."""
    # One sort by the first key; the other keys differ within a run of equal first keys only for
    # different digests sharing 64 bits (none in practice): then the full sort by every key.
    order = np.argsort(keys[0])
    new = np.zeros(len(rows), dtype=bool)
    new[:1] = True
    ks = keys[0][order]
    new[1:] = ks[1:] != ks[:-1]
    for k in keys[1:]:
        ks = k[order]
        if (~new[1:] & (ks[1:] != ks[:-1])).any():
            order = np.lexsort(tuple(reversed(keys)))
            new[1:] = False
            for k2 in keys:
                ks = k2[order]
                new[1:] |= ks[1:] != ks[:-1]
            break
    runs = np.flatnonzero(new)
    first = np.minimum.reduceat(rows[order], runs) if len(runs) else rows[:0]
    out = np.empty_like(rows)
    out[order] = first[np.cumsum(new) - 1]
    return out


def collapse(buckets, fields: Sequence[str], records_at_once: int, pairs: Pairs, distinct: Pairs = None) -> None:
    """Each bucket's records (`fields` and a row "r", in row order) grouped by equal fields:
    pairs(first row, row) for every other row; distinct(records, first rows) of each value. A
    bucket larger than `records_at_once` (one value repeated: a placeholder image) is read in
    parts, carrying its distinct values from part to part."""
    for b in range(buckets.count):
        seen = None
        for part in buckets.chunks(b, records_at_once):
            recs = part if seen is None else np.concatenate([seen, part])
            rep = first_rows([recs[f] for f in fields], recs["r"])
            dup = rep != recs["r"]
            if dup.any():
                pairs(rep[dup], recs["r"][dup])
            seen = recs[~dup]  # every value once, with its first row
        if seen is not None and distinct is not None:
            distinct(seen)
        buckets.remove(b)


def _masks(width: int, radius: int) -> np.ndarray:
    masks = [0]
    for d in range(1, radius + 1):
        masks += [sum(1 << b for b in bits) for bits in combinations(range(width), d)]
    return np.array(masks, dtype=np.int64)


def _probe(queries: np.ndarray, table: np.ndarray, shift: int, width: int, low_bits: int, masks: np.ndarray,
           k: int, same: bool, block: int = BLOCK) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Blocks of (i, j): queries[i] within k bits of table[j] (uint64), for the band (shift,
    width) probed with `masks`; the table's band values all share their bits above `low_bits`
    with the queries' band values flipped by the masks. same: both sides are one set, each
    unordered pair is given once (mask 0: i < j; else from the value lacking the mask's top bit)."""
    # The direct table is keyed by the low `low_bits` bits, or fewer when the table holds fewer
    # values (half a value per slot or fewer: its size follows the bucket's, not 2^width): values
    # that share the kept bits share a slot and the full check sorts them out; the masks are cut
    # to the kept bits (each distinct cut probed once, in the order given).
    low_bits = min(low_bits, len(table).bit_length() + 1)
    low = (1 << low_bits) - 1
    masks = np.array(list(dict.fromkeys((masks & low).tolist())), dtype=np.int64)
    index = np.int32 if max(len(queries), len(table), 1 << width) < 2**31 else np.int64  # half the bytes to move
    band = ((queries >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(index)
    band_low = band & index(low)
    tlow = ((table >> np.uint64(shift)) & np.uint64(low)).astype(index)
    order = np.argsort(tlow).astype(index)
    # Queries in band order: the probes of each mask then read the table's counts nearly in order
    # (2-3x faster than random reads of a table larger than the caches).
    qorder = order if same and table is queries else np.argsort(band_low).astype(index)
    band, band_low, qvalues = band[qorder], band_low[qorder], queries[qorder]
    counts = np.bincount(tlow, minlength=1 << low_bits).astype(index)
    starts = (np.cumsum(counts) - counts).astype(index)
    for mask in masks.tolist():
        probe = band_low ^ index(mask)  # the mask's bits above low_bits chose the table's bucket
        c = counts[probe]
        rows = np.flatnonzero(c)
        if same and mask:  # each unordered pair once: from the value whose band lacks the mask's top bit
            rows = rows[(band[rows] >> (mask.bit_length() - 1)) & 1 == 0]
        if not len(rows):
            continue
        # Most probed buckets hold one value (the bands are as wide as the rows are many): those
        # pairs need no expansion.
        single = c[rows] == 1
        if single.any():
            i = rows[single]
            j = order[starts[probe[i]]]
            keep = np.bitwise_count(qvalues[i] ^ table[j]) <= k
            i = qorder[i]
            if same and not mask:
                keep &= i < j
            if keep.any():
                yield i[keep], j[keep]
            rows = rows[~single]
            if not len(rows):
                continue
        # Expand (value, every member of the probed bucket) in blocks of about `block` pairs.
        cum = np.cumsum(c[rows])
        lo = 0
        while lo < len(rows):
            hi = int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + block, side="right"))
            hi = max(hi, lo + 1)
            r = rows[lo:hi]
            cr = c[r].astype(np.int64)
            i = np.repeat(r, cr)
            offset = np.arange(len(i)) - np.repeat(np.cumsum(cr) - cr, cr)
            j = order[np.repeat(starts[probe[r]], cr) + offset]
            keep = np.bitwise_count(qvalues[i] ^ table[j]) <= k
            i = qorder[i]
            if same and not mask:
                keep &= i < j
            if keep.any():
                yield i[keep], j[keep]
            lo = hi


def near_cross(queries: np.ndarray, table: np.ndarray, k: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Blocks of (i, j): queries[i] within k bits of table[j] (uint64 hashes)."""
    if not (len(queries) and len(table)):
        return
    for shift, width in BANDS:
        yield from _probe(queries, table, shift, width, width, _masks(width, k // len(BANDS)), k, same=False)


def near_distinct(space, values, count: int, k: int, pairs: Pairs) -> None:
    """pairs(row, row) of distinct hashes within k bits. values(): chunks of (v uint64, r int64)
    records (the `count` distinct hashes and their first rows), read once per band."""
    if count < 2:
        return
    radius = k // len(BANDS)
    dtype = RECORD
    for shift, width in BANDS:
        top = min(width, buckets_for(count, BAND_BYTES, space.budget).bit_length() - 1)
        low_bits = width - top
        buckets = Buckets(space, f"band{shift}", dtype, 1 << top)
        for recs in values():
            band = (recs["v"] >> np.uint64(shift)) & np.uint64((1 << width) - 1)
            buckets.append(recs, (band >> np.uint64(low_bits)).astype(np.int64))
        buckets.done()
        masks = _masks(width, radius)
        highs = masks >> low_bits
        block = max(1 << 14, space.budget // 256)
        for a in range(buckets.count):
            if not buckets.sizes[a]:
                continue
            q = buckets.read(a)
            for h in np.unique(highs).tolist():
                b = a ^ h
                # Two files are searched once, from the one lacking the top bit of their difference.
                if not buckets.sizes[b] or (h and a >> (h.bit_length() - 1) & 1):
                    continue
                t = q if h == 0 else buckets.read(b)
                for i, j in _probe(q["v"], t["v"], shift, width, low_bits, masks[highs == h], k, same=h == 0,
                                   block=block):
                    pairs(q["r"][i], t["r"][j])
        for a in range(buckets.count):
            buckets.remove(a)


def exact_pass(rows, space, pairs: Pairs) -> None:
    """pairs(first row, row) of rows with equal sha256 (the first 128 bits), bucket by bucket."""
    dtype = np.dtype([("a", "<u8"), ("b", "<u8"), ("r", "<i8")])
    chunk = space.rows_per_chunk(SORT_BYTES)
    buckets = Buckets(space, "sha", dtype, buckets_for(rows.count, SORT_BYTES, space.budget))
    for lo, sha in rows.sha.chunks(chunk):
        sel = np.flatnonzero(rows.has.read(lo, lo + len(sha)) & HAS_SHA)
        recs = np.empty(len(sel), dtype=dtype)
        recs["a"], recs["b"], recs["r"] = sha[sel, 0], sha[sel, 1], lo + sel
        buckets.append(recs, bucket_of(recs["a"], buckets.count))
    collapse(buckets.done(), ["a", "b"], chunk, pairs)


def near_pass(rows, space, k: int, pairs: Pairs) -> None:
    """pairs(row, row) of rows whose phash differ in at most k bits: equal hashes collapsed bucket
    by bucket (pairs with their first row), then the distinct ones searched band by band."""
    chunk = space.rows_per_chunk(SORT_BYTES)
    buckets = Buckets(space, "phash", RECORD, buckets_for(rows.count, SORT_BYTES, space.budget))
    for lo, values in rows.phash.chunks(chunk):
        sel = np.flatnonzero(rows.has.read(lo, lo + len(values)) & HAS_PHASH)
        recs = np.empty(len(sel), dtype=RECORD)
        recs["v"], recs["r"] = values[sel], lo + sel
        buckets.append(recs, bucket_of(recs["v"], buckets.count))
    distinct = Buckets(space, "distinct", RECORD, 1)
    collapse(buckets.done(), ["v"], chunk, pairs, lambda recs: distinct.append(recs, None))
    distinct.done()
    near_distinct(space, lambda: distinct.chunks(0, chunk), int(distinct.sizes[0]), k, pairs)
    distinct.remove(0)


def near_pairs(phash: np.ndarray, rows: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """In memory, for small sets: (a, b) row numbers of rows (of `rows`, whose int64 phash is given)
    within k bits (the same search as the bounded one, one bucket)."""
    import tempfile

    found: List[Tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int64), np.zeros(0, np.int64))]
    add = lambda a, b: found.append((np.asarray(a, np.int64), np.asarray(b, np.int64)))  # noqa: E731
    dtype = RECORD
    with tempfile.TemporaryDirectory() as tmp:
        space = Workspace(tmp + "/w")
        recs = np.empty(len(rows), dtype=dtype)
        recs["v"], recs["r"] = phash[rows].view(np.uint64), rows
        buckets = Buckets(space, "hash", dtype, 1)
        buckets.append(recs, np.zeros(len(rows), np.int64))
        buckets.done()
        kept = []
        collapse(buckets, ["v"], max(1, len(rows)), add, kept.append)
        distinct = np.concatenate(kept) if kept else np.zeros(0, dtype)
        near_distinct(space, lambda: [distinct], len(distinct), k, add)
        space.close()
    return np.concatenate([a for a, _ in found]), np.concatenate([b for _, b in found])
