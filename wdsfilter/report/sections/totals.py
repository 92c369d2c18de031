"""The page's opening: rows, kept rows, and each rule (a threshold, a share, dedup's marks) with
what it kept and dropped; the loader call that keeps the same rows in training."""
from __future__ import annotations

from typing import List

from ..html import escape
from .base import Section


class Totals(Section):
    def render(self, result) -> List[str]:
        ruled = result.thresholds or result.dedup is not None
        out = [f"<p>{result.rows} rows in {result.shards} finished shard(s); <b>{result.kept} of {result.rows} kept</b>"
               f" ({'by every rule below' if ruled else 'every scored row: no rule given'}).</p>"]
        if not ruled:
            return out
        out.append("<table><tr><th>rule</th><th>as given</th><th>kept</th><th>dropped</th>"
                   "<th>without a value</th></tr>")
        for t, c in zip(result.thresholds, result.counts):
            ties = ""
            if t.share is not None and c["kept"] > t.rank:
                ties = f" ({c['kept'] - t.rank} tie with the cut value and are kept too)"
            out.append(f"<tr><td>{escape(t.describe())}</td><td>{escape(t.given)}{escape(ties)}</td>"
                       f"<td class=n>{c['kept']}</td><td class=n>{result.rows - c['kept']}</td>"
                       f"<td class=n>{c['no_score']}</td></tr>")
        if result.dedup is not None:  # the dedup's marks, a rule like the others (runfolder/dedup.py)
            d = result.dedup
            out.append(f"<tr><td>one survivor per duplicate group, no eval match ({d['duplicate']} duplicates, "
                       f"{d['eval_match']} eval matches)</td><td>--dedup</td><td class=n>{d['kept']}</td>"
                       f"<td class=n>{result.rows - d['kept']}</td><td class=n>0</td></tr>")
        out.append("</table>")
        if result.selection:
            out.append(f'<p class="meta">In training: <code>{escape(result.selection.loader_call(result.scores_dir))}'
                       f'</code></p>')
        return out
