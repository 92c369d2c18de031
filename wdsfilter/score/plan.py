"""The plan as data: per device, the model processes (replicas), each scorer's own batch in frames
and the batch of samples sent to a model process at a time; the decode workers, prefetch, chunk and
queue depth. Each choice is a line (what, value, why) that `describe` renders for `--dry-run`
and the run's log; `to_dict` is what summary.json keeps. planner.py makes it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

Line = Tuple[str, str, str]  # (what, value, why): one decision of a plan and its reason


@dataclass
class DevicePlan:
    device: str
    kind: str
    replicas: int
    batch_size: int
    threads: Optional[int]
    budget: int  # bytes the run may use on this device (after headroom)
    need: int  # bytes the replicas need at these batch sizes
    # Each scorer's own sub-batch, in frames (an image is one, a k-frame video k). batch_size above
    # is the number of samples sent to a model process at a time: the largest of these (at most
    # what the host's share for queued samples allows); each scorer scores it in sub-batches of its size.
    scorer_batch: Dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    devices: List[DevicePlan]  # model workers: replicas and batch size per device
    workers: int  # decode workers (DataLoader processes)
    prefetch: int
    chunk: int
    queue_depth: int
    min_free_host: int
    lines: List[Line] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def describe(self) -> str:
        width = max((len(w) for w, _, _ in self.lines), default=10)
        out = ["plan:"]
        for what, value, why in self.lines:
            out.append(f"  {what:<{width}}  {value}" + (f"  ({why})" if why else ""))
        for w in self.warnings:
            out.append(f"  warning: {w}")
        return "\n".join(out)

    def headline(self) -> str:
        """The plan in one line (the whole of it: describe, with -v or --dry-run)."""
        devices = "; ".join(f"{d.device}: batch {d.batch_size}" + (f" x {d.replicas} model processes" if d.replicas > 1
                                                                   else "") for d in self.devices)
        warned = f", {len(self.warnings)} warning(s) below" if self.warnings else ""
        return f"plan: {devices}; {self.workers} decode worker(s){warned} (-v or --dry-run: the whole plan)"

    def to_dict(self) -> dict:
        return {"devices": [asdict(d) for d in self.devices], "workers": self.workers, "prefetch": self.prefetch,
                "chunk": self.chunk, "queue_depth": self.queue_depth, "min_free_host": self.min_free_host,
                "lines": [list(line) for line in self.lines], "warnings": list(self.warnings)}

