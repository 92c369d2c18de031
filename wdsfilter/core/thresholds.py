"""Score thresholds: the one implementation of "is this row within its minima and maxima".

Used by the scoring run (a row's `kept`), its summary (kept/dropped per bound), the training-time
score filter (wdsfilter.loader(scores=...)) and the command line (--min/--max COLUMN=X).

    th = Thresholds.build({"clip_score": 0.28}, {"ocr_area": 0.2})
    th.passes({"clip_score": 0.3, "ocr_area": 0.1})   -> True
    th.first_failure({"clip_score": 0.1, ...})          -> Bound("clip_score", 0.28, minimum=True)
    th.describe()                                        -> "clip_score >= 0.28, ocr_area <= 0.2"

A missing value (None or NaN: the scorer could not score the sample) never passes a bound.
"""
from __future__ import annotations

import math
from numbers import Real
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from .errors import ConfigError


def is_missing(value: Any) -> bool:
    """None or NaN: no score."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def is_number(v: Any) -> bool:
    """A value a bound can judge: an int or float (numpy's too), not a bool, not a string (a
    hand-edited score table may hold one)."""
    return isinstance(v, Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"


@dataclass(frozen=True)
class Bound:
    column: str
    value: float
    minimum: bool  # True: column >= value; False: column <= value

    def passes(self, v: Any) -> bool:
        """v is within this bound (a missing v, or one that is not a number, never is)."""
        if is_missing(v) or not is_number(v):
            return False
        return v >= self.value if self.minimum else v <= self.value

    def judge(self, v: Any) -> Optional[bool]:
        """passes(v), or None when v is missing or not a number (so callers can count rows
        without a score apart)."""
        return None if is_missing(v) or not is_number(v) else self.passes(v)

    def drop_reason(self, v: Any) -> Optional[str]:
        """A short reason v fails this bound, for counting per reason ('no clip_score',
        'clip_score < 0.28'); None when it passes."""
        ok = self.judge(v)
        if ok is None:
            return f"no {self.column}"
        return None if ok else f"{self.column} {'<' if self.minimum else '>'} {self.value:.4g}"

    def describe(self) -> str:
        return f"{self.column} {'>=' if self.minimum else '<='} {self.value:g}"

    def explain(self, v: Any) -> str:
        """Why v fails this bound, e.g. 'clip_score=0.1 < 0.28'."""
        if is_missing(v) or not is_number(v):
            return f"{self.column} has no score"
        return f"{self.column}={v:.4g} {'<' if self.minimum else '>'} {self.value:g}"


@dataclass(frozen=True)
class Match:
    """A text column's rule (`--equal caption_language=en`): the row's value is one of `values`.
    The same interface as Bound, so the one keep rule (runfolder/keep.py) judges both."""
    column: str
    values: Tuple[str, ...]

    def passes(self, v: Any) -> bool:
        return self.judge(v) is True

    def judge(self, v: Any) -> Optional[bool]:
        """passes(v), or None when v is missing (or not a text: a number in a hand-edited table)."""
        if is_missing(v) or not isinstance(v, str):
            return None
        return v in self.values

    def drop_reason(self, v: Any) -> Optional[str]:
        ok = self.judge(v)
        if ok is None:
            return f"no {self.column}"
        return None if ok else f"{self.column} not {self.shown()}"

    def shown(self) -> str:
        return self.values[0] if len(self.values) == 1 else "in " + ",".join(self.values)

    def describe(self) -> str:
        return f"{self.column} = {self.values[0]}" if len(self.values) == 1 else \
            f"{self.column} in {', '.join(self.values)}"

    def explain(self, v: Any) -> str:
        if self.judge(v) is None:
            return f"{self.column} has no value"
        return f"{self.column}={v!r} not {self.shown()}"


def numbers(bounds: Optional[Mapping], what: str) -> Dict[str, float]:
    """{column: number}; a value that is not a number (or is NaN) is a ConfigError naming `what`
    ("minimum", "maximum") and the column."""
    out: Dict[str, float] = {}
    try:
        items = dict(bounds or {}).items()
    except (TypeError, ValueError):
        raise ConfigError(f"{what} thresholds must map score columns to numbers, got {bounds!r}") from None
    for column, value in items:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{what} threshold for {column!r} must be a number, got {value!r}") from None
        if number != number:
            raise ConfigError(f"{what} threshold for {column!r} is NaN")
        out[str(column)] = number
    return out


@dataclass(frozen=True)
class Thresholds:
    """Minimum and maximum per score column (build() checks them)."""
    minima: Dict[str, float] = field(default_factory=dict)
    maxima: Dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, minima: Optional[Mapping] = None, maxima: Optional[Mapping] = None) -> "Thresholds":
        """Checked thresholds: numbers, and no column whose minimum is above its maximum."""
        lo, hi = numbers(minima, "minimum"), numbers(maxima, "maximum")
        empty = [c for c, v in lo.items() if c in hi and v > hi[c]]
        if empty:
            c = empty[0]
            raise ConfigError(f"no sample can be kept: the minimum {lo[c]:g} of {c} is above its maximum {hi[c]:g}")
        return cls(lo, hi)

    @classmethod
    def strictest(cls, bounds: Iterable[Bound]) -> "Thresholds":
        """The strictest minimum and maximum per column of several bounds (e.g. `--min c=0.2` and
        `--top c=30%` resolved). Not checked for an empty range: judging such bounds keeps no row,
        which is what the user asked for."""
        lo: Dict[str, float] = {}
        hi: Dict[str, float] = {}
        for b in bounds:
            if b.minimum:
                lo[b.column] = max(lo.get(b.column, -math.inf), b.value)
            else:
                hi[b.column] = min(hi.get(b.column, math.inf), b.value)
        return cls(lo, hi)

    def __bool__(self) -> bool:
        return bool(self.minima or self.maxima)

    def bounds(self) -> Iterator[Bound]:
        """Minima first, then maxima, each in the order given."""
        for c, v in self.minima.items():
            yield Bound(c, v, True)
        for c, v in self.maxima.items():
            yield Bound(c, v, False)

    def columns(self) -> List[str]:
        """Columns with a bound, each once, in order."""
        return list(dict.fromkeys([*self.minima, *self.maxima]))

    def first_failure(self, row: Mapping) -> Optional[Bound]:
        """The first bound the row does not meet (a missing value fails), or None."""
        for b in self.bounds():
            if not b.passes(row.get(b.column)):
                return b
        return None

    def passes(self, row: Mapping) -> bool:
        """Every threshold column of the row has a value within its bounds."""
        return self.first_failure(row) is None

    def describe(self) -> str:
        return ", ".join(b.describe() for b in self.bounds()) or "no thresholds"


def parse_threshold(text: str, option: str = "--min") -> Tuple[str, float]:
    """'clip_score=0.28' -> ("clip_score", 0.28) (the --min and --max options)."""
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        example = "ocr_area=0.2" if option == "--max" else "clip_score=0.28"
        raise ConfigError(f"{option} expects COLUMN=VALUE (e.g. {example}), got {text!r}")
    try:
        return column.strip(), float(value)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: {value!r} is not a number") from None


# The shorthands of the two usual bounds, the same on `score`, `filter` and wdsfilter.loader:
# option -> (a minimum?, its column).
SHORTHANDS = {"min_clip": (True, "clip_score"), "max_ocr_area": (False, "ocr_area")}


def expand_shorthands(minima: Optional[Mapping] = None, maxima: Optional[Mapping] = None,
                      **shorthands: Optional[float]) -> Tuple[Dict, Dict]:
    """(minima, maxima) with the SHORTHANDS given (min_clip=X, max_ocr_area=X; None: not given)
    set on their columns: the one expansion of them (score, filter, the loader)."""
    lo, hi = dict(minima or {}), dict(maxima or {})
    for name, value in shorthands.items():
        if value is not None:
            minimum, column = SHORTHANDS[name]
            (lo if minimum else hi)[column] = value
    return lo, hi


def shorthand_options(command):
    """--min-clip X and --max-ocr-area X on a command whose --min/--max are `mins`/`maxes`: they
    join those as clip_score=X and ocr_area=X."""
    import functools

    import click

    @functools.wraps(command)
    def with_shorthands(*args, **kwargs):
        lo, hi = expand_shorthands(**{name: kwargs.pop(name, None) for name in SHORTHANDS})
        kwargs["mins"] = (*kwargs["mins"], *(f"{c}={v!r}" for c, v in lo.items()))
        kwargs["maxes"] = (*kwargs["maxes"], *(f"{c}={v!r}" for c, v in hi.items()))
        return command(*args, **kwargs)
    with_shorthands = click.option("--max-ocr-area", "max_ocr_area", type=float, default=None,
                                   help="Keep rows with ocr_area <= X (--max ocr_area=X).")(with_shorthands)
    return click.option("--min-clip", "min_clip", type=float, default=None,
                        help="Keep rows with clip_score >= X (--min clip_score=X).")(with_shorthands)
