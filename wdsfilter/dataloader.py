"""`wdsfilter.loader`: a drop-in DataLoader for training code that raises instead of hanging.

    for images, texts in wdsfilter.loader("shards/", caption_key="json:description",
                                          transform=preprocess, tokenizer=tokenizer,
                                          batch_size=256, num_workers=8):
        ...

Each DataLoader worker carries its own copy of the stages (token config and size guard
included, so spawn/forkserver workers behave like the parent) and reports its counts through a
StatsSink; `loader.stats` merges them.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Callable, Optional, Sequence

from .config import StageConfig, config_or_options
from .errors import ConfigError, StarvationError, require
from .pipeline import sample_pipeline, set_epoch
from .shards import expand_urls
from .stages import map_dict
from .tally import StatsSink, Tally

log = logging.getLogger("wdsfilter")


def _world_size() -> int:
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:
        pass
    return 1


def _rank() -> int:
    import webdataset as wds
    return wds.utils.pytorch_worker_info()[0]


def _check_world(sized_for: int) -> None:
    """The ranks the loader was sized for must be those webdataset splits the shards among (RANK and
    WORLD_SIZE, or torch.distributed, when iterating): a loader built before init_process_group, or
    given world_size= that the split does not see, read every shard on every rank or sized the
    epoch for the wrong world, silently."""
    import webdataset as wds
    rank, world = wds.utils.pytorch_worker_info()[:2]
    if world != sized_for:
        raise ConfigError(
            f"wdsfilter.loader was sized for {sized_for} rank(s) but rank {rank} iterates it in a world of {world} "
            f"(what splits the shards): build the loader after init_process_group (or with RANK and WORLD_SIZE "
            f"set), and pass world_size= only when it is that world.")


class _Tokenize:
    """Picklable wrapper (a closure would not survive spawn workers)."""

    def __init__(self, tokenizer: Callable):
        self.tokenizer = tokenizer

    def __call__(self, text):
        tokens = self.tokenizer(text)
        shape = getattr(tokens, "shape", None)
        return tokens[0] if shape is not None and len(shape) == 2 and shape[0] == 1 else tokens


class _ToTuple:
    def __init__(self, fields: Sequence[str]):
        self.fields = tuple(fields)

    def __call__(self, data):
        for sample in data:
            yield tuple(sample[f] for f in self.fields)


class WdsLoader:
    """Iterable of batches; wraps a torch DataLoader and exposes the pipeline's counts."""

    def __init__(self, dataloader, pipeline, sink: StatsSink, num_batches: Optional[int],
                 num_samples: Optional[int] = None, watchdog: bool = True, batch_size: int = 0,
                 world: int = 1):
        self.dataloader = dataloader
        self.world = world  # the ranks num_batches and num_samples were sized for
        self.batch_size = batch_size
        self.watchdog = watchdog  # raise on an epoch that yields nothing (starvation_* not 0)
        self.pipeline = pipeline
        self.sink = sink
        # What open_clip's training loop reads (open_clip_train.train.train_one_epoch): batches per
        # epoch on this rank, and samples per epoch over all ranks. None when the epoch is unsized.
        self.num_batches = num_batches
        self.num_samples = num_samples
        self.epoch = 0  # the next epoch; set_epoch(n) to resume

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        # Per epoch, not per loader: persistent workers keep their counts across epochs, so what
        # this epoch gave is its batches, and what came out is the growth of the merged tally.
        _check_world(self.world)
        out_before = self.stats.samples_out if self.watchdog else 0
        if not getattr(self.dataloader, "persistent_workers", False):  # persistent ones count their own
            set_epoch(self.pipeline, self.epoch)
        self.epoch += 1
        batches = 0
        for batch in self.dataloader:
            batches += 1
            yield batch
        stats = self.stats
        if self.watchdog and not batches:
            stats.name = "wdsfilter.loader"
            came_out = stats.samples_out - out_before
            if came_out:
                raise StarvationError(
                    f"wdsfilter.loader: the epoch gave no batch: {came_out} sample(s) came out, fewer than "
                    f"batch_size={self.batch_size} per worker, and drop_last=True drops a partial batch; "
                    f"training would run on nothing. Use a smaller batch_size or drop_last=False.")
            raise StarvationError(stats.empty_epoch_message())
        if self.num_batches is not None and batches != self.num_batches:
            # Every rank must give the same batch count or DDP waits forever at a collective.
            raise StarvationError(
                f"wdsfilter.loader: rank {_rank()} gave {batches} batch(es) this epoch, not num_batches="
                f"{self.num_batches}: the other ranks would wait for it at their next all-reduce.")
        if sum(stats.dropped.values()) or stats.notes:
            log.warning("wdsfilter loader finished an epoch:\n%s", stats.summary())

    def __len__(self):
        if self.num_batches is None:
            raise TypeError("this loader has no length: pass epoch_samples=N, or put a sizes.json beside the shards")
        return self.num_batches

    @property
    def stats(self) -> Tally:
        """Counts merged over every worker (and the main process) so far."""
        return self.sink.read()

    @property
    def tally(self) -> Tally:
        return self.stats


def loader(urls, caption_key: Optional[str] = None, image_key: Optional[str] = None, *, batch_size: int = 32,
           num_workers: int = 0, transform: Optional[Callable] = None, tokenizer: Optional[Callable] = None,
           shuffle: int = 0, resampled: bool = False, epoch_samples: Optional[int] = None,
           config: Optional[StageConfig] = None, drop_last: bool = False, seed: int = 0,
           output: str = "tuple", multiprocessing_context: Optional[str] = None,
           persistent_workers: bool = False, world_size: Optional[int] = None,
           scores: Optional[str] = None, min_scores: Optional[dict] = None, min_clip: Optional[float] = None,
           max_scores: Optional[dict] = None, max_ocr_area: Optional[float] = None,
           top_scores: Optional[dict] = None, bottom_scores: Optional[dict] = None, dedup: bool = False,
           pin_memory: bool = False, prefetch_factor: Optional[int] = None, collate_fn: Optional[Callable] = None,
           **config_options) -> WdsLoader:
    """Build a DataLoader over WebDataset shards; see the module docstring.

    caption_key / image_key: specs (`txt`, `json:description`, `txt;json:caption`, `jpg;png`).
    transform: image -> tensor (e.g. open_clip's preprocess); tokenizer: str -> tokens.
    output: "tuple" yields (images, captions) batches, "dict" yields lists of sample dicts.
    epoch_samples: samples per epoch over all ranks; without it, the sample counts of a sizes.json
    in the shards' folder (what `wdsfilter validate --stats-dir` and open_clip's get_dataset_size
    use) give it. Either way the loader gets `num_samples` and `num_batches` (and a length), as
    open_clip's own loader does, and each worker stops after its share of batches.
    pin_memory, prefetch_factor: passed to the torch DataLoader (prefetch_factor only with workers).
    collate_fn: a list of samples -> a batch (default: stack tensors per field for "tuple", a list
    of dicts for "dict").
    config_options: any StageConfig field (max_pixels, image_token, rekey, ...).
    scores / min_scores / min_clip / max_scores / max_ocr_area: drop samples by the score files of a
    `wdsfilter score` run (scores=its --out folder; min_clip=X is min_scores={"clip_score": X},
    max_ocr_area=X is max_scores={"ocr_area": X}); see wdsfilter.scorefilter.
    top_scores / bottom_scores: {column: percent}, the share of the run to keep by the highest (lowest)
    values, resolved over the score files exactly as `wdsfilter filter --top/--bottom` does.
    dedup: with scores=, keep only the survivors of `wdsfilter dedup`'s duplicate groups and drop
    eval matches, as `wdsfilter filter --dedup` does (docs/dedup.md).
    """
    require("torch", "wdsfilter.loader", "pip install 'wdsfilter[score]' (or torch)")
    import torch.utils.data
    import webdataset as wds

    config_or_options(config, dict(config_options, caption_key=caption_key, image_key=image_key))
    if config is None:
        opts = dict(config_options)
        if caption_key:
            opts["caption_key"] = caption_key
        if image_key:
            opts["image_key"] = image_key
        try:
            config = StageConfig(**opts)
        except TypeError as e:
            raise ConfigError(f"unknown loader option: {e}") from None
    if output not in ("tuple", "dict"):
        raise ConfigError(f"output must be 'tuple' or 'dict', got {output!r}")
    if batch_size < 1 or num_workers < 0:
        raise ConfigError(f"batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}")
    if prefetch_factor is not None and (not isinstance(prefetch_factor, int) or prefetch_factor < 1):
        raise ConfigError(f"prefetch_factor must be an integer >= 1, got {prefetch_factor!r}")
    if collate_fn is not None and not callable(collate_fn):
        raise ConfigError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
    if epoch_samples is not None and (not isinstance(epoch_samples, int) or epoch_samples < 1):
        raise ConfigError(f"epoch_samples must be an integer >= 1, got {epoch_samples!r}")

    shard_urls = expand_urls(urls, config.allow_pipe, config.allow_remote)
    world = world_size or _world_size()
    consumers = world * max(num_workers, 1)
    if not resampled and len(shard_urls) < consumers:
        raise ConfigError(
            f"{len(shard_urls)} shard(s) for {world} rank(s) x {max(num_workers, 1)} worker(s) = {consumers} "
            f"readers: some would get no shard and distributed training would hang. Use fewer workers "
            f"(num_workers={max(len(shard_urls) // world, 1) if len(shard_urls) >= world else 0}), "
            f"more shards, or resampled=True.")

    if epoch_samples is None:
        epoch_samples = sizes_json_samples(shard_urls)
    if world > 1 and not resampled and epoch_samples is None:
        raise ConfigError(
            f"{world} ranks read an unsized epoch: each rank would stop when its own shards run out, at "
            f"different batch counts, and DDP would hang at the all-reduce of the longest rank. Pass "
            f"epoch_samples=N, put a sizes.json beside the shards (`wdsfilter validate --stats-dir`), or "
            f"use resampled=True with epoch_samples.")

    sink = StatsSink()
    tally = Tally(config.starvation_samples, config.starvation_seconds, name="wdsfilter.loader")
    extra, before_decode = [], []
    fns = {}
    if transform is not None:
        fns["image"] = transform
    if tokenizer is not None:
        fns["caption"] = _Tokenize(tokenizer)
    if min_clip is not None:  # shortcut for min_scores={"clip_score": min_clip}
        min_scores = dict(min_scores or {}, clip_score=min_clip)
    if max_ocr_area is not None:  # shortcut for max_scores={"ocr_area": max_ocr_area}
        max_scores = dict(max_scores or {}, ocr_area=max_ocr_area)
    if top_scores or bottom_scores:  # resolved to a minimum/maximum as `wdsfilter filter` resolves them
        from .filtering.rules import resolve_for_loader
        if scores is None:
            raise ConfigError("top_scores/bottom_scores need scores=DIR (the --out folder of `wdsfilter score`)")
        min_scores, max_scores = resolve_for_loader(scores, min_scores, max_scores, top_scores, bottom_scores)
    if dedup and scores is None:
        raise ConfigError("dedup=True needs scores=DIR (the --out folder of `wdsfilter score`, deduplicated with "
                          "`wdsfilter dedup DIR`)")
    if scores is not None or min_scores or max_scores:
        from .scorefilter import score_filter
        # Before decoding and shuffling: dropped samples are never decoded, and score tables are read
        # one shard at a time. Its drops count in the loader's tally.
        before_decode.append(score_filter(scores, min_scores or {}, tally, max_scores, dedup=dedup))
    if fns:
        extra.append(map_dict(fns))
    if output == "tuple":
        extra.append(_ToTuple(("image", "caption")))

    pipeline = sample_pipeline(shard_urls, config, tally, resampled=resampled, shuffle=shuffle, seed=seed,
                               extra=extra, sink=sink, before_decode=before_decode,
                               cycle=epoch_samples is not None)
    collate = collate_fn or (wds.filters.default_collation_fn if output == "tuple" else _as_list)
    pipeline.append(batched(batch_size, collate, partial=not drop_last))

    num_batches = num_samples = None
    if epoch_samples is not None:
        # open_clip's rule (get_wds_dataset): batches per worker rounded up, the epoch is that many
        # batches on every worker, and num_samples is what the ranks see together.
        global_batches = math.ceil(epoch_samples / (batch_size * world))
        per_worker = math.ceil(global_batches / max(num_workers, 1))
        pipeline = pipeline.with_epoch(per_worker)
        num_batches = per_worker * max(num_workers, 1)
        num_samples = num_batches * batch_size * world

    extra_args = {"prefetch_factor": prefetch_factor} if num_workers > 0 and prefetch_factor is not None else {}
    dataloader = torch.utils.data.DataLoader(
        pipeline, batch_size=None, shuffle=False, num_workers=num_workers, pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
        multiprocessing_context=multiprocessing_context if num_workers > 0 else None, **extra_args)
    return WdsLoader(dataloader, pipeline, sink, num_batches, num_samples,
                     watchdog=bool(config.starvation_samples or config.starvation_seconds), batch_size=batch_size,
                     world=world)


def sizes_json_samples(urls: Sequence[str]) -> Optional[int]:
    """The sample count of `urls` from the sizes.json in their folder(s) ({shard file name: count},
    as open_clip's get_dataset_size reads it), or None when a folder has none or a shard is not in it."""
    import json

    by_folder: dict = {}
    for url in urls:
        if "://" in url or url.startswith("pipe:"):
            return None
        path = url[len("file:"):] if url.startswith("file:") else url
        by_folder.setdefault(os.path.dirname(path), []).append(os.path.basename(path))
    total = 0
    for folder, names in by_folder.items():
        try:
            with open(os.path.join(folder, "sizes.json")) as f:
                sizes = json.load(f)
            total += sum(int(sizes[name]) for name in names)
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total or None


def _batched(data, size: int, collate: Callable, partial: bool):
    """webdataset's batched, less its read-ahead: it takes a batch's first sample before it yields the
    batch before, so on a sized (endless, cut) stream each worker decoded one sample per epoch that
    no batch carried, and the tally counted it as given to training."""
    batch = []
    for sample in data:
        batch.append(sample)
        if len(batch) == size:
            yield collate(batch)
            batch = []
    if batch and partial:
        yield collate(batch)


def batched(size: int, collate: Callable, partial: bool = True):
    import webdataset as wds
    return wds.pipelinefilter(_batched)(size, collate, partial)


def _as_list(samples):
    return list(samples)
