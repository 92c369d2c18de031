"""Byte sizes as people write them (8GB, 8GiB, 512MiB, a byte count), read and printed the one
way every option taking a size uses (--max-memory, --min-free-host, --max-bytes)."""
from __future__ import annotations

import re
from typing import Optional, Union

from .errors import ConfigError

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(value: Union[str, int, float, None], what: str = "size") -> Optional[int]:
    """'8GB' -> 8e9 bytes, '8GiB' or '8G' -> 8 * 2**30, plain numbers are bytes.

    KB/MB/GB/TB are decimal (as disks and cloud quotas count); KiB/GiB and the bare K/M/G/T
    letters are binary (as nvidia-smi and PyTorch count)."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"{what} must be positive, got {value}")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(f"{what}: cannot read {value!r} as a size; expected e.g. 8GB, 8GiB, 512MiB or a byte count")
    number, unit, binary, b = m.groups()
    decimal = bool(b) and not binary and unit != ""
    base = 1000 if decimal else 1024
    size = int(float(number) * base ** _POWERS[unit.lower()])
    if size <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return size


def format_size(n: Optional[float]) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
