"""Member names and key specs: how a tar member name becomes (key, extension), and where a
sample keeps its caption and its image.

Names: webdataset splits at the *first* dot of the basename: `img.v2.0001.jpg` becomes key `img`
with extension `v2.0001.jpg`, so every file of a dotted dataset collapses into one sample. That
stays the default (multi-part extensions like `seg.png` and `json.gz` rely on it), is detected
(is_dotted), and `rekey="last-dot"` splits at the last dot instead.

Key specs (the same syntax in Python, on the command line and in config files):

    txt                         the member <key>.txt, decoded as UTF-8
    json:description            field "description" of <key>.json
    json:meta.caption           nested field meta -> caption
    txt;json:caption            alternatives, tried left to right
    jpg;png;jpeg;webp           image alternatives

Extensions are matched case-insensitively (samples carry lower-cased extensions).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union

from .errors import ConfigError

_EXT = re.compile(r"^[a-z0-9_\-]+(\.[a-z0-9_\-]+)*$")
_FIELD = re.compile(r"^[^.\s;:]+$")

DEFAULT_CAPTION_KEY = "txt"
DEFAULT_IMAGE_KEY = "jpg;png;jpeg;webp"
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm")
# Containers checked and scored as video (an audio-only .m4a or .mp3 under the image key is then
# named for what it is, no_video_stream, by both validate and scoring).
VIDEO_EXTS = ("mp4", "webm", "mkv", "avi", "mov", "m4v", "m4a", "mp3", "mpg", "mpeg", "flv", "3gp", "ogv", "wmv",
              "mts", "m2ts", "vob", "mxf", "f4v", "3g2", "asf", "h264", "264", "hevc", "h265", "265")
# Audio containers among them: read as video when asked (to say no_video_stream), never suggested
# as the place of a sample's image.
AUDIO_EXTS = ("m4a", "mp3")
# Video only under the image key: `.ts` is MPEG-TS there (camcorders, HLS segments), but a
# webdataset field named `ts` elsewhere is as likely a timestamp.
VIDEO_EXTS_ASKED = ("ts",)
# Compression suffixes of a member name (`x.txt.gz`). webdataset's default decoder opens .gz
# (gzfilter) and so do the stages; all of them are stripped before judging what a member is.
COMPRESSION_EXTS = ("gz", "xz", "bz2", "zst", "lz4")
# Deeper JSON is not metadata; json.loads would recurse into it until RecursionError.
MAX_JSON_DEPTH = 64
REKEY_MODES = ("first-dot", "last-dot")


SHORT_KEY = 32  # ASCII characters: a key this short is its own stand-in (at most 81 bytes held)


def key_digest(key: str) -> Union[str, bytes]:
    """A bounded stand-in for a key in the sets that remember every key of a shard (is it a
    duplicate, did it come back): a short ASCII key is kept as it is (at most 81 bytes), any other
    is a 16-byte digest (49 bytes), so memory per key stays bounded however long the names are
    (50,000 names of 4,000 characters held 450 MB). Hashing every key cost validate about 8% of its
    time on ordinary shards (short keys: tools/bench_validate.py); a str and a bytes never compare
    equal, so a short key and a digest cannot be taken for each other."""
    if len(key) <= SHORT_KEY and key.isascii():
        return key
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def is_video(ext: str, asked: bool = False) -> bool:
    """Is a member of this extension a video (PyAV) rather than an image (PIL)? `asked`: the
    extension is the image key's. The one rule of the stages, validate, scoring and the report."""
    last = ext.rsplit(".", 1)[-1]
    return last in VIDEO_EXTS or (asked and last in VIDEO_EXTS_ASKED)


# -- member names ----------------------------------------------------------------------------------
def split_name(name: str, rekey: str = "first-dot") -> Tuple[Optional[str], Optional[str]]:
    """(key, extension as written) or (None, None) for names with no extension and dotfiles."""
    slash = name.rfind("/") + 1
    base = name[slash:]
    if base.startswith("."):
        return None, None
    dot = base.find(".") if rekey == "first-dot" else _last_dot(base)
    if dot <= 0 or dot == len(base) - 1:
        return None, None
    # tarfile decodes a name that is not UTF-8 (Latin-1 from an old Windows share) with surrogate
    # escapes: the key says those bytes as \xNN, the same in every reader, so rows and samples match.
    return utf8_text(name[:slash + dot]), base[dot + 1:]


def reserved_ext(ext: str) -> Optional[str]:
    """Why a member with this extension cannot be part of a sample, or None. A sample is a dict
    whose `__`-prefixed keys are its metadata (`__key__`, `__url__`, the stages' `__marker__`,
    `__skipped__`): a member `x.__marker__` would overwrite them (webdataset raises on
    `x.__key__`, and its decoders skip such fields)."""
    if not ext.startswith("__"):
        return None
    return (f"extension '.{ext}' starts with '__', which webdataset and wdsfilter reserve for a sample's "
            f"metadata (__key__, __url__); the member is ignored. Rename it when writing shards")


def _last_dot(base: str) -> int:
    """The dot before the extension, a compression suffix counting as part of it (last-dot keys
    `img.v2.0001` of `img.v2.0001.txt.gz` too, as webdataset's gz decoder reads `txt.gz`)."""
    dot = base.rfind(".")
    while dot > 0 and base[dot + 1:].split(".", 1)[0].lower() in COMPRESSION_EXTS:
        before = base.rfind(".", 0, dot)
        if before <= 0:
            break  # `0001.gz`: the compression suffix is the whole extension
        dot = before
    return dot


def utf8_text(text: str) -> str:
    """`text` with the surrogate escapes of bytes that were not UTF-8 (how Python decodes such
    file and member names) written as \\xNN: no Parquet or JSON writer accepts lone surrogates."""
    if text.isascii():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_dotted(ext: str) -> bool:
    """True when a first-dot extension looks like part of a dotted basename (`v2.0001.jpg`)."""
    parts = ext.split(".")
    return len(parts) > 1 and any(any(c.isdigit() for c in p) for p in parts[:-1])


# -- key specs -------------------------------------------------------------------------------------


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
            if ext.endswith(".gz"):  # compressed members are read under their plain extension
                ext = ext[:-3]
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


def base_ext(ext: str) -> str:
    """The extension without its compression suffixes: `txt.gz` -> `txt`, `pth.xz` -> `pth`."""
    while True:
        head, dot, last = ext.rpartition(".")
        if not dot or last not in COMPRESSION_EXTS:
            return ext
        ext = head


def parse_json_member(data: "bytes | str | Mapping") -> Any:
    """Parse a .json member once; raises ValueError (json or unicode) on bad content, including
    documents nested deeper than MAX_JSON_DEPTH (which json.loads would meet with RecursionError)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8")
    if isinstance(data, str):
        try:
            value = json.loads(data)
        except RecursionError:
            raise ValueError(f"JSON nested deeper than Python can parse (over {MAX_JSON_DEPTH} levels)") from None
        if isinstance(value, (dict, list)) and (data.count("[") + data.count("{")) > MAX_JSON_DEPTH:
            _check_depth(value)  # only documents with many containers can be that deep
        return value
    return data


def _check_depth(value: Any) -> None:
    """ValueError when containers nest deeper than MAX_JSON_DEPTH (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        children = obj.values() if isinstance(obj, dict) else obj
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


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
        return no_lone_surrogates(value), None
    return None, reason


def no_lone_surrogates(text: str) -> str:
    """JSON may escape half of a UTF-16 pair ("\\ud83d", an emoji cut by a JavaScript substring):
    json.loads keeps it as a lone surrogate, which no UTF-8 writer (Parquet, JSON lines, the HTML
    report, a tokenizer's encode) accepts. It becomes U+FFFD, as a UTF-8 decoder treats bad bytes."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
