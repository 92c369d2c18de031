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


# Source of own_peak_kb() for the memory probes the benchmarks start with `python -c`: a process's
# own peak RSS (VmHWM). Linux keeps ru_maxrss across fork and exec, so RUSAGE_SELF in a child
# reports the launching process's size (a pytest worker's 2 GB after the model tests).
OWN_PEAK_KB = """
import resource as _resource


def own_peak_kb():
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss
"""
