"""The scorers' inputs, from the decode worker to the model worker, without the main process
touching pixels. Two stages run in the DataLoader workers, appended to the sample pipeline:

    sample_pipeline(emit_rejects=True) -> Prepare(scorers) -> watch -> Chunk(n)

Prepare calls each scorer's prepare() on the decoded sample and keeps only what the model worker
needs (the PIL image and raw bytes stop there). Chunk groups items into lists so one inter-process
transfer carries many samples, and flushes at each shard end so a finished shard is not held back.

Each tensor and numpy array of a chunk is written once, in the decode worker, into one uint8
buffer allocated in shared memory (`pack`); a TensorSlot (offset, size, dtype, shape) takes its
place in the chunk. Nothing copies the pixels again until the model worker gathers its batch:

    decode worker   Chunk -> pack(items): Packed(items with slots, shared buffer)   the one write
    main process    Dispatcher: (ref, inputs with slots, chunk buffer) per pending sample;
                    Batch.of(pending[:size]) -> the model worker's queue: slots + buffer handles
    model worker    Batch.open() -> (ref, inputs) with tensors and arrays as views of the
                    buffers; the scorer's stack into its model batch is the one necessary copy

Why: PyTorch sends each tensor through a multiprocessing queue as its own shared-memory segment,
its file descriptor passed over a fresh socket connection (about half a millisecond per tensor),
and copies any tensor not yet in shared memory into a new segment; numpy arrays are pickled,
byte for byte, through the pipe. A buffer that is already shared is sent by handle: pickling it
again (main process -> model worker) copies nothing, so the main process only handles keys, rows
and slots: tools/bench_dispatch.py measures how many decode cores it can feed.

Lifetime: a chunk buffer lives while anything refers to it: the DataLoader's prefetched chunks,
the dispatcher's pending samples (dropped from the main process as soon as their batch is handed
to a model worker's queue) and the batches queued or being scored in the model workers. So at
most (decode workers x prefetch) + (chunks the <= 2 batches of pending samples come from) + (per
model worker, queue depth x the chunks each of its batches comes from: ceil(batch / chunk) + 1)
buffers are alive; a batch keeps whole chunks alive, so a model worker holds at most two partly
used chunks per batch beyond its samples. Memory is freed by the last process that unmaps it.
Sharing strategy: torch's default on Linux, file_descriptor, is kept (the code sets none): a
segment is unlinked at once, so nothing is left in /dev/shm when a process dies, and each live
buffer is one open descriptor per process that maps it: with the bounds above, about decode
workers x prefetch + a few per batch in flight, far below the usual limit of 1024 for up to
~100 decode workers. (file_system measured no faster here and can leave files behind.) A batch
waiting in a model worker's queue also holds a duplicate descriptor per buffer in the main
process until the worker takes it (multiprocessing's resource sharer).

Anything that is not a CPU tensor or a numeric numpy array (strings, flags, timestamps) stays in
the structure and is pickled with it; dicts, lists, tuples, named tuples and dataclasses (the
OCR scorer's OcrInput) are walked.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..core.errors import DataError
from ..core.markers import MARKER, SHARD_END
from .rows import TEXT, sample_text
from .scorers.base import NOTES, Noted, pixel_reader
from ..media.images import FULL_SIZE, decode_image, draft_scale
from ..stream.stages import IMAGE_BYTES

_ALIGN = 64  # every slot starts on a 64-byte boundary, so any dtype can view it


class Prepare:
    """Picklable stage: sample -> {"__key__", "__url__", "inputs": {scorer: input}, "errors":
    {scorer: (reason, message)}, "text": the row's caption, url, uid (rows.sample_text)} (and errors[NOTES]: {scorer: (reason, message)} of inputs
    prepare() returned as Noted, scored from incomplete data). A DataError from prepare() is the sample's reason; any other
    exception costs that sample alone (reason prepare_error, transient: `--retry-failed` tries it
    again), unless the scorer has failed on the first MAX_FAILURES samples and prepared none:
    that is a bug in the scorer, and it raises, naming the sample."""

    MAX_FAILURES = 8  # as the back-off's limit on score_batch (backoff.Backoff)

    def __init__(self, scorers: Sequence, stage=None):
        """stage: the scoring stage config (ScoreConfig.scoring_stage_config): a JPEG decoded once at
        the scale every scorer can use is decoded again, from its bytes, at the scale a scorer
        would get alone where that differs (OwnPixels), so a scorer's scores do not depend on
        which other scorers share the pass."""
        self.scorers = list(scorers)
        self.own = OwnPixels(stage, scorers) if stage is not None else None
        self.prepared: Dict[str, int] = {}  # per scorer, in this decode worker
        self.failures: Dict[str, int] = {}

    def __call__(self, data: Iterable[dict]) -> Iterator[dict]:
        for sample in data:
            if MARKER in sample:
                yield sample
                continue
            inputs: Dict[str, Any] = {}
            errors: Dict[str, Any] = {}
            notes: Dict[str, Tuple[str, str]] = {}
            own = self.own.images(sample) if self.own is not None else {}
            for scorer in self.scorers:
                try:
                    mine = own.get(scorer.name)
                    prepared = scorer.prepare(sample if mine is None else {**sample, "image": mine})
                    if isinstance(prepared, Noted):  # scored from incomplete data: the row says so
                        notes[scorer.name] = (prepared.reason, prepared.message)
                        prepared = prepared.input
                    inputs[scorer.name] = prepared
                    self.prepared[scorer.name] = self.prepared.get(scorer.name, 0) + 1
                except DataError as e:
                    errors[scorer.name] = (e.reason, str(e))
                except Exception as e:  # noqa: BLE001 - one sample's, unless the scorer fails on everything
                    where = f"in {scorer.name}.prepare on sample {sample.get('__key__')!r} of shard {sample.get('__url__')}"
                    self.failures[scorer.name] = self.failures.get(scorer.name, 0) + 1
                    if not self.prepared.get(scorer.name) and self.failures[scorer.name] >= self.MAX_FAILURES:
                        raise type(e)(f"{e} ({where}; it failed on the first {self.MAX_FAILURES} samples and "
                                      f"prepared none: a bug in the scorer, not bad data)") from e
                    errors[scorer.name] = ("prepare_error", f"{type(e).__name__}: {e}"[:500])
            if notes:
                errors[NOTES] = notes
            yield {"__key__": sample["__key__"], "__url__": sample["__url__"], "inputs": inputs, "errors": errors,
                   TEXT: sample_text(sample)}


class OwnPixels:
    """The image each scorer would be given alone. The decode stage decodes a JPEG once, at the
    DCT scale every scorer of the run can use (fastdecode.combine_floors: the largest floor);
    alone, a scorer with a smaller floor would be decoded at a smaller scale, and its pixels (so
    its scores) would differ: adding --scorer hash changed clip_score by up to 0.002 on the sample
    shards. Such a scorer gets the image decoded again from the member's bytes (kept by the
    decode stage: StageConfig.keep_image_bytes) at its own scale; one decode per distinct scale."""

    def __init__(self, stage, scorers: Sequence):
        self.stage = stage
        # A scorer that reads no pixels (caption, size, aesthetic, tmars) needs no image of its own.
        self.floors = {s.name: getattr(s, "decode_floor", lambda: None)() for s in scorers if pixel_reader(s)}

    def images(self, sample: dict) -> Dict[str, Any]:
        """{scorer name: its own image} for the scorers whose scale differs from the shared decode's."""
        image, data = sample.get("image"), sample.get(IMAGE_BYTES)
        stage = self.stage
        # only a JPEG is decoded at a reduced scale (draft mode)
        if image is None or not isinstance(data, (bytes, bytearray)) or not data.startswith(b"\xff\xd8") \
                or stage.decode_floor is None or not hasattr(image, "info"):
            return {}
        full = image.info.get(FULL_SIZE, image.size)
        shared = draft_scale(full, stage.decode_floor)
        out: Dict[str, Any] = {}
        by_scale: Dict[int, Any] = {shared: image}
        for name, floor in self.floors.items():
            scale = draft_scale(full, floor) if floor is not None else 1
            if scale == shared:
                continue
            if scale not in by_scale:
                try:
                    by_scale[scale] = decode_image(data, stage.max_pixels, stage.max_side, stage.oversize,
                                                   stage.image_mode, floor)
                except Exception:  # noqa: BLE001 - it decoded once already: this scorer keeps the shared image
                    by_scale[scale] = image
            out[name] = by_scale[scale]
        return out


class Chunk:
    """Picklable stage: items -> transport.Packed chunks of up to `size` items, cut after every
    shard end, their tensors and arrays in one shared buffer (the dispatcher forwards slots into
    it; model workers view it: transport.Batch)."""

    def __init__(self, size: int):
        self.size = max(1, int(size))

    def __call__(self, data: Iterable[dict]) -> Iterator[Any]:
        buf: List[dict] = []
        for item in data:
            buf.append(item)
            if len(buf) >= self.size or item.get(MARKER) == SHARD_END:
                yield pack(buf)
                buf = []
        if buf:
            yield pack(buf)


def keep_as_is(item):
    """DataLoader collate_fn: leave scorer inputs exactly as prepare() made them."""
    return item


class TensorSlot(NamedTuple):
    offset: int
    nbytes: int
    dtype: str  # torch dtype name ("uint8"), or a numpy dtype string ("<f4") when `array`
    shape: Tuple[int, ...]
    array: bool = False  # a numpy array before packing: a numpy view after


class Packed:
    """A picklable chunk: the original structure with TensorSlots, and its shared buffer (None
    when it held no array)."""

    __slots__ = ("data", "buffer")

    def __init__(self, data, buffer):
        self.data = data
        self.buffer = buffer

    def __reduce__(self):
        return (Packed, (self.data, self.buffer))


class Batch:
    """What a model worker gets: per item (ref, inputs with slots, index of its buffer or -1) and
    the chunk buffers they point into. Pickled by torch's queues, the buffers (already in shared
    memory) travel as handles: a batch's message is a few hundred bytes per sample."""

    __slots__ = ("items", "buffers")

    def __init__(self, items: List[tuple], buffers: List[Any]):
        self.items = items
        self.buffers = buffers

    def __reduce__(self):
        return (Batch, (self.items, self.buffers))

    @classmethod
    def of(cls, entries) -> "Batch":
        """entries: (ref, inputs with slots, chunk buffer or None) as the dispatcher holds them."""
        buffers: List[Any] = []
        index: Dict[int, int] = {}
        items = []
        for ref, inputs, buffer in entries:
            k = -1
            if buffer is not None:
                k = index.get(id(buffer), -1)
                if k < 0:
                    k = index[id(buffer)] = len(buffers)
                    buffers.append(buffer)
            items.append((ref, inputs, k))
        return cls(items, buffers)

    def open(self) -> List[Tuple[Any, Any]]:
        """(ref, inputs) per item, its tensors and arrays views of the buffers (no copy)."""
        return [(ref, inputs if k < 0 else _views(inputs, self.buffers[k])) for ref, inputs, k in self.items]


def open_items(batch) -> List[Tuple[Any, Any]]:
    """A model worker's (ref, inputs) items from a Batch (or from a plain list of them)."""
    return batch.open() if isinstance(batch, Batch) else batch


def open_chunk(chunk) -> Tuple[list, Optional[Any]]:
    """(items with slots, their buffer) of a chunk from a decode worker; a chunk that was never
    packed (a plain list) has no buffer."""
    if isinstance(chunk, Packed):
        return chunk.data, chunk.buffer
    return chunk, None


def walk_leaves(obj, fn):
    """Apply fn to every leaf inside dicts, lists, tuples (named too) and dataclass instances (an
    OcrInput); a TensorSlot is a leaf too."""
    if isinstance(obj, TensorSlot):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: walk_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [walk_leaves(v, fn) for v in obj]
    if isinstance(obj, tuple):
        values = [walk_leaves(v, fn) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            new = walk_leaves(value, fn)
            if new is not value:
                object.__setattr__(out, f.name, new)
        return out
    return fn(obj)


def _is_array(obj) -> bool:
    import numpy as np
    return isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc" and not obj.dtype.hasobject


def shared_buffer(nbytes: int):
    """A uint8 tensor of `nbytes` allocated in shared memory (pickled by handle from the start)."""
    import torch
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))


def pack(data, allocate: Callable[[int], Any] = None) -> Packed:
    """`data` with its CPU tensors and numeric numpy arrays written into one buffer: a uint8
    tensor from allocate(nbytes), by default in shared memory (the Ray runner's payload column
    allocates a plain one: payload.py)."""
    import torch

    leaves: List[Any] = []

    def collect(obj):
        if (isinstance(obj, torch.Tensor) and obj.device.type == "cpu") or _is_array(obj):
            leaves.append(obj)
        return obj

    walk_leaves(data, collect)
    if not leaves:
        return Packed(data, None)
    offsets: Dict[int, int] = {}
    total = 0
    for x in leaves:
        if id(x) not in offsets:
            offsets[id(x)] = total
            total += -(-int(x.nbytes) // _ALIGN) * _ALIGN
    buffer = (allocate or shared_buffer)(max(total, 1))
    raw = buffer.numpy()

    def place(obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            offset, nbytes = offsets[id(obj)], obj.nelement() * obj.element_size()
            buffer[offset:offset + nbytes].view(obj.dtype).view(obj.shape).copy_(obj)
            return TensorSlot(offset, nbytes, str(obj.dtype).rpartition(".")[2], tuple(obj.shape))
        if _is_array(obj):
            offset, nbytes = offsets[id(obj)], int(obj.nbytes)
            raw[offset:offset + nbytes].view(obj.dtype).reshape(obj.shape)[...] = obj
            return TensorSlot(offset, nbytes, obj.dtype.str, tuple(obj.shape), True)
        return obj

    return Packed(walk_leaves(data, place), buffer)


def _views(data, buffer):
    """`data` with every TensorSlot replaced by a view of `buffer`."""
    import torch
    raw = None

    def view(obj):
        nonlocal raw
        if not isinstance(obj, TensorSlot):
            return obj
        if obj.array:
            if raw is None:
                raw = buffer.numpy()
            return raw[obj.offset:obj.offset + obj.nbytes].view(obj.dtype).reshape(obj.shape)
        return buffer[obj.offset:obj.offset + obj.nbytes].view(getattr(torch, obj.dtype)).view(obj.shape)

    return walk_leaves(data, view)


def unpack(data) -> Any:
    """The structure `pack` was given, its tensors and arrays now views of the shared buffer."""
    if not isinstance(data, Packed):
        return data
    if data.buffer is None:
        return data.data
    return _views(data.data, data.buffer)
