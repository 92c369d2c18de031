"""The --stats-dir files: {shard}_stats.json per shard and sizes.json per shard folder.

Both are in the form the usual tools read, so the folder can be copied next to the shards:
* sizes.json, {shard file name: sample count}: open_clip's get_dataset_size reads it from the
  folder of the shards, DataComp's resharder as its shard table.
* {shard}_stats.json (00000.tar -> 00000_stats.json, img2dataset's naming): DataComp's resharder
  reads the sample count from its "successes" field; the rest is this validator's shard stats.

Shards from several folders go to one subfolder per folder (its path relative to the folders'
common parent), so two images-000000.tar never share a sizes.json.
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from typing import Dict, List

from ..shards import is_pipe, is_remote, shard_stem
from .report import SCHEMA_VERSION, Report


def shard_basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _subfolders(folders: List[str]) -> Dict[str, str]:
    """Shard folder -> subfolder of the stats dir ("" for all when there is one folder)."""
    if len(folders) == 1:
        return {folders[0]: ""}
    local = [f for f in folders if not (is_pipe(f) or is_remote(f))]
    common = os.path.commonpath([os.path.abspath(f or ".") for f in local]) if local else ""
    out = {}
    for f in folders:
        if f in local:
            out[f] = os.path.relpath(os.path.abspath(f or "."), common)
        else:  # a URL's folder: a flat, safe name
            out[f] = re.sub(r"[^\w.-]+", "_", f).strip("_") or "remote"
    return out


def write_stats(report: Report, folder: str) -> List[str]:
    """Writes the files and returns their paths."""
    groups: Dict[str, list] = defaultdict(list)
    for r in report.shards:
        groups[os.path.dirname(r.shard)].append(r)
    written = []
    for source, sub in _subfolders(list(groups)).items():
        out = os.path.normpath(os.path.join(folder, sub))
        os.makedirs(out, exist_ok=True)
        sizes, used = {}, set()
        for r in groups[source]:
            stem, n = shard_stem(r.shard), 1
            while stem in used:  # only for odd URLs: one folder holds unique file names
                n += 1
                stem = f"{shard_stem(r.shard)}-{n}"
            used.add(stem)
            data = dict(successes=r.samples, **r.stats(), schema_version=SCHEMA_VERSION,
                        listed_findings=[f.to_dict() for f in r.findings])
            written.append(_write_json(os.path.join(out, f"{stem}_stats.json"), data))
            sizes[shard_basename(r.shard)] = r.samples
        written.append(_write_json(os.path.join(out, "sizes.json"), sizes))
    return written


def _write_json(path: str, data) -> str:
    tmp = path + ".tmp"  # a reader never sees half a file
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)
    return path
