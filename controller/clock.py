"""Clocks: real time for the daemon, virtual time for the simulator.

Both offer `now()` (epoch seconds) and `call_at(when, fn)` returning a handle
with `cancel()`. The virtual clock only moves when the simulator advances it,
running due callbacks in time order (ties in the order they were scheduled).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable


class RealClock:
    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.time()), fn)


class _VirtualTimer:
    __slots__ = ("cancelled", "fn", "when")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimClock:
    """A virtual clock with a timer heap."""

    def __init__(self, start_at: float = 0.0) -> None:
        self._now = start_at
        self._heap: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, fn: Callable[[], None]) -> _VirtualTimer:
        timer = _VirtualTimer(max(when, self._now), fn)
        heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
        return timer

    def next_at(self) -> float | None:
        """When the earliest pending timer fires (None when there is none)."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance_to(self, when: float) -> None:
        """Move time forward to `when`, firing every timer due by then."""
        while self._heap and self._heap[0][0] <= when:
            at, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            if at > self._now:  # (max() spelt out: a call per timer)
                self._now = at
            timer.fn()
        if when > self._now:
            self._now = when
