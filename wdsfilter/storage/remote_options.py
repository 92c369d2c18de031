"""How remote objects are read and which storage options reach their filesystem, as data: the
stage config holds a RemoteOptions (picklable: it travels to decode workers and Ray tasks) and
parses `--storage-option KEY=VALUE`, so this module imports no client and no network module."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence

from ..core.errors import ConfigError


@dataclass(frozen=True)
class RemoteOptions:
    """How remote shards are read. Picklable: it travels to decode workers and Ray tasks, which
    open their shards themselves."""
    storage_options: Mapping = field(default_factory=dict)
    attempts: int = 8              # failed reads in a row before the shard fails
    retry_budget: int = 16         # retries of one object in all: bytes received do not renew it
    backoff_seconds: float = 0.5   # first wait; doubles each time, with jitter, up to max_backoff
    max_backoff_seconds: float = 30.0
    block_bytes: int = 8 << 20     # one ranged read
    readahead: int = 4             # ranged reads in flight (memory: readahead * block_bytes)
    idle_seconds: float = 600.0    # a read that sends nothing for this long is abandoned and retried; 0 = never
    # The transfer floor (curl's --speed-limit/--speed-time): a read slower than speed_limit bytes/s
    # over speed_seconds of waiting is abandoned and retried (remote_pace.py); 0 = no floor.
    speed_limit: int = 1024
    speed_seconds: float = 60.0

    def __post_init__(self):
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"remote_attempts must be >= 1, got {self.attempts!r}")
        if isinstance(self.retry_budget, bool) or not isinstance(self.retry_budget, int) or self.retry_budget < 0:
            raise ConfigError(f"remote_retry_budget must be >= 0 (retries of one object in all), got "
                              f"{self.retry_budget!r}")
        if isinstance(self.speed_limit, bool) or not isinstance(self.speed_limit, int) or self.speed_limit < 0:
            raise ConfigError(f"remote_speed_limit must be >= 0 bytes/s (0: no floor), got {self.speed_limit!r}")
        if isinstance(self.speed_seconds, bool) or not isinstance(self.speed_seconds, (int, float)) \
                or not self.speed_seconds > 0:
            raise ConfigError(f"remote_speed_time must be > 0 seconds, got {self.speed_seconds!r}")
        if not isinstance(self.block_bytes, int) or self.block_bytes < 1:
            raise ConfigError(f"remote_block_bytes must be a positive number of bytes, got {self.block_bytes!r}")
        if not isinstance(self.readahead, int) or self.readahead < 1:
            raise ConfigError(f"remote_readahead must be >= 1, got {self.readahead!r}")

    @property
    def answer_seconds(self) -> Optional[float]:
        """How long a request may go unanswered (a HEAD, a listing): the floor's window, else the
        idle limit; None: as long as the client's own timeouts allow."""
        return self.speed_seconds if self.speed_limit else (self.idle_seconds or None)


def parse_storage_options(items: Sequence[str]) -> Dict:
    """`--storage-option KEY=VALUE` (repeatable) -> fsspec storage options. VALUE is JSON when it
    parses (true, 3, {"a": 1}), text otherwise; a dotted KEY nests (client_kwargs.region_name=x)."""
    options: Dict = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--storage-option takes KEY=VALUE, got {key or item!r}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        node = options
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {key}: {p} is given both as a value and as a group")
        node[leaf] = parsed
    return options


def redact_options(options: Optional[Mapping]) -> Dict:
    """Storage options as they may be shown or written: the keys, never the values."""
    return {k: (redact_options(v) if isinstance(v, Mapping) else "<hidden>") for k, v in (options or {}).items()}
