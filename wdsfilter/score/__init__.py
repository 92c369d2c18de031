"""Scoring: `wdsfilter score` and `wdsfilter.score.score(...)`.

    from wdsfilter.score import score
    summary = score("shards/", out="scores/", scorers=["clip"], min_clip=0.28,
                    model="ViT-B-32", pretrained="openai", write_shards="filtered/")
    print(summary.format_text())

Modules, one job each: config (ScoreConfig), engine (the run), prepare (decode-side stages),
modelworker (model processes), planner (batch size, replicas, workers), memory (DeviceMemory),
backoff (OOM halving), outputs (score files, summary, histograms), resume (markers),
shardwriter (filtered shards). Scorers live in scorers/.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Callable, Dict, Optional, Sequence

from ..config import StageConfig
from ..errors import ConfigError
from .config import ScoreConfig
from .outputs import RunSummary

__all__ = ["score", "ScoreConfig", "RunSummary", "build_config"]

# Scorer option shortcuts (the CLI's --model/--pretrained): option -> scorer it belongs to.
SHORTCUTS = {"model": "clip", "pretrained": "clip"}


def build_config(out: Optional[str] = None, scorers: Sequence = ("clip",), *, min_clip: Optional[float] = None,
                 min_scores: Optional[Dict[str, float]] = None, config: Optional[ScoreConfig] = None,
                 stage: Optional[StageConfig] = None, **options) -> ScoreConfig:
    """A ScoreConfig from keyword options: ScoreConfig fields, StageConfig fields (caption_key,
    image_key, max_pixels, ...) and the scorer shortcuts model= and pretrained= (for clip)."""
    if config is not None:
        if options or out or min_clip is not None or min_scores or stage is not None:
            raise ConfigError("pass either config=ScoreConfig(...) or individual options, not both")
        return config
    score_fields = {f.name for f in fields(ScoreConfig)}
    stage_fields = {f.name for f in fields(StageConfig)}
    score_opts: Dict = {}
    stage_opts: Dict = {}
    scorer_options: Dict[str, Dict] = {k: dict(v) for k, v in dict(options.pop("scorer_options", {}) or {}).items()}
    for key, value in options.items():
        if key in SHORTCUTS:
            if value is not None:
                scorer_options.setdefault(SHORTCUTS[key], {})[key] = value
        elif key in score_fields:
            score_opts[key] = value
        elif key in stage_fields:
            if value is not None:
                stage_opts[key] = value
        else:
            raise ConfigError(f"unknown scoring option {key!r}; known: "
                              f"{', '.join(sorted((score_fields | stage_fields | set(SHORTCUTS)) - {'stage'}))}")
    if stage is not None and stage_opts:
        raise ConfigError("pass either stage=StageConfig(...) or stage options (caption_key=...), not both")
    thresholds = dict(min_scores or {})
    thresholds.update(score_opts.pop("thresholds", {}) or {})
    if min_clip is not None:
        thresholds["clip_score"] = min_clip
    names = [s if isinstance(s, str) else getattr(s, "name", "") for s in (scorers if not isinstance(scorers, str) else [scorers])]
    for name in scorer_options:
        if name in SHORTCUTS.values() and name not in names:
            raise ConfigError(f"{', '.join(k for k, v in SHORTCUTS.items() if v == name)} apply to the {name} "
                              f"scorer, which is not in this run ({', '.join(names)})")
    return ScoreConfig(out=out or "", scorers=scorers, scorer_options=scorer_options, thresholds=thresholds,
                       stage=stage or StageConfig(**stage_opts), **score_opts)


def score(shards, out: Optional[str] = None, scorers: Sequence = ("clip",), *, min_clip: Optional[float] = None,
          min_scores: Optional[Dict[str, float]] = None, config: Optional[ScoreConfig] = None,
          echo: Optional[Callable[[str], None]] = None, **options) -> RunSummary:
    """Score every sample of `shards` (folders, globs, brace patterns, files) and write the
    results under `out`; returns the RunSummary (also in out/summary.json). See docs/score.md.

    Raises ConfigError at once for settings that cannot work, and NothingScoredError (with the
    counts) when the run finished without scoring a single sample. `echo` receives the lines the
    command line prints (plan, scorer descriptions)."""
    from .engine import run_scoring
    cfg = build_config(out, scorers, min_clip=min_clip, min_scores=min_scores, config=config, **options)
    return run_scoring(shards, cfg, echo)
