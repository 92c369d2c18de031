"""What a scorer's score_batch may return for one sample: a dict of its columns. A user's scorer
that returns something a column cannot hold (an array or an infinity for a float column, no value
for any of its columns, a column it did not declare) is the scorer's error, not wdsfilter's: the
sample's row fails with `bad_score_output`, naming the scorer and the column (the ledger row names
the sample), and a scorer that returns nothing usable for its first samples stops the run as a
broken scorer does (backoff.Backoff's guard), instead of an internal error when the score file is
written, or a row marked scored with no score.

A float column declared so (column_types: float64, float32, double, float) holds a finite number
or None (NaN too: written as no value, tables._score_array). An undeclared column whose first
value was a float holds numbers (an array there would fail the score file's write); an infinity
there is kept, as scorers return sentinels (the summary counts them: `infinite`).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Dict, Optional

from .scorers.base import private
from ..runfolder.embeddings import FIELD

FLOAT_TYPES = ("float64", "float32", "double", "float", "halffloat", "float16")
REASON = "bad_score_output"


class OutputCheck:
    """One scorer's outputs, checked sample by sample (picklable state: the columns' kinds)."""

    def __init__(self, scorer):
        self.name = scorer.name
        self.columns = list(getattr(scorer, "columns", list)())  # a scorer always has them; a test's stand-in may not
        declared = (getattr(scorer, "column_types", lambda: {})() or {})
        self.floats = {c for c, t in declared.items() if str(t).lower() in FLOAT_TYPES}
        self.finite = set(self.floats)  # declared float: no infinity either
        self.undeclared = set(self.columns) - set(declared)
        self.allowed = set(self.columns) | {FIELD}

    def problem(self, scores: Dict[str, Any]) -> Optional[str]:
        """Why this sample's output cannot be written, or None."""
        extra = sorted(k for k in scores if k not in self.allowed and not private(str(k)))
        if extra:
            return (f"scorer {self.name!r} returned column {extra[0]!r}, which it does not declare (columns(): "
                    f"{', '.join(self.columns)})")
        if self.columns and not any(c in scores for c in self.columns):
            return f"scorer {self.name!r} returned no value for its column(s) {', '.join(map(repr, self.columns))}"
        for column in self.columns:
            value = scores.get(column)
            if column in self.undeclared and isinstance(value, float):
                self.floats.add(column)  # undeclared: a float column from its first float on
                self.undeclared.discard(column)
            if column in self.floats and not _float_value(value, column in self.finite):
                holds = "a finite number (or None)" if column in self.finite else "a number (or None)"
                return f"scorer {self.name!r} returned {_shown(value)} for its float column {column!r}; it holds {holds}"
        return None


def _float_value(value: Any, finite: bool) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, Real):
        if getattr(value, "shape", None) == () and hasattr(value, "item"):  # a numpy or torch scalar
            return _float_value(value.item(), finite)
        return False
    return isinstance(value, Integral) or not (finite and math.isinf(float(value)))


def _shown(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
