"""Compose shard lists and stages into a webdataset DataPipeline, read top to bottom."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import webdataset as wds

from .config import StageConfig
from .errors import StarvationError
from .shards import expand_urls
from .stages import sample_stages, watch
from .tally import StatsSink, Tally


def shard_source(urls: Sequence[str], resampled: bool = False, shuffle_shards: bool = False, seed: int = 0,
                 cycle: Optional[Tally] = None) -> list:
    """Shard-list stages: resampled shards (every worker draws its own), or a list split by node
    and by DataLoader worker. With `cycle` (the reader's tally), each reader goes round its shards
    until the epoch's batch count stops it, so that every rank gives the same number of batches."""
    if resampled:
        return [wds.ResampledShards(list(urls), seed=seed, deterministic=True)]
    stages = [wds.SimpleShardList(list(urls)), wds.split_by_node]
    if shuffle_shards:
        # A new order each epoch of this rank's own shards. Shuffled before the split, the ranks'
        # shares were disjoint only if every rank passed the same seed: with seed=rank (a common
        # habit) ranks shared shards and others were read by none, silently.
        stages.append(wds.detshuffle(bufsize=len(urls), initial=len(urls), seed=seed))
    stages.append(wds.split_by_worker)
    if cycle is not None:
        stages.append(cycle_shards(cycle))
    return stages


def _cycle_shards(src, tally: Tally):
    """Repeat a reader's shards at the shard level, before batching: batches run on across the
    wrap-around (no partial batch per pass, none lost to drop_last). A whole pass that read no
    sample, or whose samples the stages all dropped (the score filter, a wrong key), raises at once,
    naming the rank, worker and shards, instead of looping forever or (as webdataset's with_epoch
    does on an empty pass) ending this rank's epoch early."""
    def kept() -> int:  # samples read less drops (a shard that cannot be opened counts a drop too)
        return tally.samples_read - sum(tally.dropped.values())

    shards = list(src)
    while shards:
        kept_before = kept()
        yield from shards
        if kept() <= kept_before:
            rank, world, worker, workers = wds.utils.pytorch_worker_info()
            names = ", ".join(s["url"] for s in shards[:5]) + (" ..." if len(shards) > 5 else "")
            raise StarvationError(
                f"rank {rank}/{world}, DataLoader worker {worker}/{workers}: a whole pass over its "
                f"{len(shards)} shard(s) ({names}) kept no sample, so this rank cannot give its epoch's "
                f"batches and the other ranks would wait for it. Check those shards (`wdsfilter validate`).")


cycle_shards = wds.pipelinefilter(_cycle_shards)


def set_epoch(pipeline: wds.DataPipeline, epoch: int) -> None:
    """Make the pipeline's next iteration epoch `epoch` for the seeded shard stages (resampled
    shards, shard shuffle). Each of them counts its own iterations, but a DataLoader that starts
    fresh workers each epoch gives them a fresh copy whose count is always 0: every epoch would
    draw the same shards in the same order."""
    for stage in pipeline.pipeline:
        if isinstance(stage, (wds.ResampledShards, wds.detshuffle)):
            stage.epoch = epoch - 1  # they add one as the iteration starts


def sample_pipeline(urls, cfg: Optional[StageConfig] = None, tally: Optional[Tally] = None, *,
                    resampled: bool = False, shuffle: int = 0, seed: int = 0, decode_images: bool = True,
                    extra: Sequence[Callable] = (), sink: Optional[StatsSink] = None,
                    before_decode: Sequence[Callable] = (), cycle: bool = False,
                    shard_stages: Sequence[Callable] = ()) -> wds.DataPipeline:
    """urls -> decoded samples {"__key__", "__url__", "image" (PIL) or "video" (bytes), "caption", "json"}.

    `extra` stages (map_dict, to_tuple, ...) run after decoding and before the output count, so
    the watchdog sees what finally comes out. `before_decode` stages (the score filter) run in
    shard order before decoding and shuffling: what they drop is never decoded. `cycle`: each
    reader repeats its shards endlessly (the loader's sized epochs cut the stream).
    `shard_stages` run on the shard list's {"url"} items (tarsubset.ReadOnly: only some samples).
    """
    cfg = cfg or StageConfig()
    tally = tally if tally is not None else Tally(cfg.starvation_samples, cfg.starvation_seconds)
    urls = expand_urls(urls, cfg.allow_pipe, cfg.allow_remote, cfg.storage_options)
    stages = shard_source(urls, resampled, shuffle_shards=bool(shuffle), seed=seed,
                          cycle=tally if cycle and not resampled else None)
    stages += list(shard_stages)
    stages += sample_stages(cfg, tally, decode_images=decode_images, before_decode=before_decode)
    if shuffle:
        stages.append(wds.shuffle(shuffle, initial=min(shuffle, 1000)))
    stages += list(extra)
    stages.append(watch(tally, sink))
    pipeline = wds.DataPipeline(*stages)
    pipeline.tally = tally
    return pipeline
