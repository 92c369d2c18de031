"""Shared by the benchmarks: bigger shards made from the committed sample shards' members."""
from __future__ import annotations

import glob
import io
import os
import tarfile
from typing import List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sample_members(patterns: Sequence[str]) -> List[Tuple[str, bytes]]:
    """(name, bytes) of every regular member of the sample shards matching `patterns`
    (globs relative to sample_shards/), in file order."""
    sources = sorted(p for pat in patterns for p in glob.glob(os.path.join(ROOT, "sample_shards", pat)))
    members = []
    for path in sources:
        with tarfile.open(path) as tar:
            members += [(i.name, tar.extractfile(i).read()) for i in tar if i.isreg()]
    if not members:
        raise SystemExit(f"no sample_shards/{list(patterns)}: run tools/make_sample_shards.py first")
    return members


def replicate(folder: str, members: Sequence[Tuple[str, bytes]], shards: int, copies: int) -> List[str]:
    """`shards` tar files of `copies` copies of the members each, every copy under fresh keys."""
    os.makedirs(folder, exist_ok=True)
    urls = []
    for s in range(shards):
        url = os.path.join(folder, f"bench-{s:06d}.tar")
        with tarfile.open(url, "w") as tar:
            for c in range(copies):
                for name, data in members:
                    info = tarfile.TarInfo(f"s{s}c{c}_{name}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        urls.append(url)
    return urls
