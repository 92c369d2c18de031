"""Exact and near duplicates from the hash scorer's columns, as pairs of row numbers, without
comparing all pairs.

exact: rows whose sha256 are equal, found by sorting a 128-bit prefix of each digest (16 bytes a
row; two different images share one with probability ~n^2 / 2^129: none in any dataset).

near: rows whose phash differ in at most k bits, by multi-index hashing (Norouzi et al., 2012):
the 64 bits are cut into BANDS bands (21, 21 and 22 bits); two hashes within k bits agree within
floor(k / BANDS) bits on at least one band (pigeonhole), so probing, for each band, every bucket
within that radius of a row's band value finds every pair (no pair is missed), and each candidate
is checked on all 64 bits. Buckets are a direct table (a count and a start per band value:
2^22 x 2 int64 = 64 MiB at most); candidates are expanded and checked in blocks of BLOCK pairs,
so memory is the hashes (8 bytes a row), the band orders and the pairs found. Identical hashes are
collapsed first: a million copies of one placeholder image are one value, not 10^12 pairs.
"""
from __future__ import annotations

from itertools import combinations
from typing import Iterator, List, Tuple

import numpy as np

BANDS = ((0, 21), (21, 21), (42, 22))  # (first bit, width) of each band
BLOCK = 1 << 22  # candidate pairs checked at a time


def sha_prefix(digests) -> np.ndarray:
    """Hex sha256 digests (None for a row without one) -> (n, 2) uint64 of their first 128 bits;
    a row without a digest gets a value no digest has... rows without one are masked by callers."""
    out = np.zeros((len(digests), 2), dtype=np.uint64)
    for i, d in enumerate(digests):
        if d:
            out[i, 0] = int(d[:16], 16)
            out[i, 1] = int(d[16:32], 16)
    return out


def exact_pairs(prefix: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(a, b) row numbers: each row of `rows` paired with the first row of its equal-digest run."""
    if len(rows) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    p = prefix[rows]
    order = np.lexsort((rows, p[:, 1], p[:, 0]))
    p, r = p[order], rows[order]
    new = np.ones(len(r), dtype=bool)
    new[1:] = (p[1:, 0] != p[:-1, 0]) | (p[1:, 1] != p[:-1, 1])
    first = r[np.flatnonzero(new)][np.cumsum(new) - 1]
    same = ~new
    return first[same], r[same]


def _masks(width: int, radius: int) -> np.ndarray:
    masks = [0]
    for d in range(1, radius + 1):
        masks += [sum(1 << b for b in bits) for bits in combinations(range(width), d)]
    return np.array(masks, dtype=np.int64)


def near_value_pairs(values: np.ndarray, k: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Blocks of (i, j), i < j (a pair may come more than once), indices into `values` (distinct
    uint64 hashes) within k bits."""
    if len(values) >= 2:
        yield from _probe(values, values, k, same=True)


def near_cross(queries: np.ndarray, table: np.ndarray, k: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Blocks of (i, j): queries[i] within k bits of table[j] (uint64 hashes)."""
    if len(queries) and len(table):
        yield from _probe(queries, table, k, same=False)


def _probe(queries: np.ndarray, table: np.ndarray, k: int, same: bool) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    radius = k // len(BANDS)
    for shift, width in BANDS:
        low = np.uint64((1 << width) - 1)
        band = ((queries >> np.uint64(shift)) & low).astype(np.int64)
        tband = band if same else ((table >> np.uint64(shift)) & low).astype(np.int64)
        order = np.argsort(tband, kind="stable")
        counts = np.bincount(tband, minlength=1 << width)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        for mask in _masks(width, radius):
            probe = band ^ mask
            c = counts[probe]
            if same and mask:  # each unordered pair once: from the row whose band lacks the mask's top bit
                c = np.where(band & (1 << (int(mask).bit_length() - 1)), 0, c)
            rows = np.flatnonzero(c)
            if not len(rows):
                continue
            # Expand (row, every member of the probed bucket) in blocks of about BLOCK pairs.
            cum = np.cumsum(c[rows])
            lo = 0
            while lo < len(rows):
                hi = int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + BLOCK, side="right"))
                hi = max(hi, lo + 1)
                r = rows[lo:hi]
                cr = c[r]
                i = np.repeat(r, cr)
                offset = np.arange(len(i)) - np.repeat(np.cumsum(cr) - cr, cr)
                j = order[np.repeat(starts[probe[r]], cr) + offset]
                keep = np.bitwise_count(queries[i] ^ table[j]) <= k
                if same and not mask:
                    keep &= i < j
                if keep.any():
                    i, j = i[keep], j[keep]
                    yield (np.minimum(i, j), np.maximum(i, j)) if same else (i, j)
                lo = hi


def near_pairs(phash: np.ndarray, rows: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(a, b) row numbers of rows (of `rows`, whose int64 phash is given) within k bits: rows of
    equal hashes paired with the first of them, and one pair per pair of distinct hashes within k
    bits (between the first rows of each)."""
    values, first, inverse = np.unique(phash[rows].view(np.uint64), return_index=True, return_inverse=True)
    reps = rows[first]  # the first row (smallest number) of each distinct hash
    a: List[np.ndarray] = [reps[inverse]]
    b: List[np.ndarray] = [rows]
    for i, j in near_value_pairs(values, k):
        a.append(reps[i])
        b.append(reps[j])
    a_all, b_all = np.concatenate(a), np.concatenate(b)
    differ = a_all != b_all
    return a_all[differ], b_all[differ]
