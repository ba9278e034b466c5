"""How long the event loop was kept from running: a timer that should fire every
`period_s` is measured against the monotonic clock, and how late it fired is the
longest the loop (or the GIL it needs) was held by something else in that stretch.

Why measured in the daemon: a request's latency seen from outside mixes the loop's
stalls with the client's and the OS's scheduling; issue 14's bound is on the loop
("large bags never block the loop more than 100 ms at a time"), so that is what is
recorded: `spotbag_event_loop_lag_seconds` (a histogram of every late wake-up) and
`spotbag_event_loop_lag_max_seconds` (the longest since start) at /metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class LoopLagMonitor:
    """Wakes every `period_s` and records lateness = (now - then) - period_s."""

    def __init__(
        self,
        observe: Callable[[float], None],
        period_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.observe = observe
        self.period_s = period_s
        self.clock = clock
        self.max_lag_s = 0.0

    def record(self, lag_s: float) -> None:
        lag_s = max(0.0, lag_s)
        self.max_lag_s = max(self.max_lag_s, lag_s)
        self.observe(lag_s)

    async def run(self) -> None:
        while True:
            before = self.clock()
            await asyncio.sleep(self.period_s)
            self.record(self.clock() - before - self.period_s)
