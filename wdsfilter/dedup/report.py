"""RUN_DIR/dedup/report.html: the largest duplicate groups and the eval matches, as rows of
thumbnails (read from the source shards, as `wdsfilter filter`'s report reads them), so a
placeholder image repeated 10,000 times or a leaked eval image is seen, not only counted.
Self-contained (thumbnails inlined); best effort: a shard that cannot be read gets a note."""
from __future__ import annotations

import html
import os
from typing import Dict, List

MAX_MATCHES = 30


def write_report(folder: str, summary: dict, urls: Dict[str, str], matches: List[dict], stage: dict) -> str:
    """summary: dedup/summary.json's content; urls: shard output name -> source shard; matches:
    {"shard", "key", "index", "eval_match"} of rows matching an eval image."""
    from ..filtering.report_data import _attach_media  # the one reader of thumbnails from shards
    from ..writing import write_text_atomic
    examples = []
    for g in summary["largest"]:
        for m in g["members"]:
            m["url"] = urls.get(m["shard"], "")
            examples.append(m)
    shown = [dict(m, url=urls.get(m["shard"], "")) for m in matches[:MAX_MATCHES]]
    examples += shown
    _attach_media([e for e in examples if e["url"] and e.get("key") is not None], stage)
    e = html.escape
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>dedup</title><style>",
           "body{font-family:sans-serif;margin:1em} .row{display:flex;gap:8px;flex-wrap:wrap;margin:.5em 0 1.5em}",
           ".card{width:170px;font-size:12px;border:2px solid #ccc;padding:4px} .kept{border-color:#2a2}",
           ".dropped{border-color:#c33} img{max-width:160px;max-height:160px} .note{color:#888}</style></head><body>",
           f"<h1>Dedup of {e(os.path.dirname(folder))}</h1>",
           f"<p>{summary['rows']} rows; {summary['groups']} duplicate groups ({e(str(summary['per_kind']))}); "
           f"{summary['duplicates']} rows are duplicates of a survivor; settings {e(str(summary['settings']))}</p>",
           "<h2>Largest groups</h2>"]
    for g in summary["largest"]:
        out.append(f"<h3>group {g['group']}: {g['size']} rows ({e(g['kind'])})</h3><div class=\"row\">")
        out += [_card(m, "survivor" if m["survivor"] else "duplicate", m["survivor"]) for m in g["members"]]
        out.append("</div>")
    out.append(f"<h2>Eval matches</h2><p>{summary['eval_images']} eval images compared; matches "
               f"{e(str(summary['eval_matches']))}{' (the first %d shown)' % MAX_MATCHES if len(matches) > MAX_MATCHES else ''}</p>")
    out.append("<div class=\"row\">" + "".join(_card(m, m["eval_match"], False) for m in shown) + "</div>")
    out.append("</body></html>")
    path = os.path.join(folder, "report.html")
    write_text_atomic(path, "\n".join(out))
    return path


def _card(m: dict, label: str, kept: bool) -> str:
    e = html.escape
    img = (f'<img src="{m["thumb"]}" alt="{e(str(m.get("key")))}">' if m.get("thumb")
           else f'<div class="note">{e(m.get("media_note") or "no preview")}</div>')
    return (f'<div class="card {"kept" if kept else "dropped"}">{img}<div><b>{e(label)}</b></div>'
            f'<div>{e(str(m.get("key")))} in {e(m["shard"])}</div></div>')
