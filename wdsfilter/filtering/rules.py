"""Thresholds chosen after scoring: what `wdsfilter filter` and `wdsfilter.loader(scores=...)` take.

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

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..runfolder import ScoreRun
from ..runfolder.judge import Threshold, bounds, given_thresholds  # noqa: F401 - judged below filtering
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


def resolve(spec: FilterSpec, run) -> List[Threshold]:
    """Thresholds with every share resolved to its value over `run` (a runfolder.ScoreRun)."""
    out = given_thresholds(run, spec.mins, spec.maxes, spec.columns())
    for shares, top in ((spec.tops, True), (spec.bottoms, False)):
        for column, percent in shares.items():
            given = f"--{'top' if top else 'bottom'} {column}={percent:g}%"
            value, k, scored = _share(run, column, percent, top)
            if not scored:
                raise ConfigError(f"{given}: no row of {run.folder} has a value in {column}")
            out.append(Threshold(Bound(column, value, top), given, share=percent, rank=k, scored=scored))
    return out


def _share(run, column: str, percent: float, top: bool) -> Tuple[Optional[float], int, int]:
    """(v, k, rows with a value) of a --top/--bottom share over the run: the column held whole
    when it fits (one read of each file), else the streaming exact quantile (quantile.py)."""
    from ..runfolder.tables import column_numbers, read_numbers
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


def resolve_for_loader(scores_dir: str, min_scores: Optional[Dict[str, float]] = None,
                       max_scores: Optional[Dict[str, float]] = None, top_scores: Optional[Dict[str, float]] = None,
                       bottom_scores: Optional[Dict[str, float]] = None) -> Tuple[Dict[str, float], Dict[str, float]]:
    """wdsfilter.loader's shares (top_scores={"clip_score": 30}) resolved as `wdsfilter filter`
    resolves them, merged with its minima and maxima."""
    spec = FilterSpec(mins=dict(min_scores or {}), maxes=dict(max_scores or {}),
                      tops={c: _percent(p, "top_scores") for c, p in dict(top_scores or {}).items()},
                      bottoms={c: _percent(p, "bottom_scores") for c, p in dict(bottom_scores or {}).items()})
    return bounds(resolve(spec, ScoreRun.open(scores_dir)))


def _percent(value, name: str) -> float:
    try:
        percent = float(str(value).rstrip("%"))
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not a percentage") from None
    if not 0 < percent <= 100:
        raise ConfigError(f"{name}: {value!r} must be in (0, 100]")
    return percent


def write_thresholds(path: str, thresholds: Sequence[Threshold]) -> str:
    """The resolved thresholds as wdsfilter.loader's keyword arguments:
    wdsfilter.loader(shards, scores=DIR, **json.load(open(path)))."""
    from ..atomic import write_json as _atomic_json
    mins, maxes = bounds(thresholds)
    _atomic_json(path, {"min_scores": mins, "max_scores": maxes})
    return path
