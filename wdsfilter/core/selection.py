"""The selection: every rule that decides which rows of a scoring run are kept, in one object,
from the flag to the row.

    flag (and recipe word)   Python keyword    rule
    --min COL=X              min_scores        keep rows with COL >= X
    --max COL=X              max_scores        keep rows with COL <= X
    --top COL=P%             top_shares        the P% of scored rows with the highest COL (a minimum, once resolved)
    --bottom COL=P%          bottom_shares     the P% with the lowest COL (a maximum, once resolved)
    --equal COL=V[,V...]     equal             keep rows whose text column COL is one of the values
    --dedup                  dedup             keep the survivors of `wdsfilter dedup`, drop eval matches
    --recipe NAME|FILE       recipe            the rules of a recipe file (wdsfilter/core/recipes/, or your own)
    --min-clip X, --max-ocr-area X  min_clip, max_ocr_area: --min clip_score=X, --max ocr_area=X

A Selection is built from the command line (`parse`), from the Python keywords every API takes the
same way (`from_keywords`: wdsfilter.loader, score(), filter_scores()), and from files in the
flags' words (`from_dict`: a recipe, run.yaml's `thresholds:`). It is resolved against a run folder
in one place (runfolder/shares.resolve_selection): the shares become values, the dedup marks are
read. The resolved selection is what thresholds.json holds (`loader_keywords`), what `filter`
prints as the loader call (`loader_call`), what run.yaml and filter_run.json record (`to_dict`),
and what the report's rule table lists. A row is judged by the one keep rule (runfolder/keep.py)
against `row_rules()`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigError
from .recipes import INFO_KEYS, recipe_data
from .thresholds import SHORTHANDS, Match, Thresholds, expand_shorthands, numbers, parse_threshold

# The rule kinds in the words of the flags (--min ...), the order rows are judged in.
KINDS = ("min", "max", "top", "bottom", "equal")
# Python keyword of each kind (wdsfilter.loader, score(), filter_scores(), thresholds.json)
KEYWORDS = {"min": "min_scores", "max": "max_scores", "top": "top_shares", "bottom": "bottom_shares",
            "equal": "equal"}
# Old keyword names, still taken with a DeprecationWarning: name -> (the kind, where it was spelled so)
DEPRECATED = {"top_scores": "top", "bottom_scores": "bottom"}


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


def check_percent(value, name: str) -> float:
    """A share's percent (30, 30.0 or "30%") as a float in (0, 100]; else a ConfigError naming
    `name` (the option or keyword it came from)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: {value!r} is not a percentage")
    try:
        percent = float(str(value).strip().rstrip("%"))
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not a percentage") from None
    if not 0 < percent <= 100:
        raise ConfigError(f"{name}: {value!r} must be in (0, 100]%")
    return percent


def parse_equal(text: str, option: str = "--equal") -> Tuple[str, Tuple[str, ...]]:
    """'caption_language=en' -> ("caption_language", ("en",)); 'caption_language=en,de' -> two values."""
    column, sep, value = text.partition("=")
    values = tuple(v.strip() for v in value.split(",") if v.strip())
    if not sep or not column.strip() or not values:
        raise ConfigError(f"{option} expects COLUMN=VALUE[,VALUE...] (e.g. caption_language=en), got {text!r}")
    return column.strip(), values


def _texts(values, name: str) -> Tuple[str, ...]:
    """An --equal rule's values: a text or a list of texts (numbers are refused: use --min/--max)."""
    items = [values] if isinstance(values, str) else values
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) and v for v in items):
        raise ConfigError(f"{name}: the values of an equal rule are a text or a list of texts (e.g. 'en' or "
                          f"['en', 'de']), got {values!r}; compare numbers with min/max")
    return tuple(dict.fromkeys(items))


def _shares(given, name: str) -> Dict[str, float]:
    try:
        items = dict(given or {}).items()
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must map score columns to percentages, got {given!r}") from None
    return {str(c): check_percent(p, f"{name} {c}") for c, p in items}


@dataclass(frozen=True)
class Selection:
    """The rules, as given (shares as percents) or resolved (no shares: runfolder/shares.py's
    `Resolved.selection`). Checked when built; `origins` names the recipe a rule came from."""
    minima: Dict[str, float] = field(default_factory=dict)
    maxima: Dict[str, float] = field(default_factory=dict)
    top: Dict[str, float] = field(default_factory=dict)  # column -> percent
    bottom: Dict[str, float] = field(default_factory=dict)
    equal: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # text column -> values kept
    dedup: bool = False
    recipes: Tuple[str, ...] = ()  # the recipes whose rules are in it, by name (as given)
    origins: Dict[str, str] = field(default_factory=dict)  # "min min_side" -> the recipe that gave it

    def __post_init__(self):
        bounds = Thresholds.build(self.minima, self.maxima)  # numbers, and no empty range
        set_ = object.__setattr__
        set_(self, "minima", dict(bounds.minima))
        set_(self, "maxima", dict(bounds.maxima))
        set_(self, "top", _shares(self.top, "top_shares"))
        set_(self, "bottom", _shares(self.bottom, "bottom_shares"))
        try:
            equal = dict(self.equal or {})
        except (TypeError, ValueError):
            raise ConfigError(f"equal must map text columns to values, got {self.equal!r}") from None
        set_(self, "equal", {str(c): _texts(v, f"equal {c}") for c, v in equal.items()})
        if not isinstance(self.dedup, bool):
            raise ConfigError(f"dedup must be True or False, got {self.dedup!r}")
        set_(self, "recipes", tuple(self.recipes or ()))
        set_(self, "origins", dict(self.origins or {}))

    # -- built from ... ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, mins: Sequence[str] = (), maxes: Sequence[str] = (), tops: Sequence[str] = (),
              bottoms: Sequence[str] = (), equals: Sequence[str] = (), dedup: bool = False,
              recipes: Sequence[str] = ()) -> "Selection":
        """From the command line's texts (COL=X, COL=P%, COL=V); the recipes' rules first, a flag on
        the same column and kind replacing a recipe's. Usage errors before any file is read."""
        equal: Dict[str, Tuple[str, ...]] = {}
        for text in equals:  # repeated on one column: its values add up
            column, values = parse_equal(text)
            equal[column] = tuple(dict.fromkeys((*equal.get(column, ()), *values)))
        given = cls(minima=dict(parse_threshold(t, "--min") for t in mins),
                    maxima=dict(parse_threshold(t, "--max") for t in maxes),
                    top=dict(parse_share(t, "--top") for t in tops),
                    bottom=dict(parse_share(t, "--bottom") for t in bottoms), equal=equal, dedup=bool(dedup))
        return from_recipes(recipes).merged(given)

    @classmethod
    def from_keywords(cls, min_scores: Optional[Mapping] = None, max_scores: Optional[Mapping] = None,
                      top_shares: Optional[Mapping] = None, bottom_shares: Optional[Mapping] = None,
                      equal: Optional[Mapping] = None, dedup: bool = False, recipe=None,
                      min_clip: Optional[float] = None, max_ocr_area: Optional[float] = None,
                      where: str = "", **deprecated) -> "Selection":
        """From the Python keywords (the same in wdsfilter.loader, score() and filter_scores(),
        and in thresholds.json); recipe: a name or file, or a list of them. Old names
        (top_scores, bottom_scores) are taken with a DeprecationWarning."""
        shares = {"top": dict(top_shares or {}), "bottom": dict(bottom_shares or {})}
        for old, value in deprecated.items():
            if old not in DEPRECATED:
                raise ConfigError(f"unknown selection keyword {old!r}; known: "
                                  f"{', '.join([*KEYWORDS.values(), 'dedup', 'recipe', *SHORTHANDS])}")
            kind = DEPRECATED[old]
            warn_renamed(old, KEYWORDS[kind], where)
            shares[kind] = {**dict(value or {}), **shares[kind]}
        try:
            lo, hi = expand_shorthands(min_scores, max_scores, min_clip=min_clip, max_ocr_area=max_ocr_area)
        except (TypeError, ValueError):
            raise ConfigError(f"min_scores and max_scores map score columns to numbers, got {min_scores!r}, "
                              f"{max_scores!r}") from None
        given = cls(minima=lo, maxima=hi, top=shares["top"], bottom=shares["bottom"], equal=dict(equal or {}),
                    dedup=dedup)
        recipes = [recipe] if isinstance(recipe, str) else list(recipe or ())
        return from_recipes(recipes).merged(given)

    @classmethod
    def from_dict(cls, data: Optional[Mapping], where: str) -> "Selection":
        """From a mapping in the flags' words (a recipe file, run.yaml's `thresholds:`):
        {min: {COL: X}, max: ..., top: {COL: P}, bottom: ..., equal: {COL: V or [V, ...]},
        dedup: true, recipe: NAME or [NAME, ...]}. `where` names the file in errors."""
        data = dict(data or {})
        words = (*KINDS, "dedup", "recipe")
        unknown = sorted(set(data) - set(words))
        if unknown:
            raise ConfigError(f"{where}: unknown rule(s) {unknown}; a selection has {', '.join(words)} (the words of "
                              f"the flags: min: {{clip_score: 0.28}}, top: {{clip_score: 30}})")
        for kind in KINDS:
            if not isinstance(data.get(kind) or {}, dict):
                raise ConfigError(f"{where}: {kind} maps columns to {'values' if kind == 'equal' else 'numbers'}, "
                                  f"e.g. {kind}: {{COLUMN: ...}}")
        recipe = data.get("recipe")
        recipes = [recipe] if isinstance(recipe, str) else list(recipe or ())
        try:
            given = cls(minima=data.get("min") or {}, maxima=data.get("max") or {}, top=data.get("top") or {},
                        bottom=data.get("bottom") or {}, equal=data.get("equal") or {},
                        dedup=bool(data.get("dedup", False)))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        return from_recipes(recipes).merged(given)

    # -- combined -----------------------------------------------------------------------------------
    def merged(self, over: "Selection") -> "Selection":
        """self with `over`'s rules added; a rule of `over` on a column replaces self's rule of the
        same kind there (the command line over a recipe file)."""
        origins = {k: v for k, v in self.origins.items() if not _given_in(over, k)}
        origins.update(over.origins)
        return Selection(minima={**self.minima, **over.minima}, maxima={**self.maxima, **over.maxima},
                         top={**self.top, **over.top}, bottom={**self.bottom, **over.bottom},
                         equal={**self.equal, **over.equal}, dedup=self.dedup or over.dedup,
                         recipes=tuple(dict.fromkeys((*self.recipes, *over.recipes))), origins=origins)

    def without_shares(self, minima: Mapping[str, float], maxima: Mapping[str, float]) -> "Selection":
        """The resolved selection: the shares replaced by the strictest bounds they resolved to.
        Not refused for an empty range (a top share cut above a maximum): judging it keeps no row,
        which is what was asked."""
        out = object.__new__(Selection)
        for name, value in {**self.__dict__, "minima": numbers(minima, "minimum"), "maxima": numbers(maxima, "maximum"),
                            "top": {}, "bottom": {}}.items():
            object.__setattr__(out, name, value)
        return out

    # -- what it holds -----------------------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self.minima or self.maxima or self.top or self.bottom or self.equal or self.dedup)

    @property
    def bounds(self) -> Thresholds:
        """The minima and maxima (not the shares) as thresholds.Thresholds."""
        return Thresholds(dict(self.minima), dict(self.maxima))

    @property
    def shares(self) -> List[Tuple[str, str, float]]:
        """(column, "top" or "bottom", percent) of every share."""
        return [(c, "top", p) for c, p in self.top.items()] + [(c, "bottom", p) for c, p in self.bottom.items()]

    def columns(self) -> List[str]:
        """Every column a rule names, each once, in the order judged."""
        return list(dict.fromkeys([*self.minima, *self.maxima, *self.top, *self.bottom, *self.equal]))

    def numeric_columns(self) -> List[str]:
        return list(dict.fromkeys([*self.minima, *self.maxima, *self.top, *self.bottom]))

    def row_rules(self) -> List[Any]:
        """The rules a row is judged by without the whole run (thresholds.Bound and Match, in
        order): a scoring run's `kept` column, the loader's score filter. Shares need the run."""
        return [*self.bounds.bounds(), *(Match(c, v) for c, v in self.equal.items())]

    def given(self, kind: str, column: str) -> str:
        """A rule as the user wrote it: '--top clip_score=30%', 'datacomp-basic: --min min_side=200'."""
        value = {"min": self.minima, "max": self.maxima, "top": self.top, "bottom": self.bottom,
                 "equal": self.equal}[kind][column]
        text = ",".join(value) if kind == "equal" else f"{value:g}%" if kind in ("top", "bottom") else f"{value:g}"
        origin = self.origins.get(f"{kind} {column}")
        return (f"{origin}: " if origin else "") + f"--{kind} {column}={text}"

    def describe(self) -> str:
        parts = [self.given(kind, c) for kind in KINDS for c in self.rules_of(kind)]
        return ", ".join(parts + (["--dedup"] if self.dedup else [])) or "no rule"

    def rules_of(self, kind: str) -> dict:
        """{column: value} of one kind of rule ("min", "max", "top", "bottom", "equal")."""
        return {"min": self.minima, "max": self.maxima, "top": self.top, "bottom": self.bottom,
                "equal": self.equal}[kind]

    # -- written as ... -----------------------------------------------------------------------------
    def to_dict(self, expand: bool = False) -> dict:
        """In the flags' words, only what is set (run.yaml's thresholds, a recipe file):
        Selection.from_dict reads it back. The recipes by name and the rules given beside them;
        expand: every rule written out and no recipe named (what was applied: filter_run.json)."""
        out: dict = {"recipe": list(self.recipes)} if self.recipes and not expand else {}
        for kind in KINDS:
            rules = {c: v for c, v in self.rules_of(kind).items() if expand or f"{kind} {c}" not in self.origins}
            if rules:
                out[kind] = {c: list(v) for c, v in rules.items()} if kind == "equal" else rules
        if self.dedup:
            out["dedup"] = True
        return out

    def loader_keywords(self) -> dict:
        """wdsfilter.loader's keyword arguments for these rules (what thresholds.json holds):
        min_scores and max_scores always, equal and dedup when set. Shares must be resolved first."""
        if self.top or self.bottom:
            raise ValueError("resolve the shares first (runfolder/shares.resolve_selection)")
        out: dict = {"min_scores": dict(self.minima), "max_scores": dict(self.maxima)}
        if self.equal:
            out["equal"] = {c: list(v) if len(v) > 1 else v[0] for c, v in self.equal.items()}
        if self.dedup:
            out["dedup"] = True
        return out

    def loader_call(self, scores_dir: str) -> str:
        """The training loader that keeps these rows: `wdsfilter.loader(shards, scores=..., ...)`."""
        keywords = ", ".join(f"{k}={v!r}" for k, v in self.loader_keywords().items())
        return f"wdsfilter.loader(shards, scores={scores_dir!r}, {keywords})"


def _given_in(selection: Selection, rule: str) -> bool:
    kind, _, column = rule.partition(" ")
    return column in selection.rules_of(kind)


def warn_renamed(old: str, new: str, where: str = "") -> None:
    """The DeprecationWarning of an old keyword name, pointing at the user's line (the first frame
    outside this package)."""
    import os
    import sys
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is the frame of sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(f"{where + ': ' if where else ''}{old}= is deprecated; use {new}= (one spelling in "
                  f"wdsfilter.loader, score() and filter_scores())", DeprecationWarning, stacklevel=level)


def text_and_recipe_options(command):
    """--equal COL=VALUE and --recipe NAME|FILE on a command (`score`, `filter`): declared once,
    given to Selection.parse as equals= and recipes=."""
    import click
    command = click.option("--recipe", "recipes", multiple=True, metavar="NAME|FILE",
                           help="Apply a recipe's rules: datacomp-basic (DataComp's basic filter), or a YAML file in "
                                "the words of these flags (docs/filter.md); a flag here replaces the recipe's rule "
                                "on its column. Repeatable.")(command)
    return click.option("--equal", "equals", multiple=True, metavar="COL=VALUE",
                        help="Keep rows whose text column COL is VALUE (caption_language=en; VALUE,VALUE for "
                             "several). Repeatable.")(command)


def from_recipes(names: Iterable[str], seen: tuple = ()) -> Selection:
    """The rules of the recipes `names` (shipped names or files), later ones over earlier ones.
    seen: the recipes that build on these (a circle is refused)."""
    out = Selection()
    for name in names:
        out = out.merged(from_recipe(name, seen))
    return out


def from_recipe(name: str, seen: tuple = ()) -> Selection:
    """The recipe as a Selection whose every rule names this recipe as its origin."""
    if name in seen:
        raise ConfigError(f"--recipe {name}: the recipes build on each other in a circle ({' -> '.join(seen)})")
    rules = {k: v for k, v in recipe_data(name).items() if k not in INFO_KEYS}
    base = rules.pop("recipe", None)
    own = Selection.from_dict(rules, f"--recipe {name}")
    own = replace(own, recipes=(name,), origins={f"{kind} {c}": name for kind in KINDS for c in own.rules_of(kind)})
    bases = [base] if isinstance(base, str) else list(base or ())
    return from_recipes(bases, (*seen, name)).merged(own) if bases else own


def selection_of(selection: Optional[Selection], keywords: Mapping[str, Any], where: str) -> Selection:
    """The front door of every API that takes the rules: `selection=` or the keywords (min_scores=,
    top_shares=, ... as Selection.from_keywords takes them), not both."""
    given = {k: v for k, v in keywords.items()
             if not (v is None or v is False or (isinstance(v, (dict, list, tuple, str)) and not v))}
    if selection is not None:
        if given:
            raise ConfigError(f"{where}: pass either selection=Selection(...) or the rules one by one, not both "
                              f"(got selection= and {', '.join(sorted(given))})")
        if not isinstance(selection, Selection):
            raise ConfigError(f"{where}: selection= takes a wdsfilter.Selection, got {type(selection).__name__}")
        return selection
    return Selection.from_keywords(where=where, **given)


__all__ = ["Selection", "KINDS", "KEYWORDS", "parse_share", "parse_equal", "check_percent", "selection_of"]
