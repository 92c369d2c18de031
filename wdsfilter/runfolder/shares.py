"""A selection (wdsfilter/core/selection.py: --min/--max/--top/--bottom/--equal/--dedup/--recipe)
resolved against a run folder, in this one place: what `wdsfilter score --top` (at the end of its
run), `wdsfilter filter` and `wdsfilter.loader(scores=..., top_shares=...)` resolve the same way.

    --min COL=X      keep rows with COL >= X
    --max COL=X      keep rows with COL <= X
    --top COL=P%     keep the P% of scored rows with the highest COL: resolved to --min COL=v
    --bottom COL=P%  keep the P% of scored rows with the lowest COL: resolved to --max COL=v
    --equal COL=V    keep rows whose text column COL is V
    --dedup          keep the survivors of `wdsfilter dedup` (its marks read here: runfolder/dedup.py)

A share is resolved over the whole run (every finished shard of the score folder) to the exact
value v of rank k = ceil(P% of the rows that have a value in COL) (see quantile.py). Rows equal
to v are all kept, so with ties the kept share can exceed P%: the output says by how much.
Resolved, every rule is a minimum, a maximum or a text match on a column (a Threshold), judged by
the one keep rule of the scoring run and the loader (runfolder/keep.py: a row without a value in a
rule's column, and a failed or rejected row, is never kept), and the resolved selection
(`Resolved.selection`, shares replaced by values) is what thresholds.json holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..core.errors import ConfigError
from ..core.selection import KINDS, Selection, check_percent, parse_share  # noqa: F401 - the share parsers, for older callers
from ..core.thresholds import Bound, Match, Thresholds
from ..core.recipes import scorers_for
from .quantile import share_of_chunks
from .dedup import DedupMarks
from .tables import column_numbers, read_numbers
from . import quantile
from .reader import ScoreRun
from ..storage.atomic import write_json as _atomic_json

# The name of the given rules before they were a Selection (FilterSpec.parse(tops=[...]) still works).
FilterSpec = Selection


@dataclass
class Threshold:
    """One resolved rule: a thresholds.Bound (COL >= value or COL <= value) or Match (a text
    column's values), judged by the one rule in wdsfilter/runfolder/keep.py, and where it came from."""
    bound: Union[Bound, Match]
    given: str  # as the user wrote it: "--top clip_score=30%", "datacomp-basic: --min min_side=200"
    share: Optional[float] = None  # top/bottom: the percent asked for
    rank: Optional[int] = None  # top/bottom: rows the share asks for (k)
    scored: Optional[int] = None  # top/bottom: rows with a value in the column (the share's base)

    @property
    def column(self) -> str:
        return self.bound.column

    @property
    def numeric(self) -> bool:
        """A minimum or maximum (not a text column's match)."""
        return isinstance(self.bound, Bound)

    @property
    def minimum(self) -> bool:
        return self.numeric and self.bound.minimum

    @property
    def value(self) -> float:
        return self.bound.value

    def passes(self, v) -> Optional[bool]:
        """True/False, or None when the row has no value in the column."""
        return self.bound.judge(v)

    def describe(self) -> str:
        if not self.numeric:
            return self.bound.describe()
        return f"{self.column} {'>=' if self.minimum else '<='} {self.value:.6g}"


def check_present(selection: Selection, run) -> None:
    """Every rule's column is a column of `run`'s score files (a ConfigError naming the missing
    ones and, for a recipe's rules, the scorers that recipe reads); from the run's schema only."""
    missing = [c for c in selection.columns() if c not in run.columns]
    if missing:
        recipes = list(dict.fromkeys(selection.origins[f"{kind} {c}"] for kind in KINDS for c in missing
                                     if f"{kind} {c}" in selection.origins))
        scorers = scorers_for(recipes)
        hint = (f"; the recipe {', '.join(recipes)} reads the columns of "
                f"{' '.join('--scorer ' + s for s in scorers)}: score with them" if scorers else "")
        raise ConfigError(f"thresholds on {', '.join(missing)}, which the score files in {run.folder} do not have"
                          f"{hint}; their columns: {', '.join(run.columns)}")


def check_selection(selection: Selection, run) -> None:
    """check_present, and each rule's column of the right kind: numbers for --min/--max/--top/
    --bottom, text for --equal (a ConfigError naming the columns of that kind)."""
    check_present(selection, run)
    wanted = selection.numeric_columns()
    numeric = run.numeric_columns(wanted)
    flags = [c for c in wanted if c not in numeric]
    if flags:
        numeric = run.numeric_columns()
        raise ConfigError(f"thresholds on {', '.join(flags)}, which {'does' if len(flags) == 1 else 'do'} not hold "
                          f"numbers; numeric score columns: {', '.join(numeric) or 'none'}")
    numbers = [c for c in selection.equal if c in run.numeric_columns([c])]
    if numbers:
        raise ConfigError(f"--equal on {', '.join(numbers)}, which {'holds' if len(numbers) == 1 else 'hold'} numbers: "
                          f"compare them with --min and --max")


def resolve(selection: Selection, run, empty_keeps_none: bool = False,
            held: Optional[Dict[str, list]] = None) -> List[Threshold]:
    """Every rule with a column, each share resolved to its value over `run` (a
    runfolder.ScoreRun), in the order rows are judged: minima, maxima, tops, bottoms, text matches.
    A share over a column no row has a value in is a ConfigError, or with empty_keeps_none (the
    end of a scoring run, whose rows are what they are) a bound no row passes. held: a column's
    values over the whole run already in memory (float64 arrays, NaN for no value), not read again."""
    check_selection(selection, run)
    out = [Threshold(Bound(c, v, True), selection.given("min", c)) for c, v in selection.minima.items()]
    out += [Threshold(Bound(c, v, False), selection.given("max", c)) for c, v in selection.maxima.items()]
    for shares, top in ((selection.top, True), (selection.bottom, False)):
        for column, percent in shares.items():
            given = selection.given("top" if top else "bottom", column)
            if held is not None and column in held:
                value, k, scored = share_of_chunks(held[column], percent, top)
            else:
                value, k, scored = _share(run, column, percent, top)
            if not scored and not empty_keeps_none:
                raise ConfigError(f"{given}: no row of {run.folder} has a value in {column}")
            if not scored:  # a row without a value never passes a bound: no row is kept
                value = math.inf if top else -math.inf
            out.append(Threshold(Bound(column, value, top), given, share=percent, rank=k, scored=scored))
    out += [Threshold(Match(c, v), selection.given("equal", c)) for c, v in selection.equal.items()]
    return out


@dataclass
class Resolved:
    """A selection resolved against a run: its rules (`thresholds`, shares as values) and, with
    --dedup, `wdsfilter dedup`'s marks (runfolder/dedup.DedupMarks)."""
    given: Selection
    thresholds: List[Threshold]
    marks: object = None

    @property
    def selection(self) -> Selection:
        """The rules with the shares replaced by their values: what thresholds.json holds and
        the loader is given (Selection.loader_keywords)."""
        mins, maxes = bounds(self.thresholds)
        return self.given.without_shares(mins, maxes)


def resolve_selection(selection: Selection, run, empty_keeps_none: bool = False,
                      held: Optional[Dict[str, list]] = None, marks: bool = True) -> Resolved:
    """resolve() and, for --dedup, the dedup's marks checked against the run's score files
    (marks=False: not read, for a caller that reads them itself, the loader's filter)."""
    thresholds = resolve(selection, run, empty_keeps_none, held)
    dedup = None
    if selection.dedup and marks:
        dedup = DedupMarks(run.folder, [(s.name, s.score_file) for s in run.shards])
    return Resolved(selection, thresholds, dedup)


def given_thresholds(run, mins: Dict[str, float], maxes: Dict[str, float]) -> List[Threshold]:
    """The thresholds given as values (--min, --max, a scoring run's own), each column checked to
    be a numeric score column of `run` (a ConfigError naming the numeric ones)."""
    return resolve(Selection(minima=dict(mins), maxima=dict(maxes)), run)


def _share(run, column: str, percent: float, top: bool) -> Tuple[Optional[float], int, int]:
    """(v, k, rows with a value) of a --top/--bottom share over the run: the column held whole
    when it fits (one read of each file), else the streaming exact quantile (quantile.py)."""
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
    th = Thresholds.strictest(t.bound for t in thresholds if t.numeric)
    return th.minima, th.maxima


def loader_selection(scores_dir: str, selection: Selection, storage_options=None) -> Selection:
    """wdsfilter.loader's selection with its shares (top_shares={"clip_score": 30}) resolved as
    `wdsfilter filter` resolves them: the same values."""
    if not selection.shares:
        return selection
    run = ScoreRun.open(scores_dir, storage_options=storage_options)
    return resolve_selection(selection, run, marks=False).selection


def resolve_for_loader(scores_dir: str, min_scores: Optional[Dict[str, float]] = None,
                       max_scores: Optional[Dict[str, float]] = None, top_scores: Optional[Dict[str, float]] = None,
                       bottom_scores: Optional[Dict[str, float]] = None) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(minima, maxima) of the loader's rules with the shares resolved: the function before
    loader_selection (a Selection in, a Selection out), kept for its callers."""
    rules = loader_selection(scores_dir, Selection(minima=dict(min_scores or {}), maxima=dict(max_scores or {}),
                                                   top=dict(top_scores or {}), bottom=dict(bottom_scores or {})))
    return dict(rules.minima), dict(rules.maxima)


def resolve_over_run(folder: str, selection: Selection) -> Resolved:
    """The rules of a scoring run (`wdsfilter score --top ...`) resolved over its folder when it
    ends: the same values `wdsfilter filter FOLDER --min ... --top ...` resolves."""
    return resolve_selection(selection, ScoreRun.open(folder), empty_keeps_none=True)


def write_thresholds(path: str, selection: Selection) -> str:
    """A resolved selection as wdsfilter.loader's keyword arguments:
    wdsfilter.loader(shards, scores=DIR, **json.load(open(path)))."""
    _atomic_json(path, selection.loader_keywords())
    return path
