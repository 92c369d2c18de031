"""Dedup's working files under RUN_DIR/dedup/tmp: per-row columns and buckets of records on disk,
so the exact and near passes hold at most a memory budget of records at a time, whatever the rows.

A `Column` is one flat file of fixed-size values in row order, written shard by shard and read
back in ranges. `Buckets` spread records (a numpy structured array: a hash or band value and a
row number) over files by a bucket number the caller computes (high bits of a mixed hash), so
each bucket is sorted and searched alone, its size the budget's share.
"""
from __future__ import annotations

import os
import shutil
from typing import Iterator, List, Tuple

import numpy as np

MEMORY_MB = 512    # the default working budget of the exact and near passes (beyond 5 bytes a row)
MAX_BUCKETS = 4096  # files open at once while spreading records (bucket numbers fit 16 bits)


def buckets_for(records: int, bytes_per_record: int, budget: int) -> int:
    """The number of buckets (a power of two) that puts about `budget` bytes of work in each."""
    need = records * bytes_per_record / max(1, budget)
    count = 1
    while count < need and count < MAX_BUCKETS:
        count *= 2
    return count


class Workspace:
    """RUN_DIR/dedup/tmp, removed when the dedup ends (whatever the outcome)."""

    def __init__(self, folder: str, budget_mb: int = MEMORY_MB):
        self.folder = folder
        self.budget = int(budget_mb) * (1 << 20)
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted dedup's leftovers
        os.makedirs(folder)
        self._names = 0

    def path(self, stem: str) -> str:
        self._names += 1
        return os.path.join(self.folder, f"{self._names:04d}-{stem}")

    def rows_per_chunk(self, bytes_per_row: int) -> int:
        return max(1024, self.budget // max(1, bytes_per_row))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class Column:
    """Fixed-size values (a dtype, optionally `width` of them a row) in one file, in row order."""

    def __init__(self, path: str, dtype, width: int = 1):
        self.path, self.dtype, self.width = path, np.dtype(dtype), width
        self.rows = 0
        self._f = open(path, "wb")

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self._f.write(values.tobytes())
        self.rows += len(values)

    def done(self) -> "Column":
        self._f.close()
        return self

    def read(self, lo: int, hi: int) -> np.ndarray:
        size = self.dtype.itemsize * self.width
        out = np.fromfile(self.path, dtype=self.dtype, count=(hi - lo) * self.width, offset=lo * size)
        return out.reshape(-1, self.width) if self.width > 1 else out

    def chunks(self, rows: int) -> Iterator[Tuple[int, np.ndarray]]:
        """(first row, values) of consecutive ranges of `rows` rows."""
        for lo in range(0, self.rows, rows):
            yield lo, self.read(lo, min(self.rows, lo + rows))


class Buckets:
    """Records spread over `count` files by a bucket number per record."""

    def __init__(self, space: Workspace, stem: str, dtype, count: int):
        self.dtype, self.count = np.dtype(dtype), count
        self.paths: List[str] = [space.path(f"{stem}-{b}") for b in range(count)]
        self._files = [open(p, "wb") for p in self.paths]
        self.sizes = np.zeros(count, dtype=np.int64)

    def append(self, records: np.ndarray, bucket: np.ndarray) -> None:
        if self.count == 1:
            self._files[0].write(records.tobytes())
            self.sizes[0] += len(records)
            return
        # Rows stay in row order within a bucket (a stable sort: a radix sort on 16 bits).
        order = np.argsort(bucket.astype(np.uint16), kind="stable")
        counts = np.bincount(bucket, minlength=self.count)
        records = records[order]
        ends = np.cumsum(counts)
        for b in np.flatnonzero(counts):
            self._files[b].write(records[ends[b] - counts[b]:ends[b]].tobytes())
        self.sizes += counts

    def done(self) -> "Buckets":
        for f in self._files:
            f.close()
        return self

    def read(self, b: int) -> np.ndarray:
        return np.fromfile(self.paths[b], dtype=self.dtype)

    def chunks(self, b: int, records: int) -> Iterator[np.ndarray]:
        """Bucket b, `records` at a time (a bucket swollen by one repeated value is read in parts)."""
        size = self.dtype.itemsize
        for lo in range(0, int(self.sizes[b]), records):
            yield np.fromfile(self.paths[b], dtype=self.dtype, count=records, offset=lo * size)

    def remove(self, b: int) -> None:
        os.remove(self.paths[b])


def mix(values: np.ndarray) -> np.ndarray:
    """A well-spread uint64 of each uint64 (Fibonacci hashing), for bucket numbers from high bits:
    phashes of photos are not uniform in their high bits, their products with an odd constant are."""
    return values * np.uint64(0x9E3779B97F4A7C15)


def bucket_of(values: np.ndarray, count: int) -> np.ndarray:
    if count == 1:
        return np.zeros(len(values), dtype=np.int64)
    return (mix(values) >> np.uint64(64 - int(count).bit_length() + 1)).astype(np.int64)
