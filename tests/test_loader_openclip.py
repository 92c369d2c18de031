"""wdsfilter.loader as a drop-in for OpenCLIP's training loop: open_clip_train's own
train_one_epoch, its own argument parser, loss and scheduler, runs one epoch of the tiny model on
json-caption shards through wdsfilter.loader, sized by the sizes.json that `wdsfilter validate
--stats-dir` writes beside them (as open_clip's get_dataset_size reads it).

The model is the tiny architecture of tools/make_tiny_clip.py (the `tiny_clip` fixture's) with
fresh weights: the loop and the loader are under test, not what the weights learnt, and the
trained fixture costs minutes of CPU on a machine where it is not cached yet."""
import inspect
import logging
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
train_mod = pytest.importorskip("open_clip_train.train")
from open_clip_train.data import DataInfo  # noqa: E402
from open_clip_train.params import parse_args  # noqa: E402
from open_clip_train.scheduler import cosine_lr  # noqa: E402

import wdsfilter  # noqa: E402
from wdsfilter.core.errors import StarvationError  # noqa: E402
from tools import make_tiny_clip  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = os.path.join(REPO, "sample_shards", "json-captions-000000.tar")  # 32 samples, caption in json "description"


@pytest.fixture()
def json_shards(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(2):
        shutil.copy(SHARD, folder / f"part-{i:06d}.tar")
    report = validate(str(folder), caption_key="json:description", jobs=1, stats_dir=str(folder))
    assert report.passed and report.samples == 64
    return str(folder)


class _TrainLog:
    """What open_clip's training loop reports through `logging.info` (its module's name for the
    logging module), recorded here rather than through the root logger's handlers: in a full
    xdist run those received no record from this test twice (root logger at INFO, not disabled,
    no filter), though the same run alone did."""

    def __init__(self):
        self.lines = []

    def info(self, msg, *args, **kwargs):
        self.lines.append(msg % args if args else str(msg))
        logging.info(msg, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(logging, name)


def test_open_clip_train_one_epoch_through_wdsfilter_loader(json_shards, tmp_path, monkeypatch):
    tiny = str(tmp_path / "tiny-clip")
    make_tiny_clip.write_config(tiny)  # the tiny architecture, no weights
    torch.manual_seed(0)
    # As open_clip_train.main creates it (output_dict=True: the loss reads a dict).
    model, preprocess, _ = open_clip.create_model_and_transforms("local-dir:" + tiny, output_dict=True)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny)
    args = parse_args(["--batch-size", "8", "--workers", "2", "--lr", "1e-3", "--epochs", "1", "--warmup", "1",
                       "--log-every-n-steps", "1", "--precision", "fp32"])
    # What open_clip_train.main sets after parsing (init_distributed_device, report_to).
    args.device, args.rank, args.local_rank, args.world_size, args.distill = "cpu", 0, 0, 1, False
    args.wandb = False

    loader = wdsfilter.loader(json_shards, caption_key="json:description", transform=preprocess,
                              tokenizer=tokenizer, batch_size=args.batch_size, num_workers=args.workers,
                              pin_memory=False, prefetch_factor=2)
    # From sizes.json: 64 samples, 8 global batches, 4 per worker (open_clip's own rule).
    assert (loader.num_samples, loader.num_batches, len(loader)) == (64, 8, 8)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, loader.num_batches * args.epochs)
    loss = open_clip.create_loss(args)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    steps = []
    train_log = _TrainLog()
    monkeypatch.setattr(train_mod, "logging", train_log)
    train_mod.train_one_epoch(model, {"train": DataInfo(loader)}, loss, 0, optimizer, None,
                              lambda step: (steps.append(step), scheduler(step)), None, args)
    assert steps == list(range(8))  # every batch of the epoch, as num_batches promised
    assert any("Train Epoch: 0 [64/64 (100%)]" in line for line in train_log.lines), train_log.lines
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert loader.stats.samples_out == 64 and not loader.stats.dropped


def test_loader_options_and_signatures(json_shards, tmp_path):
    sig = inspect.signature(wdsfilter.loader)
    for name in ("urls", "caption_key", "batch_size", "num_workers", "pin_memory", "prefetch_factor", "collate_fn",
                 "epoch_samples", "resampled"):
        assert name in sig.parameters, name
    assert "cfg" in inspect.signature(wdsfilter.sample_pipeline).parameters
    assert "batch_size" in wdsfilter.loader.__doc__ or "num_samples" in wdsfilter.loader.__doc__

    # collate_fn gets the list of samples of a batch; epoch_samples beats sizes.json.
    seen = []

    def collate(samples):
        seen.append(len(samples))
        return [caption for _, caption in samples]
    loader = wdsfilter.loader(json_shards, caption_key="json:description", batch_size=5, collate_fn=collate,
                              epoch_samples=20, num_workers=0)
    batches = list(loader)
    assert (loader.num_samples, loader.num_batches) == (20, 4) and len(batches) == 4
    assert seen == [5, 5, 5, 5] and all(isinstance(c, str) for b in batches for c in b)
    # No sizes.json and no epoch_samples: unsized, as before.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(SHARD, bare / "x.tar")
    unsized = wdsfilter.loader(str(bare), caption_key="json:description", batch_size=8)
    assert unsized.num_samples is None and unsized.num_batches is None
    with pytest.raises(TypeError, match="sizes.json"):
        len(unsized)
    with pytest.raises(wdsfilter.ConfigError, match="prefetch_factor"):
        wdsfilter.loader(json_shards, prefetch_factor=0)


def test_resampled_starving_counts_distinct_shards_and_keeps_the_key_hint(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(SHARD, one / "x.tar")
    loader = wdsfilter.loader(str(one), batch_size=4, resampled=True, epoch_samples=64, starvation_samples=100,
                              starvation_seconds=0)  # caption key left at txt: every sample misses it
    with pytest.raises(StarvationError) as info:
        list(loader)
    message = str(info.value)
    assert "from 1 shard(s) (opened" in message and "times: resampled)" in message
    assert "use --caption-key json:description" in message


def _open_clip_run(json_shards, tiny, epochs, checkpoint=None, save=None, restore_loader=True):
    """open_clip_train's loop as its main() drives it: train_one_epoch per epoch; with `save`, the
    checkpoint main() writes after an epoch, the loader's state beside the model's; with `checkpoint`,
    what main() reads on --resume. Returns the model's parameters."""
    torch.manual_seed(0)
    model, preprocess, _ = open_clip.create_model_and_transforms("local-dir:" + tiny, output_dict=True)
    tokenizer = open_clip.get_tokenizer("local-dir:" + tiny)
    args = parse_args(["--batch-size", "8", "--workers", "2", "--lr", "1e-3", "--epochs", "2", "--warmup", "1",
                       "--log-every-n-steps", "100", "--precision", "fp32"])
    args.device, args.rank, args.local_rank, args.world_size, args.distill, args.wandb = "cpu", 0, 0, 1, False, False
    loader = wdsfilter.loader(json_shards, caption_key="json:description", transform=preprocess, tokenizer=tokenizer,
                              batch_size=args.batch_size, num_workers=args.workers, shuffle=16, seed=args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, loader.num_batches * args.epochs)
    start_epoch = 0
    if checkpoint is not None:  # open_clip_train.main on --resume, and the one line the loader needs
        saved = torch.load(checkpoint, weights_only=True)
        start_epoch = saved["epoch"]
        model.load_state_dict(saved["state_dict"])
        optimizer.load_state_dict(saved["optimizer"])
        if restore_loader:
            loader.load_state_dict(saved["loader"])
    for epoch in range(start_epoch, epochs):
        train_mod.train_one_epoch(model, {"train": DataInfo(loader)}, open_clip.create_loss(args), epoch, optimizer,
                                  None, scheduler, None, args)
        if save:
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict()}, save)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_open_clip_resume_restores_the_loader_with_the_checkpoint(json_shards, tmp_path):
    # Epoch 1 shuffles its samples by (seed, epoch): a loader that starts over after --resume would give
    # epoch 0's order again. Saved with the checkpoint and restored, training goes on as if never stopped.
    tiny = str(tmp_path / "tiny-clip")
    make_tiny_clip.write_config(tiny)
    straight = _open_clip_run(json_shards, tiny, epochs=2)
    ckpt = str(tmp_path / "epoch_1.pt")
    _open_clip_run(json_shards, tiny, epochs=1, save=ckpt)
    resumed = _open_clip_run(json_shards, tiny, epochs=2, checkpoint=ckpt)
    assert all(torch.equal(straight[n], resumed[n]) for n in straight)
    # Without the loader's state, epoch 1 is read in epoch 0's order: another model.
    forgetful = _open_clip_run(json_shards, tiny, epochs=2, checkpoint=ckpt, restore_loader=False)
    assert not all(torch.equal(straight[n], forgetful[n]) for n in straight)


def test_a_training_loop_stopped_mid_epoch_resumes_to_the_same_weights(json_shards, tmp_path):
    """A loop that checkpoints every few steps (as torchtitan or Lightning do) and is killed between
    two of them: restored from the last checkpoint, it ends with the weights of a run never stopped."""
    tiny = str(tmp_path / "tiny-clip")
    make_tiny_clip.write_config(tiny)
    ckpt = str(tmp_path / "step.pt")

    def run(stop_after=None, resume=False):
        torch.manual_seed(0)
        model, preprocess, _ = open_clip.create_model_and_transforms("local-dir:" + tiny)
        loader = wdsfilter.loader(json_shards, caption_key="json:description", transform=preprocess,
                                  tokenizer=open_clip.get_tokenizer("local-dir:" + tiny), batch_size=8, num_workers=2,
                                  shuffle=16, seed=4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = open_clip.ClipLoss()
        step, epoch = 0, 0
        if resume:
            saved = torch.load(ckpt, weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            loader.load_state_dict(saved["loader"])
            step, epoch = saved["step"], loader.epoch
        while epoch < 2:
            for images, texts in loader:
                loss = loss_fn(*model(images, texts))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step % 3 == 0:  # the checkpoint, the loader's place in it
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "loader": loader.state_dict(), "step": step}, ckpt)
                if step == stop_after:
                    return None
            epoch += 1
        return step, {n: p.detach().clone() for n, p in model.named_parameters()}

    steps, straight = run()
    assert steps == 16  # 2 epochs of 8 batches
    run(stop_after=10)  # killed after step 10: the last checkpoint is step 9, mid-epoch 1
    steps, resumed = run(resume=True)
    assert steps == 16
    assert all(torch.equal(straight[n], resumed[n]) for n in straight)
