"""The random generators a user's transform may draw from (torch's CPU generator, Python's and numpy's
global ones), seeded per sample, and the training loop's own state kept around the sample pipeline
when it runs in the training loop's process (num_workers=0)."""
from __future__ import annotations

import random
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


class TrainingLoopState:
    """What the sample pipeline must give back to a training loop it runs inside: the generators'
    states, and torch's intra-op thread count, which the pipeline runs at 1, as torch sets it in a
    DataLoader worker (a 224 px image's tensor ops split over the loop's threads cost several times
    their work in OpenMP hand-offs, and far more on a loaded machine). Saved once per batch, around the
    DataLoader's next(), rather than around each sample (numpy's get/set_state alone is ~100 us)."""

    def __init__(self):
        self.saved: Optional[tuple] = None

    def __enter__(self):
        import torch
        cpu, np_random = generators()
        threads = torch.get_num_threads()
        self.saved = cpu.get_state(), random.getstate(), np_random.get_state(), threads
        if threads != 1:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        import torch
        cpu, np_random = generators()
        state, python_state, numpy_state, threads = self.saved
        cpu.set_state(state)
        random.setstate(python_state)
        np_random.set_state(numpy_state)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.saved = None
        return False


def batches_in_training_loop(dataloader, place):
    """The batches of a DataLoader without workers, each made under TrainingLoopState; the pipeline's
    SeededTransform then only seeds (`place.guarded`). Anything the loop draws between batches comes
    from its own generators, as if no transform had drawn."""
    iterator = iter(dataloader)  # torch draws its base seed from the loop's generator here, as without us
    state = TrainingLoopState()
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
