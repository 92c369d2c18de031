"""What keys the samples actually carry, so a wrong caption/image spec can be named and fixed.

Shared by the select stage (its first-shard configuration check) and the validator (its
"use --caption-key json:description" suggestions).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, List, Mapping, Optional, Tuple

from ..core.specs import AUDIO_EXTS, IMAGE_EXTS, VIDEO_EXTS, KeySpec, is_dotted, parse_json_member

_CAPTION_WORDS = ("caption", "description", "text", "title", "alt", "prompt", "sentence")


def _string_paths(obj: Any, prefix: Tuple[str, ...] = (), depth: int = 3):
    if not isinstance(obj, Mapping) or depth == 0:
        return
    for name, value in obj.items():
        if not isinstance(name, str) or not name or any(c in name for c in ".;: "):
            continue
        if isinstance(value, str) and value.strip():
            yield prefix + (name,)
        elif isinstance(value, Mapping):
            yield from _string_paths(value, prefix + (name,), depth - 1)


class KeyCensus:
    """Counts, over samples, each extension and each non-empty string field of .json members."""

    def __init__(self):
        self.samples = 0
        self.exts: Counter = Counter()
        self.json_fields: Counter = Counter()

    def add(self, sample: Mapping[str, Any], parsed_json: Any = None) -> None:
        self.samples += 1
        for ext in sample:
            if not ext.startswith("__"):
                self.exts[ext] += 1
        if parsed_json is None and "json" in sample:
            try:
                parsed_json = parse_json_member(sample["json"])
            except ValueError:
                parsed_json = None
        for path in _string_paths(parsed_json):
            self.json_fields["json:" + ".".join(path)] += 1
        # Text members other than .json (txt, caption, text...) are caption candidates too.

    def share(self, count: int) -> float:
        return count / self.samples if self.samples else 0.0

    def describe(self) -> str:
        exts = ", ".join(f"{e} ({self.share(n):.0%})" for e, n in self.exts.most_common(8)) or "none"
        text = f"extensions present: {exts}"
        if self.json_fields:
            fields = ", ".join(f"{f} ({self.share(n):.0%})" for f, n in self.json_fields.most_common(6))
            text += f"; JSON string fields: {fields}"
        return text

    def caption_candidates(self) -> List[Tuple[str, float]]:
        """Specs that would find a caption, best first: (spec, share of samples)."""
        found = []
        for ext in ("txt", "text", "caption", "cap"):
            if self.exts.get(ext):
                found.append((ext, self.share(self.exts[ext]), 0))
        for field, n in self.json_fields.items():
            last = field.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()
            rank = next((i for i, w in enumerate(_CAPTION_WORDS) if w in last), None)
            if rank is not None:
                found.append((field, self.share(n), rank + 1))
        found.sort(key=lambda t: (-t[1], t[2]))
        return [(spec, share) for spec, share, _ in found]

    def image_candidates(self) -> List[Tuple[str, float]]:
        media = [e for e in self.exts if e.rsplit(".", 1)[-1] in IMAGE_EXTS + VIDEO_EXTS
                 and e.rsplit(".", 1)[-1] not in AUDIO_EXTS]
        return sorted(((e, self.share(self.exts[e])) for e in media), key=lambda t: -t[1])

    def dotted_share(self) -> float:
        """Share of samples whose extensions look like dotted basenames (v2.0001.jpg)."""
        n = sum(c for e, c in self.exts.items() if is_dotted(e))
        return min(1.0, self.share(n))

    def suggest(self, what: str, spec: KeySpec) -> Optional[str]:
        """A one-line suggestion for a spec that finds nothing, or None."""
        candidates = self.caption_candidates() if what == "caption" else self.image_candidates()
        candidates = [(s, sh) for s, sh in candidates if s not in {str(a) for a in spec.alternatives}]
        if not candidates:
            return None
        best, share = candidates[0]
        return f"{what} found under {best} in {share:.0%} of samples; use --{what}-key {best}"
