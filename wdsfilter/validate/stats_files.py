"""The --stats-dir files: {shard}_stats.json per shard and sizes.json per shard folder.

Both are in the form the usual tools read, so the folder can be copied next to the shards:
* sizes.json, {shard file name: sample count}: open_clip's get_dataset_size reads it from the
  folder of the shards, DataComp's resharder as its shard table.
* {shard}_stats.json (00000.tar -> 00000_stats.json, img2dataset's naming): DataComp's resharder
  reads the sample count from its "successes" field; the rest is this validator's shard stats.

Shards from several folders go to one subfolder per folder (its path relative to the folders'
common parent), so two images-000000.tar never share a sizes.json.

A file we did not write is never destroyed. The stats dir may be the shards' own folder, where
img2dataset keeps its {shard}_stats.json (count, successes, failed_to_download, status_dict, ...):
such a file is left as it is and ours goes beside it as {shard}_validate.json (a name that
`*_stats.json` globs do not pick up). An existing sizes.json is merged: the entries of the shards
validated are set, the others kept (shardstats.update_sizes, under the folder lock every writer of
sizes.json takes; both files are written by shardstats, the one writer of the files beside shards).

A shard whose stream failed (a pipe: command or download that exited non-zero, or stalled: a
`shard_command_failed` finding) was not read to its end: how many samples came through depends on
timing, so sizes.json gets no entry for it (an entry that was there is removed) and its stats file
says `"complete": false`. A shard that reads the same every time (a tar cut short on disk) keeps
its count: that is what a loader gets from it.
"""
from __future__ import annotations

import json
import os
import posixpath
import re
from collections import defaultdict
from typing import Dict, List, Optional

from ..core.publish import published
from ..storage.shards import is_pipe, is_remote, shard_stem, shown_url, web_path
from ..storage.shardstats import SIZES, STATS_SUFFIX, update_sizes, write_stats_file
from .formats import escape_data
from .report import SCHEMA_VERSION, Report
from ..storage.remote import read_object

TOOL = "wdsfilter validate"
BESIDE = "_validate.json"  # our stats file's suffix where another tool's {shard}_stats.json is


def shard_basename(url: str) -> str:
    return web_path(url).rstrip("/").rsplit("/", 1)[-1]


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
        else:  # a URL's folder: a flat, safe name (of the URL as published: no password)
            out[f] = re.sub(r"[^\w.-]+", "_", published(f).replace("<hidden>@", "")).strip("_") or "remote"
    return out


def write_stats(report: Report, folder: str) -> List[str]:
    """Writes the files and returns their paths. `folder` may be an s3://, gs:// URL: each file is
    one object, written whole or not at all."""
    groups: Dict[str, list] = defaultdict(list)
    for r in report.shards:
        groups[os.path.dirname(web_path(r.shard))].append(r)
    written = []
    options = report.options.stage.storage_options
    seconds = report.options.stage.remote_options().answer_seconds  # a remote read's bound, the user's
    remote = is_remote(folder)
    join = posixpath.join if remote else os.path.join
    for source, sub in _subfolders(list(groups)).items():
        if remote:
            out = posixpath.join(folder.rstrip("/"), sub) if sub else folder.rstrip("/")
        else:
            out = os.path.normpath(os.path.join(folder, sub))
            os.makedirs(out, exist_ok=True)
        sizes, used = {}, set()
        for r in groups[source]:
            stem, n = shard_stem(r.shard), 1
            while stem in used:  # only for odd URLs: one folder holds unique file names
                n += 1
                stem = f"{shard_stem(r.shard)}-{n}"
            used.add(stem)
            complete = not (r.counts.get("shard_command_failed") or r.counts.get("remote_read_failed"))
            data = dict(successes=r.samples, **r.stats(), schema_version=SCHEMA_VERSION, tool=TOOL,
                        complete=complete, listed_findings=[f.to_dict() for f in r.findings])
            data["shard"] = shown_url(r.shard)  # published beside the shards: no password, no signed query
            path = join(out, stem + STATS_SUFFIX)
            if _foreign(path, options, seconds):
                path = join(out, stem + BESIDE)
            written.append(_write_json(path, data, options))
            sizes[shard_basename(r.shard)] = r.samples if complete else None
        update_sizes(out, sizes, options, seconds)  # merged as the shard writers merge it (under the folder lock)
        written.append(join(out, SIZES))
    return written


def _read_dict(path: str, options=None, seconds: Optional[float] = None) -> Optional[dict]:
    """The JSON object in `path`; {} when there is none or it is not one; None when no file is there."""
    try:
        if is_remote(path):
            raw = read_object(path, options, seconds=seconds)
            if raw is None:
                return None
            data = json.loads(raw)
        else:
            if not os.path.lexists(path):
                return None
            with open(path, "rb") as f:
                data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _foreign(path: str, options=None, seconds: Optional[float] = None) -> bool:
    """True when `path` exists and was not written by this validator (img2dataset's stats, or
    anything that is not our JSON): we must not overwrite it."""
    data: Optional[dict] = _read_dict(path, options, seconds)
    if data is None:
        return False
    ours = data.get("tool") == TOOL or ("listed_findings" in data and "schema_version" in data)
    return not ours


def _write_json(path: str, data, options=None) -> str:
    # escape_data: member names that are not UTF-8 appear as \\xNN instead of failing the write.
    return write_stats_file(path, escape_data(data), options)
