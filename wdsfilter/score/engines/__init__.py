"""The scoring engines, by name: `wdsfilter score --engine NAME` and a recipe's `engine:` are the
names of ENGINES, and nothing else tests an engine's name.

An engine is one module with one function of one signature,

    run(shards, cfg: ScoreConfig, *, echo=None, **options) -> RunSummary

which holds a `runner.Run` (the run's shards, scorers, lease, state on disk and run.yaml: it
composes the run state, it does not extend it), scores the shards its way, and ends with
`Run.finish(Outcome)` (the summary, report and nothing-scored check every engine shares). The
engines here: `local.py` (this machine: decode workers, model workers, the memory planner) and
`ray.py` (Ray Data across a cluster; its workers run the engine-neutral score/batches.py).
ARCHITECTURE.md ("Engines") sketches where a new one goes.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Dict, Mapping


@dataclass(frozen=True)
class Engine:
    """One engine: where its run() is, what --engine's help says of it, its own command-line
    options (the click parameter -> run()'s keyword; refused with another engine), and whether a
    process of it can be one of many workers on one run folder (--join)."""
    run: str  # "module:function", imported when the engine runs (Ray and torch stay unloaded till then)
    help: str
    options: Mapping[str, str] = field(default_factory=dict)
    joins: bool = False

    def load(self):
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)


ENGINES: Dict[str, Engine] = {
    "local": Engine("wdsfilter.score.engines.local:run_scoring", "this machine's engine (memory planner)",
                    joins=True),
    "ray": Engine("wdsfilter.score.engines.ray:run_on_ray",
                  "Ray Data across a cluster (pip install 'wdsfilter[ray]'; no shared filesystem needed: the "
                  "driver writes --out)",
                  options={"ray_address": "address", "ray_actors": "actors", "ray_gpus_per_actor": "gpus_per_actor"}),
}
