"""The examples' media, read back from the source shards for the report: each shown example's
thumbnail and caption (attach_media: one streaming read of each shard that holds one, one member at
a time, each image member made into its thumbnail before the next is read, captions cut), and the
bounded heap that picks which rows are shown (Nearest)."""
from __future__ import annotations

import base64
import heapq
import io
import itertools
import math
import tarfile
from collections import OrderedDict
from typing import Dict, List, Optional

from PIL import Image

from ..media.frames import sample_frames
from ..media.images import open_image
from ..storage.shards import is_pipe, is_remote, open_shard
from ..core.specs import KeySpec, find_caption, is_video, split_name
from ..storage.tars import ShardTarInfo

# What one example may cost, whatever the shards hold: members are read one at a time and dropped
# once their thumbnail (a few KB) or caption is made, so the report's memory is one member's
# decode, and its size a few KB per example.
MAX_MEMBER = 32 << 20  # image/video members larger than this are not read for a thumbnail
MAX_CAPTION_MEMBER = 16 << 20  # caption members larger than this are not read (the JSON cap of the stages)
CAPTION_CHARS = 2000  # a caption is cut to this many characters
THUMB = 160  # thumbnail long side, pixels


class Nearest:
    """The K examples with the highest closeness among those pushed (a bounded heap); closeness
    is -|value - cut| beside a threshold, the value itself for "highest", -value for "lowest"."""

    def __init__(self, k: int):
        self.k, self.heap, self.order = k, [], itertools.count()

    def push(self, closeness: float, example: dict) -> None:
        item = (closeness, -next(self.order), example)  # earlier rows win ties
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, item)
        elif item[:2] > self.heap[0][:2]:
            heapq.heapreplace(self.heap, item)

    def examples(self) -> List[dict]:
        return [e for _, _, e in sorted(self.heap, key=lambda x: (x[0], x[1]), reverse=True)]


def number(v) -> Optional[float]:
    """A finite number (an infinity has no distance to a cut value, and no place on the axes)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def attach_media(examples: List[dict], stage: dict, allow_pipe: bool = False, allow_remote: bool = False,
                 idle_seconds: float = 0.0) -> None:
    """Each example gets `thumb` (a data: URI or None), `caption` and `media_note`."""
    by_url: Dict[str, Dict[str, List[dict]]] = OrderedDict()
    for e in examples:
        by_url.setdefault(e["url"], {}).setdefault(e["key"], []).append(e)
    for url, wanted in by_url.items():
        media = _ShardMedia(wanted, stage)
        # A local file is opened seekable, so tarfile reads the headers and skips over the data of
        # the members not shown (a big shard costs a header walk, not a full read); URLs stream.
        local = not (is_pipe(url) or is_remote(url))
        try:
            with (open(url[5:] if url.startswith("file:") else url, "rb") if local else
                  open_shard(url, allow_pipe, allow_remote, idle_seconds)) as f, \
                    tarfile.open(fileobj=f, mode="r:*" if local else "r|*", tarinfo=ShardTarInfo) as tar:
                media.read(tar)
        except Exception as e:  # a report is best effort: say why the pictures are missing
            note = f"shard not readable for the report: {type(e).__name__}: {e}"
            for es in wanted.values():
                for ex in es:
                    ex.setdefault("media_note", note)
        media.attach()


class _ShardMedia:
    """The shown samples of one shard: per key its caption (cut) and each image member's
    thumbnail; a sample's caption members are held only until its members end (the next key),
    one sample at a time."""

    def __init__(self, wanted: Dict[str, List[dict]], stage: dict):
        self.wanted = wanted
        self.caption_spec = KeySpec.parse(stage.get("caption_key") or "txt")
        self.image_spec = KeySpec.parse(stage.get("image_key") or "jpg;png;jpeg;webp")
        self.rekey = stage.get("rekey") or "first-dot"
        self.image_exts = set(self.image_spec.exts)
        self.caption_exts = set(self.caption_spec.exts) - self.image_exts
        self.captions: Dict[str, Optional[str]] = {}
        self.thumbs: Dict[str, Dict[str, tuple]] = {}
        self.too_big: Dict[str, int] = {}

    def read(self, tar) -> None:
        seen, current, members = 0, None, {}
        for info in tar:
            tar.members = []  # headers are not kept either: a shard of many members stays flat
            key, ext = split_name(info.name, self.rekey)
            if key != current:
                _settle(self.captions, current, members, self.caption_spec)
                current, members = key, {}
                if key in self.wanted and key not in self.thumbs:
                    self.thumbs[key], seen = {}, seen + 1
            if key not in self.wanted:
                if seen == len(self.wanted):
                    break  # every shown sample of this shard is read
                continue
            if info.isreg() and ext is not None:
                self._member(tar, info, key, ext.lower(), members)
        _settle(self.captions, current, members, self.caption_spec)

    def _member(self, tar, info, key: str, ext: str, members: Dict[str, bytes]) -> None:
        if ext in self.image_exts and ext not in self.thumbs[key]:
            self.thumbs[key][ext] = ((None, f"{ext} member of {info.size} bytes: too large to preview")
                                     if info.size > MAX_MEMBER else thumbnail(tar.extractfile(info).read(), ext))
        elif ext in self.caption_exts and ext not in members:
            if info.size > MAX_CAPTION_MEMBER:
                self.too_big.setdefault(key, info.size)
            else:
                members[ext] = tar.extractfile(info).read()

    def attach(self) -> None:
        for key, es in self.wanted.items():
            caption = self.captions.get(key)
            if caption is None and key in self.too_big:
                caption = f"(a caption member of {self.too_big[key]} bytes, not shown)"
            shown = self.thumbs.get(key, {})
            ref = self.image_spec.first_present(shown)
            thumb, note = (None, "no image member") if ref is None else shown[ref.ext]
            for ex in es:
                ex.update(caption=caption, thumb=thumb)
                ex.setdefault("media_note", note)


def _settle(captions: Dict[str, Optional[str]], key: Optional[str], members: Dict[str, bytes], spec) -> None:
    """The caption of `key` from its caption members (bytes then dropped), cut to CAPTION_CHARS;
    a key whose members come in several runs keeps the first caption found."""
    if key is None or not members or captions.get(key) is not None:
        return
    caption, _ = find_caption(dict(members), spec)
    if caption is not None and len(caption) > CAPTION_CHARS:
        caption = caption[:CAPTION_CHARS] + f" ... ({len(caption)} characters in all)"
    captions[key] = caption


def thumbnail(data: bytes, ext: str):
    """(data URI, None) or (None, why there is none)."""
    try:
        if is_video(ext, asked=True):
            image = Image.fromarray(sample_frames(data, 1, max_side=THUMB * 2).frames[0])
        else:
            image = open_image(data)  # the header alone, once; what is refused (ICO, EPS) is refused here too
            w, h = image.size
            if w * h > 64_000_000:  # never decode a decompression bomb for a thumbnail
                return None, f"image of {w}x{h} pixels: too large to preview"
            image.draft("RGB", (THUMB * 2, THUMB * 2))
            image = image.convert("RGB")
        image.thumbnail((THUMB, THUMB))
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=80)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), None
    except Exception as e:
        return None, f"no preview: {type(e).__name__}: {e}"
