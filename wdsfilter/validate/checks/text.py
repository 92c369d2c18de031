"""Text and JSON members, and a sample's caption as the stages see it (specs.find_caption and the
CaptionCleaner of the stages, with the same StageConfig)."""
from __future__ import annotations

from typing import Optional

from ...core.specs import FieldRef, KeySpec, find_caption, parse_json_member
from ..findings import FindingLog

TEXT_EXTS = frozenset({"txt", "text", "caption", "cap"})


def check_text(name: str, key: str, data: bytes, log: FindingLog) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        log.add("invalid_utf8", name, key, f"not UTF-8 at byte {e.start} ({data[e.start:e.start + 4]!r}); "
                                           f"re-encode the captions as UTF-8")


def check_json(name: str, key: str, data: bytes, log: FindingLog) -> None:
    try:
        parse_json_member(data)
    except UnicodeDecodeError as e:
        log.add("invalid_utf8", name, key, f"JSON is not UTF-8 at byte {e.start}")
    except ValueError as e:
        log.add("invalid_json", name, key, f"not valid JSON: {e}")


def caption_source(sample: dict, spec: KeySpec, want: str) -> Optional[FieldRef]:
    """The alternative of the spec that gave the caption (want=None) or the given failure reason
    (e.g. 'empty_caption'): evaluated one alternative at a time, only when a finding needs it."""
    for alt in spec.alternatives:
        if alt.ext in sample:
            caption, reason = find_caption(sample, KeySpec((alt,)))
            if (caption is not None) if want is None else (reason == want):
                return alt
    return None
