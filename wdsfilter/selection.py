"""The select decision: would the stages keep this sample, and if not, why.

One function, asked by the select stage (stages.select) and by the validator (its per-sample
verdict), so that what validate reports is what training gets. Kept apart from stages.py because
the validator must not import webdataset (which imports torch).
"""
from __future__ import annotations

from typing import Optional, Tuple

from .config import StageConfig
from .reading import OVERSIZED
from .specs import FieldRef, find_caption, is_dotted


def select_sample(sample: dict, cfg: StageConfig) -> Tuple[Optional[str], Optional[FieldRef], Optional[str], Optional[str]]:
    """The select decision, the one both the select stage and the validator ask.

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


