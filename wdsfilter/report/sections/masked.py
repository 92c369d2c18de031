"""The report's text-masking section, for a run with the tmars scorer (score/scorers/tmars.py):
the samples whose CLIP score drops most when their text is masked, each shown as its image beside
the same image masked as the scorer masked it (masking.py, from the row's masked_boxes in
the image's original pixels). Gathered while `filter` judges the rows (a bounded heap), then one
streaming read of each source shard that holds one of them (one member at a time)."""
from __future__ import annotations

import html
import io
import os
from collections import OrderedDict
from typing import Dict, List, Optional

import numpy as np
from PIL import Image

from ...media.images import open_image
from ...media.masking import box_rects, mask_frame
from ...stream.reading import iter_tar
from ...storage.shards import is_pipe, is_remote, open_shard, shown_url
from ...core.specs import KeySpec, find_caption, split_name
from ..media import CAPTION_CHARS, MAX_MEMBER, Nearest, number, thumbnail
from .base import Section

COLUMNS = ["clip_score", "clip_score_masked", "masked_boxes"]  # read beside the thresholds' columns
SHOWN = 8  # samples shown


class MaskedDrops(Section):
    """Nothing for a run without tmars's columns."""

    def __init__(self, context):
        super().__init__(context)
        self.largest = Nearest(SHOWN) if all(c in context.run.columns for c in COLUMNS) else None
        self.shown: List[dict] = []

    def columns(self) -> List[str]:
        return COLUMNS if self.largest is not None else []

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        if self.largest is None:
            return
        score, masked, boxes = number(row.get("clip_score")), number(row.get("clip_score_masked")), \
            row.get("masked_boxes")
        if score is None or masked is None or boxes is None or not len(boxes):
            return  # no text masked (or a video): nothing to show side by side
        self.largest.push(score - masked, {"url": shard.url, "key": row["key"], "clip_score": score,
                                           "clip_score_masked": masked, "boxes": [float(v) for v in boxes]})

    def finish(self, result) -> None:
        if self.largest is not None:
            self.shown = shown_pairs(self.largest.examples(), self.context.run.stage, *self.context.allow)

    def render(self, result) -> List[str]:
        return masked_section(self.shown)


def shown_pairs(examples: List[dict], stage: dict, allow_pipe: bool = False, allow_remote: bool = False,
                idle_seconds: float = 0.0) -> List[dict]:
    """The shown samples, largest drop first, each with `original` and `masked` thumbnails (data
    URIs, or None with a `note`) and its caption."""
    by_url: Dict[str, Dict[str, dict]] = OrderedDict()
    for e in examples:
        by_url.setdefault(e["url"], {})[e["key"]] = e
    for url, wanted in by_url.items():
        try:
            _read_images(url, wanted, stage, allow_pipe, allow_remote, idle_seconds)
        except Exception as e:  # a report is best effort: say why the pictures are missing
            for ex in wanted.values():
                ex.setdefault("note", f"shard not readable for the report: {type(e).__name__}: {e}")
    return examples


def _read_images(url: str, wanted: Dict[str, dict], stage: dict, allow_pipe: bool, allow_remote: bool,
                 idle_seconds: float) -> None:
    image_spec = KeySpec.parse(stage.get("image_key") or "jpg;png;jpeg;webp")
    caption_spec = KeySpec.parse(stage.get("caption_key") or "txt")
    rekey = stage.get("rekey") or "first-dot"
    local = not (is_pipe(url) or is_remote(url))
    captions: Dict[str, Dict[str, bytes]] = {}
    with (open(url[5:] if url.startswith("file:") else url, "rb") if local else
          open_shard(url, allow_pipe, allow_remote, idle_seconds)) as stream:
        for m in iter_tar(stream, url):
            if not isinstance(m, dict) or m.get("data") is None:
                continue
            key, ext = split_name(m["fname"], rekey)
            if key not in wanted or ext is None:
                continue
            ext, e = ext.lower(), wanted[key]
            if ext in image_spec.exts and "original" not in e:
                e["original"], e["masked"], note = _pair(m["data"], ext, e["boxes"])
                if note:
                    e["note"] = note
            elif ext in caption_spec.exts and len(m["data"]) <= MAX_MEMBER:
                captions.setdefault(key, {})[ext] = m["data"]
    for key, e in wanted.items():
        caption, _ = find_caption(dict(captions.get(key, {})), caption_spec) if key in captions else (None, None)
        e["caption"] = caption[:CAPTION_CHARS] if caption else caption
        e.setdefault("note", None if "original" in e else "no image member")


def _pair(data: bytes, ext: str, boxes: List[float]):
    """(original thumbnail, masked thumbnail, note): the masked image is the decoded image with
    the row's rectangles filled by masking.py, the scorer's own rule."""
    original, note = thumbnail(data, ext) if len(data) <= MAX_MEMBER else (None, "too large to preview")
    if original is None:
        return None, None, note
    image = open_image(data).convert("RGB")  # _thumbnail refused what is too large to decode
    pixels = np.asarray(image)
    corners = [np.array([[boxes[i], boxes[i + 1]], [boxes[i + 2], boxes[i + 3]]]) for i in range(0, len(boxes) - 3, 4)]
    masked, _ = mask_frame(pixels, box_rects(corners, image.width, image.height))
    buf = io.BytesIO()
    Image.fromarray(masked).save(buf, "PNG")
    return original, thumbnail(buf.getvalue(), "png")[0], None


def masked_section(examples: List[dict]) -> List[str]:
    """The report's HTML for MaskedDrops.finish's examples (nothing for a run without tmars)."""
    if not examples:
        return []
    e_ = html.escape
    out = ["<h2>Text masked (T-MARS): the largest drops in clip_score</h2>",
           '<p class="meta">each sample as scored, and with every detected text box filled with the mean colour '
           "around it (the tmars scorer's clip_score_masked)</p><div class=\"grid\">"]
    for e in examples:
        images = "".join(f'<figure style="margin:0"><img src="{e[k]}" alt="{k}"><figcaption>{k}</figcaption>'
                         f'</figure>' for k in ("original", "masked") if e.get(k))
        images = (f'<div style="display:flex;gap:6px">{images}</div>' if images else
                  f'<div class="note">{e_(e.get("note") or "no preview")}</div>')
        caption = e.get("caption")
        out.append(f'<div class="card masked" style="width:350px">{images}<div><b>clip_score {e["clip_score"]:.4g} &rarr; '
                   f'{e["clip_score_masked"]:.4g}</b> (drop {e["clip_score"] - e["clip_score_masked"]:.4g})</div>'
                   f'<div class="cap">{e_(caption if caption is not None else "(no caption)")}</div>'
                   f'<div class="meta">{e_(e["key"])} in {e_(os.path.basename(shown_url(e["url"])))}</div></div>')
    out.append("</div>")
    return out
