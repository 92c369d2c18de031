"""A run recipe: one file (YAML or JSON) for a whole `wdsfilter score` run, and the resolved recipe
every run writes to OUT/run.yaml, so `wdsfilter score --config OUT/run.yaml` runs it again.

    shards: [sample_shards/images-000000.tar]     # or give them on the command line
    out: out/scores
    scorers: [clip, ocr]
    scorer_options: {clip: {model: "local-dir:models/tiny-clip"}, ocr: {max_side: 640}}
    thresholds: {min: {clip_score: 0.2}, max: {ocr_area: 0.1}, top: {clip_score: 30}}
    stage: {caption_key: "txt;json:description"}
    write_shards: filtered/
    engine: local
    device: cpu                                    # and any other ScoreConfig option: batch_size, ...

A file of stage options only (caption_key, image_key, ...) is read as `stage:`, as before.
Command-line options override the file: a scorer shortcut (--model) its scorer's option, a
threshold flag its column, a stage flag its option. run.yaml is JSON text (JSON is YAML), so it is
read without PyYAML.
"""
from __future__ import annotations

import json
import os
from dataclasses import fields
from typing import Any, Dict, List, Optional, Sequence

from ..config import StageConfig
from ..errors import ConfigError
from .config import ScoreConfig

RECIPE_FILE = "run.yaml"
ENGINES = ("local", "ray")
# ScoreConfig fields a recipe may set beside the ones it spells itself (never resume/overwrite/
# dry_run: a replay says those on its command line).
OPTIONS = ("write_shards", "device", "gpus", "devices", "batch_size", "workers", "replicas", "prefetch", "max_memory",
           "headroom", "fit", "format", "max_batch", "cpu_max_batch", "min_free_host", "histogram_bins",
           "probe_samples", "probe_scan", "probe_seconds", "worker_start")
# thresholds: {min: {COLUMN: X}, max: ..., top: {COLUMN: PERCENT}, bottom: ...} -> build_config's keywords
THRESHOLD_KEYS = {"min": "min_scores", "max": "max_scores", "top": "top_shares", "bottom": "bottom_shares"}
KEYS = ("shards", "out", "scorers", "scorer_options", "thresholds", "stage", "engine") + OPTIONS


def read_recipe(path: str) -> Dict[str, Any]:
    """The recipe in `path`, its keys checked; a file of stage options only is {"stage": ...}."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror or e}") from None
    try:  # run.yaml is JSON after its comment lines
        data = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    except ValueError:
        if not path.endswith((".yaml", ".yml")):
            raise ConfigError(f"--config {path}: not JSON (a YAML file is named .yaml or .yml)") from None
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of options, got {type(data).__name__}")
    stage_fields = {f.name for f in fields(StageConfig)}
    if data and set(data) <= stage_fields:
        return {"stage": data}
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {unknown}; a recipe has {', '.join(KEYS)} "
                          f"(stage options go under stage:)")
    if data.get("engine", "local") not in ENGINES:
        raise ConfigError(f"--config {path}: engine must be one of {ENGINES}, got {data['engine']!r}")
    thresholds = data.get("thresholds") or {}
    if not isinstance(thresholds, dict) or set(thresholds) - set(THRESHOLD_KEYS) \
            or not all(isinstance(v or {}, dict) for v in thresholds.values()):
        raise ConfigError(f"--config {path}: thresholds is {{min: {{COLUMN: X}}, max: {{COLUMN: X}}, "
                          f"top: {{COLUMN: PERCENT}}, bottom: {{COLUMN: PERCENT}}}}")
    for key in ("scorer_options", "stage"):
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(f"--config {path}: {key} is a mapping")
    if isinstance(data.get("shards"), str):
        data["shards"] = [data["shards"]]
    if any("<hidden>" in str(u) for u in data.get("shards") or ()):
        data["shards"] = _unhidden(path, data["shards"])
    return data


def _unhidden(path: str, shards: List[str]) -> List[str]:
    """run.yaml names a shard URL without its password or signature (publish.py): the URL as given
    is in the shards.json beside it, the one file that keeps it."""
    from ..publish import published
    from ..runfolder.layout import read_shard_list
    listed = {published(s.url): s.url for s in read_shard_list(os.path.dirname(os.path.abspath(path))) or ()}
    missing = [u for u in shards if "<hidden>" in str(u) and u not in listed]
    if missing:
        raise ConfigError(f"--config {path}: {missing[0]} is named with its secret hidden, and no shards.json beside "
                          f"it holds the URL; give the shards on the command line")
    return [listed.get(u, u) for u in shards]


def recipe_of(cfg: ScoreConfig, urls: Sequence[str], engine: str = "local") -> Optional[Dict[str, Any]]:
    """The resolved recipe of a run (None where a scorer was passed as an object: its options are
    not known)."""
    if not all(isinstance(s, str) for s in cfg.scorers):
        return None
    defaults = ScoreConfig.__dataclass_fields__
    stage_defaults = StageConfig()
    from ..shards import absolute_url
    recipe: Dict[str, Any] = {"shards": [absolute_url(u) for u in urls], "out": os.path.abspath(cfg.out), "scorers": list(cfg.scorers),
                              "scorer_options": cfg.scorer_options,
                              "thresholds": {"min": dict(cfg.thresholds), "max": dict(cfg.max_thresholds),
                                             # shares only where given: a recipe without them reads as before
                                             **({"top": dict(cfg.top_shares)} if cfg.top_shares else {}),
                                             **({"bottom": dict(cfg.bottom_shares)} if cfg.bottom_shares else {})},
                              # never a permission to run commands (a replay passes --allow-pipe again) nor
                              # storage options (secrets: a replay passes --storage-option again)
                              "stage": {k: v for k, v in cfg.stage.to_dict().items()
                                        if v != getattr(stage_defaults, k)
                                        and k not in ("caption_spec", "allow_pipe", "storage_options")},
                              "engine": engine}
    for name in OPTIONS:
        value = getattr(cfg, name)
        if value != defaults[name].default:
            recipe[name] = list(value) if isinstance(value, tuple) else value
    return json.loads(json.dumps(recipe, default=str))


def write_recipe(cfg: ScoreConfig, urls: Sequence[str], engine: str = "local",
                 shown: Optional[Dict[str, str]] = None) -> Optional[str]:
    """OUT/run.yaml: the run as a recipe (`wdsfilter score --config OUT/run.yaml` runs it again).
    shown: the out/write_shards it names where they are not cfg's (a bucket's, written through staging)."""
    from ..writing import write_text_atomic
    recipe = recipe_of(cfg, urls, engine)
    if recipe is None:
        return None
    recipe.update({k: v for k, v in (shown or {}).items() if v})
    path = os.path.join(cfg.out, RECIPE_FILE)
    header = "# wdsfilter score --config this file runs it again (JSON is YAML); command-line options override it\n"
    return write_text_atomic(path, header + json.dumps(recipe, indent=2) + "\n")


def merge(recipe: Dict[str, Any], given: Dict[str, Any], shortcuts: Dict[str, List[tuple]]) -> Dict[str, Any]:
    """build_config's keywords from a recipe and the options given on the command line (only those
    given: the command line wins). `given` uses build_config's names; shortcuts: its SHORTCUTS."""
    out = {k: v for k, v in recipe.items() if k not in ("shards", "thresholds", "stage", "engine")}
    options = {name: dict(v) for name, v in (recipe.get("scorer_options") or {}).items()}
    for key in given:
        for scorer, option in shortcuts.get(key, ()):  # --model replaces the recipe's clip.model
            options.get(scorer, {}).pop(option, None)
    for name, extra in (given.pop("scorer_options", None) or {}).items():
        options.setdefault(name, {}).update(extra)
    out["scorer_options"] = options
    thresholds = recipe.get("thresholds") or {}
    for key, name in THRESHOLD_KEYS.items():  # per column: the command line's bound replaces the file's
        out[name] = {**(thresholds.get(key) or {}), **(given.pop(name, None) or {})}
    out.update(given)
    return out
