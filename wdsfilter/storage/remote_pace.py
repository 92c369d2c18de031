"""How slow a remote read may be: a transfer floor like curl's --speed-limit/--speed-time, and the
idle limit (stream_idle_seconds), both measured while the reader waits for bytes.

Only waiting counts: a consumer that is slow to ask for more (a long training step, a full queue)
leaves the bytes waiting in the read-ahead, and the server is not blamed for that time. Bytes are
counted as they come off the network (the streaming GET, each ranged block's chunks), so a block
still arriving counts too. A read whose rate over the last `seconds` of waiting is below `limit`
bytes/s, or that got nothing for `idle` seconds, is abandoned: a failed read, asked again from the
byte reached, within the object's retry budget (remote_read.RemoteShard). Each new request starts
a new window: a reconnect gets a fair chance.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from typing import Callable, Optional

from ..core.units import format_size


class SlowRead(TimeoutError):
    """A read abandoned for its pace: below the floor, or idle too long."""


class Pace:
    def __init__(self, limit: int, seconds: float, idle: float):
        self.limit, self.seconds, self.idle = limit, seconds, idle
        self._lock = threading.Lock()
        self.received = 0          # bytes off the network for this object (every request)
        self.clock = 0.0           # seconds the reader has waited for bytes
        self.started = time.monotonic()
        self._window: deque = deque()
        self.restart()

    def add(self, n: int) -> None:
        """Bytes that came off the network (any thread)."""
        with self._lock:
            self.received += n

    def restart(self) -> None:
        """A new request: a new window."""
        self._window = deque([(self.clock, self.received)])
        self._last_byte = (self.clock, self.received)

    def slice(self) -> float:
        """How long one wait may last before the pace is looked at again."""
        spans = [s for s in (self.seconds if self.limit else 0, self.idle) if s]
        return max(0.02, min(1.0, min(spans) / 8)) if spans else 1.0

    def wait(self, get: Callable[[float], object]):
        """get(timeout) until it returns something other than NOTHING (nothing came in time).
        Raises SlowRead when the read is below the floor or idle too long."""
        while True:
            began = time.monotonic()
            item = get(self.slice())
            self._waited(time.monotonic() - began)
            if item is not NOTHING:
                return item
            why = self.too_slow()
            if why:
                raise SlowRead(why)

    @staticmethod
    def result_of(fut: concurrent.futures.Future) -> Callable[[float], object]:
        """A future's result as a `get` for wait(): NOTHING while it is not done."""
        def get(timeout: float):
            done, _ = concurrent.futures.wait([fut], timeout)
            return fut.result() if done else NOTHING
        return get

    def _waited(self, seconds: float) -> None:
        self.clock += seconds
        sample = (self.clock, self.received)
        if sample[1] != self._last_byte[1]:
            self._last_byte = sample
        window = self._window
        # one sample per 1/64 of the window at most: bounded memory whatever the chunk rate
        if len(window) > 1 and sample[0] - window[-2][0] < self.seconds / 64:
            window[-1] = sample
        else:
            window.append(sample)
        while len(window) > 1 and window[1][0] <= self.clock - self.seconds:
            window.popleft()

    def too_slow(self) -> Optional[str]:
        """Why the read in progress is abandoned, or None."""
        if self.idle and self.clock - self._last_byte[0] >= self.idle:
            return f"too slow: no bytes for {self.idle:g}s (stream_idle_seconds)"
        if not self.limit:
            return None
        t0, r0 = self._window[0]
        span = self.clock - t0
        if span >= self.seconds and (self.received - r0) < self.limit * span:
            return (f"too slow: {_rate((self.received - r0) / span)} over the last {span:.0f}s, below the floor of "
                    f"{_rate(self.limit)} (--remote-speed-limit, over --remote-speed-time {self.seconds:g}s)")
        return None

    def seen(self) -> str:
        """The rate seen over the whole object, in words (for the message that gives up)."""
        took = max(time.monotonic() - self.started, 1e-3)
        return f"{format_size(self.received)} received in {took:.0f}s ({_rate(self.received / took)})"


NOTHING = object()  # what a `get` returns when nothing came in time


def _rate(bytes_per_second: float) -> str:
    if bytes_per_second < 1024:
        return f"{bytes_per_second:.0f} B/s"
    return f"{format_size(int(bytes_per_second))}/s"
