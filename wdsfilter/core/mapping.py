"""A YAML or JSON file of one mapping (a run recipe, a selection recipe, a file of stage options),
read with one rule: JSON after its '#' comment lines needs no PyYAML; every failure is a
ConfigError naming the option and the file."""
from __future__ import annotations

import json

from .errors import ConfigError


def read_mapping(path: str, what: str) -> dict:
    """A YAML or JSON file of one mapping (a run recipe, a selection recipe). JSON after its '#'
    comment lines is read without PyYAML (run.yaml and the shipped recipes are written so); other
    YAML needs PyYAML. Every failure is a ConfigError naming `what` (the option and file)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{what}: {e.strerror or e}") from None
    try:
        data = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    except ValueError:
        if not path.endswith((".yaml", ".yml")):
            raise ConfigError(f"{what}: not JSON (a YAML file is named .yaml or .yml)") from None
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{what}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{what}: not valid YAML ({str(e).splitlines()[0]})") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a mapping of options, got {type(data).__name__}")
    return data
