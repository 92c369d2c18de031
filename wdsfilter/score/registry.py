"""Name -> "module:Class" registries (scorers, OCR backends): classes are imported only when
used, so heavy optional dependencies stay optional."""
from __future__ import annotations

import importlib
from typing import Dict

from ..errors import ConfigError


def build(registry: Dict[str, str], name: str, what: str, **options):
    """An instance of the class registered as `name`; ConfigError naming the choices if none is."""
    try:
        target = registry[name]
    except KeyError:
        raise ConfigError(f"unknown {what} {name!r}; available: {', '.join(sorted(registry))}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**options)
