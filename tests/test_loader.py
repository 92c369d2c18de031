"""wdsfilter.loader: DataLoader batches, worker splitting, misconfiguration errors, worker stats."""
import pytest
import torch

import wdsfilter
from shardkit import image_bytes, image_text_members, write_shard
from wdsfilter import ConfigError


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
    from wdsfilter.errors import StarvationError
    shard = write_shard(tmp_path / "small-000000.tar", image_text_members(5))
    with pytest.raises(StarvationError, match=r"5 sample\(s\) came out, fewer than batch_size=8.*drop_last=False"):
        list(wdsfilter.loader([shard], batch_size=8, drop_last=True))
    assert sum(len(b[1]) for b in wdsfilter.loader([shard], batch_size=8)) == 5  # a partial batch is fine


def test_a_later_empty_epoch_raises_with_persistent_workers(tmp_path):
    # Persistent workers keep their counts across epochs: the check must be of this epoch, not of
    # the loader's life. Between epochs the shard is replaced by what a clone without `git lfs pull` leaves.
    from wdsfilter.errors import StarvationError
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
