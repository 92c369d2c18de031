"""A run recipe: one file (YAML or JSON) for a whole `wdsfilter score` run, and the resolved recipe
every run writes to OUT/run.yaml, so `wdsfilter score --config OUT/run.yaml` runs it again.

    shards: [sample_shards/images-000000.tar]     # or give them on the command line
    out: out/scores
    scorers: [clip, ocr]
    scorer_options: {clip: {model: "local-dir:models/tiny-clip"}, ocr: {max_side: 640}}
    thresholds: {min: {clip_score: 0.2}, max: {ocr_area: 0.1}, top: {clip_score: 30}}   # wdsfilter.Selection
    stage: {caption_key: "txt;json:description"}
    write_shards: filtered/
    samples_per_shard: 1000                        # with a prefix: shard-000000.tar, ... (else a copy per shard)
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

from ..stream.config import StageConfig
from ..core.mapping import read_mapping
from ..runfolder.runyaml import PATHS_FROM, RECIPE_FILE, resolve_recipe_paths  # run.yaml's name and paths
from ..core.errors import ConfigError
from .config import ScoreConfig
from .engines import ENGINES
from ..core.selection import Selection
from ..storage.shards import absolute_url, is_local, local_path
from ..storage.writing import write_text_atomic
# `wdsfilter score`'s flags (click's parameter names) -> the build_config keyword each sets: a
# ScoreConfig field (a run.yaml key of its own, OPTIONS) or a scorer shortcut (SHORTCUTS: in run.yaml
# its scorer's option, under scorer_options). The command line passes the flags given (only those:
# a recipe's value stays otherwise); run.yaml keeps what they set, so a replay sets the same.
FLAGS = {**{name: name for name in (
    "scorers", "model", "pretrained", "precision", "frames", "frame_reduce", "keyframes", "ocr_backend",
    "ocr_model_dir", "ocr_download", "write_shards", "samples_per_shard", "prefix", "save_embeddings", "device",
    "gpus", "decode_device", "batch_size", "workers", "replicas", "max_memory", "headroom", "fit")},
    "scorer_opts": "scorer_options", "fmt": "format"}
# The other flags: run.yaml keeps these under keys of their own (shards, out, engine) or as its
# thresholds (a wdsfilter.Selection); the stage flags (stream/config.STAGE_OPTIONS) go under stage:,
# an engine's own flags are its registry entry's (engines.ENGINES); run.yaml never keeps these, a
# replay gives them again on its command line (the run's control, the terminal, the recipe itself).
RECIPE_FLAGS = ("shards", "out", "engine", "min_clip", "max_ocr_area", "mins", "maxes", "tops", "bottoms", "equals",
                "recipes")
CLI_ONLY = ("config_file", "resume", "overwrite", "retry_failed", "dry_run", "join", "task_index", "task_count",
            "steal", "status", "progress", "no_histograms", "quiet", "verbose")
# ScoreConfig fields a recipe may set: the flags' (never resume/overwrite/dry_run: a replay says those
# on its command line) and those of the Python API only.
OPTIONS = tuple(key for key in FLAGS.values() if key in ScoreConfig.__dataclass_fields__
                and key not in ("scorers", "scorer_options")) + (
    "devices", "prefetch", "max_batch", "cpu_max_batch", "min_free_host", "histogram_bins", "probe_samples",
    "probe_scan", "probe_seconds", "worker_start")
KEYS = ("shards", "out", "scorers", "scorer_options", "thresholds", "stage", "engine", PATHS_FROM) + OPTIONS


def read_recipe(path: str) -> Dict[str, Any]:
    """The recipe in `path`, its keys checked; a file of stage options only is {"stage": ...}."""
    data = read_mapping(path, f"--config {path}")
    stage_fields = {f.name for f in fields(StageConfig)}
    if data and set(data) <= stage_fields:
        return {"stage": data}
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {unknown}; a recipe has {', '.join(KEYS)} "
                          f"(stage options go under stage:)")
    if data.get("engine", "local") not in ENGINES:
        raise ConfigError(f"--config {path}: engine must be one of {', '.join(ENGINES)}, got {data['engine']!r}")
    if not isinstance(data.get("thresholds") or {}, dict):
        raise ConfigError(f"--config {path}: thresholds is {{min: {{COLUMN: X}}, max: {{COLUMN: X}}, "
                          f"top: {{COLUMN: PERCENT}}, bottom: {{COLUMN: PERCENT}}, equal: {{COLUMN: VALUE}}}}")
    Selection.from_dict(data.get("thresholds"), f"--config {path}")  # its rules checked now, read where used
    for key in ("scorer_options", "stage"):
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(f"--config {path}: {key} is a mapping")
    if isinstance(data.get("shards"), str):
        data["shards"] = [data["shards"]]
    return resolve_recipe_paths(data, path)


def recipe_of(cfg: ScoreConfig, urls: Sequence[str], engine: str = "local",
              relative: bool = True) -> Optional[Dict[str, Any]]:
    """The resolved recipe of a run (None where a scorer was passed as an object: its options are
    not known). relative: a local path given relative (shards, out, write_shards) is written
    relative to OUT, where run.yaml is (`paths_from: run.yaml`), so a moved folder still replays;
    one given absolute stays absolute."""
    if not all(isinstance(s, str) for s in cfg.scorers):
        return None
    defaults = ScoreConfig.__dataclass_fields__
    stage_defaults = StageConfig()
    out = os.path.abspath(cfg.out)

    def where(path: str) -> str:
        if not relative or not is_local(path) or path.startswith("file:") or os.path.isabs(local_path(path)):
            return absolute_url(path)
        return os.path.relpath(os.path.abspath(local_path(path)), out)
    recipe: Dict[str, Any] = {"shards": [where(u) for u in urls], "out": where(cfg.out), "scorers": list(cfg.scorers),
                              "scorer_options": cfg.scorer_options,
                              "thresholds": cfg.selection.to_dict(),
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
    if cfg.write_shards:
        recipe["write_shards"] = where(cfg.write_shards)
    if relative:
        recipe[PATHS_FROM] = RECIPE_FILE
    return json.loads(json.dumps(recipe, default=str))


def write_recipe(cfg: ScoreConfig, urls: Sequence[str], engine: str = "local",
                 shown: Optional[Dict[str, str]] = None) -> Optional[str]:
    """OUT/run.yaml: the run as a recipe (`wdsfilter score --config OUT/run.yaml` runs it again).
    shown: the out/write_shards it names where they are not cfg's (a bucket's, written through staging)."""
    recipe = recipe_of(cfg, urls, engine, relative=not any((shown or {}).values()))  # a bucket's: absolute
    if recipe is None:
        return None
    recipe.update({k: v for k, v in (shown or {}).items() if v})
    path = os.path.join(cfg.out, RECIPE_FILE)
    header = "# wdsfilter score --config this file runs it again (JSON is YAML); command-line options override it\n"
    return write_text_atomic(path, header + json.dumps(recipe, indent=2) + "\n")


def merge(recipe: Dict[str, Any], given: Dict[str, Any], shortcuts: Dict[str, List[tuple]]) -> Dict[str, Any]:
    """build_config's keywords from a recipe and the options given on the command line (only those
    given: the command line wins). `given` uses build_config's names; shortcuts: its SHORTCUTS. The
    recipe's thresholds are not among them: the command line merges them as a Selection."""
    out = {k: v for k, v in recipe.items() if k not in ("shards", "thresholds", "stage", "engine", PATHS_FROM)}
    options = {name: dict(v) for name, v in (recipe.get("scorer_options") or {}).items()}
    for key in given:
        for scorer, option in shortcuts.get(key, ()):  # --model replaces the recipe's clip.model
            options.get(scorer, {}).pop(option, None)
    for name, extra in (given.pop("scorer_options", None) or {}).items():
        options.setdefault(name, {}).update(extra)
    out["scorer_options"] = options
    out.update(given)
    return out
