"""Members that a default webdataset decoder would execute (pickle, torch.load). The validator
only looks at their names; their bytes are dropped unread."""
from __future__ import annotations

from ...stream.reading import is_unsafe_ext
from ..findings import FindingLog


def check_member(name: str, key: str, ext: str, log: FindingLog) -> bool:
    """True when the member is unsafe (recorded); the caller then lets its bytes go."""
    if not is_unsafe_ext(ext):
        return False
    log.add("unsafe_member", name, key,
            f"'.{ext}' is loaded with pickle/torch.load by webdataset's default decoders, which runs "
            f"any code inside; not loaded")
    return True
