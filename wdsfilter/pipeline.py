"""Compose shard lists and stages into a webdataset DataPipeline, read top to bottom."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import webdataset as wds

from .config import StageConfig
from .shards import expand_urls
from .stages import sample_stages, watch
from .tally import StatsSink, Tally


def shard_source(urls: Sequence[str], resampled: bool = False, shuffle_shards: bool = False, seed: int = 0) -> list:
    """Shard-list stages: resampled shards (every worker draws its own), or a list split by node
    and by DataLoader worker."""
    if resampled:
        return [wds.ResampledShards(list(urls), seed=seed, deterministic=True)]
    stages = [wds.SimpleShardList(list(urls))]
    if shuffle_shards:  # a new shard order each epoch, the same on every node
        stages.append(wds.detshuffle(bufsize=len(urls), initial=len(urls), seed=seed))
    stages += [wds.split_by_node, wds.split_by_worker]
    return stages


def sample_pipeline(urls, cfg: Optional[StageConfig] = None, tally: Optional[Tally] = None, *,
                    resampled: bool = False, shuffle: int = 0, seed: int = 0, decode_images: bool = True,
                    extra: Sequence[Callable] = (), sink: Optional[StatsSink] = None,
                    before_decode: Sequence[Callable] = ()) -> wds.DataPipeline:
    """urls -> decoded samples {"__key__", "__url__", "image" (PIL) or "video" (bytes), "caption", "json"}.

    `extra` stages (map_dict, to_tuple, ...) run after decoding and before the output count, so
    the watchdog sees what finally comes out. `before_decode` stages (the score filter) run in
    shard order before decoding and shuffling: what they drop is never decoded.
    """
    cfg = cfg or StageConfig()
    tally = tally if tally is not None else Tally(cfg.starvation_samples, cfg.starvation_seconds)
    urls = expand_urls(urls, cfg.allow_pipe, cfg.allow_remote)
    stages = shard_source(urls, resampled, shuffle_shards=bool(shuffle), seed=seed)
    stages += sample_stages(cfg, tally, decode_images=decode_images, before_decode=before_decode)
    if shuffle:
        stages.append(wds.shuffle(shuffle, initial=min(shuffle, 1000)))
    stages += list(extra)
    stages.append(watch(tally, sink))
    pipeline = wds.DataPipeline(*stages)
    pipeline.tally = tally
    return pipeline
