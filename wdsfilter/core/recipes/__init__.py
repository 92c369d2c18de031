"""Recipes: selections with a name, in the words of the flags. The shipped ones live in this folder
(`--recipe datacomp-basic`); `--recipe FILE.yaml` reads your own the same way.

A recipe file is YAML or JSON (the shipped ones are JSON after their '#' comment lines, which YAML
reads too, so they need no PyYAML):

    about: "one line: what the recipe keeps"
    scorers: [caption, size]        # the scorers whose columns its rules read (said when one is missing)
    min: {COLUMN: X}                # --min COLUMN=X
    max: {COLUMN: X}                # --max COLUMN=X
    top: {COLUMN: PERCENT}          # --top COLUMN=P%   (bottom: the same)
    equal: {COLUMN: VALUE}          # --equal COLUMN=VALUE (or a list of values)
    dedup: true                     # --dedup
    recipe: OTHER                   # the rules of another recipe first (these replace them per column)

Here: finding and reading them (`recipe_data`); a recipe becomes a Selection in selection.py
(`from_recipes`), where every rule keeps the recipe's name (Selection.origins): the dry run, the
report and the printed rules say where each came from.
"""
from __future__ import annotations

import os
from typing import Dict, List

from ..errors import ConfigError
from ..mapping import read_mapping

FOLDER = os.path.dirname(os.path.abspath(__file__))
SUFFIX = ".yaml"
INFO_KEYS = ("about", "scorers")  # what a recipe says of itself beside its rules


def names() -> List[str]:
    """The shipped recipes, by name."""
    return sorted(f[:-len(SUFFIX)] for f in os.listdir(FOLDER) if f.endswith(SUFFIX))


def recipe_path(name: str) -> str:
    """A shipped recipe's file, or `name` itself when it is a file; else a ConfigError naming both kinds."""
    shipped = os.path.join(FOLDER, name + SUFFIX)
    if os.sep not in name and "/" not in name and os.path.isfile(shipped):
        return shipped
    if os.path.isfile(name):
        return name
    raise ConfigError(f"--recipe {name}: no such recipe file, and not a recipe of wdsfilter ({', '.join(names())})")


def recipe_data(name: str) -> Dict:
    """The recipe's mapping as written (its rules and INFO_KEYS)."""
    path = recipe_path(name)
    data = read_mapping(path, f"--recipe {name}")
    scorers = data.get("scorers", [])
    if not isinstance(data.get("about", ""), str) or not isinstance(scorers, list) \
            or not all(isinstance(s, str) for s in scorers):
        raise ConfigError(f"--recipe {name} ({path}): about is a line of text and scorers a list of scorer names")
    return data


def scorers_for(recipes) -> List[str]:
    """The scorers the named recipes' rules read (their `scorers:`), each once."""
    out: List[str] = []
    for name in recipes:
        try:
            out += recipe_data(name).get("scorers", [])
        except ConfigError:
            continue
    return list(dict.fromkeys(out))
