"""wdsfilter.loader saves and restores its place: a loader given the state_dict() taken after batch N
gives exactly the batches an uninterrupted loader gives from batch N+1 on, into the next epochs too,
and its counts (the score filter's drops included) end where the uninterrupted run's end.

Every comparison is against an uninterrupted loader built the same way in the same test: nothing
here is a hard-coded order."""
import json
import os

import pytest

import wdsfilter
from filterkit import gnu_tar_shards, score_folder
from shardkit import image_text_members, write_shard
from wdsfilter import ConfigError

pytestmark = pytest.mark.slow  # DataLoader workers


@pytest.fixture
def shards(tmp_path):
    """Four shards of uneven sizes: with 2 workers, one worker runs out before the other."""
    return [write_shard(tmp_path / f"s{i}.tar", image_text_members(n, start=100 * i))
            for i, n in enumerate([10, 7, 12, 5])]


def keys(batch):
    return [s["__key__"] for s in batch]


def epochs(loader, n=2):
    return [[keys(b) for b in loader] for _ in range(n)]


def interrupted(make, n_batches, epochs_after=2):
    """Take n_batches of a loader's first epoch, save its state (through JSON, as a checkpoint
    would keep it), then give a new loader that state and read `epochs_after` epochs from it. Returns
    (batches before, batches after, the restored loader)."""
    first = make()
    it = iter(first)
    before = [keys(next(it)) for _ in range(n_batches)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    again = make()
    again.load_state_dict(state)
    after = [keys(b) for _ in range(epochs_after) for b in again]
    return before, after, again


def counts(stats):
    return stats.samples_read, stats.samples_out, dict(stats.dropped)


@pytest.mark.parametrize("workers,shuffle,epoch_samples,at", [
    (0, 0, None, 4),    # one reader, in shard order
    (2, 0, None, 9),    # two workers; worker 1 (12 + 5 samples... ) has run out by batch 9
    (2, 6, None, 3),    # with the sample shuffle buffer (and the shard shuffle) mid-buffer
    (2, 6, 40, 7),      # a sized epoch: each worker goes round its shards, cut at num_batches
])
def test_resume_after_n_batches_gives_the_uninterrupted_rest(shards, workers, shuffle, epoch_samples, at):
    def make():
        return wdsfilter.loader(shards, batch_size=3, num_workers=workers, shuffle=shuffle, seed=5,
                                epoch_samples=epoch_samples, output="dict")
    full = make()
    whole = epochs(full)
    before, after, again = interrupted(make, at)
    assert before + after == whole[0] + whole[1]
    assert len(whole[0]) > at and whole[0] != whole[1] or not shuffle  # a shuffled epoch differs from the next
    if epoch_samples is None:  # a finite pass: every count is exact
        assert counts(again.stats) == counts(full.stats)


def test_a_restore_decodes_only_the_samples_it_will_give(tmp_path):
    # The restored reader passes over the samples it gave without decoding them: those the decode
    # stage dropped before the position (corrupt JPEGs) are dropped again from the saved list, the
    # others in the shuffle buffer are decoded after the replay. num_workers=0: the reader is this
    # process, so its count of decoded images (Place.decodes) is the loader's.
    shards = gnu_tar_shards(str(tmp_path), [9, 8, 7], corrupt=[(0, 2), (1, 1), (2, 4)])

    def make():
        return wdsfilter.loader(shards, batch_size=3, num_workers=0, shuffle=5, seed=4, output="dict")
    full = make()
    whole = [keys(b) for b in full]
    decoded_whole = full.pipeline.place.decodes
    assert decoded_whole == 9 + 8 + 7  # every image once, the corrupt ones included
    at = 4
    before, after, again = interrupted(make, at, epochs_after=1)
    assert before + after == whole
    saved = again.state_dict()["position"]  # the epoch is over: the next one's (nothing decoded yet)
    assert saved["epoch"] == 1
    first = make()
    it = iter(first)
    for _ in range(at):
        next(it)
    drops = first.state_dict()["position"]["decoded"]["0"]["drops"]
    assert sorted(reason for _, reason in drops) == ["corrupt_image", "corrupt_image"]  # two were behind
    assert again.pipeline.place.decodes == decoded_whole - at * 3 - len(drops)
    assert counts(again.stats) == counts(full.stats)  # the corrupt ones counted, with their reason


def draws(img):
    """A random augmentation that shows what it drew (torch's, Python's and numpy's generators)."""
    import random

    import numpy as np
    import torch
    return (torch.rand(1).item(), random.random(), float(np.random.rand()))


def test_a_restored_loader_gives_the_same_random_augmentations(shards):
    # Each sample's transform draws from generators seeded by its place in the reader's stream, in
    # DataLoader workers too (seeded there, not put back): the restored loader's samples get the
    # uninterrupted run's draws, and every sample its own.
    def make():
        return wdsfilter.loader(shards, batch_size=3, num_workers=2, shuffle=6, seed=5, epoch_samples=30,
                                transform=draws, output="dict")

    def with_draws(loader, n):
        return [[(s["__key__"], tuple(s["image"])) for s in batch] for _, batch in zip(range(n), loader)]
    whole = with_draws(make(), 10)
    first = make()
    it = iter(first)
    before = [[(s["__key__"], tuple(s["image"])) for s in next(it)] for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    again = make()
    again.load_state_dict(state)
    assert before + with_draws(again, 6) == whole
    assert len({d for batch in whole for _, d in batch}) == 30


def test_shuffled_epochs_are_reproducible_from_the_seed(shards):
    # The sample shuffle drew from the clock: no two runs gave the same order, so no position could
    # be restored. Seeded by (seed, epoch, rank, worker) it is the same on every run.
    def order(seed):
        return epochs(wdsfilter.loader(shards, batch_size=4, num_workers=2, shuffle=8, seed=seed, output="dict"))
    assert order(1) == order(1)
    assert order(1) != order(2)


def test_resume_with_the_score_filter(tmp_path):
    # A real scoring run (brightness); a sample the scorer refuses has no score (no_score), a
    # corrupt JPEG's row was rejected for it; the threshold drops about half of the others.
    shards = gnu_tar_shards(str(tmp_path), [9, 8, 7, 6], refused=[(1, 2)], corrupt=[(2, 3)])
    out = score_folder(shards, tmp_path / "scores")

    def make():
        return wdsfilter.loader(shards, batch_size=2, num_workers=2, shuffle=4, seed=1, output="dict",
                                scores=out, min_scores={"brightness": 0.4})
    full = make()
    whole = epochs(full)
    dropped = full.stats.dropped
    # two epochs: the refused sample has no score, the corrupt JPEG's row says why it has none
    assert dropped["filtered_by_score"] > 10 and dropped["no_score"] == 2 and dropped["rejected: corrupt_image"] == 2
    for at in (2, 5):
        before, after, again = interrupted(make, at)
        assert before + after == whole[0] + whole[1]
        assert counts(again.stats) == counts(full.stats)
    # Other thresholds keep other samples: the position means nothing there.
    other = wdsfilter.loader(shards, batch_size=2, num_workers=2, shuffle=4, seed=1, output="dict",
                             scores=out, min_scores={"brightness": 0.5})
    with pytest.raises(ConfigError, match="the score filter"):
        other.load_state_dict(again.state_dict())


def test_resume_resampled(tmp_path):
    shards = [write_shard(tmp_path / f"r{i}.tar", image_text_members(4, start=10 * i)) for i in range(6)]

    def make():
        return wdsfilter.loader(shards, batch_size=2, num_workers=2, resampled=True, epoch_samples=20,
                                shuffle=3, seed=7, output="dict")
    whole = epochs(make())
    before, after, _ = interrupted(make, 5)
    assert before + after == whole[0] + whole[1]


def test_resume_with_persistent_workers(shards):
    # open_clip's own loader keeps its workers (persistent_workers=True): they count their epochs.
    def make():
        return wdsfilter.loader(shards, batch_size=3, num_workers=2, shuffle=5, seed=2, epoch_samples=30,
                                persistent_workers=True, output="dict")
    whole = epochs(make(), 3)
    before, after, again = interrupted(make, 6, epochs_after=3)
    assert before + after == whole[0] + whole[1] + whole[2]
    with pytest.raises(ConfigError, match="before the first iteration"):
        again.load_state_dict(again.state_dict())


def test_state_saved_after_the_last_batch_starts_the_next_epoch(shards):
    def make():
        return wdsfilter.loader(shards, batch_size=3, num_workers=2, shuffle=5, seed=2, epoch_samples=30,
                                output="dict")
    whole = epochs(make())
    before, after, again = interrupted(make, len(whole[0]), epochs_after=1)
    assert before == whole[0] and after == whole[1]
    assert again.epoch == 2


@pytest.mark.parametrize("change,message", [
    (dict(shards=3), "the shard list (4 shards -> 3 shards) changed"),
    (dict(batch_size=4), "batch_size (3 -> 4) changed"),
    (dict(world_size=2), "the world size (ranks) (1 -> 2) changed"),
    (dict(num_workers=1), "num_workers (the split of shards by worker) (2 -> 1) changed"),
])
def test_a_state_from_other_settings_is_refused_naming_what_changed(shards, change, message):
    # Restoring into a loader over other shards, batches or ranks would repeat or skip samples.
    first = wdsfilter.loader(shards, batch_size=3, num_workers=2, output="dict", epoch_samples=30)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    kw = dict(batch_size=change.get("batch_size", 3), num_workers=change.get("num_workers", 2),
              output="dict", epoch_samples=30, world_size=change.get("world_size"))
    other = wdsfilter.loader(shards[:change.get("shards", 4)], **kw)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        other.load_state_dict(state)
    with pytest.raises(ConfigError, match="not a wdsfilter loader state"):
        other.load_state_dict({"epoch": 3})


def _rank_resume(rank, world, port, shards, at, out):
    """One rank: an uninterrupted epoch, then a loader stopped after `at` batches whose rank-0 state
    (what open_clip's checkpoint, saved by rank 0, holds) restores a new loader on every rank."""
    import datetime

    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    kw = dict(batch_size=3, num_workers=2, shuffle=6, seed=3, epoch_samples=24, output="dict")
    try:
        full = [keys(b) for b in wdsfilter.loader(shards, **kw)]
        first = wdsfilter.loader(shards, **kw)
        it = iter(first)
        before = [keys(next(it)) for _ in range(at)]
        state = [first.state_dict()]
        dist.broadcast_object_list(state, src=0)
        del it
        again = wdsfilter.loader(shards, **kw)
        again.load_state_dict(state[0])
        result = dict(full=full, before=before, after=[keys(b) for b in again])
    except Exception as e:  # reported to the test
        result = {"error": f"{type(e).__name__}: {e}"}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def test_two_ranks_two_workers_resume_gives_one_epoch_none_twice(tmp_path):
    import time
    from collections import Counter

    import torch.multiprocessing as mp
    from remotekit import free_port

    # 8 shards of 6: each of the 2 x 2 readers has 2 shards and gives 2 batches of 3 (epoch_samples=24), all
    # from its first pass (a shuffle buffer of 6 has not reached the second), so the epoch has no sample twice.
    shards = [write_shard(tmp_path / f"d{i}.tar", image_text_members(6, start=100 * i)) for i in range(8)]
    out = str(tmp_path / "rank")
    ctx = mp.spawn(_rank_resume, args=(2, free_port(), shards, 1, out), nprocs=2, join=False)
    try:
        deadline = time.monotonic() + 600  # a hang guard only (three loaders a rank, on a busy machine)
        while not ctx.join(timeout=5):
            assert time.monotonic() < deadline, "the ranks hung"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = []
    for rank in range(2):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
    seen, uninterrupted = Counter(), Counter()
    for rank, r in enumerate(results):
        assert "error" not in r, r["error"]
        assert r["before"] + r["after"] == r["full"], rank  # this rank's batches, in order
        assert len(r["full"]) == 4 and len(r["before"]) == 1
        seen.update(k for batch in r["before"] + r["after"] for k in batch)
        uninterrupted.update(k for batch in r["full"] for k in batch)
    assert seen == uninterrupted  # one uninterrupted epoch over both ranks
    assert len(seen) == 24 and set(seen.values()) == {1}  # none twice
