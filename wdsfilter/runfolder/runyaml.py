"""run.yaml as a run folder holds it (score/recipe.py writes it, `score --config` and `validate
--config` read it back): its local paths relative to its own folder, so a moved run folder still
replays, and a URL written without its secret restored from the run's shards.json."""
from __future__ import annotations

import os

from ..core.errors import ConfigError
from ..core.mapping import read_mapping
from .layout import unhidden_shards  # a URL written without its secret: shards.json has it
from .names import RECIPE_FILE

# run.yaml (score/recipe.py) names local paths relative to its own folder where they were given
# relative, so a moved run folder still replays: it says so with this key.
PATHS_FROM = "paths_from"


def resolve_recipe_paths(data: dict, path: str) -> dict:
    """A recipe's shards, out and write_shards as this process can open them: where the file says
    `paths_from: run.yaml` (every run.yaml a run writes), a relative local path is relative to the
    file's own folder (read back relative to the current folder: still given relative, so a
    replay's own run.yaml names them relative again); in a recipe written by hand, to the current
    folder, as on the command line."""
    if any("<hidden>" in str(u) for u in (data.get("shards") if isinstance(data.get("shards"), list) else ())):
        data = {**data, "shards": unhidden_shards(path, data["shards"])}
    if data.get(PATHS_FROM) != RECIPE_FILE:
        return data
    base = os.path.dirname(os.path.abspath(path))

    def resolved(value):
        if not isinstance(value, str) or "://" in value or value.startswith(("pipe:", "file:")) or os.path.isabs(value):
            return value
        return os.path.relpath(os.path.join(base, value))
    out = dict(data)
    if isinstance(out.get("shards"), list):
        out["shards"] = [resolved(s) for s in out["shards"]]
    for key in ("out", "write_shards"):
        if key in out:
            out[key] = resolved(out[key])
    return out


def recipe_stage_and_shards(path: str) -> tuple:
    """(stage options, shards) of a run recipe (OUT/run.yaml, or one written by hand), or of a file
    of stage options only ((the file's options, [])): what `wdsfilter validate --config` takes
    from a scoring run, so a replay can validate first."""
    data = read_mapping(path, f"--config {path}")
    if not {"shards", "out", "scorers", "stage"} & set(data):  # stage options only (an unknown one named by the caller)
        return data, []
    data = resolve_recipe_paths(data, path)
    stage = data.get("stage") or {}
    if not isinstance(stage, dict):
        raise ConfigError(f"--config {path}: stage is a mapping of stage options")
    shards = data.get("shards") or []
    return stage, [shards] if isinstance(shards, str) else list(shards)
