"""What was dropped, by reason: the count of each reason, and the first rows of each as cards."""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional

from ..html import escape, grid
from .base import Section

PER_REASON = 6  # examples per drop reason
MAX_REASONS = 24


class Dropped(Section):
    def __init__(self, context):
        super().__init__(context)
        self.dropped: Dict[str, List[dict]] = OrderedDict()

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        if reason is None:
            return
        examples = self.dropped.get(reason)
        if examples is None and len(self.dropped) < MAX_REASONS:
            examples = self.dropped[reason] = []
        if examples is not None and len(examples) < PER_REASON:
            examples.append(self.context.example(shard, row, reason))

    def examples(self) -> List[dict]:
        return [e for ex in self.dropped.values() for e in ex]

    def render(self, result) -> List[str]:
        out = ["<h2>Dropped, by reason</h2>"]
        if not result.reasons:
            return out + ["<p>nothing was dropped</p>"]
        out.append("<table>" + "".join(f"<tr><td class=n>{n}</td><td>{escape(r)}</td></tr>"
                                       for r, n in result.reasons.items()) + "</table>")
        for reason, examples in self.dropped.items():
            out.append(f"<h3>{escape(reason)} ({result.reasons.get(reason, 0)})</h3>" + grid(examples, None))
        return out
