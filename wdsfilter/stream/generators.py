"""The random generators a user's transform may draw from (torch's CPU generator, Python's and numpy's
global ones), seeded per sample, and the training loop's own state kept apart from the sample
pipeline's when the pipeline runs in the training loop's process (num_workers=0)."""
from __future__ import annotations

import atexit
import random
import weakref
from typing import Optional

_GENERATORS: Optional[tuple] = None


def generators() -> tuple:
    """(torch's CPU generator, numpy.random), imported once (a transform's process has torch)."""
    global _GENERATORS
    if _GENERATORS is None:
        import numpy as np
        import torch
        _GENERATORS = torch.default_generator, np.random
    return _GENERATORS


def seed_all(seed: int) -> None:
    """Seed each generator directly: torch.manual_seed also queues a seed for every CUDA, XPU and MTIA
    generator, recording a stack each time when none is initialised (~100x the cost), and on a GPU it
    reseeded the training loop's CUDA generator."""
    cpu, np_random = generators()
    cpu.manual_seed(seed)
    random.seed(seed)
    np_random.seed(seed)


def saved_states() -> tuple:
    """The three generators' states, to give back with restore_states."""
    cpu, np_random = generators()
    return cpu.get_state(), random.getstate(), np_random.get_state()


def restore_states(states: tuple) -> None:
    cpu, np_random = generators()
    cpu.set_state(states[0])
    random.setstate(states[1])
    np_random.set_state(states[2])


class TrainingLoopState:
    """The sample pipeline's generators and torch thread count, swapped in for the training loop's
    around each batch the pipeline makes in the loop's process (num_workers=0), as a DataLoader
    worker has its own:

    - generators: the loop's are saved before the batch and given back after it, so what the loop
      draws between batches is what it would draw without the loader; the pipeline's continue from
      batch to batch (a tokenizer or collate_fn that draws gets new draws each batch), seeded once
      per epoch from `seed` (SeededTransform seeds them per sample besides). Once per batch: numpy's
      get/set_state alone is ~100 us, per sample it was ~7% of a 224 px sample's cost.
    - threads: 1 for the samples, as torch sets it in a DataLoader worker (a 224 px image's tensor
      ops split over the loop's threads cost more in OpenMP hand-offs than they save: 1.6x the CPU
      on an idle machine, several times the wall time on a loaded one); a collate_fn's collation at
      the loop's count (`place.loop_threads`, CollateAtLoopThreads: a batch's one large copy, which
      threads do speed up; the loader's own batches are copied row by row as samples come, into
      memory a helper thread prepared: stream/collate.py's BatchMemory); the loop's count given
      back after. torch's thread count is per thread: iterate the loader in the training thread
      (the generators are the process's: a second thread drawing while a batch is made would see
      the pipeline's)."""

    def __init__(self, seed: int, place=None):
        self.seed = seed
        self.place = place  # where the collation finds the loop's thread count
        self.pipeline: Optional[tuple] = None  # the pipeline's generator states after its last batch
        self.loop: Optional[tuple] = None
        self.threads = 1

    def __enter__(self):
        import torch
        self.loop, self.threads = saved_states(), torch.get_num_threads()
        if self.pipeline is None:
            seed_all(self.seed)
        else:
            restore_states(self.pipeline)
        if self.place is not None:
            self.place.loop_threads = self.threads
        if self.threads != 1:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        import torch
        self.pipeline = saved_states()
        restore_states(self.loop)
        self.loop = None
        if self.place is not None:
            self.place.loop_threads = 0
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return False


def batches_in_training_loop(dataloader, place, seed: int):
    """The batches of a DataLoader without workers, each made under TrainingLoopState (seeded from
    `seed`, the epoch's); the pipeline's SeededTransform then only seeds (`place.guarded`)."""
    iterator = iter(dataloader)  # torch draws its base seed from the loop's generator here, as without us
    state = TrainingLoopState(seed, place)
    place.guarded = True
    try:
        while True:
            with state:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item
    finally:
        place.guarded = False


class CollateAtLoopThreads:
    """A batch's collation at the training loop's torch thread count while the pipeline runs in the
    loop's process at one (TrainingLoopState); as it is elsewhere (a worker's, or a bare pipeline's)."""

    def __init__(self, collate, place):
        self.collate, self.place = collate, place

    def __call__(self, samples):
        threads = self.place.loop_threads
        if threads <= 1:
            return self.collate(samples)
        import torch
        torch.set_num_threads(threads)
        try:
            return self.collate(samples)
        finally:
            torch.set_num_threads(1)


_OPEN_EPOCHS: "weakref.WeakSet" = weakref.WeakSet()


def close_at_exit(epoch) -> None:
    """Close the generator `epoch` (a loader's epoch read in this process) when the interpreter
    exits, if it is still open then: a loop that broke out of an epoch and ended left its shard
    readers suspended, and the interpreter's teardown closed them after their modules' globals were
    gone, printing their cleanup's failures as tracebacks. Closed here, while every module is
    still there, the readers close their shards as at any epoch's end."""
    if not _OPEN_EPOCHS:
        atexit.unregister(_close_open_epochs)
        atexit.register(_close_open_epochs)
    _OPEN_EPOCHS.add(epoch)


def _close_open_epochs() -> None:
    for epoch in list(_OPEN_EPOCHS):
        try:
            epoch.close()
        except Exception:  # noqa: BLE001 - one that cannot close (running in another thread) leaves the rest to close
            pass
