"""Shares of a run (--top COL=P%, --bottom COL=P%) and the thresholds as given, resolved over a
run folder to plain minima and maxima: what `wdsfilter score --top` (at the end of its run),
`wdsfilter filter` and `wdsfilter.loader(scores=..., top_scores=...)` resolve the same way.

    --min COL=X      keep rows with COL >= X
    --max COL=X      keep rows with COL <= X
    --top COL=P%     keep the P% of scored rows with the highest COL: resolved to --min COL=v
    --bottom COL=P%  keep the P% of scored rows with the lowest COL: resolved to --max COL=v

A share is resolved over the whole run (every finished shard of the score folder) to the exact
value v of rank k = ceil(P% of the rows that have a value in COL) (see quantile.py). Rows equal
to v are all kept, so with ties the kept share can exceed P%: the output says by how much.
Resolved, every threshold is a minimum or a maximum on a column, judged by the one keep rule of
the scoring run and the loader (runfolder/keep.py: a row without a value in a threshold column,
and a failed or rejected row, is never kept).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..thresholds import Bound, Thresholds, parse_threshold


def parse_share(text: str, option: str = "--top") -> Tuple[str, float]:
    """'clip_score=30%' -> ("clip_score", 30.0)."""
    column, sep, value = text.partition("=")
    value = value.strip()
    if not sep or not column.strip() or not value.endswith("%"):
        raise ConfigError(f"{option} expects COLUMN=P% (e.g. clip_score=30%), got {text!r}")
    try:
        percent = float(value[:-1])
    except ValueError:
        raise ConfigError(f"{option} {text!r}: {value!r} is not a percentage") from None
    if not 0 < percent <= 100:
        raise ConfigError(f"{option} {text!r}: the share must be in (0, 100]%")
    return column.strip(), percent


@dataclass
class FilterSpec:
    """The thresholds as given: column -> bound (min, max) or -> percent (top, bottom)."""
    mins: Dict[str, float] = field(default_factory=dict)
    maxes: Dict[str, float] = field(default_factory=dict)
    tops: Dict[str, float] = field(default_factory=dict)
    bottoms: Dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, mins: Sequence[str] = (), maxes: Sequence[str] = (), tops: Sequence[str] = (),
              bottoms: Sequence[str] = (), thresholds: Optional[Thresholds] = None) -> "FilterSpec":
        """From the command line's COL=X and COL=P% texts; `thresholds`' minima and maxima come
        first (a text for the same column replaces its bound)."""
        given = thresholds or Thresholds()
        return cls(mins={**given.minima, **dict(parse_threshold(t, "--min") for t in mins)},
                   maxes={**given.maxima, **dict(parse_threshold(t, "--max") for t in maxes)},
                   tops=dict(parse_share(t, "--top") for t in tops),
                   bottoms=dict(parse_share(t, "--bottom") for t in bottoms))

    def columns(self) -> List[str]:
        return list(dict.fromkeys([*self.mins, *self.maxes, *self.tops, *self.bottoms]))

    def __bool__(self) -> bool:
        return bool(self.mins or self.maxes or self.tops or self.bottoms)


@dataclass
class Threshold:
    """One resolved threshold: a thresholds.Bound (COL >= value or COL <= value, judged by the one
    rule in wdsfilter/thresholds.py) and where it came from."""
    bound: Bound
    given: str  # as the user wrote it: "--top clip_score=30%"
    share: Optional[float] = None  # top/bottom: the percent asked for
    rank: Optional[int] = None  # top/bottom: rows the share asks for (k)
    scored: Optional[int] = None  # top/bottom: rows with a value in the column (the share's base)

    @property
    def column(self) -> str:
        return self.bound.column

    @property
    def minimum(self) -> bool:
        return self.bound.minimum

    @property
    def value(self) -> float:
        return self.bound.value

    def passes(self, v) -> Optional[bool]:
        """True/False, or None when the row has no value in the column."""
        return self.bound.judge(v)

    def describe(self) -> str:
        return f"{self.column} {'>=' if self.minimum else '<='} {self.value:.6g}"


def check_spec(spec: FilterSpec, run) -> None:
    """Every threshold column is a numeric score column of `run`'s files (a ConfigError naming it)."""
    run.check_columns(spec.columns(), "thresholds")
    numeric = run.numeric_columns(spec.columns())
    flags = [c for c in spec.columns() if c not in numeric]
    if flags:
        numeric = run.numeric_columns()
        raise ConfigError(f"thresholds on {', '.join(flags)}, which {'does' if len(flags) == 1 else 'do'} not hold "
                          f"numbers; numeric score columns: {', '.join(numeric) or 'none'}")


def resolve(spec: FilterSpec, run, empty_keeps_none: bool = False,
            held: Optional[Dict[str, list]] = None) -> List[Threshold]:
    """Thresholds with every share resolved to its value over `run` (a runfolder.ScoreRun).
    A share over a column no row has a value in is a ConfigError, or with empty_keeps_none (the
    end of a scoring run, whose rows are what they are) a bound no row passes. held: a column's
    values over the whole run already in memory (float64 arrays, NaN for no value), not read again."""
    check_spec(spec, run)
    out = [Threshold(Bound(c, v, True), f"--min {c}={v:g}") for c, v in spec.mins.items()]
    out += [Threshold(Bound(c, v, False), f"--max {c}={v:g}") for c, v in spec.maxes.items()]
    for shares, top in ((spec.tops, True), (spec.bottoms, False)):
        for column, percent in shares.items():
            given = f"--{'top' if top else 'bottom'} {column}={percent:g}%"
            if held is not None and column in held:
                from .quantile import share_of_chunks
                value, k, scored = share_of_chunks(held[column], percent, top)
            else:
                value, k, scored = _share(run, column, percent, top)
            if not scored and not empty_keeps_none:
                raise ConfigError(f"{given}: no row of {run.folder} has a value in {column}")
            if not scored:  # a row without a value never passes a bound: no row is kept
                value = math.inf if top else -math.inf
            out.append(Threshold(Bound(column, value, top), given, share=percent, rank=k, scored=scored))
    return out


def given_thresholds(run, mins: Dict[str, float], maxes: Dict[str, float]) -> List[Threshold]:
    """The thresholds given as values (--min, --max, a scoring run's own), each column checked to
    be a numeric score column of `run` (a ConfigError naming the numeric ones)."""
    return resolve(FilterSpec(mins=dict(mins), maxes=dict(maxes)), run)


def _share(run, column: str, percent: float, top: bool) -> Tuple[Optional[float], int, int]:
    """(v, k, rows with a value) of a --top/--bottom share over the run: the column held whole
    when it fits (one read of each file), else the streaming exact quantile (quantile.py)."""
    from .tables import column_numbers, read_numbers
    from . import quantile
    values = column_numbers([s.score_file for s in run.shards], column, quantile.IN_MEMORY_ROWS)
    if values is not None:
        if not len(values):
            return None, 0, 0
        return (*quantile.share_value(values, percent, top), len(values))

    def source():
        return (v for s in run.shards for v in read_numbers(s.score_file, column))
    stats = quantile.count_range(source)
    if not stats[0]:
        return None, 0, 0
    pick = quantile.top_share_value if top else quantile.bottom_share_value
    return (*pick(source, percent, stats), stats[0])


def bounds(thresholds: Sequence[Threshold]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(min_scores, max_scores) as wdsfilter.loader takes them: the strictest bound per column."""
    th = Thresholds.strictest(t.bound for t in thresholds)
    return th.minima, th.maxima


def resolve_for_loader(scores_dir: str, min_scores: Optional[Dict[str, float]] = None,
                       max_scores: Optional[Dict[str, float]] = None, top_scores: Optional[Dict[str, float]] = None,
                       bottom_scores: Optional[Dict[str, float]] = None) -> Tuple[Dict[str, float], Dict[str, float]]:
    """wdsfilter.loader's shares (top_scores={"clip_score": 30}) resolved as `wdsfilter filter`
    resolves them, merged with its minima and maxima."""
    spec = FilterSpec(mins=dict(min_scores or {}), maxes=dict(max_scores or {}),
                      tops={c: check_percent(p, "top_scores") for c, p in dict(top_scores or {}).items()},
                      bottoms={c: check_percent(p, "bottom_scores") for c, p in dict(bottom_scores or {}).items()})
    from .reader import ScoreRun
    return bounds(resolve(spec, ScoreRun.open(scores_dir)))


def resolve_over_run(folder: str, minima: Dict[str, float], maxima: Dict[str, float], tops: Dict[str, float],
                     bottoms: Dict[str, float]) -> List[Threshold]:
    """The thresholds of a scoring run (`wdsfilter score --top ...`) resolved over its folder when
    it ends: the same values `wdsfilter filter FOLDER --min ... --top ...` resolves."""
    from .reader import ScoreRun
    spec = FilterSpec(mins=dict(minima), maxes=dict(maxima), tops=dict(tops), bottoms=dict(bottoms))
    return resolve(spec, ScoreRun.open(folder), empty_keeps_none=True)


def check_percent(value, name: str) -> float:
    """A share's percent (30, 30.0 or "30%") as a float in (0, 100]; else a ConfigError naming
    `name` (the option or keyword it came from)."""
    try:
        percent = float(str(value).strip().rstrip("%"))
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not a percentage") from None
    if not 0 < percent <= 100:
        raise ConfigError(f"{name}: {value!r} must be in (0, 100]%")
    return percent


def write_thresholds(path: str, thresholds: Sequence[Threshold]) -> str:
    """The resolved thresholds as wdsfilter.loader's keyword arguments:
    wdsfilter.loader(shards, scores=DIR, **json.load(open(path)))."""
    from ..atomic import write_json as _atomic_json
    mins, maxes = bounds(thresholds)
    _atomic_json(path, {"min_scores": mins, "max_scores": maxes})
    return path
