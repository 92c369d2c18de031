"""How a tar member name becomes (key, extension).

webdataset splits at the *first* dot of the basename: `img.v2.0001.jpg` becomes key `img` with
extension `v2.0001.jpg`, so every file of a dotted dataset collapses into one sample. That stays
the default (multi-part extensions like `seg.png` and `json.gz` rely on it), is detected, and
`rekey="last-dot"` splits at the last dot instead.
"""
from __future__ import annotations

from typing import Optional, Tuple

REKEY_MODES = ("first-dot", "last-dot")


def split_name(name: str, rekey: str = "first-dot") -> Tuple[Optional[str], Optional[str]]:
    """(key, extension as written) or (None, None) for names with no extension and dotfiles."""
    slash = name.rfind("/") + 1
    base = name[slash:]
    if base.startswith("."):
        return None, None
    dot = base.find(".") if rekey == "first-dot" else base.rfind(".")
    if dot <= 0 or dot == len(base) - 1:
        return None, None
    return name[:slash + dot], base[dot + 1:]


def is_dotted(ext: str) -> bool:
    """True when a first-dot extension looks like part of a dotted basename (`v2.0001.jpg`)."""
    parts = ext.split(".")
    return len(parts) > 1 and any(any(c.isdigit() for c in p) for p in parts[:-1])
