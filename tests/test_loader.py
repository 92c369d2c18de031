"""wdsfilter.loader: DataLoader batches, worker splitting, misconfiguration errors, worker stats."""
import pytest
import torch

import wdsfilter
from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import ConfigError
from wdsfilter.core.errors import StarvationError


def to_tensor(img):
    return torch.from_numpy(__import__("numpy").asarray(img.resize((16, 16)), dtype="float32")).permute(2, 0, 1)


@pytest.fixture
def shards(tmp_path):
    return [write_shard(tmp_path / f"s{i}.tar", image_text_members(10, start=100 * i)) for i in range(4)]


def test_batches_of_tensors_and_captions(shards):
    loader = wdsfilter.loader(shards, batch_size=8, transform=to_tensor)
    batches = list(loader)
    assert sum(len(b[1]) for b in batches) == 40
    images, captions = batches[0]
    assert images.shape == (8, 3, 16, 16) and isinstance(captions[0], str)


def test_tokenizer_rows_are_unbatched(shards):
    def tokenizer(text):  # open_clip style: [1, context] for one string
        return torch.tensor([[len(text), 1, 2]])
    images, tokens = next(iter(wdsfilter.loader(shards, batch_size=4, transform=to_tensor, tokenizer=tokenizer)))
    assert tokens.shape == (4, 3)


def test_fewer_shards_than_readers_is_a_config_error(shards):
    with pytest.raises(ConfigError, match="4 shard\\(s\\) for 2 rank\\(s\\) x 3 worker\\(s\\) = 6 readers"):
        wdsfilter.loader(shards, num_workers=3, world_size=2)
    wdsfilter.loader(shards, num_workers=3, world_size=2, resampled=True, epoch_samples=16)  # fine


def test_worker_stats_are_merged_in_the_parent(tmp_path):
    members = image_text_members(3) + [("bad.jpg", b"not an image"), ("bad.txt", "x"), ("nocap.jpg", image_bytes())]
    a = write_shard(tmp_path / "a.tar", members)
    b = write_shard(tmp_path / "b.tar", image_text_members(3, start=10) + [("z.jpg", b""), ("z.txt", "z")])
    loader = wdsfilter.loader([a, b], batch_size=2, num_workers=2, transform=to_tensor)
    assert sum(len(c) for _, c in loader) == 6
    stats = loader.stats
    assert stats.samples_out == 6 and stats.samples_read == 9
    assert stats.dropped == {"corrupt_image": 1, "missing_caption": 1, "missing_image": 1}
    assert stats.by_shard[a]["corrupt_image"] == 1 and stats.by_shard[b]["missing_image"] == 1
    assert stats.notes["empty_member"] == 1


def test_token_config_and_size_guard_survive_spawn_workers(tmp_path):
    big = __import__("io").BytesIO()
    __import__("PIL.Image").Image.new("1", (3000, 3000)).save(big, "PNG")
    members = [("0.jpg", image_bytes()), ("0.txt", "<image> a red square"),
               ("1.png", big.getvalue()), ("1.txt", "<image> huge")]
    urls = [write_shard(tmp_path / f"t{i}.tar", members) for i in range(2)]
    loader = wdsfilter.loader(urls, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                              image_token="<__dj__image>", max_pixels=1_000_000, output="dict")
    samples = [s for batch in loader for s in batch]
    assert [s["caption"] for s in samples] == ["<__dj__image> a red square"] * 2
    assert loader.stats.dropped == {"oversized_image": 2}
    assert loader.stats.notes["foreign_image_token"] == 4  # counted before the guard drops two


def test_epoch_samples_sets_length(shards):
    loader = wdsfilter.loader(shards, batch_size=4, num_workers=2, resampled=True, epoch_samples=20,
                              transform=to_tensor)
    assert len(loader) == 6  # ceil(20 / 4) = 5 batches, ceil(5 / 2) = 3 per worker
    assert len(list(loader)) == 6


def test_options_and_config_are_exclusive(shards):
    with pytest.raises(ConfigError, match="either config"):
        wdsfilter.loader(shards, config=wdsfilter.StageConfig(), caption_key="txt")
    with pytest.raises(ConfigError, match="unknown loader option"):
        wdsfilter.loader(shards, caption_keys="txt")


def test_one_shard_without_captions_is_a_data_error_unless_it_is_the_first(tmp_path):
    # Worker 1's first shard lacks every caption (a captioning job failed for it): counted and
    # skipped. The dataset's first shard in the same state is a configuration error.
    good = [write_shard(tmp_path / f"g{i}.tar", image_text_members(6, start=100 * i)) for i in range(3)]
    bad = write_shard(tmp_path / "bad.tar", [(f"{i:06d}.jpg", image_bytes()) for i in range(500, 506)])
    loader = wdsfilter.loader([good[0], bad, good[1], good[2]], batch_size=4, num_workers=2, output="dict")
    keys = [s["__key__"] for batch in loader for s in batch]
    assert len(keys) == 18 and loader.stats.dropped["missing_caption"] == 6
    with pytest.raises(ConfigError, match="no sample of the first shard .*bad.tar has a caption"):
        list(wdsfilter.loader([bad, *good], batch_size=4, num_workers=2))


def test_drop_last_with_fewer_samples_than_a_batch_raises_instead_of_an_empty_epoch(tmp_path):
    from wdsfilter.core.errors import StarvationError
    shard = write_shard(tmp_path / "small-000000.tar", image_text_members(5))
    with pytest.raises(StarvationError, match=r"5 sample\(s\) came out, fewer than batch_size=8.*drop_last=False"):
        list(wdsfilter.loader([shard], batch_size=8, drop_last=True))
    assert sum(len(b[1]) for b in wdsfilter.loader([shard], batch_size=8)) == 5  # a partial batch is fine


def test_a_later_empty_epoch_raises_with_persistent_workers(tmp_path):
    # Persistent workers keep their counts across epochs: the check must be of this epoch, not of
    # the loader's life. Between epochs the shard is replaced by what a clone without `git lfs pull` leaves.
    from wdsfilter.core.errors import StarvationError
    shard = write_shard(tmp_path / "shard-000000.tar", image_text_members(6))
    loader = wdsfilter.loader([shard], batch_size=4, num_workers=1, persistent_workers=True)
    assert sum(len(b[1]) for b in loader) == 6
    with open(shard, "w") as f:
        f.write(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'4a' * 32}\nsize 20480\n")
    with pytest.raises(StarvationError, match="the epoch ended with no sample"):
        list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sized_shuffled_epoch_gives_each_sample_at_most_once(tmp_path, workers):
    # A sized epoch goes round each reader's shards (cycle_shards); the shuffle buffer filled across
    # the wrap-around, so samples of the next pass came out in this epoch: some twice, others never.
    # Each reader's share is its whole quota (two workers: two shards, 5 batches of 4 each).
    urls = [write_shard(tmp_path / f"e{i}.tar", image_text_members(10, start=100 * i)) for i in range(4)]
    loader = wdsfilter.loader(urls, batch_size=4, num_workers=workers, shuffle=16, seed=3,
                              epoch_samples=40, output="dict")
    for _ in range(2):
        seen = [s["__key__"] for batch in loader for s in batch]
        assert len(seen) == 40
        assert len(set(seen)) == len(seen), sorted(k for k in seen if seen.count(k) > 1)


def test_a_shuffle_buffer_filling_is_not_starvation(tmp_path):
    # A shuffle buffer takes in min(shuffle, 1000) samples before it gives the first (open_clip's
    # training sizes: 5000, initial 1000), more than the watchdog's starvation_samples (500 by
    # default): the watchdog raised "none came out; the run would hang" on healthy shards.
    urls = [write_shard(tmp_path / f"f{i}.tar", image_text_members(20, start=100 * i)) for i in range(2)]
    loader = wdsfilter.loader(urls, batch_size=8, shuffle=30, starvation_samples=10, output="dict")
    assert sorted(s["__key__"] for b in loader for s in b) == sorted(f"{k:06d}" for k in
                                                                     [*range(20), *range(100, 120)])
    # A stream that truly keeps nothing still raises, after the buffer's fill and the watchdog's count.
    starving = wdsfilter.loader(urls, batch_size=8, shuffle=30, starvation_samples=5, caption_key="json",
                                check_first_shard=False, output="dict")
    with pytest.raises(StarvationError, match="none came out"):
        list(starving)


def draws(img):
    """A 'random augmentation' that shows what it drew from each generator a transform may use."""
    import random

    import numpy as np
    return torch.tensor([torch.rand(1).item(), random.random(), np.random.rand()], dtype=torch.float64)


def test_transforms_draw_from_generators_seeded_per_sample_and_the_loops_are_kept(shards):
    # num_workers=0: the transform runs in the training loop's process. Each sample's draws are those
    # of generators seeded by (seed, epoch, rank, worker, sample number), as webdataset's make_seed
    # combines them; the loop's own generators are as they were; and no CUDA generator is seeded
    # (torch.manual_seed queued a seed for every CUDA device per sample: on a GPU it reseeded the
    # training loop's CUDA generator, on a CPU it recorded a stack trace each time, ~100x the cost).
    import random

    import numpy as np
    import webdataset as wds
    def epoch(transform):
        torch.manual_seed(5)  # the loop's state (torch's DataLoader draws its base seed from it)
        random.seed(6)
        np.random.seed(7)
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() \
            else torch.cuda._lazy_seed_tracker.get_calls()
        out = [images for images, _ in wdsfilter.loader(shards, batch_size=8, transform=transform, seed=11)]
        cuda_after = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() \
            else torch.cuda._lazy_seed_tracker.get_calls()
        assert (all(torch.equal(a, b) for a, b in zip(cuda_after, cuda)) if torch.cuda.is_initialized()
                else cuda_after == cuda)
        return out, (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())

    plain, loop_state = epoch(to_tensor)
    got, after = epoch(draws)
    got = torch.cat(got)
    assert len(got) == 40
    for k in (0, 1, 39):
        seed = wds.utils.make_seed(11, 0, 0, 0, k + 1)
        rng = torch.Generator().manual_seed(seed)
        want = [torch.rand(1, generator=rng).item(), random.Random(seed).random(), np.random.RandomState(seed).rand()]
        assert got[k].tolist() == want
    assert torch.equal(after[0], loop_state[0]) and after[1] == loop_state[1] and (after[2] == loop_state[2]).all()


def test_without_workers_samples_are_made_at_one_thread_and_the_loop_keeps_its_count(shards):
    # num_workers=0: the samples are made at one torch thread, as in a DataLoader worker, and stacked
    # into a batch at the loop's count; the loop's count is given back before the loop sees the
    # batch. The loop's draws between batches are those it would draw with no loader drawing at all.
    import random

    import numpy as np
    seen_threads = []

    def drawing(img):
        seen_threads.append(torch.get_num_threads())
        return draws(img)

    collating_threads = []

    def collate(samples):  # the batch's one large copy is made at the loop's count
        collating_threads.append(torch.get_num_threads())
        return torch.stack([image for image, _ in samples])

    def loop(transform):
        torch.manual_seed(5)
        random.seed(6)
        np.random.seed(7)
        threads_between, loop_draws = [], []
        for _batch in wdsfilter.loader(shards, batch_size=8, transform=transform, seed=11, collate_fn=collate):
            threads_between.append(torch.get_num_threads())
            loop_draws.append((torch.rand(1).item(), random.random(), np.random.rand()))
        return loop_draws, threads_between

    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        quiet, _ = loop(to_tensor)
        drawn, threads_between = loop(drawing)
    finally:
        torch.set_num_threads(threads)
    assert len(drawn) == 5 and drawn == quiet
    assert threads_between == [3] * 5 and seen_threads == [1] * 40 and collating_threads == [3] * 10


def test_without_workers_a_drawing_tokenizer_and_collate_draw_anew_each_batch_the_same_each_run(shards):
    # The pipeline's generators in the loop's process are its own and continue from batch to batch,
    # as a worker's do (seeded per epoch): a tokenizer or collate_fn that draws, with no transform
    # seeding per sample, gets new draws each batch (given the loop's state back after each batch,
    # they repeated the first batch's), the same on every run, and the loop's draws are its own.
    import random

    import numpy as np

    def tokenizer(text):
        return torch.tensor([random.randrange(1 << 30), int(np.random.randint(1 << 30)), torch.randint(1 << 30, ()).item()])

    def mixup(samples):
        return float(np.random.beta(0.4, 0.4)), len(samples)

    def loop(loop_draws: bool = False, **options):
        torch.manual_seed(5)
        random.seed(6)
        np.random.seed(7)
        got, drawn = [], []
        for batch in wdsfilter.loader(shards, batch_size=8, seed=11, **options):
            got.append(batch)
            if loop_draws:  # a loop that draws between batches moved the state the batches started from
                drawn.append((torch.rand(1).item(), random.random(), np.random.rand()))
        return got, drawn

    first, _ = loop(tokenizer=tokenizer)
    again, _ = loop(tokenizer=tokenizer)
    tokens = torch.cat([captions for _, captions in first])
    assert tokens.shape == (40, 3) and len({tuple(t.tolist()) for t in tokens}) == 40
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, again))
    mixes, _ = loop(collate_fn=mixup)
    assert [n for _, n in mixes] == [8] * 5 and len({m for m, _ in mixes}) == 5
    assert loop(loop_draws=True, tokenizer=tokenizer)[1] == loop(loop_draws=True)[1]


def test_a_pipeline_iterated_bare_gives_the_loop_its_generators_back_after_each_sample(shards):
    # Iterated without the loader's batches (loader.pipeline, in the loop's process), the transform's
    # per-sample seeding still gives the loop's generators back.
    import random

    import numpy as np
    loader = wdsfilter.loader(shards, batch_size=8, transform=draws, seed=11)
    torch.manual_seed(5)
    random.seed(6)
    np.random.seed(7)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    batch, _, _ = next(iter(loader.pipeline))
    assert batch[0].shape == (8, 3) and len({tuple(x.tolist()) for x in batch[0]}) == 8
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()


class _CollateInWorker(torch.utils.data.IterableDataset):
    def __iter__(self):
        from wdsfilter.stream.collate import collate_tuples
        images, captions = collate_tuples([(torch.ones(3, 4, 4), "a"), (torch.zeros(3, 4, 4), "b")])
        mixed, = collate_tuples([(torch.ones(2, dtype=torch.uint8),), (torch.full((2,), 0.5),)])
        yield images.is_shared(), images.sum().item(), captions, mixed


def test_batches_are_stacked_into_shared_memory_in_a_worker_as_webdatasets_values():
    # In a DataLoader worker the batch's tensors are stacked straight into shared memory (torch's
    # default_collate), so sending the batch copies nothing; the values are webdataset's.
    import numpy as np
    import webdataset as wds

    from wdsfilter.stream.collate import collate_tuples
    (shared, total, captions, mixed), = list(torch.utils.data.DataLoader(_CollateInWorker(), batch_size=None,
                                                                        num_workers=1))
    assert shared and total == 48 and captions == ["a", "b"]
    assert mixed.dtype == torch.float32 and mixed.tolist() == [[1, 1], [0.5, 0.5]]  # promoted, as webdataset's stack
    samples = [(torch.ones(2), "a", 1, np.zeros(2), 1.5), (torch.zeros(2), "b", 2, np.ones(2), 2.5)]
    ours, theirs = collate_tuples(samples), wds.filters.default_collation_fn(samples)
    assert isinstance(ours, tuple) and [type(x) for x in ours] == [type(x) for x in theirs]
    assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1]
    assert all(np.array_equal(a, b) for a, b in zip(ours[2:], theirs[2:]))
    with pytest.raises(AssertionError, match="shapes must be equal"):
        collate_tuples([(torch.ones(2),), (torch.ones(3),)])


def _batch_of(samples, size, memory=None):
    """What the loader's batching makes of `samples` (stream/collate.py's TupleBatch)."""
    from wdsfilter.stream.collate import BatchMemory, TupleBatch, collate_tuples
    from wdsfilter.stream.pipeline import Place
    batch = TupleBatch(size, collate_tuples, memory or BatchMemory(Place()))
    for sample in samples:
        batch.add(sample)
    return batch.finish()


def _same_batches(ours, theirs) -> bool:
    import numpy as np
    if type(ours) is not type(theirs) or len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b) or not a.is_contiguous():
                return False
        elif isinstance(a, np.ndarray):
            if a.dtype != b.dtype or not np.array_equal(a, b):
                return False
        elif a != b:
            return False
    return True


def test_batches_made_as_samples_come_are_collate_tuples_batches():
    # Each tensor is copied into its row as its sample comes; the batch is what collate_tuples (and
    # webdataset's default_collation_fn) makes of the same samples, whatever the samples hold.
    import numpy as np
    import webdataset as wds

    from wdsfilter.stream.collate import collate_tuples
    g = torch.Generator().manual_seed(0)

    def sample(i, image=None, tokens=None):
        return (torch.rand(3, 5, 4, generator=g) if image is None else image,
                torch.randint(0, 9, (7,), generator=g) if tokens is None else tokens, f"caption {i}", i, i / 2)

    cases = {
        "same shapes": [sample(i) for i in range(6)],
        "a non-contiguous image": [sample(0), sample(1, image=torch.rand(5, 4, 3, generator=g).permute(2, 0, 1))]
        + [sample(i) for i in range(2, 6)],
        "a dtype that differs mid-batch": [sample(i) for i in range(3)] + [sample(3, tokens=torch.ones(7))]
        + [sample(i) for i in range(4, 6)],
        "arrays, not tensors": [(np.full(3, i), f"c{i}") for i in range(6)],
        "tensors that need grad": [(torch.ones(2, requires_grad=True) * i, i) for i in range(6)],
        "a tensor subclass (a torchvision v2 transform's)": [(_tv_image(i), torch.ones(2) * i) for i in range(6)],
    }
    for name, samples in cases.items():
        theirs = collate_tuples(samples)
        assert _same_batches(_batch_of(samples, 6), theirs), name
        assert _same_batches(theirs, wds.filters.default_collation_fn(samples)) or name == "tensors that need grad"
    mixed = _batch_of(cases["a dtype that differs mid-batch"], 6)[1]
    assert mixed.dtype == torch.float32 and mixed[3].tolist() == [1.0] * 7  # promoted, as webdataset's stack
    short = cases["same shapes"][:4]  # the last batch of an epoch: stacked at its own size
    assert _same_batches(_batch_of(short, 6), collate_tuples(short))
    assert _batch_of(short, 6)[0].untyped_storage().nbytes() == 4 * 3 * 5 * 4 * 4
    with pytest.raises(AssertionError, match="shapes must be equal"):
        _batch_of([sample(0), sample(1, image=torch.ones(3, 5, 5))], 2)
    with pytest.raises(AssertionError, match="keys don't match"):
        _batch_of([sample(0), sample(1)[:2]], 2)


def test_a_sample_tensor_is_let_go_as_soon_as_it_is_in_its_batch(shards):
    # The batch holds its samples' tensors no longer than their copy: at most one image tensor of
    # the batch is alive at a time (stacking at the end held all of them beside the stack).
    import gc
    import weakref
    alive, most = [0], [0]

    def gone():
        alive[0] -= 1

    def transform(img):
        out = to_tensor(img)
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        weakref.finalize(out, gone)
        return out
    for num_workers in (0, 1):
        alive[0] = most[0] = 0
        gc.disable()  # freed by their count of references, as they are: no collector run helps
        try:
            batches = list(wdsfilter.loader(shards, batch_size=8, transform=transform, num_workers=num_workers,
                                            persistent_workers=False))
        finally:
            gc.enable()
        assert [len(b[1]) for b in batches] == [8] * 5
        if num_workers == 0:  # (a worker's counts stay in the worker)
            assert most[0] <= 2 and alive[0] == 0


def _tv_image(i):
    from torchvision import tv_tensors
    return tv_tensors.Image(torch.full((3, 4, 4), float(i)))


class _BatchInWorker(torch.utils.data.IterableDataset):
    def __iter__(self):
        from wdsfilter.stream.collate import BatchMemory, TupleBatch, collate_tuples
        from wdsfilter.stream.pipeline import Place
        place = Place()
        place.start()  # a DataLoader worker's pass
        batch = TupleBatch(2, collate_tuples, BatchMemory(place))
        batch.add((torch.ones(3, 4, 4), _tv_image(1), "a"))
        batch.add((torch.zeros(3, 4, 4), _tv_image(2), "b"))
        images, v2_images, captions = batch.finish()
        yield place.in_worker, images.is_shared(), v2_images.is_shared(), images.sum().item(), captions


def test_a_workers_batch_is_made_in_shared_memory():
    # In a DataLoader worker the batch's tensors are made in shared memory, as torch's default_collate
    # makes them there (a tensor subclass, such as a torchvision v2 transform's tv_tensors.Image,
    # too): sending the batch copies nothing.
    (in_worker, shared, v2_shared, total, captions), = list(
        torch.utils.data.DataLoader(_BatchInWorker(), batch_size=None, num_workers=1))
    assert in_worker and shared and v2_shared and total == 48 and captions == ["a", "b"]


def test_without_workers_batch_memory_is_made_ready_by_a_helper_thread_that_draws_nothing():
    # In the loop's process (a loader without workers) the next batch's tensor is allocated and
    # its pages touched by a helper thread while this batch is made; it draws no random number,
    # and a copy of the stage (pickled into a worker) takes no thread or tensor with it.
    import pickle
    import random
    import threading

    from wdsfilter.stream.collate import BatchMemory
    from wdsfilter.stream.pipeline import Place
    place = Place()
    place.guarded = True  # as TrainingLoopState sets it
    memory = BatchMemory(place)
    like = torch.zeros(3, 8, 8)
    torch.manual_seed(1)
    random.seed(1)
    before = torch.get_rng_state(), random.getstate()
    first = memory.empty(0, (4, 3, 8, 8), like)
    prepared = memory._ready[0][1].result()  # the helper's, for the next batch
    second = memory.empty(0, (4, 3, 8, 8), like)
    assert second is prepared and second.shape == (4, 3, 8, 8) and second.dtype == torch.float32
    assert first.data_ptr() != second.data_ptr()
    assert any(t.name.startswith("wdsfilter-batch-memory") for t in threading.enumerate())
    other = memory.empty(0, (2, 3, 8, 8), like)  # another shape: a tensor of its own, not the one prepared
    assert other.shape == (2, 3, 8, 8) and other.data_ptr() != memory._ready[0][1].result().data_ptr()
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    copy = pickle.loads(pickle.dumps(memory))
    assert copy._ready == {} and copy._pool is None and copy.place.guarded


_ONE_BATCH_THEN_EXIT = """
import sys
import torchvision.transforms as T
import wdsfilter
loader = wdsfilter.loader(sys.argv[1:], batch_size=4, num_workers=0,
                          transform=T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))
epoch = iter(loader)
next(epoch)
print("one batch")
"""


_AN_EPOCH_AT_EXIT = """
import atexit, sys
import torchvision.transforms as T
import wdsfilter
loader = wdsfilter.loader(sys.argv[1:], batch_size=4, num_workers=0,
                          transform=T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()]))
# Run once the main thread has ended (thread pools are shut down by then), as a loop in a thread
# the main thread left running would be.
atexit.register(lambda: print("samples", sum(len(captions) for _, captions in loader)))
"""


def test_a_loader_without_workers_still_gives_its_batches_after_the_main_thread_ended(tmp_path):
    # The helper that prepares batch memory is gone then: the batches are made without it.
    import subprocess
    import sys
    urls = [write_shard(tmp_path / f"s{i}.tar", image_text_members(6, start=100 * i)) for i in range(2)]
    done = subprocess.run([sys.executable, "-c", _AN_EPOCH_AT_EXIT, *urls], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "samples 12", done.stderr


def test_a_script_that_leaves_an_epoch_open_exits_without_tracebacks(tmp_path):
    # A loop that breaks out of an epoch (without workers) and ends: the shard readers are closed
    # while the modules are still there. Left to the interpreter's teardown they printed
    # "Exception ignored in: <generator object tar_members ...>" tracebacks from their cleanup.
    import subprocess
    import sys
    urls = [write_shard(tmp_path / f"s{i}.tar", image_text_members(300, start=1000 * i)) for i in range(2)]
    done = subprocess.run([sys.executable, "-c", _ONE_BATCH_THEN_EXIT, *urls], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "one batch", done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_the_shuffle_buffer_holds_samples_undecoded(tmp_path):
    # Decoded before the shuffle, the buffer held min(shuffle, 1000) decoded images (open_clip's 5000
    # of 512 px: GBs per worker) and the first batch waited for them all; decoded after it, as
    # open_clip's pipeline decodes, the first batch decodes its own samples only.
    urls = [write_shard(tmp_path / f"u{i}.tar", image_text_members(20, start=100 * i)) for i in range(2)]
    loader = wdsfilter.loader(urls, batch_size=4, shuffle=30, seed=1, output="dict")
    it = iter(loader)
    first = next(it)
    assert len(first) == 4 and all(hasattr(s["image"], "size") for s in first)  # decoded PIL images
    assert loader.pipeline.place.decodes == 4
    assert sum(len(b) for b in it) == 36 and loader.pipeline.place.decodes == 40
