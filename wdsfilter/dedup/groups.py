"""Duplicate pairs of every kind -> groups (connected components) and one survivor per group.

The survivor rule: the row with the highest clip_score (a row without one ranks last), ties and
runs without CLIP scores broken by the first row in shard order (shard output names sorted, then
the row's index): the same survivor whichever order the shards finished in.

A row's kind is the closest link it has to its group: "exact" (another row has its bytes), else
"near" (a phash within k bits), else "semantic".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

KINDS = ("exact", "near", "semantic")


@dataclass
class Groups:
    group: np.ndarray      # int64 per row: the group's number, -1 for a row without duplicates
    kind: np.ndarray       # int8 per row: index into KINDS, -1 for none
    survivor: np.ndarray   # bool per row: kept (rows without duplicates included)
    sizes: np.ndarray      # rows per group, by group number
    per_kind: Dict[str, int]  # groups each kind forms on its own


def _components(n: int, a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels, np.bincount(labels)


def build_groups(n: int, pairs: Dict[str, Tuple[np.ndarray, np.ndarray]], clip: np.ndarray) -> Groups:
    kind = np.full(n, -1, dtype=np.int8)
    per_kind = {}
    for k in reversed(KINDS):  # the closest kind is written last
        if k in pairs:
            a, b = pairs[k]
            kind[a] = kind[b] = KINDS.index(k)
            if len(a):
                _, sizes = _components(n, a, b)
                per_kind[k] = int((sizes > 1).sum())
            else:
                per_kind[k] = 0
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
    return Groups(group=group, kind=kind, survivor=survivor, sizes=np.bincount(group[rows], minlength=len(firsts)),
                  per_kind=per_kind)
