"""A loader's place in its epoch: what `WdsLoader.state_dict()` saves and `load_state_dict()` checks.

The convention is torchdata's StatefulDataLoader: a plain dict (torch.save / json friendly) taken
after batch N, from which a new loader gives batch N+1 on. Nothing of the stream itself is saved:
every seed of a reader's stream (shard shuffle, resampling, the sample shuffle buffer) is a function
of (seed, epoch, rank, worker), so a reader's position is the number of batches it gave this epoch;
a restored reader replays its stream to there before the user's transforms (pipeline.Place).

What the position means depends on the loader's settings (which shards each reader has, how many
samples a batch takes, the split by rank and worker, the seeds, the score thresholds): those are
saved with it, and a loader built with other settings refuses the state, naming what changed,
rather than repeat or skip data silently.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..core.errors import ConfigError

VERSION = 1
MAX_DROPS = 1000  # decode drops kept per worker and epoch; past them a restore decodes from the last kept count

# The settings a position depends on, in the words of the error (what changed -> what to do).
SETTINGS = {
    "shards": "the shard list",
    "batch_size": "batch_size",
    "world_size": "the world size (ranks)",
    "num_workers": "num_workers (the split of shards by worker)",
    "seed": "seed",
    "shuffle": "shuffle",
    "resampled": "resampled",
    "epoch_samples": "the epoch size (epoch_samples or sizes.json)",
    "drop_last": "drop_last",
    "score_filter": "the score filter (scores=, its thresholds)",
    "stages": "the stage options (StageConfig)",
}


def settings(shard_urls: List[str], opts, world: int, epoch_samples: Optional[int], stage_options: dict,
             rules=None) -> dict:
    """The settings a position depends on. The shard list and the stage options are kept as a digest
    (a state saved every few minutes stays small with a million shards)."""
    return {
        "shards": {"count": len(shard_urls), "digest": _digest(list(shard_urls))},
        "batch_size": opts.batch_size, "world_size": world, "num_workers": opts.num_workers,
        "seed": opts.seed, "shuffle": opts.shuffle, "resampled": opts.resampled,
        "epoch_samples": epoch_samples, "drop_last": opts.drop_last,
        "score_filter": None if rules is None else _score_filter(opts.scores, rules),
        "stages": _digest(stage_options),
    }


def _score_filter(scores: str, rules) -> str:
    """The digest of a score filter's rules (a resolved wdsfilter.Selection): the same as before
    text columns and recipes existed for the rules that existed then."""
    extra = (["equal", {c: list(v) for c, v in rules.equal.items()}] if rules.equal else []) \
        + (["dedup"] if rules.dedup else [])
    return _digest([scores, [rules.minima, rules.maxima]] + extra)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def check_settings(saved: dict, current: dict) -> None:
    """ConfigError naming every setting that differs between the saved state and this loader."""
    changed = [name for name in SETTINGS if saved.get(name) != current.get(name)]
    if not changed:
        return
    described = []
    for name in changed:
        was, now = saved.get(name), current.get(name)
        if name == "shards":
            was, now = f"{was['count']} shards" if was else None, f"{now['count']} shards"
            if was == now:
                was, now = "other shards", "these"
        elif isinstance(now, str):  # a digest says only that it changed
            was = now = None
        described.append(SETTINGS[name] + (f" ({was} -> {now})" if was is not None or now is not None else ""))
    raise ConfigError(
        f"the loader state was saved by a loader with other settings: {', '.join(described)} changed; its "
        f"position would repeat or skip samples. Build the loader as it was when the state was saved, or start "
        f"the epoch afresh (set_epoch(n) without load_state_dict).")


@dataclass
class Progress:
    """One epoch's batches as the main process took them: how many each (logical) worker gave, and
    which worker gave the last (the DataLoader asks the workers in turn, skipping finished ones)."""
    epoch: int
    workers: int  # readers on this rank (DataLoader workers, or 1)
    given: Dict[int, int] = field(default_factory=dict)
    last: Optional[int] = None
    # per worker, what its decode stage had seen: {"raw": samples, "drops": [[index, reason], ...]}, so
    # that a restored reader does not decode the samples it gave again (pipeline._placed_decode)
    decoded: Dict[int, dict] = field(default_factory=dict)

    @property
    def batches(self) -> int:
        return sum(self.given.values())

    def took(self, worker: int, report: Optional[tuple] = None) -> None:
        """A batch of `worker`; report: its decode stage's (samples seen, new drops) (Place.report)."""
        self.given[worker] = self.given.get(worker, 0) + 1
        self.last = worker
        if report is None:
            return
        raw, drops = report
        mine = self.decoded.setdefault(worker, {"raw": 0, "drops": []})
        if len(mine["drops"]) + len(drops) > MAX_DROPS:
            mine["full"] = True  # bounded: the count stays where the list was whole
        if not mine.get("full"):
            mine["raw"] = raw
            mine["drops"] += drops

    @property
    def next_worker(self) -> int:
        return 0 if self.last is None else (self.last + 1) % self.workers

    def resume_plan(self, batch_size: int) -> dict:
        """What each reader of the restored epoch needs (pipeline.Place.resume): in torch's round
        robin, which starts at worker 0, worker j reads as worker (j + offset) % workers."""
        return {"epoch": self.epoch, "offset": self.next_worker, "batches": dict(self.given),
                "batch_size": batch_size,
                "decoded": {w: {"raw": d["raw"], "drops": list(d["drops"])} for w, d in self.decoded.items()}}

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches,
                "workers": {str(w): n for w, n in sorted(self.given.items())}, "next_worker": self.next_worker,
                "decoded": {str(w): {**d, "drops": [list(x) for x in d["drops"]]} for w, d in sorted(self.decoded.items())}}

    @classmethod
    def from_dict(cls, d: dict, workers: int) -> "Progress":
        given = {int(w): int(n) for w, n in (d.get("workers") or {}).items()}
        last = None if not given else (int(d["next_worker"]) - 1) % workers
        decoded = {int(w): {**x, "raw": int(x["raw"]), "drops": [[int(i), str(r)] for i, r in x["drops"]]}
                   for w, x in (d.get("decoded") or {}).items()}  # none in a state saved before it came
        return cls(int(d["epoch"]), workers, given, last, decoded)


def check_state(state) -> dict:
    if not isinstance(state, dict) or state.get("version") != VERSION or "settings" not in state:
        raise ConfigError(f"load_state_dict: not a wdsfilter loader state (version {VERSION}); pass what "
                          f"loader.state_dict() returned")
    return state
