"""The scorers of a run: from names ("clip", "ocr", "module:Class") or objects to checked Scorer
instances (options, distinct names and columns, threshold columns), and the run's identity (what
its outputs depend on: --resume refuses to mix outputs of different settings).

Nothing here loads a model: a scorer is a small picklable config until its load() is called.
"""
from __future__ import annotations

import inspect
import os
from typing import Dict, List, Mapping, Optional, Sequence

from ..core.errors import ConfigError, require
from .config import ScoreConfig
from ..runfolder.tables import BASE_FIELDS, arrow_type
from .registry import check_name, resolve
from .scorers.base import REGISTRY, Scorer, make_scorer, overridden


OWN = "module:Class for your own Scorer"


def check_scorer_names(cfg: ScoreConfig) -> None:
    """Unknown scorer names are ConfigErrors, found without importing any scorer."""
    for spec in cfg.scorers:
        if isinstance(spec, str):
            check_name(REGISTRY, spec, "scorer", OWN)


def _scorer_class(spec: str):
    return resolve(REGISTRY, spec, "scorer", own=OWN)


def _spec_name(spec, cls=None) -> str:
    """The name a scorer spec goes by (its options, --scorer-option NAME.KEY, `requires`): a
    registered name itself, else its class's `name` (or the spec where it has none). cls: the
    spec's class where the caller resolved it already."""
    if not isinstance(spec, str):
        return getattr(spec, "name", "")
    return spec if spec in REGISTRY else (getattr(cls or _scorer_class(spec), "name", "") or spec)


def with_required(specs: Sequence) -> tuple:
    """The scorer specs (names, "module:Class" paths or objects) with the scorers they require
    (Scorer.requires) added by their registered names, and ordered so that each scorer comes after
    the ones it requires (otherwise as given): `--scorer tmars` runs ocr, clip, tmars. Imports a
    named class only to read its `requires` (no model, no torch)."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    by_name = {_spec_name(spec): spec for spec in specs}
    out: list = []
    state: Dict[str, str] = {}

    def visit(name: str, spec, chain: List[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ConfigError(f"scorers require each other in a circle: {' -> '.join(chain + [name])}")
        state[name] = "visiting"
        required = getattr(spec if not isinstance(spec, str) else _scorer_class(spec), "requires", ()) or ()
        for req in required:
            if req not in by_name:
                if req not in REGISTRY:
                    raise ConfigError(f"scorer {name!r} requires the scorer {req!r}, which is not registered: "
                                      f"pass it too (--scorer module:Class)")
                by_name[req] = req
            visit(req, by_name[req], chain + [name])
        state[name] = "done"
        out.append(spec)

    for spec in specs:
        visit(_spec_name(spec), spec, [])
    return tuple(out)


def bind_required(scorers: Sequence[Scorer]) -> None:
    """Hand each scorer with `requires` the required scorer objects of this run (Scorer.bind):
    when the scorers are resolved (their checks), and in each model process after loading."""
    by_name = {s.name: s for s in scorers}
    for s in scorers:
        bind_one(s, by_name)


def bind_one(scorer: Scorer, by_name: Mapping[str, Scorer]) -> None:
    """Hand one scorer with `requires` its required scorers from `by_name` (this run's scorers by
    name); a scorer without `requires` is left alone."""
    required = getattr(scorer, "requires", ()) or ()
    if required:
        missing = [r for r in required if r not in by_name]
        if missing:
            raise ConfigError(f"scorer {scorer.name!r} requires {missing}, which this run does not have")
        scorer.bind({r: by_name[r] for r in required})


def resolve_scorers(cfg: ScoreConfig) -> List[Scorer]:
    """Scorer instances (unloaded) for cfg.scorers; options and threshold columns checked."""
    scorers = []
    used_options = set()
    for spec in with_required(cfg.scorers):
        if not isinstance(spec, str):
            if not all(hasattr(spec, a) for a in ("prepare", "load", "score_batch", "columns")):
                raise ConfigError(f"{spec!r} is not a Scorer (it needs prepare, load, score_batch, columns)")
            if cfg.scorer_options.get(getattr(spec, "name", "")):
                raise ConfigError(f"options {sorted(cfg.scorer_options[spec.name])} were given for the {spec.name} "
                                  f"scorer, which was passed as an object: set them on the object instead")
            scorers.append(spec)
            continue
        cls = _scorer_class(spec)
        name = _spec_name(spec, cls)
        options = dict(cfg.scorer_options.get(name, {}))
        used_options.add(name)
        param = inspect.signature(cls).parameters.get("config")
        if "config" not in options and param is not None and "StageConfig" in str(param.annotation):
            # The run's stage config (a `config: StageConfig` parameter): its image token and size
            # guard apply inside the scorer too.
            options["config"] = cfg.stage
        try:
            scorer = make_scorer(spec, **options) if spec in REGISTRY else cls(**options)
        except TypeError as e:
            accepted = ", ".join(p for p in inspect.signature(cls).parameters if p not in ("self", "kwargs"))
            raise ConfigError(f"scorer {name!r}: {e}; its options are: {accepted}") from None
        scorers.append(scorer)
    unknown = set(cfg.scorer_options) - used_options - {s.name for s in scorers}
    if unknown:
        raise ConfigError(f"options given for scorer(s) {sorted(unknown)} that are not in this run "
                          f"({', '.join(s.name for s in scorers)})")
    names = [s.name for s in scorers]
    if len(set(names)) != len(names) or not all(names):
        raise ConfigError(f"scorers need distinct, non-empty names; got {names}")
    bind_required(scorers)
    check_threshold_columns(cfg, score_columns(scorers))
    return scorers


def check_before_torch(cfg: ScoreConfig) -> None:
    """What can be checked of the scorers before torch is imported (Scorer.early_columns: a CLIP
    model name or folder) and, where every scorer declares its columns then, the threshold columns:
    a configuration error answers in a second instead of after the imports and the model load.
    Every scorer's optional dependencies (Scorer.needs) are checked first."""
    specs = with_required(cfg.scorers)
    for spec in specs:
        cls = _scorer_class(spec) if isinstance(spec, str) else type(spec)
        for module, install in getattr(cls, "needs", ()) or ():
            require(module, f"the {_spec_name(spec, cls) if isinstance(spec, str) else spec.name} scorer", install)
    columns: List[str] = []
    for spec in specs:
        if isinstance(spec, str):
            cls = _scorer_class(spec)
            name = _spec_name(spec, cls)
            early = getattr(cls, "early_columns", None)
            try:
                found = early(dict(cfg.scorer_options.get(name, {}))) if early else None
            except TypeError:  # an option the scorer does not have: resolve_scorers names its options
                return
        else:  # an object is built already
            found = spec.columns() if callable(getattr(spec, "columns", None)) else None
        if found is None:
            return
        columns += found
    check_threshold_columns(cfg, columns)


def check_threshold_columns(cfg: ScoreConfig, columns) -> None:
    """Every threshold and share column is one a scorer writes; where `columns` holds the declared
    types (score_columns), one declared as numbers: the end of the run resolves the shares with
    `wdsfilter filter`'s rule (runfolder.shares.check_spec), which refuses any other column, and
    that after every shard was scored."""
    missing = [c for c in cfg.threshold_columns() if c not in columns]
    if missing:
        raise ConfigError(f"threshold(s) on {missing}, which no scorer of this run writes; "
                          f"score columns: {', '.join(columns)}")
    if isinstance(columns, Mapping):
        import pyarrow as pa
        declared = {c: arrow_type(columns[c]) for c in cfg.selection.numeric_columns() if columns[c] is not None}
        flags = [c for c, t in declared.items() if t is not None and not (pa.types.is_floating(t) or
                                                                           pa.types.is_integer(t))]
        if flags:
            numeric = [c for c, t in columns.items() if t is None or pa.types.is_floating(arrow_type(t))
                       or pa.types.is_integer(arrow_type(t))]
            raise ConfigError(f"threshold(s) on {', '.join(flags)}, which {'does' if len(flags) == 1 else 'do'} not "
                              f"hold numbers; numeric score columns: {', '.join(numeric) or 'none'}")
        texts = {c: arrow_type(columns[c]) for c in cfg.selection.equal if columns[c] is not None}
        numbers = [c for c, t in texts.items() if t is not None and not pa.types.is_string(t)]
        if numbers:
            raise ConfigError(f"--equal on {', '.join(numbers)}, which {'does' if len(numbers) == 1 else 'do'} not "
                              f"hold text; compare numbers with --min and --max")


def score_columns(scorers: Sequence[Scorer]) -> Dict[str, Optional[str]]:
    """The run's score columns in order, each with its declared Parquet type (None: typed by its
    values; Scorer.column_types)."""
    columns: Dict[str, Optional[str]] = {}
    for s in scorers:
        declared = overridden(s, "column_types")  # a scorer that is not a Scorer subclass may have none
        types = declared() if declared else {}
        for c in s.columns():
            if c in columns or c in BASE_FIELDS:
                raise ConfigError(f"scorer {s.name!r} writes column {c!r}, which is taken; rename it")
            columns[c] = types.get(c)
            if columns[c] is not None and arrow_type(columns[c]) is None:
                raise ConfigError(f"scorer {s.name!r} declares column {c!r} of type {columns[c]!r}, which is not "
                                  f"a pyarrow type name (float64, int64, bool, string, list<float64>)")
    return columns


def run_identity(cfg: ScoreConfig, scorers: Sequence[Scorer]) -> dict:
    """What the outputs depend on; --resume refuses to mix outputs of different settings."""
    def simple(v):
        return isinstance(v, (str, int, float, bool, type(None))) or (
            isinstance(v, (list, tuple)) and all(simple(x) for x in v))
    described = []
    for s in scorers:
        cls = type(s)
        described.append({"name": s.name, "class": f"{cls.__module__}:{cls.__qualname__}", "columns": s.columns(),
                          "options": {k: v for k, v in sorted(vars(s).items()) if not k.startswith("_") and simple(v)}})
    stage = {k: v for k, v in cfg.stage.to_dict().items()
             if k not in ("emit_rejects", "starvation_samples", "starvation_seconds",
                                                                 "stream_idle_seconds", "keep_image_bytes", "decode_pixels")
             and k not in ("allow_remote", "storage_options") and not k.startswith("remote_")}  # how, not what
    rules = cfg.selection
    identity = {"scorers": described, "thresholds": dict(rules.minima), "stage": stage, "format": cfg.format,
                "write_shards": os.path.abspath(cfg.write_shards) if cfg.write_shards else None}
    if cfg.reshards:  # only when set, as maxima: new shards of N at the end, not a copy per shard
        identity.update(samples_per_shard=cfg.samples_per_shard, prefix=cfg.prefix)
    if rules.maxima:  # only when set, so runs without maxima keep the identity they had
        identity["max_thresholds"] = dict(rules.maxima)
    if rules.equal:  # the same: the `kept` column judges them too
        identity["equal"] = {c: list(v) for c, v in rules.equal.items()}
    return identity


