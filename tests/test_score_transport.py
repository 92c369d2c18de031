"""Prepared inputs cross processes with all their tensors in one shared buffer (transport.py):
the round trip gives back equal tensors, of every dtype and shape, and leaves everything else as
it was; through a real DataLoader worker and a real model-worker queue too."""
import collections
import pickle

import numpy as np
import torch
import torch.multiprocessing as mp

from wdsfilter.score.transport import Packed, pack, unpack

Pair = collections.namedtuple("Pair", "left right")


def items():
    frames = np.arange(24, dtype=np.uint8).reshape(2, 2, 2, 3)
    return [{"__key__": f"k{i}", "__url__": "a.tar",
             "inputs": {"clip": {"image": torch.rand(3, 5, 7), "tokens": torch.arange(9) + i,
                                 "truncated": bool(i % 2)},
                        "other": Pair(torch.tensor([True, False]), torch.zeros(0, 4, dtype=torch.float16)),
                        "ocr": frames},
             "errors": {}} for i in range(3)] + [{"__marker__": "shard_end", "__url__": "a.tar"}]


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, Packed):
        return tensors_in(obj.data) + tensors_in(obj.buffer)
    if isinstance(obj, dict):
        return sum(tensors_in(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensors_in(v) for v in obj)
    return 0


def test_round_trip_keeps_values_dtypes_shapes_and_everything_else():
    original = items()
    packed = pack(original)
    assert isinstance(packed, Packed) and tensors_in(packed) == 1  # one buffer instead of 12 tensors
    assert same(unpack(pickle.loads(pickle.dumps(packed))), original)
    back = unpack(packed)
    assert same(back, original)
    assert back[0]["inputs"]["ocr"] is original[0]["inputs"]["ocr"]  # numpy is left alone


def test_nothing_to_pack_is_left_as_is():
    one = [{"x": torch.ones(2)}, "text"]
    assert pack(one) is one and unpack(one) is one
    assert unpack(pack([])) == []


def _echo(inbox, outbox):
    outbox.put(inbox.get())
    inbox.get()  # stay alive until the parent took the buffer (it is handed over by this process)


def test_a_packed_chunk_crosses_a_process_boundary():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_echo, args=(inbox, outbox))
    proc.start()
    try:
        original = items()
        inbox.put(pack(original))
        assert same(unpack(outbox.get(timeout=60)), original)
    finally:
        inbox.put("done")
        proc.join(timeout=30)


def test_chunks_from_dataloader_workers_unpack_to_the_prepared_items(tmp_path):
    from shardkit import image_text_members, write_shard
    from wdsfilter.config import StageConfig
    from wdsfilter.pipeline import sample_pipeline
    from wdsfilter.score.prepare import Chunk, Prepare, keep_as_is
    from wdsfilter.tally import Tally
    from scorekit import BrightnessScorer

    url = write_shard(tmp_path / "a.tar", image_text_members(10))
    cfg = StageConfig(caption_key="txt")
    pipeline = sample_pipeline([url], cfg, Tally(), extra=[Prepare([BrightnessScorer()])])
    pipeline.append(Chunk(4))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=1, collate_fn=keep_as_is)
    got = [item for chunk in loader for item in unpack(chunk)]
    direct = list(sample_pipeline([url], cfg, Tally(), extra=[Prepare([BrightnessScorer()])]))
    assert same(got, direct)
