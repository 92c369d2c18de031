"""Name -> "module:Class" registries (scorers, OCR backends) and the one import of a class by its
"module:Class" path: classes are imported only when used, so heavy optional dependencies stay
optional, and a user's own class is named the same way as a registered one."""
from __future__ import annotations

import importlib
from typing import Dict

from ..core.errors import ConfigError


def import_class(target: str, what: str):
    """The class at "module:Class"; a ConfigError naming `what` when it cannot be imported."""
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what} is not available: {type(e).__name__}: {e}") from None


def check_name(registry: Dict[str, str], spec: str, what: str, own: str = "") -> str:
    """The "module:Class" target of a registered name or path, without importing it; `own` (e.g.
    "module:Class for your own Scorer") allows the path form and is offered in the error."""
    if spec in registry:
        return registry[spec]
    if own and ":" in spec:
        return spec
    choices = ", ".join(sorted(registry)) + (f", or {own}" if own else "")
    raise ConfigError(f"unknown {what} {spec!r}; available: {choices}")


def resolve(registry: Dict[str, str], spec: str, what: str, own: str = ""):
    """The class of a registered name, or of a "module:Class" path (see check_name)."""
    return import_class(check_name(registry, spec, what, own), f"{what} {spec!r}")


def build(registry: Dict[str, str], name: str, what: str, **options):
    """An instance of the class registered as `name`; ConfigError naming the choices if none is."""
    return resolve(registry, name, what)(**options)
