"""Duplicate pairs of every kind -> groups (connected components) and one survivor per group.

The survivor rule: the row with the highest clip_score (a row without one ranks last), ties and
runs without CLIP scores broken by the first row in shard order (shard output names sorted, then
the row's index): the same survivor whichever order the shards finished in.

A row's kind is the closest link it has to its group: "exact" (another row has its bytes), else
"near" (a phash within k bits), else "semantic". A group's kind is the set of its rows' kinds,
"+"-joined in KINDS order ("exact+near": byte copies and a re-encode of them; "exact": byte copies
alone), so each group is counted under one kind and the groups per kind add up to the groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

KINDS = ("exact", "near", "semantic")


@dataclass
class Groups:
    group: np.ndarray      # int64 per row: the group's number, -1 for a row without duplicates
    kind: np.ndarray       # int8 per row: index into KINDS, -1 for none
    survivor: np.ndarray   # bool per row: kept (rows without duplicates included)
    sizes: np.ndarray      # rows per group, by group number
    group_kind: List[str]  # per group number: the kinds of its rows, "+"-joined ("exact+near")
    per_kind: Dict[str, int]  # groups per group kind (one kind per group: they add up to the groups)
    rows_per_kind: Dict[str, int]  # rows in a group per row kind (closest link; they add up to the rows in groups)


def _components(n: int, a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels, np.bincount(labels)


def build_groups(n: int, pairs: Dict[str, Tuple[np.ndarray, np.ndarray]], clip: np.ndarray) -> Groups:
    kind = np.full(n, -1, dtype=np.int8)
    for k in reversed(KINDS):  # the closest kind is written last
        if k in pairs:
            a, b = pairs[k]
            kind[a] = kind[b] = KINDS.index(k)
    a_all = np.concatenate([p[0] for p in pairs.values()]) if pairs else np.zeros(0, np.int64)
    b_all = np.concatenate([p[1] for p in pairs.values()]) if pairs else np.zeros(0, np.int64)
    labels, sizes = _components(n, a_all, b_all) if n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    in_group = sizes[labels] > 1 if n else np.zeros(0, bool)
    rows = np.flatnonzero(in_group)
    score = np.where(np.isnan(clip[rows]), -np.inf, clip[rows])
    order = rows[np.lexsort((rows, -score, labels[rows]))]  # per label: best score, then first row
    first = np.ones(len(order), dtype=bool)
    first[1:] = labels[order[1:]] != labels[order[:-1]]
    survivor = ~in_group
    survivor[order[first]] = True
    # Groups numbered in the order of their first row.
    group = np.full(n, -1, dtype=np.int64)
    firsts = np.zeros(0, np.int64)
    if len(rows):
        label_first = np.full(len(sizes), n, dtype=np.int64)
        np.minimum.at(label_first, labels[rows], rows)
        grouped = np.flatnonzero(sizes > 1)
        firsts = label_first[grouped]
        number = np.empty(len(sizes), dtype=np.int64)
        number[grouped[np.argsort(firsts)]] = np.arange(len(grouped))
        group[rows] = number[labels[rows]]
    kind[~in_group] = -1
    # A group's kind: a bit per kind of its rows (closest links).
    links = np.zeros(len(firsts), dtype=np.int8)
    np.bitwise_or.at(links, group[rows], (1 << kind[rows]).astype(np.int8))
    names = ["+".join(k for i, k in enumerate(KINDS) if m >> i & 1) for m in range(1 << len(KINDS))]
    group_kind = [names[m] for m in links.tolist()]
    mixes = np.bincount(links, minlength=len(names))
    per_kind = {names[m]: int(mixes[m]) for m in sorted(range(len(names)), key=lambda m: _mix_order(names[m])) if mixes[m]}
    row_kinds = np.bincount(kind[rows], minlength=len(KINDS)) if len(rows) else np.zeros(len(KINDS), np.int64)
    rows_per_kind = {k: int(c) for k, c in zip(KINDS, row_kinds) if c}
    return Groups(group=group, kind=kind, survivor=survivor, sizes=np.bincount(group[rows], minlength=len(firsts)),
                  group_kind=group_kind, per_kind=per_kind, rows_per_kind=rows_per_kind)


def _mix_order(name: str) -> Tuple[int, List[int]]:
    """Group kinds listed single kinds first (exact, near, semantic), then the mixes."""
    parts = name.split("+") if name else []
    return len(parts), [KINDS.index(p) for p in parts]
