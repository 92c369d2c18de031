"""The public sample stages, in pipeline order. Each is a webdataset stage (a generator curried by
`pipelinefilter`): picklable, composable with webdataset's own stages, and every drop is counted.

    read -> select -> rename -> clean_captions -> decode -> map_dict -> watch

After `rename` a sample is {"__key__", "__url__", "caption": str, "image" or "video": bytes,
"json": parsed metadata or None}; after `decode`, "image" is a PIL image.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

from .census import KeyCensus
from .config import StageConfig
from .curry import pipelinefilter  # webdataset's, without importing webdataset (and torch)
from ..core.errors import ConfigError, DataError
from ..media.images import decode_image, deferred_jpeg
from ..core.markers import MARKER, reject_marker  # markers flow through every stage untouched (markers.py)
from .reading import OVERSIZED, group_samples, tar_members
from ..core.specs import FieldRef, find_caption, is_dotted, is_video, parse_json_member
from ..core.tally import Tally


def _reject(tally: Tally, sample: dict, reason: str, stage: str, member: str, message: str, emit: bool):
    """Count a dropped sample; with emit_rejects, return a marker that flows on (scoring gives every
    sample a row, its reason included)."""
    tally.drop(reason, stage, sample.get("__url__", ""), member, message)
    if emit:
        caption, meta = _said(sample)
        return reject_marker(sample.get("__key__", ""), sample.get("__url__", ""), reason, message, stage, member,
                             caption, meta)
    return None


def _said(sample: dict) -> tuple:
    """(caption, json object) of a sample being dropped, as far as its text members were read:
    after rename its fields; before, the caption select found and its .json (parsed here only for
    a dropped sample, behind the json byte cap the reader applied)."""
    caption = sample.get("caption") if isinstance(sample.get("caption"), str) else sample.get("__caption__")
    meta = sample.get("json") if isinstance(sample.get("json"), dict) else sample.get("__parsed_json")
    if meta is None and isinstance(sample.get("json"), (bytes, bytearray)):
        try:
            meta = parse_json_member(sample["json"])
        except ValueError:
            meta = None
    return caption, meta if isinstance(meta, dict) else None


def _read(src, cfg: StageConfig, tally: Tally):
    return group_samples(tar_members(src, cfg, tally), cfg, tally)


def _is_first_reader() -> bool:
    """Rank 0 and DataLoader worker 0 (or no DataLoader): exactly one stream of a run, decided as
    webdataset's pytorch_worker_info decides it (which splits the shards), but reading torch's
    state only where torch is already imported (the light core never imports it)."""
    env = os.environ
    rank = worker = 0
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = int(env["RANK"])
    else:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
    if "WORKER" in env and "NUM_WORKERS" in env:
        worker = int(env["WORKER"])
    else:
        data = sys.modules.get("torch.utils.data")
        info = data.get_worker_info() if data is not None else None
        worker = info.id if info is not None else 0
    return rank == 0 and worker == 0


class FirstShardCheck:
    """Raises ConfigError when every sample of the first shard misses the caption or image key.

    Only one stream checks: rank 0, DataLoader worker 0, whose first shard is the first of its
    shard list (the dataset's first, unless shards are shuffled or resampled). Other workers'
    first shards are ordinary shards: a single shard whose captions are missing is a data error,
    counted and skipped, not a reason to stop training. A caption field that is there but not
    text in every sample (caption_not_text: a list of captions) counts as a miss too."""

    def __init__(self, cfg: StageConfig):
        self.cfg = cfg
        self.active = cfg.check_first_shard
        self.started = False
        self.first_url = None
        self.census = KeyCensus()
        self.misses = {"caption": 0, "image": 0}
        self.not_text = 0
        self.first = False

    def observe(self, sample: dict, missing: Optional[str], reason: Optional[str] = None) -> None:
        # Every reader takes the census of its first shard (the starvation message quotes its hint);
        # only the first reader raises.
        if not self.started:
            self.started = True
            self.first = _is_first_reader()
        if not self.active:
            return
        url = sample.get("__url__")
        if self.first_url is None:
            self.first_url = url
        elif url != self.first_url:
            self.finish()
            return
        if missing is None:
            self.active = False  # one good sample: the config works
            return
        self.census.add(sample, sample.get("__parsed_json"))
        if missing in ("caption", "image"):
            self.misses[missing] += 1
        self.not_text += reason == "caption_not_text"

    def finish(self) -> None:
        if not self.active:
            return
        self.active = False
        problem = self.problem()
        if problem and self.first:
            raise ConfigError(problem)

    def problem(self) -> Optional[str]:
        """What is wrong with the keys when every sample of the first shard missed one, else None."""
        n = self.census.samples
        if not n:
            return None
        cfg = self.cfg
        for what, spec in (("caption", cfg.caption_spec), ("image", cfg.image_spec)):
            if self.misses[what] == n:
                hint = self.census.suggest(what, spec)
                if what == "caption" and self.not_text:
                    hint = (f"in {self.not_text} of {n} samples the caption field is a JSON list, number or object, "
                            f"not text; point the caption key at a text field") + (f"; {hint}" if hint else "")
                if self.census.dotted_share() > 0.5:
                    hint = "member names have dots in their basenames (img.v2.0001.jpg); use rekey='last-dot' (--rekey last-dot)"
                return (  # one line (errors are one line each): the fix first, then what was seen
                    f"no sample of the first shard {self.first_url} has {'an' if what == 'image' else 'a'} {what} under {what} key "
                    f"'{spec}' (every sample would be filtered and the run would hang); "
                    f"{hint or 'no ' + what + ' candidate found; check the shards with wdsfilter validate'} "
                    f"({self.census.describe()})")
        return None


def select_sample(sample: dict, cfg: StageConfig) -> Tuple[Optional[str], Optional[FieldRef], Optional[str], Optional[str]]:
    """The select decision, the one both the select stage and the validator ask (its per-sample
    verdict), so that what validate reports is what training gets.

    Returns (caption, image alternative, None, None) for a sample that is kept, else (caption or
    None, image alternative or None, reason, missing): `missing` is "caption" or "image" when the
    spec found no such member, "data" when the member is there but broken (invalid_utf8,
    invalid_json, empty_caption) or was skipped unread (oversized_member, special_member,
    corrupt_member: its reason is the sample's reason)."""
    if OVERSIZED in sample:  # emptied by the reader: its members are names only
        exts = cfg.image_spec.exts + cfg.caption_spec.exts
        return None, None, "dotted_basename" if _dotted_match(sample, exts) else "oversized_sample", "data"
    caption, reason = find_caption(sample, cfg.caption_spec)
    image = cfg.image_spec.first_present(sample)
    if caption is not None and image is not None:
        return caption, image, None, None
    missing = "caption" if caption is None else "image"
    skipped = sample.get("__skipped__")
    if caption is None and reason not in ("missing_caption", "caption_not_text"):
        missing = "data"  # the field is there but broken
    elif skipped and (why := _skip_reason(skipped, cfg, caption is None, image is None)):
        reason, missing = why, "data"
    elif _dotted_match(sample, cfg.image_spec.exts + cfg.caption_spec.exts):
        reason = "dotted_basename"
    elif caption is not None:
        reason = "missing_image"
    return caption, image, reason, missing


def _skip_reason(skipped: dict, cfg: StageConfig, no_caption: bool, no_image: bool) -> Optional[str]:
    """The reason of a skipped member the sample needed (its caption or its image), if any."""
    wanted = (cfg.caption_spec.exts if no_caption else ()) + (cfg.image_spec.exts if no_image else ())
    return next((skipped[e] for e in wanted if e in skipped), None)


def _dotted_match(sample: dict, exts) -> bool:
    return any(is_dotted(e) and e.rsplit(".", 1)[-1] in exts for e in sample if not e.startswith("__"))


def _select(data: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    """Keep samples that have a caption and an image per the specs; count the others by reason."""
    check = FirstShardCheck(cfg)
    tally.explain = check.problem  # a starving resampled stream never ends its first shard: say it there
    emit = cfg.emit_rejects
    for sample in data:
        if MARKER in sample:
            yield sample
            continue
        caption, image_alt, reason, missing = select_sample(sample, cfg)
        if reason is not None:
            key = sample.get("__key__", "")
            check.observe(sample, missing, reason)
            marker = _reject(tally, sample, reason, "select", key, _why(sample, reason), emit)
            if marker:
                yield marker
            continue
        check.observe(sample, None)
        sample["__caption__"] = caption
        sample["__image_ext__"] = image_alt.ext
        yield sample
    check.finish()


def _why(sample: dict, reason: str) -> str:
    skipped = sample.get("__skipped__")
    if skipped and reason in skipped.values():
        exts = ", ".join(e for e, r in skipped.items() if r == reason)
        return f"sample {sample.get('__key__', '')!r}: {reason} (its {exts} member was not read)"
    return f"sample {sample.get('__key__', '')!r}: {reason}"


def _rename(data: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    """Reshape to the canonical fields; other members (and their bytes) are let go here."""
    for sample in data:
        if MARKER in sample:
            yield sample
            continue
        ext = sample["__image_ext__"]
        field = "video" if is_video(ext, asked=True) else "image"
        meta = sample.get("__parsed_json")
        if meta is None and "json" in sample:
            try:
                meta = parse_json_member(sample["json"])
            except ValueError:
                tally.note("invalid_json", "rename", sample["__url__"], sample["__key__"] + ".json",
                           "metadata .json is not valid JSON; sample kept without it")
        yield {"__key__": sample["__key__"], "__url__": sample["__url__"], "caption": sample["__caption__"],
               field: sample[ext], "__media_ext__": ext, "json": meta}


# Special tokens in captions, held in a picklable object (never a module global): a global set in
# the parent process is silently lost in spawn/forkserver DataLoader workers, so the configured
# image token lives in the CaptionCleaner that each clean_captions stage carries with it (the
# validator and the CLIP scorer clean captions with it too).
@dataclass
class CaptionCleaner:
    image_token: Optional[str]
    mode: str  # normalise | strip | keep
    known_image_tokens: Tuple[str, ...]
    extra_tokens: Tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: StageConfig) -> "CaptionCleaner":
        return cls(cfg.image_token, cfg.effective_token_mode, cfg.known_image_tokens, cfg.extra_tokens)

    @property
    def foreign_tokens(self) -> Tuple[str, ...]:
        return tuple(t for t in self.known_image_tokens if t != self.image_token)

    def find_foreign(self, caption: str) -> Tuple[str, ...]:
        return tuple(t for t in self.foreign_tokens if t in caption)

    def clean(self, caption: str) -> Tuple[str, Tuple[str, ...]]:
        """(cleaned caption, foreign tokens that were found)."""
        foreign = self.find_foreign(caption)
        if self.mode == "keep":
            return caption, foreign
        if self.mode == "normalise":
            for token in foreign:
                caption = caption.replace(token, self.image_token)
            return caption, foreign
        # strip: remove every image token and the extra tokens, for models that see pixels.
        for token in set(self.known_image_tokens) | {self.image_token or ""} | set(self.extra_tokens):
            if token:
                caption = caption.replace(token, " ")
        return re.sub(r"\s+", " ", caption).strip(), foreign


def _clean_captions(data: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    cleaner = CaptionCleaner.from_config(cfg)
    for sample in data:
        if MARKER in sample:
            yield sample
            continue
        caption, foreign = cleaner.clean(sample["caption"])
        if foreign:
            tally.note("foreign_image_token", "clean_captions", sample["__url__"], sample["__key__"],
                       f"caption has {', '.join(foreign)} but the configured image token is {cleaner.image_token!r}")
        if not caption.strip():
            marker = _reject(tally, sample, "empty_caption", "clean_captions", sample["__key__"],
                             "caption is empty after removing special tokens", cfg.emit_rejects)
            if marker:
                yield marker
            continue
        sample["caption"] = caption
        yield sample


# Where the decode stage keeps the image member's bytes when StageConfig.keep_image_bytes is set.
IMAGE_BYTES = "__image_bytes__"


def decode_sample(sample: dict, cfg: StageConfig, tally: Tally) -> Tuple[Optional[dict], Optional[str]]:
    """One sample through the decode stage: what it gives (the sample, a reject marker with
    emit_rejects, or None) and the reason when it dropped the sample (None when it kept it)."""
    if MARKER in sample or "image" not in sample or not cfg.decode_pixels:
        return sample, None
    try:
        raw = sample["image"]
        deferred = deferred_jpeg(raw, cfg.max_pixels, cfg.max_side) if cfg.defer_jpeg else None
        if deferred is not None:  # its consumer decodes it from the bytes (the CLIP scorer's --decode-device)
            sample["image"], sample[IMAGE_BYTES] = deferred, raw
            return sample, None
        sample["image"] = decode_image(raw, cfg.max_pixels, cfg.max_side, cfg.oversize, cfg.image_mode,
                                       cfg.decode_floor)
        if cfg.keep_image_bytes:
            sample[IMAGE_BYTES] = raw
        return sample, None
    except DataError as e:
        member = f"{sample['__key__']}.{sample['__media_ext__']}"
        return _reject(tally, sample, e.reason, "decode", member, str(e), cfg.emit_rejects), e.reason


def _decode(data: Iterable[dict], cfg: StageConfig, tally: Tally) -> Iterator[dict]:
    """Decode "image" behind the size guard. Videos stay bytes (the scorers decode frames), and so
    do images where nothing reads their pixels (cfg.decode_pixels)."""
    for sample in data:
        out, _ = decode_sample(sample, cfg, tally)
        if out is not None:
            yield out


def _map_dict(data: Iterable[dict], fns: Dict[str, Callable[[Any], Any]], tally: Optional[Tally] = None,
              on_error: str = "raise") -> Iterator[dict]:
    """Apply the user's transforms per field. Their exceptions are bugs, so they raise by default
    (with the sample named); on_error='skip' counts them as `transform_error` instead."""
    for sample in data:
        if MARKER in sample:
            yield sample
            continue
        try:
            for field, fn in fns.items():
                if field in sample:
                    sample[field] = fn(sample[field])
        except Exception as e:
            where = f"sample {sample.get('__key__')!r} of shard {sample.get('__url__')}"
            if on_error == "skip" and tally is not None:
                tally.drop("transform_error", "map_dict", sample.get("__url__", ""), sample.get("__key__", ""),
                           f"{type(e).__name__}: {e}")
                continue
            raise type(e)(f"{e} (in map_dict on field {field!r}, {where})") from e
        yield sample


def _watch(data: Iterable[dict], tally: Tally, sink=None, report_every: int = 256) -> Iterator[dict]:
    """Count output; the starvation check itself runs as members are read, samples dropped and
    shards opened.
    With a sink, the tally is written for the parent process every `report_every` samples and at
    the end."""
    n = 0
    try:
        tally.waiting()
        for sample in data:
            # markers are dicts; `in` on a loader's (image, tokens) tuple compared the string with each
            # tensor (torch's __eq__ and its TypeError: ~100 us a sample, more than the seeding)
            if not isinstance(sample, dict) or MARKER not in sample:
                tally.sample_out()
            n += 1
            if sink is not None and n % report_every == 0:
                sink.write(tally)
            yield sample
            tally.waiting()  # the clock of starvation_seconds runs only while the stages work
        tally.check_starvation(stream_ended=True)
    finally:
        # A generator left open is closed when the interpreter exits, after `open` is gone (and
        # the module's globals, `sys` among them, may be None by then): a worker that is being
        # torn down has no parent left to read the tally anyway.
        finalizing = getattr(sys, "is_finalizing", None)
        if sink is not None and finalizing is not None and not finalizing():
            sink.write(tally)


read = pipelinefilter(_read)
select = pipelinefilter(_select)
rename = pipelinefilter(_rename)
clean_captions = pipelinefilter(_clean_captions)
decode = pipelinefilter(_decode)
map_dict = pipelinefilter(_map_dict)
watch = pipelinefilter(_watch)


def sample_stages(cfg: StageConfig, tally: Tally, decode_images: bool = True, before_decode: Sequence = ()) -> list:
    """The per-sample stages after the shard list, in order; callers append their own.
    before_decode: stages that need only keys and captions (a score filter), so what they drop
    is never decoded."""
    stages = [read(cfg, tally), select(cfg, tally), rename(cfg, tally), clean_captions(cfg, tally)]
    stages += list(before_decode)
    if decode_images:
        stages.append(decode(cfg, tally))
    return stages
