"""The report pages' building blocks: the style sheet, the script the browser test reads back,
text made safe for HTML, and an example's card (its thumbnail, values, verdict and caption) in a
grid. Every section (sections/) and both pages (page.py, sections/dedup.py's dedup page) use these."""
from __future__ import annotations

import html
import os
from typing import List, Optional

from ..storage.shards import shown_url

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg { background: #fafafa; border: 1px solid #e4e4e4; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; margin: 6px 0 14px; }
.card { width: 170px; border: 1px solid #ddd; border-radius: 4px; padding: 4px; font-size: 12px; }
.card.kept { border-color: #3a8; } .card.dropped { border-color: #d55; }
.card img { display: block; max-width: 160px; max-height: 160px; margin: 0 auto 4px; }
.verdict { color: #555; } .dropped .verdict { color: #b33; }
.cap { color: #333; max-height: 6em; overflow: hidden; } .meta { color: #777; word-break: break-all; }
.note { color: #a60; } .counts { color: #444; }
"""

# Once every image has loaded: body data-images ("ok N" or "broken N of M": the thumbnails the
# browser decoded) and data-overlaps (how many pairs of texts in one chart overlap: axis labels,
# titles, threshold labels), which the browser test reads back with chromium --dump-dom.
SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.setAttribute('data-images', ok === imgs.length ? 'ok ' + ok : 'broken ' + ok + ' of ' + imgs.length);
  var overlaps = [];
  Array.prototype.forEach.call(document.querySelectorAll('svg'), function (svg) {
    var boxes = Array.prototype.map.call(svg.querySelectorAll('text'), function (t) {
      return [t.getBoundingClientRect(), t.textContent];
    });
    for (var i = 0; i < boxes.length; i++) for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i][0], b = boxes[j][0];
      if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
        overlaps.push(boxes[i][1] + ' / ' + boxes[j][1]);
    }
  });
  document.body.setAttribute('data-overlaps', overlaps.length + (overlaps.length ? ': ' + overlaps.join('; ') : ''));
});
"""

# Bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE, isolates, marks) in a key, a caption or a
# file name would reorder the text after them, the shard's name included: shown escaped (\u202e).
BIDI = dict.fromkeys([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
BIDI = {c: f"\\u{c:04x}" for c in BIDI}


def escape(text, limit: int = 4000) -> str:
    """Text as HTML, bidi controls escaped, cut to `limit` characters (a key or a message may be
    as long as a file holds: the report stays a few KB per example)."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        text = text[:limit] + f" ... ({len(text)} characters)"
    return html.escape(text.translate(BIDI))


def verdict(e: dict) -> str:
    """What became of an example's row: "kept", or "dropped: " and the rule that dropped it (the
    threshold, "clip_score < 0.21"; a dedup mark; why it was not scored)."""
    if e.get("verdict"):  # a section's own words (dedup: "survivor", "eval match: exact:x.jpg")
        return e["verdict"]
    return "kept" if e["kept"] else f"dropped: {e.get('reason') or 'no reason recorded'}"


def card(e: dict, column: Optional[str]) -> str:
    state = "kept" if e["kept"] else "dropped"
    img = (f'<img src="{e["thumb"]}" alt="{escape(e["key"])}">' if e.get("thumb")
           else f'<div class="note">{escape(e.get("media_note") or "no preview")}</div>')
    value = e["values"].get(column) if column else None
    head = f"{column} = {value:.5g}" if value is not None else \
        ", ".join(f"{c} = {v:.4g}" for c, v in e["values"].items())
    caption = e.get("caption")
    return (f'<div class="card {state}" title="{escape(e.get("message") or "")}">{img}'
            + (f'<div><b>{escape(head)}</b></div>' if head else "")
            + f'<div class="verdict">{escape(verdict(e))}</div>'
            f'<div class="cap">{escape(caption if caption is not None else "(no caption)")}</div>'
            f'<div class="meta">{escape(e["key"])} in {escape(os.path.basename(shown_url(e["url"])))}</div></div>')


def grid(examples: List[dict], column: Optional[str]) -> str:
    if not examples:
        return '<p class="meta">no rows on this side</p>'
    return '<div class="grid">' + "".join(card(e, column) for e in examples) + "</div>"
