"""ValidateOptions: the stage configuration the pipeline would run with, plus what only the
validator needs. Checked at once: a bad option is a ConfigError before any shard is read."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ..stream.config import StageConfig
from ..core.errors import ConfigError
from .findings import SAMPLE_KINDS, SEVERITIES


def parse_max_drop(given) -> Tuple[Optional[float], Dict[str, float]]:
    """--max-drop: '1%' (every dropped sample together) and 'corrupt_image=0.5%' (one reason), as
    texts (repeatable), a number (percent) or {reason: percent}; -> (overall share, {reason: share})."""
    if given is None or given == ():
        return None, {}
    items = list(given.items()) if isinstance(given, dict) else [given] if isinstance(given, (str, int, float)) \
        else list(given)
    overall, by_reason = None, {}
    for item in items:
        reason, value = item if isinstance(item, tuple) else \
            (str(item).split("=", 1) if isinstance(item, str) and "=" in item else (None, item))
        share = _percent(value, item)
        if reason is None:
            overall = share
        elif reason.strip() not in SAMPLE_KINDS:
            raise ConfigError(f"--max-drop {item}: a tolerance per reason is for the kinds that cost one sample each "
                              f"({', '.join(SAMPLE_KINDS)}); whole-shard problems stay errors")
        else:
            by_reason[reason.strip()] = share
    return overall, by_reason


def _percent(value, given) -> float:
    try:
        percent = float(str(value).strip().rstrip("%"))
    except ValueError:
        raise ConfigError(f"--max-drop {given}: expects a percentage such as 1% or corrupt_image=0.5%") from None
    if not 0 <= percent <= 100:
        raise ConfigError(f"--max-drop {given}: the share must be in [0, 100]%")
    return percent / 100


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass
class ValidateOptions:
    # The very configuration the stages use: keys, rekey, size guard, image token, safety.
    stage: StageConfig = field(default_factory=StageConfig)
    # Full decode of every image (behind the size guard) and of every video frame, instead of
    # headers plus an end-of-file check.
    deep: bool = False
    # Optional warnings on small or extreme images (never filtered by the stages).
    min_side: Optional[int] = None
    max_aspect: Optional[float] = None
    # Layout: the training job's readers; None skips the too_few_shards check.
    ranks: Optional[int] = None
    loader_workers: Optional[int] = None
    # A shard whose sample count is below median/uneven_ratio or above median*uneven_ratio.
    uneven_ratio: float = 2.0
    # Findings kept in full per kind and shard (all are counted).
    max_findings: int = 100
    fail_on: str = "error"
    jobs: Optional[int] = None
    # --max-drop, as given ("1%", 1 (percent), ["1%", "corrupt_image=0.5%"], {"corrupt_image": 0.5}):
    # the share of samples that may be dropped, overall and per reason (SAMPLE_KINDS); None: no
    # tolerance, every error fails. Parsed into drop_limit and drop_limits (shares in [0, 1]).
    max_drop: object = None

    def __post_init__(self):
        if not isinstance(self.stage, StageConfig):
            raise ConfigError(f"stage must be a StageConfig, got {type(self.stage).__name__}")
        if self.fail_on not in SEVERITIES:
            raise ConfigError(f"fail_on must be one of {SEVERITIES}, got {self.fail_on!r}")
        for name in ("min_side", "ranks", "loader_workers", "jobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_aspect is not None and self.max_aspect < 1:
            raise ConfigError(f"max_aspect is long side / short side and must be >= 1, got {self.max_aspect}")
        if self.uneven_ratio <= 1:
            raise ConfigError(f"uneven_ratio must be > 1, got {self.uneven_ratio}")
        if self.max_findings < 1:
            raise ConfigError(f"max_findings must be >= 1, got {self.max_findings}")
        max_side = self.stage.max_side
        if max_side is not None and self.min_side and self.min_side > max_side:
            raise ConfigError(f"min_side={self.min_side} is above max_side={max_side}")
        if self.jobs is None:
            self.jobs = default_jobs()
        self.drop_limit, self.drop_limits = parse_max_drop(self.max_drop)

    def tolerance(self, kind: str) -> Optional[float]:
        """The share of samples `kind` may drop without failing (None: it fails as its severity says)."""
        if kind not in SAMPLE_KINDS:
            return None
        return self.drop_limits.get(kind, self.drop_limit)

    def to_dict(self) -> dict:
        """The options as printed in reports (JSON-safe)."""
        s = self.stage
        return {"caption_key": str(s.caption_spec), "image_key": str(s.image_spec), "rekey": s.rekey,
                "max_pixels": s.max_pixels, "max_side": s.max_side, "oversize": s.oversize,
                "image_token": s.image_token, "deep": self.deep, "min_side": self.min_side,
                "max_aspect": self.max_aspect, "ranks": self.ranks, "loader_workers": self.loader_workers,
                "uneven_ratio": self.uneven_ratio, "fail_on": self.fail_on, "max_drop": self.drop_limit,
                "max_drop_by_reason": dict(self.drop_limits)}
