"""wdsfilter: safe, loud, memory-aware filtering and scoring of WebDataset shards.

Where a sample flows: shards.py (which shards) -> reading.py (tar -> samples) -> stages.py
(select, rename, clean_captions, decode, map_dict, watch) -> pipeline.py / dataloader.py.
The validator lives in wdsfilter/validate/, scoring in wdsfilter/score/; ARCHITECTURE.md (top
level) maps every module.
"""

__version__ = "0.1.0"

from .config import StageConfig  # noqa: E402
from .errors import ConfigError, DataError, StarvationError, UnsafeInputError, WdsFilterError  # noqa: E402
from .specs import KeySpec  # noqa: E402
from .tally import Tally  # noqa: E402


def loader(*args, **kwargs):
    """See wdsfilter.dataloader.loader (imported lazily: it needs torch)."""
    from .dataloader import loader as _loader
    return _loader(*args, **kwargs)


def sample_pipeline(*args, **kwargs):
    """See wdsfilter.pipeline.sample_pipeline."""
    from .pipeline import sample_pipeline as _sample_pipeline
    return _sample_pipeline(*args, **kwargs)


def __getattr__(name):
    # `wdsfilter.validate(...)`: the validator package is callable and imported on first use.
    if name == "validate":
        import importlib
        return importlib.import_module(".validate", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["validate", "StageConfig", "KeySpec", "Tally", "ConfigError", "DataError", "StarvationError",
           "UnsafeInputError", "WdsFilterError", "loader", "sample_pipeline", "__version__"]
