"""What a tar member is, before its bytes are used: its kind and byte cap, whether a decoder would
run code from it, and its compressed form.

One place for these rules: the stages' reader (reading.py), the validator's fast tar reader and
its member checks all ask here, so a member the stages skip is the member the validator reports.
"""
from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Optional, Tuple

from ..core.errors import DataError
from ..core.specs import IMAGE_EXTS, VIDEO_EXTS, base_ext, is_video

# Members whose only readers unpickle them: webdataset 1.x decodes .pyd/.pickle/.pkl with
# pickle.loads and .pth with torch.load (weights_only off unless WDS_PYTORCH_WEIGHTS_ONLY=1), and
# .pt/.ckpt/.joblib are pickle files to any reader. Its other decoders run no code: .mp/.msg with
# msgpack.unpackb, .ten/.tb with tenbin, .npy/.npz with numpy (allow_pickle=False), so they are safe.
UNSAFE_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "joblib"})

TEXT_EXTS = frozenset({"txt", "text", "caption", "cap", "transcript"})
JSON_EXTS = frozenset({"json", "jsn"})


@lru_cache(maxsize=4096)
def is_unsafe_ext(ext: str) -> bool:
    """True when a default decoder would unpickle the member: its extension after the compression
    suffixes a reader strips (`.pyd.gz`, `.pth.xz`, `.pickle.bz2`) names a pickle format. The
    part before is a name, not a format (`x.pyd.jpg` is decoded as a JPEG)."""
    return base_ext(ext.lower()).rsplit(".", 1)[-1] in UNSAFE_EXTS


class MemberCaps:
    """Byte caps per kind of member. A member over its cap is streamed past, never read into memory.

    Built from a StageConfig: the caption spec's plain extensions count as text, its JSON
    extensions as json, the image spec's extensions as image or video."""

    def __init__(self, cfg):
        self.text = cfg.max_text_bytes
        self.json = cfg.max_json_bytes
        self.image = cfg.max_image_bytes
        self.video = cfg.max_video_bytes
        self.other = cfg.max_other_bytes
        self.decompressed = cfg.max_decompressed_bytes
        # Below the smallest cap no member needs its kind worked out (the common case: one compare).
        self.floor = min(self.text, self.json, self.image, self.video, self.other)
        text = set(TEXT_EXTS) | {a.ext for a in cfg.caption_spec.alternatives if not a.path}
        json_ = set(JSON_EXTS) | {a.ext for a in cfg.caption_spec.alternatives if a.path}
        media = set(IMAGE_EXTS) | set(VIDEO_EXTS) | set(cfg.image_spec.exts)
        self._kinds = {}
        for ext in media:
            self._kinds[ext] = "video" if is_video(ext, ext in cfg.image_spec.exts) else "image"
        for ext in json_:
            self._kinds[ext] = "json"
        for ext in text:
            self._kinds[ext] = "text"

    def kind(self, ext: str) -> str:
        """The kind of a member by its (lower-cased) extension, compression suffixes stripped."""
        ext = base_ext(ext)
        kind = self._kinds.get(ext)
        if kind is None:
            kind = self._kinds.get(ext.rsplit(".", 1)[-1], "other")
        return kind

    def limit(self, kind: str) -> int:
        return getattr(self, kind)

    def for_name(self, name: str) -> Tuple[str, int]:
        """(kind, cap) of a member from its name alone (the last dot parts of its basename)."""
        base = name.rsplit("/", 1)[-1].lower()
        dot = base.find(".")
        kind = self.kind(base[dot + 1:]) if dot > 0 else "other"
        return kind, self.limit(kind)

    def over(self, name: str, size: int) -> Optional[str]:
        """A one-line reason when a member of this size is over its cap, else None."""
        if size <= self.floor:
            return None
        kind, cap = self.for_name(name)
        if size <= cap:
            return None
        return (f"{kind} member of {size:,} bytes is over the {kind} cap of {cap:,} bytes "
                f"(max_{kind}_bytes); streamed past, not read")


def gunzip_member(data: bytes, cap: int, name: str) -> bytes:
    """A .gz member's content, as webdataset's gzfilter gives it, never more than `cap` bytes.
    Raises DataError('oversized_member') past the cap, DataError('corrupt_member') on bad data."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer
    try:
        out = d.decompress(data, cap + 1)
        if len(out) > cap:
            raise DataError("oversized_member", f"{name} decompresses to more than the cap of {cap:,} bytes; "
                                                f"not read further")
        while d.eof and d.unused_data.strip(b"\0"):  # concatenated gzip members, as gzip.open reads them
            rest = d.unused_data.lstrip(b"\0")
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            more = d.decompress(rest, cap + 1 - len(out))
            out += more
            if len(out) > cap:
                raise DataError("oversized_member", f"{name} decompresses to more than the cap of {cap:,} "
                                                    f"bytes; not read further")
        if not d.eof:
            raise DataError("corrupt_member", f"{name}: the gzip data is cut short")
        return out
    except zlib.error as e:
        raise DataError("corrupt_member", f"{name}: not valid gzip data ({e})") from None
