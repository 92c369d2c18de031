"""The failure ledger's section: the samples not scored, by reason, transient or not (written by
score/ledger.py, read by runfolder/failures.py), and a few partly scored rows of each reason as
cards (the rejected and failed ones are the "Dropped" section's cards already: a sample is shown
once)."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Dict, List

from ...runfolder import failures as ledger
from ..html import escape, grid
from .base import Section
from .dropped import PER_REASON


class Ledger(Section):
    by_reason: Dict[str, dict] = {}
    partial: Dict[str, List[dict]] = {}

    def finish(self, result) -> None:
        run = self.context.run
        self.by_reason = ledger.summarize(ledger.read_entries(os.path.join(run.folder, ledger.MERGED), run.folder))
        self.partial = OrderedDict()
        for shard in run.shards:
            if not shard.trusted:  # a source the run's own record does not name is never read
                continue
            for e in ledger.read_entries(ledger.shard_file(run.folder, shard.name), run.folder):
                if e.get("status") != "partial":
                    continue
                ex = self.partial.setdefault(e["reason"], [])
                if len(ex) < PER_REASON and e["index"] >= 0:
                    ex.append({"url": shard.url, "key": e["key"], "values": {}, "kept": False, "reason": e["reason"],
                               "message": e["message"]})

    def examples(self) -> List[dict]:
        return [e for ex in self.partial.values() for e in ex]

    def render(self, result) -> List[str]:
        if not self.by_reason:
            return []
        out = [f"<h2>Failure ledger ({ledger.MERGED})</h2><table><tr><th>samples</th><th>shards</th><th>reason</th>"
               "<th>kind</th></tr>"]
        out += [f"<tr><td class=n>{s['samples']}</td><td class=n>{s['shards']}</td><td>{escape(r)}</td>"
                f"<td>{'transient: wdsfilter score --retry-failed' if s['transient'] else 'data'}</td></tr>"
                for r, s in self.by_reason.items()]
        out.append("</table><p class=\"meta\">Rejected and failed samples are shown above, under \"Dropped, by "
                   "reason\"; partly scored ones (kept) below.</p>")
        for reason, examples in self.partial.items():
            if examples:
                out.append(f"<h3>{escape(reason)} (partly scored)</h3>" + grid(examples, None))
        return out
