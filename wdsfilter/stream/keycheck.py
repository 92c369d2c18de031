"""The first-shard key check, importable before torch: a caption or image key that no sample of
the first shard has is a ConfigError (with the keys the samples do carry and a spec that would
work), raised before any model loads or any worker starts. Runners whose workers cannot tell
which shard is the dataset's first (the scoring engine, Ray tasks) call it once, up front."""
from __future__ import annotations

from dataclasses import replace

from .config import StageConfig
from .curry import compose
from .stages import sample_stages
from ..core.tally import Tally


def check_keys(url: str, cfg: StageConfig, tally: Tally = None) -> None:
    """Read shard `url` until one sample passes the caption/image selection, or to its end; raises
    the first-shard ConfigError (keys present, a spec that would work) when none does. Nothing is
    decoded and there is no scan limit, so a 10k-sample shard that is all misses is caught too.
    tally: where its notes go (a remote read's retries, which the run's summary counts)."""
    stage = replace(cfg, emit_rejects=False, starvation_samples=0, starvation_seconds=0.0, check_first_shard=True)
    for _ in compose([{"url": url}], sample_stages(stage, Tally(0, 0) if tally is None else tally, decode_images=False)):
        return
