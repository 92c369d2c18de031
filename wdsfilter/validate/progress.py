"""The progress bar of long runs (stderr): shards done, with shards/s, MB/s and samples/s.

tqdm's own rate flips to s/shard when shards are slow, so the rates are computed here and shown
in a fixed form."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, file=None):
        from tqdm import tqdm

        self.started = time.perf_counter()
        self.shards = self.bytes = self.samples = 0
        self.bar = tqdm(total=total, unit="shard", file=file or sys.stderr, dynamic_ncols=True, desc="validate")

    def update(self, result) -> None:
        self.shards += 1
        self.bytes += result.bytes
        self.samples += result.samples
        self.bar.set_postfix_str(self.rates(), refresh=False)
        self.bar.update(1)

    def rates(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return (f"{self.shards / elapsed:.2f} shards/s, {self.bytes / elapsed / 1e6:.1f} MB/s, "
                f"{self.samples / elapsed:.0f} samples/s")

    def close(self) -> None:
        self.bar.close()
