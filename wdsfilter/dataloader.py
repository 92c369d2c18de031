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
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .stream.config import StageConfig, config_or_options
from .core.errors import ConfigError, StarvationError, require
from .stream.loaderstate import VERSION as STATE_VERSION, Progress, check_settings, check_state, settings
from .stream.generators import CollateAtLoopThreads, batches_in_training_loop, close_at_exit
from .stream.pipeline import Place, SeededTransform, sample_pipeline, set_epoch, worker_batches
from .core.selection import DEPRECATED as DEPRECATED_RULES, Selection, selection_of
from .storage.shardstats import sizes_samples
from .storage.shards import expand_urls
from .stream.collate import BatchMemory, Collated, TupleBatches, collate_tuples
from .stream.stages import map_dict
from .core.tally import StatsSink, Tally
from .runfolder.shares import loader_selection
from .scorefilter import ScoreFilter

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


def _epoch_seed(seed: int, epoch: int) -> int:
    """The seed of the pipeline's own generators in the training loop's process for one epoch (the
    per-sample seeds of SeededTransform are (seed, epoch, rank, worker, sample index))."""
    import webdataset as wds
    return wds.utils.make_seed(seed, epoch, _rank(), -1)


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
    """Iterable of batches; wraps a torch DataLoader and exposes the pipeline's counts. Saves and
    restores its place in the epoch: state_dict() / load_state_dict() (wdsfilter.stream.loaderstate)."""

    def __init__(self, dataloader, pipeline, sink: StatsSink, num_batches: Optional[int],
                 num_samples: Optional[int] = None, watchdog: bool = True, batch_size: int = 0,
                 world: int = 1, settings: Optional[dict] = None, readers: int = 1, seed: int = 0):
        self.dataloader = dataloader
        self.seed = seed  # the pipeline's generators in the training loop's process: seeded per epoch from it
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
        self.settings = settings or {}  # what a saved position depends on (loaderstate.settings)
        self.readers = readers
        self._progress: Optional[Progress] = None  # the epoch being iterated
        self._restored: Optional[Progress] = None  # a mid-epoch position from load_state_dict
        self._stats_before: dict = {}  # counts of the epochs before the one being iterated
        self._started = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        epoch = self._epoch_batches()
        if not self.dataloader.num_workers:  # its shard readers are in this process
            close_at_exit(epoch)
        return epoch

    def _epoch_batches(self):
        # Per epoch, not per loader: persistent workers keep their counts across epochs, so what
        # this epoch gave is its batches, and what came out is the growth of the merged tally.
        _check_world(self.world)
        progress = self._begin_epoch()
        out_before = self.stats.samples_out if self.watchdog else 0
        batches_before = progress.batches  # given before a restore
        batches = self.dataloader if self.dataloader.num_workers \
            else batches_in_training_loop(self.dataloader, self.pipeline.place, _epoch_seed(self.seed, progress.epoch))
        for batch, worker, decoded in batches:
            progress.took(worker, decoded)
            yield batch
        self._progress = None
        self._end_epoch(progress.batches, progress.batches - batches_before, out_before)

    def _begin_epoch(self) -> Progress:
        persistent = getattr(self.dataloader, "persistent_workers", False)
        if not persistent or not self._started:  # persistent workers count their own epochs
            set_epoch(self.pipeline, self.epoch)
        self._started = True
        self._stats_before = self.stats.to_dict()
        restored, self._restored = self._restored, None
        progress = restored if restored is not None and restored.epoch == self.epoch \
            else Progress(self.epoch, self.readers)
        self.pipeline.place.resume = progress.resume_plan(self.batch_size) if progress.batches else None
        self.epoch += 1
        self._progress = progress
        return progress

    def _end_epoch(self, batches: int, new_batches: int, out_before: int) -> None:
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
        # once per epoch: data problems at WARNING, the drops the rules asked for (scores, dedup) at INFO
        if stats.problems():
            log.warning("wdsfilter loader finished an epoch:\n%s", stats.summary())
        elif sum(stats.dropped.values()):
            log.info("wdsfilter loader finished an epoch:\n%s", stats.summary())

    def state_dict(self) -> dict:
        """Where this loader is, to save with the model's checkpoint (after batch N, a loader given
        this state by load_state_dict gives batch N+1 on). Per rank: each rank's readers are at the
        same batch on every rank of a sized or resampled epoch, so one rank's state restores all."""
        progress = self._progress or self._restored or Progress(self.epoch, self.readers)
        return {"version": STATE_VERSION, "rank": _rank(), "settings": self.settings,
                "position": progress.to_dict(),
                "stats": self._stats_before if self._progress is not None else self.stats.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict() of a loader built with the same settings (a ConfigError names
        any that changed). Call it before iterating; the next iteration is the saved epoch's rest."""
        state = check_state(state)
        check_settings(state["settings"], self.settings)
        if self._started and getattr(self.dataloader, "persistent_workers", False):
            raise ConfigError("load_state_dict on a loader whose persistent workers have started: call it before "
                              "the first iteration (build a new loader to restore into)")
        progress = Progress.from_dict(state["position"], self.readers)
        if self.num_batches is not None and progress.batches >= self.num_batches:
            progress = Progress(progress.epoch + 1, self.readers)  # saved after the epoch's last batch
        self.epoch = progress.epoch
        self._restored = progress if progress.batches else None
        if state.get("rank") == _rank() and state.get("stats"):  # this rank's counts so far
            saved = Tally()
            saved.merge_dict(state["stats"])
            self.sink.write(saved, "tally-restored")

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


@dataclass
class LoaderOptions:
    """Every option of `wdsfilter.loader` but the stage options (those are a StageConfig), checked when
    built. A new option is one field here, its check in __post_init__, and its use in one builder step."""
    batch_size: int = 32
    num_workers: int = 0
    transform: Optional[Callable] = None  # image -> tensor (e.g. open_clip's preprocess)
    tokenizer: Optional[Callable] = None  # str -> tokens
    shuffle: int = 0  # sample shuffle buffer (0: none); shards are shuffled too when it is set
    resampled: bool = False  # every worker draws shards with replacement, endlessly
    epoch_samples: Optional[int] = None  # samples per epoch over all ranks (None: from sizes.json)
    drop_last: bool = False
    seed: int = 0
    output: str = "tuple"  # "tuple": (images, captions) batches; "dict": lists of sample dicts
    multiprocessing_context: Optional[str] = None
    persistent_workers: bool = False
    world_size: Optional[int] = None  # None: WORLD_SIZE or torch.distributed
    # Score filtering by a `wdsfilter score` run (see wdsfilter.scorefilter): its folder, and the
    # rules (wdsfilter.Selection: minima, maxima, shares, text columns, dedup, recipes).
    scores: Optional[str] = None
    selection: Selection = field(default_factory=Selection)
    # Passed to the torch DataLoader.
    pin_memory: bool = False
    prefetch_factor: Optional[int] = None
    collate_fn: Optional[Callable] = None

    def __post_init__(self):
        if self.output not in ("tuple", "dict"):
            raise ConfigError(f"output must be 'tuple' or 'dict', got {self.output!r}")
        if self.batch_size < 1 or self.num_workers < 0:
            raise ConfigError(f"batch_size must be >= 1 and num_workers >= 0, got {self.batch_size}, {self.num_workers}")
        if self.prefetch_factor is not None and (not isinstance(self.prefetch_factor, int) or self.prefetch_factor < 1):
            raise ConfigError(f"prefetch_factor must be an integer >= 1, got {self.prefetch_factor!r}")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise ConfigError(f"collate_fn must be callable, got {type(self.collate_fn).__name__}")
        if self.epoch_samples is not None and (not isinstance(self.epoch_samples, int) or self.epoch_samples < 1):
            raise ConfigError(f"epoch_samples must be an integer >= 1, got {self.epoch_samples!r}")
        if not isinstance(self.selection, Selection):
            raise ConfigError(f"selection must be a wdsfilter.Selection, got {type(self.selection).__name__}")
        if self.selection and self.scores is None:
            raise ConfigError(f"score rules ({self.selection.describe()}) need scores=DIR (the --out folder of "
                              f"`wdsfilter score`{', deduplicated with `wdsfilter dedup DIR`' if self.selection.dedup else ''})")

    @property
    def readers(self) -> int:
        """Shard readers per rank: the DataLoader workers, or the main process."""
        return max(self.num_workers, 1)

    @property
    def filters_by_score(self) -> bool:
        return self.scores is not None

    def resolved(self, storage_options=None) -> Selection:
        """The selection with its shares resolved over the score files, exactly as `wdsfilter
        filter --top/--bottom` resolves them (runfolder/shares.py)."""
        return loader_selection(self.scores, self.selection, storage_options)


def loader(urls, caption_key: Optional[str] = None, image_key: Optional[str] = None, *, batch_size: int = 32,
           num_workers: int = 0, transform: Optional[Callable] = None, tokenizer: Optional[Callable] = None,
           shuffle: int = 0, resampled: bool = False, epoch_samples: Optional[int] = None,
           config: Optional[StageConfig] = None, drop_last: bool = False, seed: int = 0,
           output: str = "tuple", multiprocessing_context: Optional[str] = None,
           persistent_workers: bool = False, world_size: Optional[int] = None,
           scores: Optional[str] = None, min_scores: Optional[dict] = None, min_clip: Optional[float] = None,
           max_scores: Optional[dict] = None, max_ocr_area: Optional[float] = None,
           top_shares: Optional[dict] = None, bottom_shares: Optional[dict] = None, equal: Optional[dict] = None,
           dedup: bool = False, recipe=None, selection: Optional[Selection] = None, pin_memory: bool = False, prefetch_factor: Optional[int] = None, collate_fn: Optional[Callable] = None,
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
    scores: drop samples by the score files of a `wdsfilter score` run (its --out folder), by the
    rules (wdsfilter.Selection; docs/loader.md), given as selection= or as these keywords, the
    same as `filter`'s flags and the keys of the thresholds.json it writes
    (`wdsfilter.loader(shards, scores=RUN, **json.load(open("RUN/thresholds.json")))`):
    min_scores / max_scores: {column: X}; min_clip=X is min_scores={"clip_score": X},
    max_ocr_area=X is max_scores={"ocr_area": X}; see wdsfilter.scorefilter.
    top_shares / bottom_shares: {column: percent}, the share of the run to keep by the highest
    (lowest) values, resolved over the score files exactly as `wdsfilter filter --top/--bottom`
    does (top_scores/bottom_scores: the old names, deprecated).
    equal: {text column: value or [values]} (`--equal`); recipe: a recipe's name or file (`--recipe`).
    dedup: keep only the survivors of `wdsfilter dedup`'s duplicate groups and drop eval matches,
    as `wdsfilter filter --dedup` does (docs/dedup.md).
    """
    require("torch", "wdsfilter.loader", "pip install 'wdsfilter[score]' (or torch)")
    old = {name: config_options.pop(name) for name in list(config_options) if name in DEPRECATED_RULES}
    rules = selection_of(selection, dict(min_scores=min_scores, max_scores=max_scores, min_clip=min_clip,
                                         max_ocr_area=max_ocr_area, top_shares=top_shares,
                                         bottom_shares=bottom_shares, equal=equal, dedup=dedup, recipe=recipe, **old),
                         "wdsfilter.loader")
    config = _stage_config(config, caption_key, image_key, config_options)
    opts = LoaderOptions(
        batch_size=batch_size, num_workers=num_workers, transform=transform, tokenizer=tokenizer, shuffle=shuffle,
        resampled=resampled, epoch_samples=epoch_samples, drop_last=drop_last, seed=seed, output=output,
        multiprocessing_context=multiprocessing_context, persistent_workers=persistent_workers,
        world_size=world_size, scores=scores, selection=rules, pin_memory=pin_memory,
        prefetch_factor=prefetch_factor, collate_fn=collate_fn)
    return build_loader(urls, config, opts)


def _stage_config(config: Optional[StageConfig], caption_key, image_key, options: dict) -> StageConfig:
    """config=, or the stage options one by one (never both)."""
    config_or_options(config, dict(options, caption_key=caption_key, image_key=image_key))
    if config is not None:
        return config
    opts = dict(options)
    if caption_key:
        opts["caption_key"] = caption_key
    if image_key:
        opts["image_key"] = image_key
    try:
        return StageConfig(**opts)
    except TypeError as e:
        raise ConfigError(f"unknown loader option: {e}") from None


def build_loader(urls, config: StageConfig, opts: LoaderOptions) -> WdsLoader:
    """The loader, top to bottom as open_clip's get_wds_dataset builds its own: shards, the epoch's
    size, the sample pipeline, batches, the epoch cut per worker, the DataLoader."""
    import torch.utils.data

    shard_urls = expand_urls(urls, config.allow_pipe, config.allow_remote, config.storage_options)
    world = opts.world_size or _world_size()
    _check_readers(shard_urls, world, opts)
    epoch_samples = opts.epoch_samples if opts.epoch_samples is not None else (sizes_samples(shard_urls) or None)
    _check_sized(world, opts, epoch_samples)

    # the rules of the score filter, shares resolved over the run
    rules = opts.resolved(config.storage_options) if opts.filters_by_score else None
    sink = StatsSink()
    tally = Tally(config.starvation_samples, config.starvation_seconds, name="wdsfilter.loader")
    place = Place()  # the readers' epoch and worker, shared by the seeded stages
    pipeline = sample_pipeline(shard_urls, config, tally, resampled=opts.resampled, shuffle=opts.shuffle,
                               seed=opts.seed, extra=_output_stages(opts, place), sink=sink,
                               before_decode=_score_stages(opts, rules, tally, config.storage_options), cycle=epoch_samples is not None,
                               place=place)
    pipeline.append(batched(opts.batch_size, _batches(opts, place), partial=not opts.drop_last))
    num_batches = num_samples = per_worker = None
    if epoch_samples is not None:
        # open_clip's rule (get_wds_dataset): batches per worker rounded up, the epoch is that many
        # batches on every worker, and num_samples is what the ranks see together.
        global_batches = math.ceil(epoch_samples / (opts.batch_size * world))
        per_worker = math.ceil(global_batches / opts.readers)
        num_batches = per_worker * opts.readers
        num_samples = num_batches * opts.batch_size * world
    pipeline.append(worker_batches(pipeline.place, per_worker))  # the epoch's cut per worker

    workers = opts.num_workers
    extra_args = {"prefetch_factor": opts.prefetch_factor} if workers > 0 and opts.prefetch_factor is not None else {}
    dataloader = torch.utils.data.DataLoader(
        pipeline, batch_size=None, shuffle=False, num_workers=workers, pin_memory=opts.pin_memory,
        persistent_workers=opts.persistent_workers and workers > 0,
        multiprocessing_context=opts.multiprocessing_context if workers > 0 else None, **extra_args)
    return WdsLoader(dataloader, pipeline, sink, num_batches, num_samples,
                     watchdog=bool(config.starvation_samples or config.starvation_seconds),
                     batch_size=opts.batch_size, world=world, readers=opts.readers, seed=opts.seed,
                     settings=settings(shard_urls, opts, world, epoch_samples, config.to_dict(), rules))


def _check_readers(shard_urls: Sequence[str], world: int, opts: LoaderOptions) -> None:
    consumers = world * opts.readers
    if not opts.resampled and len(shard_urls) < consumers:
        raise ConfigError(
            f"{len(shard_urls)} shard(s) for {world} rank(s) x {opts.readers} worker(s) = {consumers} "
            f"readers: some would get no shard and distributed training would hang. Use fewer workers "
            f"(num_workers={max(len(shard_urls) // world, 1) if len(shard_urls) >= world else 0}), "
            f"more shards, or resampled=True.")


def _check_sized(world: int, opts: LoaderOptions, epoch_samples: Optional[int]) -> None:
    if world > 1 and not opts.resampled and epoch_samples is None:
        raise ConfigError(
            f"{world} ranks read an unsized epoch: each rank would stop when its own shards run out, at "
            f"different batch counts, and DDP would hang at the all-reduce of the longest rank. Pass "
            f"epoch_samples=N, put a sizes.json beside the shards (`wdsfilter validate --stats-dir`), or "
            f"use resampled=True with epoch_samples.")


def _score_stages(opts: LoaderOptions, rules: Optional[Selection], tally: Tally, storage_options=None) -> list:
    """The score filter, if asked for: before decoding and shuffling, so dropped samples are never
    decoded, and score tables are read one shard at a time. Its drops count in the loader's tally."""
    if rules is None:
        return []
    return [ScoreFilter(opts.scores, rules, tally, storage_options=storage_options)]


def _output_stages(opts: LoaderOptions, place: Place) -> list:
    """The user's transform (its random draws seeded per sample) and tokenizer, then the output shape."""
    fns = {}
    if opts.transform is not None:
        fns["image"] = SeededTransform(opts.transform, place, opts.seed)
    if opts.tokenizer is not None:
        fns["caption"] = _Tokenize(opts.tokenizer)
    stages = [map_dict(fns)] if fns else []
    if opts.output == "tuple":
        stages.append(_ToTuple(("image", "caption")))
    return stages


def _batches(opts: LoaderOptions, place: Place) -> Callable:
    """How the pipeline's batches are made: the loader's own tuples as their samples come
    (stream/collate.py's TupleBatch), a collate_fn's or a dict output's from the list of samples."""
    if opts.collate_fn is None and opts.output == "tuple":
        return TupleBatches(CollateAtLoopThreads(collate_tuples, place), BatchMemory(place))
    return Collated(CollateAtLoopThreads(opts.collate_fn or _as_list, place))


def _batched(data, size: int, new_batch: Callable, partial: bool):
    """webdataset's batched, less its read-ahead: it takes a batch's first sample before it yields the
    batch before, so on a sized (endless, cut) stream each worker decoded one sample per epoch that
    no batch carried, and the tally counted it as given to training. new_batch(size): an empty
    batch (add, len, finish), stream/collate.py's."""
    batch = new_batch(size)
    for sample in data:
        batch.add(sample)
        if len(batch) == size:
            yield batch.finish()
            batch = new_batch(size)
    if len(batch) and partial:
        yield batch.finish()


def batched(size: int, new_batch: Callable, partial: bool = True):
    import webdataset as wds
    return wds.pipelinefilter(_batched)(size, new_batch, partial)


def _as_list(samples):
    return list(samples)
