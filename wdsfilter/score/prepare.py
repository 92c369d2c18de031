"""The decode side of scoring: stages appended to the foundation's sample pipeline, run in the
DataLoader workers.

    sample_pipeline(emit_rejects=True) -> Prepare(scorers) -> watch -> Chunk(n)

Prepare calls each scorer's prepare() on the decoded sample and keeps only what the model worker
needs (the PIL image and raw bytes stop here). Chunk groups items into lists so one inter-process
transfer carries many samples, and flushes at each shard end so a finished shard is not held
back. Their tensors and numpy arrays are written once into one shared-memory buffer here, which
the model workers read in place (transport.py): the main process handles keys and rows only.
"""
from __future__ import annotations

import pickle
import time
from typing import Any, Dict, Iterable, Iterator, List, Sequence, Tuple

from ..errors import DataError
from ..markers import MARKER, SHARD_END
from .scorers.base import NOTES, Noted
from .transport import pack


class Prepare:
    """Picklable stage: sample -> {"__key__", "__url__", "inputs": {scorer: input}, "errors":
    {scorer: (reason, message)}} (and errors[NOTES]: {scorer: (reason, message)} of inputs
    prepare() returned as Noted, scored from incomplete data). A DataError from prepare() is the sample's reason; any other
    exception is a bug in the scorer and raises, naming the sample."""

    def __init__(self, scorers: Sequence):
        self.scorers = list(scorers)

    def __call__(self, data: Iterable[dict]) -> Iterator[dict]:
        for sample in data:
            if MARKER in sample:
                yield sample
                continue
            inputs: Dict[str, Any] = {}
            errors: Dict[str, Any] = {}
            notes: Dict[str, Tuple[str, str]] = {}
            for scorer in self.scorers:
                try:
                    prepared = scorer.prepare(sample)
                    if isinstance(prepared, Noted):  # scored from incomplete data: the row says so
                        notes[scorer.name] = (prepared.reason, prepared.message)
                        prepared = prepared.input
                    inputs[scorer.name] = prepared
                except DataError as e:
                    errors[scorer.name] = (e.reason, str(e))
                except Exception as e:
                    raise type(e)(f"{e} (in {scorer.name}.prepare on sample {sample.get('__key__')!r} of shard "
                                  f"{sample.get('__url__')})") from e
            if notes:
                errors[NOTES] = notes
            yield {"__key__": sample["__key__"], "__url__": sample["__url__"], "inputs": inputs, "errors": errors}


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


def nbytes(obj: Any) -> int:
    """Host bytes of a prepared input: tensor/array storage, else its pickled size."""
    if hasattr(obj, "element_size") and hasattr(obj, "nelement"):
        return int(obj.element_size() * obj.nelement())
    if hasattr(obj, "nbytes") and not isinstance(obj, (bytes, bytearray)):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    try:
        return len(pickle.dumps(obj))
    except Exception:  # noqa: BLE001 - an estimate only
        return 0


def collect_probe(urls: Sequence[str], stage_cfg, scorers: Sequence, want: int, scan: int,
                  max_seconds: float = 30.0):
    """Read, decode and prepare samples in this process until `want` of them were prepared by
    every scorer (or `scan` samples were read, or `max_seconds` passed). Returns (inputs, seconds
    per sample, samples read)."""
    from ..pipeline import sample_pipeline
    from ..tally import Tally
    pipe = sample_pipeline(list(urls), stage_cfg, Tally(), extra=[Prepare(scorers)])
    found: List[Dict[str, Any]] = []
    seen = 0
    start = time.perf_counter()
    iterator = iter(pipe)
    try:
        for item in iterator:
            if item.get(MARKER) == SHARD_END:
                continue
            seen += 1
            if MARKER not in item and not item["errors"]:
                found.append(item["inputs"])
            if len(found) >= want or seen >= scan or time.perf_counter() - start > max_seconds:
                break
    finally:
        close = getattr(iterator, "close", None)
        if close:
            close()
    elapsed = time.perf_counter() - start
    return found, (elapsed / seen if seen else 0.0), seen
