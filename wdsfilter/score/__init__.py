"""Scoring: `wdsfilter score` and `wdsfilter.score.score(...)`.

    from wdsfilter.score import score
    if __name__ == "__main__":  # model workers are spawned processes: they re-import this script
        summary = score("shards/", out="scores/", scorers=["clip", "ocr"], min_clip=0.28, max_ocr_area=0.2,
                        model="ViT-B-32", pretrained="openai", write_shards="filtered/")
        print(summary.format_text())

The extension API is exported here too: Scorer (the interface of a scorer), ClipScorer,
OcrScorer, DetectorBackend (an OCR text detector) and score_on_ray (the same run on Ray); the
ones that need torch, open_clip or Ray are imported on first use. ARCHITECTURE.md (top level)
maps the modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..stream.config import StageConfig, config_or_options
from ..core.errors import ConfigError
from .config import ScoreConfig
from .summary import RunSummary

__all__ = ["score", "ScoreConfig", "RunSummary", "build_config", "NothingScoredError", "Scorer", "ClipScorer",
           "OcrScorer", "DetectorBackend", "score_on_ray"]

# Exported names whose modules are imported on first use (torch, open_clip, Ray stay optional).
_LAZY = {
    "Scorer": "wdsfilter.score.scorers.base",
    "ClipScorer": "wdsfilter.score.scorers.clip",
    "OcrScorer": "wdsfilter.score.scorers.ocr",
    "DetectorBackend": "wdsfilter.score.ocr_backends.base",
    "score_on_ray": "wdsfilter.score.engines.ray",
    "NothingScoredError": "wdsfilter.score.rows",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Scorer option shortcuts (first-class CLI flags): option -> [(scorer, that scorer's option)]. The
# frame sampling options go to every scorer of the run that samples frames (clip, blur, nsfw,
# ocr); --frame-reduce to clip and ocr only (nsfw reduces by max, blur by mean, unless their own
# frame_reduce option says otherwise). The last scorer of a list is the one an error suggests.
SHORTCUTS = {
    "model": [("clip", "model")],
    "pretrained": [("clip", "pretrained")],
    "precision": [("clip", "precision")],
    "frames": [("clip", "frames"), ("blur", "frames"), ("nsfw", "frames"), ("ocr", "frames")],
    "frame_reduce": [("clip", "frame_reduce"), ("ocr", "frame_reduce")],
    "keyframes": [("clip", "keyframes"), ("blur", "keyframes"), ("nsfw", "keyframes"), ("ocr", "keyframes")],
    "ocr_backend": [("ocr", "backend")],
    "ocr_model_dir": [("ocr", "model_dir")],
    "ocr_download": [("ocr", "download")],
    "save_embeddings": [("clip", "save_embeddings")],
}


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


@dataclass
class SortedOptions:
    """Where build_config's keyword options go: the decisions, as data; the refusals are
    rendered from them by refusal()/wrong_scorer()."""
    score: Dict[str, Any] = field(default_factory=dict)  # ScoreConfig fields
    stage: Dict[str, Any] = field(default_factory=dict)  # StageConfig fields given (None left out)
    scorer_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # scorer -> its options
    # scorer -> the shortcuts given for it; a scorer not in the run means they cannot apply
    shortcuts: Dict[str, List[str]] = field(default_factory=dict)
    # the first option that cannot be taken: ("unknown", key) or
    # ("conflict", shortcut, value, scorer, its option, the value given there)
    refused: Optional[tuple] = None


def sort_options(names: Sequence[str], options: Dict[str, Any], scorer_options: Dict[str, Dict]) -> SortedOptions:
    """Sort keyword options into ScoreConfig fields, StageConfig fields and scorer options (the
    SHORTCUTS, for the scorers of the run named `names`); stops at the first it cannot take."""
    score_fields = {f.name for f in fields(ScoreConfig)}
    stage_fields = {f.name for f in fields(StageConfig)}
    out = SortedOptions(scorer_options={k: dict(v) for k, v in scorer_options.items()})
    for key, value in options.items():
        if key in SHORTCUTS:
            if value is None:
                continue
            targets = [(name, option) for name, option in SHORTCUTS[key] if name in names]
            if not targets:  # refused later by wrong_scorer(), naming the scorer to add
                out.shortcuts.setdefault(SHORTCUTS[key][-1][0], []).append(key)
            for name, option in targets:
                given = out.scorer_options.setdefault(name, {})
                if option in given and given[option] != value:
                    out.refused = ("conflict", key, value, name, option, given[option])
                    return out
                given[option] = value
                out.shortcuts.setdefault(name, []).append(key)
        elif key in score_fields:
            out.score[key] = value
        elif key in stage_fields:
            if value is not None:
                out.stage[key] = value
        else:
            out.refused = ("unknown", key)
            return out
    return out


def refusal(refused: tuple) -> str:
    """The ConfigError message of SortedOptions.refused."""
    if refused[0] == "conflict":
        _, key, value, name, option, given = refused
        return (f"{key} ({_flag(key)}) = {value!r} and the scorer option {name}.{option} = "
                f"{given!r} disagree; pass one of them")
    known = ({f.name for f in fields(ScoreConfig)} | {f.name for f in fields(StageConfig)} | set(SHORTCUTS)) \
        - {"stage"}
    return (f"unknown scoring option {refused[1]!r}; known: {', '.join(sorted(known))}, "
            f"min_clip, max_ocr_area, min_scores, max_scores, {', '.join(RULE_KEYWORDS)}")


def wrong_scorer(name: str, keys: Sequence[str], names: Sequence[str]) -> str:
    """The ConfigError message for shortcuts given for a scorer the run does not have."""
    given = ", ".join(f"{k} ({_flag(k)})" for k in keys)
    return (f"{given} {'applies' if len(keys) == 1 else 'apply'} to the {name} scorer, which is not "
            f"in this run ({', '.join(names)}); add --scorer {name}")


# The selection's keywords (wdsfilter/core/selection.py), the same as wdsfilter.loader's and filter_scores()'; the
# old names of score()'s, taken with a DeprecationWarning.
RULE_KEYWORDS = ("top_shares", "bottom_shares", "equal", "dedup", "recipe")
OLD_RULE_KEYWORDS = {"thresholds": "min_scores", "max_thresholds": "max_scores"}


def rule_keywords(options: Dict[str, Any]) -> Dict[str, Any]:
    """The selection's keywords taken out of `options` (the old names renamed, with a warning)."""
    from ..core.selection import warn_renamed
    rules = {k: options.pop(k) for k in list(options) if k in RULE_KEYWORDS}
    for old, new in OLD_RULE_KEYWORDS.items():
        if old in options:
            value = options.pop(old)
            warn_renamed(old, new, "score")
            rules[new] = {**dict(value or {}), **dict(rules.get(new) or {})}
    return rules


def build_config(out: Optional[str] = None, scorers: Sequence = ("clip",), *, min_clip: Optional[float] = None,
                 min_scores: Optional[Dict[str, float]] = None, max_scores: Optional[Dict[str, float]] = None,
                 max_ocr_area: Optional[float] = None, config: Optional[ScoreConfig] = None,
                 stage: Optional[StageConfig] = None, selection=None, **options) -> ScoreConfig:
    """A ScoreConfig from keyword options: ScoreConfig fields, StageConfig fields (caption_key,
    image_key, max_pixels, ...), the scorer shortcuts of SHORTCUTS (model=, pretrained= for clip;
    precision= for clip; frames=, frame_reduce=, keyframes= for clip and ocr, whichever run; ocr_backend=, ocr_model_dir=,
    ocr_download= for ocr) and the rules (wdsfilter.Selection, as selection= or as the keywords
    wdsfilter.loader takes too): min_clip (clip_score >= X), max_ocr_area (ocr_area <= X),
    min_scores and max_scores ({column: X}), top_shares and bottom_shares ({column: percent}),
    equal ({text column: value}), recipe."""
    from ..core.selection import selection_of
    rules = rule_keywords(options)
    for name, value in (("min_clip", min_clip), ("max_ocr_area", max_ocr_area)):
        rules[name] = value
    for name, value in (("min_scores", min_scores), ("max_scores", max_scores)):  # beside an old name's
        rules[name] = {**dict(rules.get(name) or {}), **dict(value or {})}
    config_or_options(config, dict(options, out=out, stage=stage, selection=selection, **rules), "config", "ScoreConfig")
    if config is not None:
        return config
    from .scorerset import with_required
    scorers = with_required(scorers)  # --scorer tmars brings ocr and clip, so their shortcuts apply
    names = [s if isinstance(s, str) else getattr(s, "name", "") for s in (scorers if not isinstance(scorers, str) else [scorers])]
    given_scorer_options = dict(options.pop("scorer_options", {}) or {})
    opts = sort_options(names, options, given_scorer_options)
    if opts.refused:
        raise ConfigError(refusal(opts.refused))
    config_or_options(stage, opts.stage, "stage")
    for name, keys in opts.shortcuts.items():
        if name not in names:
            raise ConfigError(wrong_scorer(name, keys, names))
    return ScoreConfig(out=out or "", scorers=scorers, scorer_options=opts.scorer_options,
                       selection=selection_of(selection, rules, "score"), stage=stage or StageConfig(**opts.stage),
                       **opts.score)


def score(shards, out: Optional[str] = None, scorers: Sequence = ("clip",), *, min_clip: Optional[float] = None,
          min_scores: Optional[Dict[str, float]] = None, max_scores: Optional[Dict[str, float]] = None,
          max_ocr_area: Optional[float] = None, config: Optional[ScoreConfig] = None,
          echo: Optional[Callable[[str], None]] = None, **options) -> RunSummary:
    """Score every sample of `shards` (folders, globs, brace patterns, files) and write the
    results under `out`; returns the RunSummary (also in out/summary.json). See docs/score.md.

    Raises ConfigError at once for settings that cannot work, and NothingScoredError (with the
    counts) when the run finished without scoring a single sample. `echo` receives the lines the
    command line prints (plan, scorer descriptions)."""
    from .engines.local import run_scoring
    cfg = build_config(out, scorers, min_clip=min_clip, min_scores=min_scores, max_scores=max_scores,
                       max_ocr_area=max_ocr_area, config=config, **options)
    return run_scoring(shards, cfg, echo)
