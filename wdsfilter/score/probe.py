"""What the planner is given, measured before planning, and its description in the plan.

  * per device (the report dict of modelworker.ModelRunner.load, from the model worker that
    loaded the scorers there): its free memory before loading (torch.cuda.mem_get_info on GPUs,
    psutil on the host), each model's footprint (memory_allocated after load minus before) and
    what another process costs there;
  * the activation probe (ProbeReport): peak memory above the loaded model for probe batches of
    two sizes (max_memory_allocated; the larger cut short for a slow scorer), per scorer, giving
    each scorer's bytes per frame (a video of k frames is k frames, an image one:
    scorer.frame_count) and a fixed part, plus the model's and the decode side's seconds per
    sample and the size of one prepared sample;
  * the host (psutil, memory.host_status): available RAM and CPU cores.

The local engine and the Ray runner build their ProbeReport the same way (ProbeReport.measured).
input_lines renders these numbers as the first lines of the plan; planner.py decides from them.
"""
from __future__ import annotations

import math
import pickle
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ..core.markers import MARKER, SHARD_END
from ..core.units import format_size as fs
from .plan import Line
from ..core.tally import Tally
from .transport import Prepare

if TYPE_CHECKING:
    from .modelrunner import LoadReport


@dataclass
class ProbeReport:
    samples: int = 0  # prepared samples the probe had (0: none could be prepared)
    scanned: int = 0  # samples read to find them
    sizes: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # scorer -> its probe batch sizes (1, n)
    peaks: Dict[str, List[int]] = field(default_factory=dict)  # scorer -> bytes above the model at each size
    # scorer -> frames in the probe batches of `sizes` (a k-frame video is k); missing: one per sample
    frames: Dict[str, List[int]] = field(default_factory=dict)
    # scorer -> bytes its first batch left allocated on the device (workspaces, arenas): model memory
    retained: Dict[str, int] = field(default_factory=dict)
    seconds_per_sample: float = 0.0  # model time at the larger size, all scorers
    # scorer -> seconds/sample on the CPU for the larger probe's inputs: one at a time, then together
    timings: Dict[str, List[float]] = field(default_factory=dict)
    threads: int = 1  # torch threads during that measurement
    prepared_bytes: int = 0  # host bytes of one prepared sample (all scorers)
    prepare_seconds: float = 0.0  # read + decode + prepare per sample, one process
    oom_at: Optional[int] = None
    errors: Dict[str, str] = field(default_factory=dict)  # scorer -> error raised on probe samples

    def scorer_activations(self) -> Dict[str, Tuple[int, int]]:
        """scorer -> (fixed bytes, bytes per frame): the line through its two probe points, with the
        frames of each probe batch (not its samples) on the x axis, so a 3-frame video costs 3 frames.
        A scorer whose probe failed has no entry."""
        out: Dict[str, Tuple[int, int]] = {}
        for name, points in self.peaks.items():
            x1, x2 = self.frames.get(name) or self.sizes.get(name) or (1, 1)
            if len(points) == 2 and x2 > x1:
                slope = max(0.0, (points[1] - points[0]) / (x2 - x1))
                base = max(0.0, points[0] - slope * x1)
            elif points:  # the larger probe ran out of memory: assume it all scales
                slope, base = points[0] / max(x1, 1), 0.0
            else:
                continue
            out[name] = (int(base), int(math.ceil(slope)))
        return out

    def activation(self) -> Tuple[int, int]:
        """(fixed bytes, bytes per frame), the largest over the scorers (a summary; the plan itself
        uses each scorer's own numbers)."""
        acts = self.scorer_activations().values()
        return max((f for f, _ in acts), default=0), max((p for _, p in acts), default=0)

    @classmethod
    def measured(cls, inputs: List[dict], scanned: int, prepare_seconds: float, pool_probe=None) -> "ProbeReport":
        """A report from the probe samples (collect_probe below) and, given two or more of them,
        a model worker's probe of them (`pool_probe(inputs)` -> ModelRunner.probe's dict). The
        local engine and the Ray runner build theirs the same way."""
        report = cls(samples=len(inputs), scanned=scanned, prepare_seconds=prepare_seconds)
        if inputs:
            report.prepared_bytes = int(sum(nbytes(x) for x in inputs) / len(inputs))
        if len(inputs) >= 2 and pool_probe is not None:
            m = pool_probe(inputs)
            report.sizes = {name: tuple(n) for name, n in m["sizes"].items()}
            report.peaks = m["peaks"]
            report.frames = m.get("frames", {})
            report.retained = m.get("retained", {})
            report.seconds_per_sample = m["seconds_per_sample"]
            report.timings = m.get("timings", {})
            report.threads = m["threads"]
            report.oom_at = m["oom_at"]
            report.errors = m.get("errors", {})
        return report

    def frames_per_sample(self, name: str) -> float:
        """Frames per prepared sample of `name` in the larger probe batch (1.0 when not counted)."""
        f, n = self.frames.get(name), self.sizes.get(name)
        return f[1] / n[1] if f and len(f) == 2 and n and n[1] else 1.0

    def batch_sizes_text(self) -> str:
        """The larger probe batch, in words: "16", or "16 (clip), 2 (ocr)" when a slow scorer's
        was cut to its time limit."""
        larger = {name: n[1] for name, n in self.sizes.items()}
        if len(set(larger.values())) <= 1:
            return str(next(iter(larger.values()), 0))
        return ", ".join(f"{n} ({name})" for name, n in larger.items())


def input_lines(reports: List[LoadReport], probe: ProbeReport) -> Tuple[List[Line], List[str]]:
    """The plan's lines (and warnings) on what was measured: each device's models, each scorer's
    activations, the speeds, the size of a prepared sample and the warm-up memory."""
    lines: List[Line] = []
    warnings: List[str] = []
    seen = set()
    for r in reports:
        if r.device in seen:
            continue
        seen.add(r.device)
        parts = ", ".join(f"{n} {fs(b)}" for n, b in r.footprints.items())
        lines.append((f"model on {r.device}", fs(r.footprint),
                      f"measured: memory allocated after loading minus before; {parts}"))
    p = probe
    if not p.samples:
        warnings.append(f"none of the first {p.scanned} samples could be prepared, so activation memory "
                        f"was not measured; the batch size is not memory-checked and the back-off "
                        f"will halve it on out-of-memory")
        return lines, warnings
    acts = p.scorer_activations()
    for name, (fixed, per) in acts.items():
        fps = p.frames_per_sample(name)
        unit = "frame" if fps != 1.0 else "sample"
        lines.append(("activations" if len(acts) == 1 else f"{name} activations",
                      f"{fs(per)}/{unit} + {fs(fixed)}",
                      f"peak memory above the loaded model for probe batches of "
                      f"{' and '.join(map(str, p.sizes.get(name, ())))} samples"
                      + (f" ({fps:.2f} frames per sample: memory is planned per frame)" if fps != 1.0 else "")
                      + ("; the larger ran out of memory" if p.oom_at else "")))
    lines.append(("model speed", f"{p.seconds_per_sample * 1000:.2f} ms/sample",
                  f"probe batch of {p.batch_sizes_text()} with {p.threads} thread(s)"))
    lines.append(("decode speed", f"{p.prepare_seconds * 1000:.2f} ms/sample",
                  f"read + decode + prepare in one process, over {p.scanned} samples"))
    lines.append(("prepared sample", fs(p.prepared_bytes), "host memory of one prepared model input"))
    retained = {n: b for n, b in p.retained.items() if b}
    if retained and any(r.kind != "host" for r in reports):
        lines.append(("warm-up memory", fs(sum(retained.values())),
                      "left on the device by the first batch (" + ", ".join(
                          f"{n} {fs(b)}" for n, b in retained.items()) + "; workspaces, arenas): "
                      "counted with the model"))
    for name, error in p.errors.items():
        warnings.append(f"the {name} probe failed ({error}); its activation memory is not measured "
                        f"and the back-off will handle what does not fit")
    return lines, warnings


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
                  max_seconds: float = 30.0, only: Sequence = (), tally=None):
    """Read, decode and prepare samples in this process until `want` of them were prepared by
    every scorer (or `scan` samples were read, or `max_seconds` passed). Returns (inputs, seconds
    per sample, samples read). only: --retry-failed's ledger.OnlyKeys (the probe reads only its samples).
    tally: where its notes go (a remote read's retries, which the run's summary counts)."""
    from ..stream.pipeline import sample_pipeline
    pipe = sample_pipeline(list(urls), stage_cfg, Tally() if tally is None else tally, extra=[Prepare(scorers, stage_cfg)], before_decode=only,
                           shard_stages=[s.reader() for s in only])
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
