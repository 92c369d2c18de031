"""What the HTML report shows, gathered while `filter` judges the rows (one pass, bounded memory):
per threshold the K rows nearest to its value on either side, per drop reason its first K rows,
per score column a histogram; then one streaming read of each source shard that holds one of
these rows, for its thumbnail and caption (nothing else of the shard is kept: one member at a
time, each image member made into its thumbnail before the next is read, captions cut)."""
from __future__ import annotations

import base64
import heapq
import io
import itertools
import math
import os
import tarfile
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

from ..reading import ShardTarInfo
from ..specs import KeySpec, find_caption, is_video, split_name

PER_SIDE = 6  # thumbnails on each side of a threshold
PER_REASON = 6  # examples per drop reason
MAX_REASONS = 24
# What one example may cost, whatever the shards hold: members are read one at a time and dropped
# once their thumbnail (a few KB) or caption is made, so the report's memory is one member's
# decode, and its size a few KB per example.
MAX_MEMBER = 32 << 20  # image/video members larger than this are not read for a thumbnail
MAX_CAPTION_MEMBER = 16 << 20  # caption members larger than this are not read (the JSON cap of the stages)
CAPTION_CHARS = 2000  # a caption is cut to this many characters
THUMB = 160  # thumbnail long side, pixels
BINS = 40
IDENTIFIERS = ("phash",)


class _Nearest:
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


def _number(v) -> Optional[float]:
    """A finite number (an infinity has no distance to a cut value, and no place on the axes)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


class ReportCollector:
    def __init__(self, run, thresholds: Sequence, allow_pipe: bool = False, allow_remote: bool = False,
                 idle_seconds: float = 0.0):
        self.run, self.thresholds = run, list(thresholds)
        self.allow = (allow_pipe, allow_remote, idle_seconds)  # this command's permissions, never the folder's
        # phash (the hash scorer) is a number that names an image, not a score: no histogram
        self.numeric = [c for c in run.numeric_columns() if c not in IDENTIFIERS]
        self.columns = self.numeric  # read beside the threshold columns while judging
        self.sides: List[tuple] = []  # (column, label, cut, above: _Nearest, below: _Nearest)
        for t in self.thresholds:
            if not t.numeric:  # a text column's rule has no cut to show rows beside
                continue
            self.sides.append((t.column, f"{t.describe()} ({t.given})", t.value, _Nearest(PER_SIDE),
                               _Nearest(PER_SIDE)))
        for c in self.numeric:  # no threshold: the highest and the lowest rows show the range
            if not any(t.column == c for t in self.thresholds):
                self.sides.append((c, f"{c}: highest and lowest", None, _Nearest(PER_SIDE), _Nearest(PER_SIDE)))
        self.dropped: Dict[str, List[dict]] = OrderedDict()
        from .sections.masked import COLUMNS, MaskedDrops
        self.masked = MaskedDrops.for_run(run)  # a tmars run: the largest drops when text is masked
        if self.masked is not None:
            self.columns = self.numeric + [c for c in COLUMNS if c not in self.numeric]

    def observe(self, shard, row: dict, reason: Optional[str]) -> None:
        if self.masked is not None:
            self.masked.observe(shard, row)
        example = None
        for column, _, cut, above, below in self.sides:
            v = _number(row.get(column))
            if v is None:
                continue
            example = example or self._example(shard, row, reason)
            if cut is None:
                above.push(v, example)
                below.push(-v, example)
            else:
                (above if v >= cut else below).push(-abs(v - cut), example)
        if reason is not None:
            examples = self.dropped.get(reason)
            if examples is None and len(self.dropped) < MAX_REASONS:
                examples = self.dropped[reason] = []
            if examples is not None and len(examples) < PER_REASON:
                examples.append(example or self._example(shard, row, reason))

    def _example(self, shard, row: dict, reason: Optional[str]) -> dict:
        values = {c: row.get(c) for c in self.numeric if _number(row.get(c)) is not None}
        return {"url": shard.url, "key": row["key"], "values": values, "kept": reason is None,
                "reason": reason, "message": row.get("message")}

    def finish(self, result) -> dict:
        from .sections.dedup import section_data
        from .statistics import summarize_files
        stats = summarize_files([s.score_file for s in self.run.shards], self.numeric, {}, BINS)["columns"]
        counts = count_columns(stats, self.thresholds)
        sections = []
        for column, label, cut, above, below in self.sides:
            if column not in counts:  # a count column is one line: no thumbnails
                sections.append({"column": column, "label": label, "cut": cut,
                                 "above": above.examples(), "below": below.examples()})
        everything = [e for s in sections for e in s["above"] + s["below"]]
        everything += [e for ex in self.dropped.values() for e in ex]
        failures = ledger_section(self.run)
        everything += [e for ex in failures["examples"].values() for e in ex]
        dedup = section_data(self.run)  # None where `wdsfilter dedup` has not run
        if dedup is not None:
            everything += dedup["examples"]
        _attach_media(everything, self.run.stage, *self.allow)
        return {"result": result, "columns": {c: stats.get(c, {}) for c in self.numeric if c not in counts},
                "count_columns": {c: stats[c] for c in counts}, "sections": sections,
                "dropped": self.dropped, "failures": failures, "dedup": dedup,
                "masked": self.masked.finish(self.run.stage, *self.allow) if self.masked is not None else []}


def count_columns(stats: Dict[str, dict], thresholds: Sequence) -> List[str]:
    """Columns the report gives one line, not a section: whole numbers of a few values (one
    histogram bin per value: frame counts, ocr_frames, clip_frames) that no threshold names."""
    return [c for c, st in stats.items() if (st.get("histogram") or {}).get("per_value")
            and not any(t.column == c for t in thresholds)]


def ledger_section(run) -> dict:
    """The run's failure ledger (runfolder/failures.py) for the report: counts by reason (from
    failures.parquet) and a few samples of each reason, shown like the dropped ones: only partial
    rows (kept, some scorer missing), since the rejected and failed ones are the "Dropped" section's
    cards already (a sample is shown once)."""
    from ..runfolder import failures as ledger
    by_reason = ledger.summarize(ledger.read_entries(os.path.join(run.folder, ledger.MERGED), run.folder))
    examples: Dict[str, List[dict]] = OrderedDict()
    for shard in run.shards:
        if not shard.trusted:  # a source the run's own record does not name is never read
            continue
        for e in ledger.read_entries(ledger.shard_file(run.folder, shard.name), run.folder):
            if e.get("status") != "partial":
                continue
            ex = examples.setdefault(e["reason"], [])
            if len(ex) < PER_REASON and e["index"] >= 0:
                ex.append({"url": shard.url, "key": e["key"], "values": {}, "kept": False, "reason": e["reason"],
                           "message": e["message"]})
    return {"by_reason": by_reason, "examples": examples}


def _attach_media(examples: List[dict], stage: dict, allow_pipe: bool = False, allow_remote: bool = False,
                  idle_seconds: float = 0.0) -> None:
    """Each example gets `thumb` (a data: URI or None), `caption` and `media_note`."""
    from ..shards import is_pipe, is_remote, open_shard
    caption_spec = KeySpec.parse(stage.get("caption_key") or "txt")
    image_spec = KeySpec.parse(stage.get("image_key") or "jpg;png;jpeg;webp")
    rekey = stage.get("rekey") or "first-dot"
    by_url: Dict[str, Dict[str, List[dict]]] = OrderedDict()
    for e in examples:
        by_url.setdefault(e["url"], {}).setdefault(e["key"], []).append(e)
    image_exts, caption_exts = set(image_spec.exts), set(caption_spec.exts) - set(image_spec.exts)
    for url, wanted in by_url.items():
        # per key: its caption (cut) and each image member's thumbnail; a sample's caption members
        # are held only until its members end (the next key), one sample at a time
        captions: Dict[str, Optional[str]] = {}
        thumbs: Dict[str, Dict[str, tuple]] = {}
        too_big: Dict[str, int] = {}
        seen, current, members = 0, None, {}
        # A local file is opened seekable, so tarfile reads the headers and skips over the data of
        # the members not shown (a big shard costs a header walk, not a full read); URLs stream.
        local = not (is_pipe(url) or is_remote(url))
        try:
            with (open(url[5:] if url.startswith("file:") else url, "rb") if local else
                  open_shard(url, allow_pipe, allow_remote, idle_seconds)) as f, \
                    tarfile.open(fileobj=f, mode="r:*" if local else "r|*", tarinfo=ShardTarInfo) as tar:
                for info in tar:
                    tar.members = []  # headers are not kept either: a shard of many members stays flat
                    key, ext = split_name(info.name, rekey)
                    if key != current:
                        _settle(captions, current, members, caption_spec)
                        current, members = key, {}
                        if key in wanted and key not in thumbs:
                            thumbs[key], seen = {}, seen + 1
                    if key not in wanted:
                        if seen == len(wanted):
                            break  # every shown sample of this shard is read
                        continue
                    if not info.isreg() or ext is None:
                        continue
                    ext = ext.lower()
                    if ext in image_exts and ext not in thumbs[key]:
                        thumbs[key][ext] = ((None, f"{ext} member of {info.size} bytes: too large to preview")
                                            if info.size > MAX_MEMBER else
                                            _thumbnail(tar.extractfile(info).read(), ext))
                    elif ext in caption_exts and ext not in members:
                        if info.size > MAX_CAPTION_MEMBER:
                            too_big.setdefault(key, info.size)
                        else:
                            members[ext] = tar.extractfile(info).read()
                _settle(captions, current, members, caption_spec)
        except Exception as e:  # a report is best effort: say why the pictures are missing
            note = f"shard not readable for the report: {type(e).__name__}: {e}"
            for es in wanted.values():
                for ex in es:
                    ex.setdefault("media_note", note)
        for key, es in wanted.items():
            caption = captions.get(key)
            if caption is None and key in too_big:
                caption = f"(a caption member of {too_big[key]} bytes, not shown)"
            shown = thumbs.get(key, {})
            ref = image_spec.first_present(shown)
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


def _thumbnail(data: bytes, ext: str):
    """(data URI, None) or (None, why there is none)."""
    from PIL import Image
    try:
        if is_video(ext, asked=True):
            from ..frames import sample_frames
            image = Image.fromarray(sample_frames(data, 1, max_side=THUMB * 2).frames[0])
        else:
            from ..images import open_image
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
