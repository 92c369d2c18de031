"""Key specs: where a sample keeps its caption and its image.

Syntax (the same in Python, on the command line and in config files):

    txt                         the member <key>.txt, decoded as UTF-8
    json:description            field "description" of <key>.json
    json:meta.caption           nested field meta -> caption
    txt;json:caption            alternatives, tried left to right
    jpg;png;jpeg;webp           image alternatives

Extensions are matched case-insensitively (samples carry lower-cased extensions).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from .errors import ConfigError

_EXT = re.compile(r"^[a-z0-9_\-]+(\.[a-z0-9_\-]+)*$")
_FIELD = re.compile(r"^[^.\s;:]+$")

DEFAULT_CAPTION_KEY = "txt"
DEFAULT_IMAGE_KEY = "jpg;png;jpeg;webp"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm")
VIDEO_EXTS = ("mp4", "webm", "mkv", "avi", "mov")


@dataclass(frozen=True)
class FieldRef:
    """One alternative: a member extension and, for JSON members, a path inside it."""

    ext: str
    path: Tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.ext + (":" + ".".join(self.path) if self.path else "")


@dataclass(frozen=True)
class KeySpec:
    """An ordered list of alternatives; the first one a sample has wins."""

    alternatives: Tuple[FieldRef, ...]

    @classmethod
    def parse(cls, spec: "str | KeySpec", what: str = "key") -> "KeySpec":
        if isinstance(spec, KeySpec):
            return spec
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"empty {what} spec; expected e.g. 'txt' or 'json:description' or 'txt;json:caption'")
        alternatives = []
        for part in spec.split(";"):
            part = part.strip()
            ext, sep, path = part.partition(":")
            ext = ext.strip().lower().lstrip(".")
            if not ext or not _EXT.match(ext):
                raise ConfigError(f"malformed {what} spec {spec!r}: bad extension {part!r}; "
                                  f"expected e.g. 'txt', 'json:description', 'jpg;png'")
            fields = tuple(f.strip() for f in path.split(".")) if sep else ()
            if sep and (not fields or not all(_FIELD.match(f) for f in fields)):
                raise ConfigError(f"malformed {what} spec {spec!r}: bad JSON path in {part!r}; "
                                  f"expected e.g. 'json:description' or 'json:meta.caption'")
            alternatives.append(FieldRef(ext, fields))
        return cls(tuple(alternatives))

    def __str__(self) -> str:
        return ";".join(str(a) for a in self.alternatives)

    @property
    def exts(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(a.ext for a in self.alternatives))

    def first_present(self, sample: Mapping[str, Any]) -> Optional[FieldRef]:
        """The first alternative whose member the sample has (without looking inside JSON)."""
        for alt in self.alternatives:
            if alt.ext in sample:
                return alt
        return None


def parse_json_member(data: "bytes | str | Mapping") -> Any:
    """Parse a .json member once; raises ValueError (json or unicode) on bad content."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8")
    if isinstance(data, str):
        return json.loads(data)
    return data


def decode_text_member(data: "bytes | str") -> str:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data).decode("utf-8")
    return data


def json_path_get(obj: Any, path: Tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(obj, Mapping) or name not in obj:
            return None
        obj = obj[name]
    return obj


def find_caption(sample: dict, spec: KeySpec):
    """(caption, None) or (None, reason) for a raw sample (extension -> bytes).

    The reason is the most specific one seen: invalid_utf8, invalid_json, caption_not_text (a JSON
    number, list or object where text was expected: str() of it would be trained on), empty_caption,
    or missing_caption. A parsed .json member is kept in sample["__parsed_json"] (parsed once)."""
    reason = "missing_caption"
    for alt in spec.alternatives:
        if alt.ext not in sample:
            continue
        raw = sample[alt.ext]
        try:
            if alt.path:
                cache = "__parsed_" + alt.ext
                if cache not in sample:
                    sample[cache] = parse_json_member(raw)
                value = json_path_get(sample[cache], alt.path)
            else:
                value = decode_text_member(raw)
        except UnicodeDecodeError:
            reason = "invalid_utf8"
            continue
        except ValueError:
            reason = "invalid_json"
            continue
        if value is None:
            continue
        if not isinstance(value, str):
            reason = "caption_not_text"
            continue
        if not value.strip():
            reason = "empty_caption"
            continue
        return value, None
    return None, reason
