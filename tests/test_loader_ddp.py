"""wdsfilter.loader in real multi-rank training: 2 gloo ranks on CPU, an all-reduce per batch (a
DDP step's collective). Every rank must give exactly num_batches full batches an epoch, or raise at
once naming the rank and shards; a rank that stops early would leave the others waiting.

Hang guards are generous and only guards: gloo's timeout and a join timeout that kills the ranks
and fails the test as a hang. No assertion is about time."""
import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wdsfilter
from remotekit import free_port
from shardkit import image_text_members, write_shard
from wdsfilter import ConfigError

pytestmark = pytest.mark.slow  # starts processes and DataLoader workers

HANG_SECONDS = 300


def _rank_main(rank, world, port, shards, kws, epochs, out):
    """One rank: a loader for each of `kws` in turn (one process group, as a script that builds a
    new loader per phase), each iterated `epochs` times; writes a result per loader."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    results = []
    for kw in kws:
        result = {"epochs": []}
        results.append(result)
        try:
            kw = dict(kw)
            if kw.pop("seed_per_rank", False):  # what training scripts that seed by rank pass
                kw["seed"] = 1 + 7 * rank
            loader = wdsfilter.loader(shards, output="dict", **kw)
            result.update(num_batches=loader.num_batches, num_samples=loader.num_samples)
            for _ in range(epochs):
                sizes, keys = [], []
                for batch in loader:
                    sizes.append(len(batch))
                    keys += [s["__key__"] for s in batch]
                    step = torch.ones(1)
                    dist.all_reduce(step)  # the training step's collective: every rank must reach it
                result["epochs"].append({"sizes": sizes, "keys": keys})
        except Exception as e:  # reported to the test; the other rank then fails its collective, not hangs
            result["error"] = f"{type(e).__name__}: {e}"
            break  # the process group is broken: the later loaders are not run
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def run_ranks(tmp_path, shards, epochs=1, **kw):
    """Per rank: {"num_batches", "num_samples", "epochs": [{"sizes", "keys"}], "error"?}."""
    return [r[0] for r in run_ranks_each(tmp_path, shards, [kw], epochs)]


def run_ranks_each(tmp_path, shards, kws, epochs=1):
    """run_ranks for several loader settings in one pair of rank processes (each spawned rank
    imports torch and wdsfilter: seconds of CPU): per rank, a result per settings."""
    out = str(tmp_path / "rank")
    ctx = mp.spawn(_rank_main, args=(2, free_port(), shards, kws, epochs, out), nprocs=2, join=False)
    try:
        deadline = time.monotonic() + HANG_SECONDS
        while not ctx.join(timeout=5):  # False while a rank is still running
            if time.monotonic() > deadline:
                pytest.fail(f"ranks still running after {HANG_SECONDS}s: the training hung")
    except mp.ProcessRaisedException:
        pass  # a rank's result file says why
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = []
    for rank in range(2):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
    return results


@pytest.fixture
def uneven(tmp_path):
    """Rank 0 reads s0 and s2 (20 samples), rank 1 s1 and s3 (13): what a filtered or uneven
    dataset gives."""
    return [write_shard(tmp_path / f"s{i}.tar", image_text_members(n, start=1000 * i))
            for i, n in enumerate([10, 10, 10, 3])]


SETTINGS = [(0, False), (2, False), (2, True)]  # (num_workers, drop_last)


def test_uneven_ranks_give_exactly_num_batches_full_batches(tmp_path, uneven):
    # Before: rank 1 ended its epoch early (drop_last: worker 1's 3 samples never made a batch and
    # webdataset's with_epoch stops on an empty pass: 3 batches against 6) or gave partial batches
    # mid-epoch (num_samples overstated what was yielded). Every setting in one pair of ranks.
    each = run_ranks_each(tmp_path, uneven, [dict(batch_size=4, epoch_samples=33, num_workers=workers,
                                                  drop_last=drop_last) for workers, drop_last in SETTINGS], epochs=2)
    for n, setting in enumerate(SETTINGS):
        results = [each[rank][n] for rank in range(2)]
        for rank, r in enumerate(results):
            assert "error" not in r, (setting, r["error"])
            for epoch in r["epochs"]:
                assert len(epoch["sizes"]) == r["num_batches"], (setting, rank, epoch["sizes"])
                assert set(epoch["sizes"]) == {4}, (setting, rank, epoch["sizes"])
            assert r["num_samples"] == r["num_batches"] * 4 * 2, setting
        # Nothing lost: each rank reads all of its own shards (the short one goes round them again).
        seen = set(results[0]["epochs"][0]["keys"]) | set(results[1]["epochs"][0]["keys"])
        assert len(seen) == 33, setting
        assert not set(results[0]["epochs"][0]["keys"]) & set(results[1]["epochs"][0]["keys"]), setting


def test_shard_shuffle_seeded_per_rank_neither_shares_nor_skips_shards(tmp_path):
    # Before: shards were shuffled before the split by rank, so ranks with different seeds took
    # overlapping shares: 12 of 40 samples on both ranks, 16 on neither, nothing said.
    shards = [write_shard(tmp_path / f"g{i}.tar", image_text_members(5, start=100 * i)) for i in range(8)]
    each = run_ranks_each(tmp_path, shards, [dict(batch_size=5, epoch_samples=40, shuffle=10, seed_per_rank=True,
                                                  num_workers=workers) for workers in (0, 2)], epochs=2)
    for n, workers in enumerate((0, 2)):
        results = [each[rank][n] for rank in range(2)]
        for e in range(2):
            keys = [set(r["epochs"][e]["keys"]) for r in results]
            assert not keys[0] & keys[1], workers
            assert {k[:4] for k in keys[0]}.isdisjoint({k[:4] for k in keys[1]}), workers  # shard prefixes: 0000, ...


def test_a_loader_sized_for_another_world_than_the_split_raises(tmp_path, uneven):
    # Before: world_size=1 on 2 ranks sized each rank's epoch for the whole dataset (num_samples
    # and num_batches for one rank) while the shards were split in two: every rank went round its
    # half twice, silently. Without RANK/WORLD_SIZE, world_size=2 read every shard on every rank.
    results = run_ranks(tmp_path, uneven, batch_size=4, epoch_samples=33, world_size=1)
    for rank, r in enumerate(results):
        assert r["error"].startswith(f"ConfigError: wdsfilter.loader was sized for 1 rank(s) but rank {rank} "
                                     f"iterates it in a world of 2"), r["error"]
    with pytest.raises(ConfigError, match="sized for 2 rank"):
        next(iter(wdsfilter.loader(uneven, batch_size=4, epoch_samples=33, world_size=2)))


def test_an_unsized_epoch_on_several_ranks_is_a_config_error(tmp_path, uneven):
    # Before: rank 0 gave 5 batches, rank 1 gave 4; rank 1's next collective met rank 0's fifth
    # batch and the ranks went on out of step (with NCCL: a hang at the end).
    results = run_ranks(tmp_path, uneven, batch_size=4)
    for r in results:
        assert r["error"].startswith("ConfigError: 2 ranks read an unsized epoch"), r["error"]
    with pytest.raises(ConfigError, match="unsized epoch"):
        wdsfilter.loader(uneven, batch_size=4, world_size=2)
    assert wdsfilter.loader(uneven, batch_size=4, world_size=2, resampled=True).num_batches is None  # infinite: allowed


def test_a_rank_whose_shards_read_nothing_raises_naming_rank_and_shards(tmp_path, uneven):
    # The watchdog off (starvation_samples=0): before, with_epoch ended rank 1's epoch with no
    # batch and no error while rank 0 waited at its first all-reduce.
    for name in ("s1.tar", "s3.tar"):
        with open(tmp_path / name, "w") as f:
            f.write("version https://git-lfs.github.com/spec/v1\n")
    results = run_ranks(tmp_path, uneven, batch_size=4, epoch_samples=33, starvation_samples=0,
                        starvation_seconds=0)
    error = results[1]["error"]
    assert error.startswith("StarvationError: rank 1/2, DataLoader worker 0/1: a whole pass"), error
    assert "s1.tar" in error and "s3.tar" in error
    assert "error" in results[0]  # rank 0's all-reduce failed when rank 1 left; it did not hang


def test_a_rank_whose_samples_are_all_dropped_raises_instead_of_looping(tmp_path, uneven):
    # Rank 1's shards are read but every sample is dropped (its captions are under `json`, the
    # loader asks for `txt`; the first-shard key check sees rank 0's shard). Its reader went round
    # its shards for ever (a pass that read samples was not 'empty') and rank 0 waited.
    for i, n in ((1, 10), (3, 3)):
        write_shard(tmp_path / f"s{i}.tar", image_text_members(n, start=1000 * i, text_ext="json"))
    results = run_ranks(tmp_path, uneven, batch_size=4, epoch_samples=33, starvation_samples=0,
                        starvation_seconds=0)
    error = results[1]["error"]
    assert error.startswith("StarvationError: rank 1/2, DataLoader worker 0/1: a whole pass"), error
    assert "kept no sample" in error and "s1.tar" in error
    assert "error" in results[0]


def test_resampled_workers_draw_new_shards_every_epoch(tmp_path):
    # Before: fresh (non-persistent) workers each got a copy of ResampledShards whose epoch count was
    # 0, so every epoch replayed the same shards in the same order.
    shards = [write_shard(tmp_path / f"r{i}.tar", image_text_members(2, start=10 * i)) for i in range(20)]
    loader = wdsfilter.loader(shards, batch_size=2, num_workers=2, resampled=True, epoch_samples=16,
                              output="dict", seed=3)
    epochs = [[s["__key__"] for batch in loader for s in batch] for _ in range(3)]
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    again = wdsfilter.loader(shards, batch_size=2, num_workers=2, resampled=True, epoch_samples=16,
                             output="dict", seed=3)
    again.set_epoch(1)  # resuming at epoch 1 draws what epoch 1 drew
    assert [s["__key__"] for batch in again for s in batch] == epochs[1]
