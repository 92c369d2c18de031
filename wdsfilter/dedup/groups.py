"""Duplicate pairs of every kind -> groups (connected components) and one survivor per group, in
memory proportional to the rows by a few bytes (a union-find parent and a kind a row) and to the
groups (their first row, size, best score and survivor), never to the pairs: pairs are joined as
they are found and dropped.

The survivor rule: the row with the highest clip_score (a row without one ranks last), ties and
runs without CLIP scores broken by the first row in shard order (shard output names sorted, then
the row's index): the same survivor whichever order the shards finished in.

A row's kind is the closest link it has to its group: "exact" (another row has its bytes), else
"near" (a phash within k bits), else "semantic". A group's kind is the set of its rows' kinds,
"+"-joined in KINDS order ("exact+near": byte copies and a re-encode of them; "exact": byte copies
alone), so each group is counted under one kind and the groups per kind add up to the groups.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Tuple

import numpy as np

KINDS = ("exact", "near", "semantic")
NONE = len(KINDS)  # the kind code of a row without duplicates


class UnionFind:
    """Row numbers joined by pairs; every root is the smallest row of its set (parent <= row), so
    a set's root is its first row and one pass in row order flattens every path."""

    def __init__(self, n: int):
        self.n = n
        self.parent = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        self.kind = np.full(n, NONE, dtype=np.int8)

    def find(self, x: np.ndarray) -> np.ndarray:
        r = self.parent[x]
        while True:
            up = self.parent[r]
            if np.array_equal(up, r):
                return r
            r = up

    def union(self, a: np.ndarray, b: np.ndarray, kind: str) -> None:
        """Join each a[i] with b[i] (pairs of kind `kind`); vectorised: no Python loop per pair."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        code = KINDS.index(kind)
        for side in (a, b):  # the closest kind wins (duplicate indices all write the same value)
            self.kind[side] = np.minimum(self.kind[side], code)
        while len(a):
            ra, rb = self.find(a), self.find(b)
            self.parent[a], self.parent[b] = ra, rb  # shorter paths for the next finds
            apart = ra != rb
            lo, hi = np.minimum(ra[apart], rb[apart]), np.maximum(ra[apart], rb[apart])
            order = np.lexsort((lo, hi))
            lo, hi = lo[order], hi[order]
            first = np.ones(len(hi), dtype=bool)
            first[1:] = hi[1:] != hi[:-1]
            self.parent[hi[first]] = lo[first]  # each root hung under its smallest partner
            a, b = lo[~first], hi[~first]       # the others: joined to that partner next round

    def flatten(self, chunk: int) -> None:
        """Every row's parent made its root, in row order (earlier rows are final when read)."""
        for lo in range(0, self.n, chunk):
            p = self.parent[lo:lo + chunk]
            while True:
                up = self.parent[p]
                if np.array_equal(up, p):
                    break
                p = up
            self.parent[lo:lo + chunk] = p


class Groups:
    """Per group (numbered in the order of their first row): first row, size, kinds, survivor."""

    def __init__(self, uf: UnionFind, scores: Callable[[int, int], np.ndarray], chunk: int):
        """`scores(lo, hi)`: clip_score of rows lo..hi (NaN where missing)."""
        uf.flatten(chunk)
        self.uf, self.chunk = uf, chunk
        n = uf.n
        roots = [lo + np.flatnonzero((uf.parent[lo:lo + chunk] == np.arange(lo, min(n, lo + chunk)))
                                     & (uf.kind[lo:lo + chunk] < NONE)) for lo in range(0, n, chunk)]
        self.roots = np.concatenate(roots) if roots else np.zeros(0, np.int64)
        count = len(self.roots)
        self.sizes = np.zeros(count, dtype=np.int64)
        links = np.zeros(count, dtype=np.int8)
        self.best = np.full(count, -1, dtype=np.int64)
        best_score = np.full(count, -np.inf)
        for lo, rows, g in self._grouped():
            self.sizes += np.bincount(g, minlength=count)
            kind = uf.kind[rows]
            for code in range(NONE):
                links[np.unique(g[kind == code])] |= np.int8(1 << code)
            score = scores(lo, min(n, lo + chunk))[rows - lo]
            score = np.where(np.isnan(score), -np.inf, score)
            order = np.lexsort((rows, -score, g))  # per group: best score, then first row
            first = np.ones(len(order), dtype=bool)
            first[1:] = g[order[1:]] != g[order[:-1]]
            top = order[first]
            gt = g[top]
            better = (self.best[gt] < 0) | (score[top] > best_score[gt])  # earlier rows win ties
            self.best[gt[better]], best_score[gt[better]] = rows[top[better]], score[top[better]]
        names = ["+".join(k for i, k in enumerate(KINDS) if m >> i & 1) for m in range(1 << len(KINDS))]
        self.group_kind: List[str] = [names[m] for m in links.tolist()]
        mixes = np.bincount(links, minlength=len(names))
        self.per_kind: Dict[str, int] = {names[m]: int(mixes[m]) for m in
                                         sorted(range(len(names)), key=lambda m: _mix_order(names[m])) if mixes[m]}
        row_kinds = np.zeros(NONE, dtype=np.int64)
        for lo in range(0, n, chunk):
            row_kinds += np.bincount(uf.kind[lo:lo + chunk], minlength=NONE + 1)[:NONE]
        self.rows_per_kind: Dict[str, int] = {k: int(c) for k, c in zip(KINDS, row_kinds) if c}
        self.duplicates = int(self.sizes.sum()) - count  # rows in groups that are not their survivor

    def _grouped(self) -> Iterator[Tuple[int, np.ndarray, np.ndarray]]:
        """(first row of the chunk, its rows in a group, their group numbers), chunk by chunk."""
        for lo in range(0, self.uf.n, self.chunk):
            rows = lo + np.flatnonzero(self.uf.kind[lo:lo + self.chunk] < NONE)
            yield lo, rows, np.searchsorted(self.roots, self.uf.parent[rows])

    def rows(self, lo: int, hi: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(group number or -1, kind code or -1, survivor) of rows lo..hi."""
        kind = self.uf.kind[lo:hi].astype(np.int8)
        grouped = kind < NONE
        group = np.full(hi - lo, -1, dtype=np.int64)
        group[grouped] = np.searchsorted(self.roots, self.uf.parent[lo:hi][grouped])
        survivor = ~grouped
        survivor[grouped] = self.best[group[grouped]] == np.arange(lo, hi)[grouped]
        kind[~grouped] = -1
        return group, kind, survivor

    def members(self, wanted: np.ndarray, limit: int) -> Dict[int, List[int]]:
        """{group: its first `limit` rows} for the group numbers `wanted`."""
        out: Dict[int, List[int]] = {int(g): [] for g in wanted}
        for _, rows, g in self._grouped():
            for w, got in out.items():
                if len(got) < limit:
                    got += rows[g == w][:limit - len(got)].tolist()
        return out


def _mix_order(name: str) -> Tuple[int, List[int]]:
    """Group kinds listed single kinds first (exact, near, semantic), then the mixes."""
    parts = name.split("+") if name else []
    return len(parts), [KINDS.index(p) for p in parts]
