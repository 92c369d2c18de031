"""Remote shards against the `sizes.json` beside them: {shard file name: sample count}, which
open_clip and img2dataset readers trust for the epoch length. An object replaced or cut after
sizes.json was written reads as a clean tar with the wrong count: only this comparison shows it."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

from ...storage.shards import is_remote
from ...storage.shardstats import read_sizes
from ..findings import Finding


def check_remote_sizes(results: Sequence, storage_options: Optional[Mapping] = None,
                       seconds: Optional[float] = None) -> None:
    """Adds a remote_size_mismatch finding to each remote shard read to its end whose sample count
    differs from its folder's sizes.json (read once per folder, within `seconds`; a folder without
    one, or whose one cannot be read, is skipped)."""
    folders: Dict[str, dict] = {}
    for r in results:
        if r is None or not is_remote(r.shard) or r.error or "/" not in r.shard:
            continue
        folder, name = r.shard.rsplit("/", 1)
        if folder not in folders:
            folders[folder] = _sizes(folder, storage_options, seconds)
        recorded = folders[folder].get(name)
        if isinstance(recorded, int) and recorded != r.samples:
            r.add([Finding("remote_size_mismatch", r.shard, "", "",
                           f"sizes.json beside it records {recorded} sample(s), the object holds {r.samples}: it "
                           f"was replaced or cut after sizes.json was written. Re-upload it or regenerate sizes.json")])


def _sizes(folder: str, storage_options: Optional[Mapping], seconds: Optional[float]) -> dict:
    try:
        return read_sizes(folder, storage_options, seconds)
    except Exception:  # noqa: BLE001 - a folder that cannot be listed or read: nothing to compare with
        return {}
