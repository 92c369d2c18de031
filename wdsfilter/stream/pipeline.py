"""Compose shard lists and stages into a webdataset DataPipeline, read top to bottom."""
from __future__ import annotations

import os
import random
import sys
from typing import Callable, Dict, Optional, Sequence, Tuple

import webdataset as wds

from .config import StageConfig
from ..core.errors import StarvationError
from ..core.markers import MARKER
from ..storage.shards import expand_urls
from .generators import restore_states, saved_states, seed_all
from .stages import decode_sample, sample_stages, watch
from ..core.tally import StatsSink, Tally


def shard_source(urls: Sequence[str], resampled: bool = False, shuffle_shards: bool = False, seed: int = 0,
                 cycle: Optional[Tally] = None, place: Optional["Place"] = None) -> list:
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
        stages.append(cycle_shards(cycle, place))
    return stages


def _cycle_shards(src, tally: Tally, place: Optional["Place"] = None):
    """Repeat a reader's shards at the shard level, before batching: batches run on across the
    wrap-around (no partial batch per pass, none lost to drop_last). A whole pass that read no
    sample, or whose samples the stages all dropped (the score filter, a wrong key), raises at once,
    naming the rank, worker and shards, instead of looping forever or (as webdataset's with_epoch
    does on an empty pass) ending this rank's epoch early. `place.passes` counts the passes (the
    sample shuffle keeps them apart)."""
    def kept() -> int:  # samples read less drops (a shard that cannot be opened counts a drop too)
        return tally.samples_read - sum(tally.dropped.values())

    shards = list(src)
    while shards:
        kept_before = kept()
        yield from shards
        if place is not None:
            place.passes += 1
        if kept() <= kept_before:
            rank, world, worker, workers = wds.utils.pytorch_worker_info()
            names = ", ".join(s["url"] for s in shards[:5]) + (" ..." if len(shards) > 5 else "")
            raise StarvationError(
                f"rank {rank}/{world}, DataLoader worker {worker}/{workers}: a whole pass over its "
                f"{len(shards)} shard(s) ({names}) kept no sample, so this rank cannot give its epoch's "
                f"batches and the other ranks would wait for it. Check those shards (`wdsfilter validate`).")


cycle_shards = wds.pipelinefilter(_cycle_shards)


class Place:
    """Where one reader (a rank's DataLoader worker, or its main process) is, shared by the stages of
    its pipeline: the epoch it reads, which worker it is, and, on a restored loader, how many samples
    of the restored epoch to replay unseen. Every seed of the stream is a function of (seed, epoch,
    rank, worker), so a reader's stream is the same on every run and a position is one count.

    `worker` is the reader's *logical* id: a loader restored after batch N must give next the batch
    of the worker that an uninterrupted run would ask next, and torch's DataLoader always starts its
    round robin at worker 0; so in the restored epoch torch's worker j reads as worker
    (j + offset) % workers (its shards, its seeds), with offset the worker that was next."""

    def __init__(self):
        self.epoch = -1  # the next pass adds one, as webdataset's seeded stages do
        self.worker = 0
        self.in_worker = False  # the reader is a DataLoader worker (not the training loop's process)
        self.guarded = False  # the loader keeps the training loop's generators around each batch
        self.loop_threads = 0  # meanwhile, the loop's torch thread count (the batch's collation takes it)
        self.rank: Optional[int] = None  # this reader's rank, read when a pass starts
        self.index = 0  # samples this reader passed to the user's transforms this epoch (replayed included)
        self.passes = 0  # passes over its shards this reader finished this epoch (cycle_shards)
        # The decode stage's count: samples it was given this epoch, images it decoded, and those it
        # dropped since the last batch ([index, reason]; the batch reports them, see `report`).
        self.raw = self.decodes = 0
        self.new_drops: list = []
        # {"epoch", "offset", "batches": {worker: batches given}, "batch_size",
        #  "decoded": {worker: {"raw": samples decoded, "drops": [[index, reason], ...]}}}
        self.resume: Optional[dict] = None

    def start(self) -> None:
        """A pass begins (in the process that reads): count the epoch and take the worker's logical
        id, set where webdataset's split_by_worker and ResampledShards read it (WORKER, NUM_WORKERS)."""
        self.epoch += 1
        self.index = self.passes = self.raw = self.decodes = 0
        self.new_drops = []
        data = sys.modules.get("torch.utils.data")  # a DataLoader worker has imported it; never import torch here
        info = data.get_worker_info() if data is not None else None
        self.in_worker = info is not None
        self.rank = None
        if info is None:
            self.worker = 0
            return
        offset = self.resume["offset"] if self.restoring else 0
        self.worker = (info.id + offset) % info.num_workers
        os.environ.update(WORKER=str(self.worker), NUM_WORKERS=str(info.num_workers))

    @property
    def restoring(self) -> bool:
        return self.resume is not None and self.resume["epoch"] == self.epoch

    def to_skip_batches(self) -> int:
        """Batches this reader gave in the restored epoch before the checkpoint (0 otherwise)."""
        return int(self.resume["batches"].get(self.worker, 0)) if self.restoring else 0

    def to_skip(self) -> int:
        """Samples this reader gave in the restored epoch before the checkpoint (0 otherwise)."""
        return self.to_skip_batches() * self.resume["batch_size"] if self.restoring else 0

    def decoded_before(self) -> Tuple[int, Dict[int, str]]:
        """On a restored epoch: how many of this reader's first samples the decode stage had seen by
        the checkpoint, and which of them it dropped (index -> reason); (0, {}) otherwise."""
        if not self.restoring:
            return 0, {}
        mine = (self.resume.get("decoded") or {}).get(self.worker) or {}
        return int(mine.get("raw", 0)), {int(i): reason for i, reason in mine.get("drops", ())}

    def report(self) -> Tuple[int, list]:
        """What a batch tells the main process of its reader's decoding: the samples the decode stage
        has seen this epoch, and those it dropped since the last batch."""
        drops, self.new_drops = self.new_drops, []
        return self.raw, drops

    def seed(self, seed: int, *more) -> int:
        if self.rank is None:  # once a pass (per sample it cost as much as the seeding)
            self.rank = wds.utils.pytorch_worker_info()[0]
        return wds.utils.make_seed(seed, self.epoch, self.rank, self.worker, *more)


class SeededTransform:
    """The user's image transform with the random generators it may draw from seeded per sample from
    (seed, epoch, rank, worker, sample index): a random crop is the same on every run and after a
    restore (whose replayed samples never reach the transform). A DataLoader worker's generators are
    its own (no other stage draws from them: the shuffles have their own), so they are only seeded. In
    the training loop's process (num_workers=0) they are the loop's: the loader keeps them around each
    batch (`place.guarded`, generators.batches_in_training_loop); a pipeline iterated bare gives them
    back after each sample."""

    def __init__(self, transform: Callable, place: Place, seed: int):
        self.transform, self.place, self.seed = transform, place, seed

    def __call__(self, image):
        place = self.place
        seed = place.seed(self.seed, place.index)
        if place.in_worker or place.guarded:
            seed_all(seed)
            return self.transform(image)
        saved = saved_states()
        try:
            seed_all(seed)
            return self.transform(image)
        finally:
            restore_states(saved)


class PlacedSource(wds.PipelineStage):
    """The first stage: starts the reader's pass (Place.start), then its shard source."""

    def __init__(self, place: Place, source):
        self.place = place
        self.source = source

    def run(self):
        self.place.start()
        return iter(self.source)


class SeededShuffle(wds.PipelineStage):
    """webdataset's sample shuffle with a seeded generator: its own draws from the clock, so no run
    could give the same order twice and a restored loader could not rebuild its buffer."""

    def __init__(self, place: Place, bufsize: int, initial: int, seed: int):
        self.place, self.bufsize, self.initial, self.seed = place, bufsize, initial, seed

    def run(self, src):
        rng = random.Random(self.place.seed(self.seed))
        for one_pass in _passes(iter(src), self.place):
            yield from wds.shuffle(self.bufsize, self.initial, rng=rng)(one_pass)


_END = object()


def _passes(src, place: Place):
    """The stream cut where a sized epoch's reader starts its next pass over its shards (place.passes
    grew), each pass an iterator: the shuffle buffer drains at the end of each pass. One buffer
    across the wrap-around gave samples of the next pass in this epoch (some twice, some never, when
    the epoch asked for no more than one pass). A sample reaches the shuffle before the reader opens
    the next shard (no stage in between reads ahead across shards), so the count tells its pass."""
    first = next(src, _END)
    while first is not _END:
        current, after = place.passes, [_END]

        def this_pass(first=first, current=current, after=after):
            yield first
            for sample in src:
                if place.passes != current:
                    after[0] = sample
                    return
                yield sample
        yield this_pass()
        first = after[0]


def _placed_decode(data, cfg: StageConfig, tally: Tally, place: Place, decode_images: bool = True):
    """The loader's decode stage, after the sample shuffle: the buffer holds samples as read (their
    compressed bytes, as open_clip's pipeline holds them), and a batch waits for the decoding of its
    own samples only. It counts the samples it is given (place.raw), notes those it drops with their
    reason (place.new_drops: each batch reports them) and numbers those it gives (place.index, the
    transforms' sample index), so a saved position says how far into the shuffled stream a reader was.

    On a restored epoch it passes over the samples the reader had given before the checkpoint without
    decoding them (they count as given: they were) and drops again, with their reason and undecoded,
    those it had dropped; past the count the saved list of drops covers (it is bounded) it decodes
    until the reader's given samples are passed. The shuffle above it sees the same samples in the same
    order either way, so the rest of the stream is the uninterrupted run's. The watchdog sleeps while
    it passes over samples (a long replay is not a stall)."""
    upto, drops = place.decoded_before() if not cfg.emit_rejects else (0, {})
    skip = place.to_skip()
    limits = tally.starvation_samples, tally.starvation_seconds
    if skip:
        tally.starvation_samples = tally.starvation_seconds = 0
    try:
        for sample in data:
            if MARKER in sample:
                yield sample
                continue
            index = place.raw
            place.raw += 1
            if index < upto and skip:
                if index in drops:
                    member = f"{sample.get('__key__')}.{sample.get('__media_ext__')}"
                    tally.drop(drops[index], "decode", sample.get("__url__", ""), member,
                               "dropped before the restored position; not decoded again")
                else:
                    skip -= 1
                    place.index += 1
                    tally.sample_out()
                continue
            if decode_images and "image" in sample:
                place.decodes += 1
                sample, reason = decode_sample(sample, cfg, tally)
                if reason is not None:
                    place.new_drops.append([index, reason])
                    if sample is None:
                        continue
                    if skip:  # a reject marker (emit_rejects) the reader gave before the checkpoint
                        skip -= 1
                        continue
                    yield sample
                    continue
            place.index += 1
            if skip:  # past the saved drops, still before the restored position
                skip -= 1
                tally.sample_out()
                continue
            if limits[0] != tally.starvation_samples or limits[1] != tally.starvation_seconds:
                tally.starvation_samples, tally.starvation_seconds = limits
                tally.waiting()
            yield sample
    finally:
        tally.starvation_samples, tally.starvation_seconds = limits


placed_decode = wds.pipelinefilter(_placed_decode)


def _worker_batches(data, place: Place, per_worker: Optional[int] = None):
    """Each batch with the worker that made it (so the loader knows each worker's position) and its
    decode stage's report (Place.report), and on a sized epoch the cut after the worker's
    `per_worker` batches, those it gave before a restore included. Like webdataset's with_epoch, it
    takes no batch past the cut (that would read ahead)."""
    left = None if per_worker is None else per_worker - place.to_skip_batches()
    if left is not None and left <= 0:
        return
    for batch in data:
        yield batch, place.worker, place.report()
        if left is not None:
            left -= 1
            if not left:
                return


worker_batches = wds.pipelinefilter(_worker_batches)


def set_epoch(pipeline: wds.DataPipeline, epoch: int) -> None:
    """Make the pipeline's next iteration epoch `epoch` for the seeded shard stages (resampled
    shards, shard shuffle). Each of them counts its own iterations, but a DataLoader that starts
    fresh workers each epoch gives them a fresh copy whose count is always 0: every epoch would
    draw the same shards in the same order."""
    for stage in pipeline.pipeline:
        stage = stage.source if isinstance(stage, PlacedSource) else stage
        if isinstance(stage, (wds.ResampledShards, wds.detshuffle)):
            stage.epoch = epoch - 1  # they add one as the iteration starts
    place = getattr(pipeline, "place", None)
    if place is not None:
        place.epoch = epoch - 1


def sample_pipeline(urls, cfg: Optional[StageConfig] = None, tally: Optional[Tally] = None, *,
                    resampled: bool = False, shuffle: int = 0, seed: int = 0, decode_images: bool = True,
                    extra: Sequence[Callable] = (), sink: Optional[StatsSink] = None,
                    before_decode: Sequence[Callable] = (), cycle: bool = False,
                    shard_stages: Sequence[Callable] = (), place: Optional[Place] = None,
                    source=None) -> wds.DataPipeline:
    """urls -> decoded samples {"__key__", "__url__", "image" (PIL) or "video" (bytes), "caption", "json"}.

    `extra` stages (map_dict, to_tuple, ...) run after decoding and before the output count, so
    the watchdog sees what finally comes out. `before_decode` stages (the score filter) run in
    shard order before decoding and shuffling: what they drop is never decoded. `cycle`: each
    reader repeats its shards endlessly (the loader's sized epochs cut the stream).
    `shard_stages` run on the shard list's {"url"} items (tarsubset.ReadOnly: only some samples).
    `source`: an iterable of {"url"} items read in place of the list (a joined scoring run's
    worker reads the shards it claims as its readers ask: score/join.FedShards); `urls` unused.
    """
    cfg = cfg or StageConfig()
    tally = tally if tally is not None else Tally(cfg.starvation_samples, cfg.starvation_seconds)
    restorable = place is not None  # the loader's pipeline: its place can be saved and restored
    place = place if restorable else Place()
    if source is not None:
        stages = [source]
    else:
        urls = expand_urls(urls, cfg.allow_pipe, cfg.allow_remote, cfg.storage_options)
        stages = shard_source(urls, resampled, shuffle_shards=bool(shuffle), seed=seed,
                              cycle=tally if cycle and not resampled else None, place=place)
    stages[0] = PlacedSource(place, stages[0])
    stages += list(shard_stages)
    stages += sample_stages(cfg, tally, decode_images=decode_images and not restorable, before_decode=before_decode)
    if shuffle:
        tally.held_back = min(shuffle, 1000)
        stages.append(SeededShuffle(place, shuffle, tally.held_back, seed))
    if restorable:  # the loader's: decoded after the shuffle, a restored reader's given samples passed over
        stages.append(placed_decode(cfg, tally, place, decode_images))
    stages += list(extra)
    stages.append(watch(tally, sink))
    pipeline = wds.DataPipeline(*stages)
    pipeline.tally = tally
    pipeline.place = place
    return pipeline
