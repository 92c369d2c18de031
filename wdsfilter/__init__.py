"""wdsfilter: safe, loud, memory-aware filtering and scoring of WebDataset shards.

Where a sample flows: shards.py (which shards) -> reading.py (tar -> samples) -> stages.py
(select, rename, clean_captions, decode, map_dict, watch) -> pipeline.py / dataloader.py.
The validator lives in wdsfilter/validate/, scoring in wdsfilter/score/; ARCHITECTURE.md (top
level) maps every module.
"""

__version__ = "0.1.0"

from .core.errors import ConfigError, DataError, StarvationError, UnsafeInputError, WdsFilterError  # noqa: E402
from .core.publish import RedactedRecords


def _redact_log_lines() -> None:
    """Every log line of the package names a URL without its password or signature (publish.py)."""
    import logging
    logger = logging.getLogger("wdsfilter")
    if not any(isinstance(f, RedactedRecords) for f in logger.filters):
        logger.addFilter(RedactedRecords())


_redact_log_lines()


# Imported on first use, so `import wdsfilter` (and the validator) needs neither webdataset nor
# torch; what is returned is the function itself, with its real signature and help.
# Imported on first use: every command imports this package first, and `wdsfilter filter` needs
# none of these (StageConfig and Tally alone cost a tenth of a dry run's start: tools/bench_filter.py).
_LAZY = {"loader": (".dataloader", "loader"), "sample_pipeline": (".stream.pipeline", "sample_pipeline"),
         "StageConfig": (".stream.config", "StageConfig"), "Selection": (".core.selection", "Selection"),
         "KeySpec": (".core.specs", "KeySpec"), "Tally": (".core.tally", "Tally")}


def __getattr__(name):
    import importlib
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value
        return value
    # `wdsfilter.validate(...)`: the validator package is callable and imported on first use.
    if name == "validate":
        return importlib.import_module(".validate", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"validate"})


__all__ = ["validate", "StageConfig", "Selection", "KeySpec", "Tally", "ConfigError", "DataError", "StarvationError",
           "UnsafeInputError", "WdsFilterError", "loader", "sample_pipeline", "__version__"]
