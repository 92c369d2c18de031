"""Small builders for tests that need a shard of a precise layout (the committed sample shards and
tools/make_sample_shards.py cover the realistic ones)."""
from __future__ import annotations

import io
import json
import tarfile

from PIL import Image


def image_bytes(size=(32, 24), color=(200, 30, 30), fmt="JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


def write_shard(path, members) -> str:
    """members: (name, bytes | str | dict) in tar order; dicts become JSON, str UTF-8."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            if isinstance(data, dict):
                data = json.dumps(data).encode()
            elif isinstance(data, str):
                data = data.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def image_text_members(n, start=0, caption="a red square", ext="jpg", text_ext="txt"):
    members = []
    for i in range(start, start + n):
        members.append((f"{i:06d}.{ext}", image_bytes()))
        members.append((f"{i:06d}.{text_ext}", f"{caption} {i}"))
    return members
