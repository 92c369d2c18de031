"""validate's progress on stderr: shards done of the total, with shards/s, MB/s and samples/s
(the line itself, on a terminal or in a log, is wdsfilter/core/progress.py's)."""
from __future__ import annotations

import time

from ..core.progress import Progress as Line


class Progress:
    def __init__(self, total: int, file=None, tty=None, interval=None):
        self.started = time.monotonic()
        self.bytes = self.samples = 0
        options = {} if interval is None else {"interval": interval}
        self.line = Line("validate", "shards", total=total, file=file, tty=tty, extra=self.rates, **options)

    def update(self, result) -> None:
        self.bytes += result.bytes
        self.samples += result.samples
        self.line.update(1)

    def rates(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"{self.bytes / elapsed / 1e6:.1f} MB/s, {self.samples / elapsed:.0f} samples/s"

    def close(self) -> None:
        self.line.close()
