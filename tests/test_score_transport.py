"""Prepared inputs cross processes with all their tensors and numpy arrays in one shared buffer
(transport.py): the round trip gives back equal tensors and arrays, of every dtype and shape, and
leaves everything else as it was; through a real DataLoader worker and a real model-worker queue
too. The main process sends batches as slots and buffer handles: no pixel is copied or pickled
there, the model worker maps the decode worker's very buffer, and a run leaks no shared memory."""
import collections
import dataclasses
import os
import pickle
import re

import numpy as np
import psutil
import pytest
import torch
import torch.multiprocessing as mp

from wdsfilter.score.transport import Batch, Packed, TensorSlot, open_chunk, pack, unpack

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


@dataclasses.dataclass
class Frames:  # like the OCR scorer's OcrInput
    frames: np.ndarray
    media: str
    times: tuple = ()


def arrays_in(obj):
    if isinstance(obj, np.ndarray):
        return 1
    if dataclasses.is_dataclass(obj):
        return sum(arrays_in(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(arrays_in(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(arrays_in(v) for v in obj)
    return 0


def test_round_trip_keeps_values_dtypes_shapes_and_everything_else():
    original = items()
    packed = pack(original)
    assert isinstance(packed, Packed) and tensors_in(packed) == 1  # one buffer instead of 12 tensors
    assert arrays_in(packed.data) == 0 and packed.buffer.is_shared()  # numpy frames are slots too
    assert same(unpack(pickle.loads(pickle.dumps(packed))), original)
    back = unpack(packed)
    assert same(back, original)
    assert back[0]["inputs"]["ocr"].base is not None  # a view of the buffer


def test_numpy_arrays_of_every_kind_and_dataclasses_round_trip():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 9, 16, 3), dtype=np.uint8)
    data = [{"ocr": Frames(frames, "video", (0.0, 1.5, 3.0)),
             "f64": rng.random((2, 3)), "bool": np.array([True, False]), "empty": np.zeros((0, 5), np.float32),
             "strided": frames[:, ::2, ::-1], "big_endian": np.arange(5, dtype=">i4"),
             "strings": np.array(["a", "bc"]), "objects": np.array([None, 1], dtype=object)}]
    packed = pack(data)
    slots = packed.data[0]
    assert isinstance(slots["ocr"].frames, TensorSlot) and slots["ocr"].times == (0.0, 1.5, 3.0)
    assert isinstance(slots["strided"], TensorSlot) and isinstance(slots["big_endian"], TensorSlot)
    assert slots["strings"] is data[0]["strings"] and slots["objects"] is data[0]["objects"]  # pickled as they are
    back = unpack(pickle.loads(pickle.dumps(packed)))
    assert type(back[0]["ocr"]) is Frames and np.array_equal(back[0]["ocr"].frames, frames)
    for key in ("f64", "bool", "empty", "strided", "big_endian"):
        assert back[0][key].dtype == data[0][key].dtype and np.array_equal(back[0][key], data[0][key])
    assert data[0]["ocr"].frames is frames  # the original is not modified


def test_nothing_to_pack_keeps_the_structure():
    one = [{"x": "text", "n": 3}]
    packed = pack(one)
    assert packed.buffer is None and unpack(packed) == one
    assert unpack(pack([])) == [] and unpack(one) is one


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
    from wdsfilter.stream.config import StageConfig
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.transport import Chunk, Prepare, keep_as_is
    from wdsfilter.core.tally import Tally
    from scorekit import BrightnessScorer

    url = write_shard(tmp_path / "a.tar", image_text_members(10))
    cfg = StageConfig(caption_key="txt")
    pipeline = sample_pipeline([url], cfg, Tally(), extra=[Prepare([BrightnessScorer()])])
    pipeline.append(Chunk(4))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=1, collate_fn=keep_as_is)
    got = [item for chunk in loader for item in unpack(chunk)]
    direct = list(sample_pipeline([url], cfg, Tally(), extra=[Prepare([BrightnessScorer()])]))
    assert same(got, direct)


def _chunks_from_a_decode_worker(tmp_path, n=10, chunk=4, size=32):
    from shardkit import image_text_members, write_shard
    from wdsfilter.stream.config import StageConfig
    from wdsfilter.stream.pipeline import sample_pipeline
    from wdsfilter.score.transport import Chunk, Prepare, keep_as_is
    from wdsfilter.core.tally import Tally
    from scorekit import BrightnessScorer

    url = write_shard(tmp_path / "a.tar", image_text_members(n))
    pipeline = sample_pipeline([url], StageConfig(caption_key="txt"), Tally(), extra=[Prepare([BrightnessScorer(size)])])
    pipeline.append(Chunk(chunk))
    return list(torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=1, collate_fn=keep_as_is))


def _entries(chunks):
    """What the dispatcher holds per pending sample: (ref, inputs with slots, chunk buffer)."""
    out = []
    for chunk in chunks:
        items, buffer = open_chunk(chunk)
        out += [((item["__key__"], 0), item["inputs"], buffer) for item in items if "inputs" in item]
    return out


def test_a_batch_holds_slots_and_the_chunk_buffers_not_pixels(tmp_path):
    """The main process copies no pixel: the batch points into the buffers the decode worker
    wrote (the same shared memory), and its pickled items hold slots of a few hundred bytes."""
    chunks = _chunks_from_a_decode_worker(tmp_path, size=64)
    entries = _entries(chunks)
    batch = Batch.of(entries[2:9])  # spans three chunks of 4
    chunk_buffers = [c.buffer for c in chunks if c.buffer is not None]
    assert len(batch.buffers) == 3 and all(b.is_shared() for b in batch.buffers)
    assert {b.untyped_storage().data_ptr() for b in batch.buffers} <= {
        b.untyped_storage().data_ptr() for b in chunk_buffers}
    assert tensors_in(batch.items) == 0 and arrays_in(batch.items) == 0  # slots only
    pixels = 3 * 64 * 64
    assert len(pickle.dumps(batch.items)) < 7 * 600 < 7 * pixels // 20
    opened = batch.open()
    for (ref, inputs), (ref0, _slots, buffer) in zip(opened, entries[2:9]):
        assert ref == ref0 and inputs["bright"]["pixels"].shape == (3, 64, 64)
        # a view: the tensor lives in the chunk's buffer
        assert inputs["bright"]["pixels"].untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    direct = [item for chunk in chunks for item in unpack(chunk) if "inputs" in item]
    assert same([inputs for _, inputs in opened], [item["inputs"] for item in direct[2:9]])


def _open_and_write(inbox, outbox):
    batch = inbox.get()
    outbox.put([(ref, inputs["bright"]["pixels"].sum().item()) for ref, inputs in batch.open()])
    for buffer in batch.buffers:
        buffer[-1] = 77  # the parent sees this: the same memory, not a copy
    outbox.put("written")
    inbox.get()


def test_a_model_worker_maps_the_decode_workers_buffer(tmp_path):
    chunks = _chunks_from_a_decode_worker(tmp_path)
    entries = _entries(chunks)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_open_and_write, args=(inbox, outbox))
    proc.start()
    expected = [(ref, inputs["bright"]["pixels"].sum().item()) for ref, inputs in Batch.of(entries).open()]
    try:
        inbox.put(Batch.of(entries))
        assert outbox.get(timeout=60) == expected
        assert outbox.get(timeout=60) == "written"
        assert all(c.buffer[-1].item() == 77 for c in chunks if c.buffer is not None)
    finally:
        inbox.put("done")
        proc.join(timeout=30)


def _shared_memory_held():
    """The shared-memory files this process holds open or mapped (a chunk buffer is both: a
    `/dev/shm/torch_*` descriptor and its mapping). Only these, not every descriptor: a Ray driver
    or thread left by another test in this pytest process opens sockets and pipes of its own."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, or one closed since
            continue
        if target.startswith(("/dev/shm/", "/memfd:")):
            held.append(("fd", target))
    with open("/proc/self/maps") as maps:
        held += [("map", line.split(None, 5)[-1].strip()) for line in maps if " /dev/shm/" in line]
    return held


def _shm_entries(pids=None):
    """torch's shared-memory files in /dev/shm (named `torch_<pid>_...` by the process that made
    them); with pids, only those of these processes: the suite runs in parallel processes (xdist)
    whose own buffers come and go meanwhile."""
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {n for n in names if pids is None or (n.startswith("torch_") and n.split("_")[1] in pids)}


def test_a_run_with_model_workers_sends_no_pixels_and_leaks_no_shared_memory(tmp_path, monkeypatch):
    """Two runs through DataLoader workers and two model worker processes: every batch the main
    process sends holds slots and shared chunk buffers only (the pickled items are small); the
    main process ends holding no more shared memory than it had (every chunk buffer closed and
    unmapped) and /dev/shm holds nothing new."""
    import gc

    from scorekit import BrightnessScorer, make_shards
    from wdsfilter.score import score
    from wdsfilter.score.modelworker import ProcessPool

    urls, _ = make_shards(tmp_path / "shards", [20, 15])
    sent = []
    submit = ProcessPool.submit

    ours = {str(os.getpid())}  # this process and its decode and model workers (seen while they run)

    def spy(self, worker, batch_id, batch):
        ours.update(str(p.pid) for p in psutil.Process().children(recursive=True))
        assert isinstance(batch, Batch) and all(b.is_shared() for b in batch.buffers)
        assert tensors_in(batch.items) == 0 and arrays_in(batch.items) == 0
        sent.append((len(batch.items), len(pickle.dumps(batch.items))))
        return submit(self, worker, batch_id, batch)

    monkeypatch.setattr(ProcessPool, "submit", spy)

    def one(name):
        score(urls, out=str(tmp_path / name), scorers=[BrightnessScorer(size=32)], devices=["cpu", "cpu"],
              workers=1, batch_size=4, progress=False)
        gc.collect()

    one("warm")  # imports, the resource sharer's thread and its socket
    held, shm = _shared_memory_held(), _shm_entries()
    one("out")
    assert sum(n for n, _ in sent) == 2 * 35 and all(size < 600 * n for n, size in sent)  # 3x32x32 pixels: 3 KB
    assert len(_shared_memory_held()) <= len(held)
    assert not _shm_entries(ours) - shm


@pytest.mark.slow
def test_bench_dispatch_quick_ends_with_the_ratio(capsys):
    """tools/bench_dispatch.py --quick: the real engine with no-op CLIP and OCR models; the last
    line is the lowest ratio of dispatcher to decode samples/s per core."""
    pytest.importorskip("av")
    from tools import bench_dispatch
    out = bench_dispatch.main(["--quick"])
    assert set(out["kinds"]) == {"clip", "ocr"}
    for result in out["kinds"].values():
        assert result["dispatcher"]["rows"] > 0 and result["decode"]["rows"] > 0 and result["ratio"] > 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"ratio dispatcher / decode per core = \d+\.\d", last)
    assert float(last.rpartition("= ")[2]) == pytest.approx(out["ratio"], abs=0.05)


class FramesScorer:
    """numpy frames in a dataclass, as the OCR scorer prepares them; the score is their mean."""

    name = "frames"

    def columns(self):
        return ["frame_mean", "frame_shape"]

    def prepare(self, sample):
        img = np.asarray(sample["image"].convert("RGB"), dtype=np.uint8)
        return Frames(np.stack([img, 255 - img]), "image", (0.0, 1.0))

    def fetch(self):
        pass

    def load(self, device):
        pass

    def unload(self):
        pass

    def batch_key(self, prepared):
        return prepared.frames.shape[1:3]

    def score_batch(self, inputs):
        assert all(isinstance(x.frames, np.ndarray) and x.times == (0.0, 1.0) for x in inputs)
        return [{"frame_mean": float(x.frames.astype(np.float64).mean()), "frame_shape": list(x.frames.shape)}
                for x in inputs]

    def describe(self):
        return "frames"


def test_numpy_frames_score_the_same_through_model_worker_processes(tmp_path):
    from scorekit import make_shards
    from wdsfilter.score import score
    from wdsfilter.runfolder.tables import read_rows

    urls, _ = make_shards(tmp_path / "shards", [9, 6])

    def rows(name, **kw):
        score(urls, out=str(tmp_path / name), scorers=[FramesScorer()], progress=False, batch_size=4, **kw)
        folder = tmp_path / name / "scores"
        return sorted((r["key"], r["frame_mean"], list(r["frame_shape"]), r["status"])
                      for f in sorted(os.listdir(folder)) for r in read_rows(str(folder / f)))

    local = rows("local", device="cpu", workers=0)
    assert len(local) == 15 and all(r[3] == "scored" for r in local)
    assert rows("procs", devices=["cpu", "cpu"], workers=1) == local
