"""The event loop's stall monitor: a callback that holds the loop shows as a late
wake-up of about its length; an idle loop shows none."""

from __future__ import annotations

import asyncio
import itertools
import time

from controller.plumbing.loop_lag import LoopLagMonitor


def test_a_callback_that_holds_the_loop_is_recorded_as_a_stall_of_its_length():
    seen: list[float] = []
    monitor = LoopLagMonitor(seen.append, period_s=0.01)

    async def main() -> None:
        task = asyncio.create_task(monitor.run())
        await asyncio.sleep(0.1)
        idle_max = monitor.max_lag_s
        time.sleep(0.2)  # holds the loop, as a blocking call would
        await asyncio.sleep(0.05)
        task.cancel()
        assert idle_max < 0.1

    asyncio.run(main())
    assert 0.19 <= monitor.max_lag_s < 1.0
    assert max(seen) == monitor.max_lag_s
    assert len(seen) >= 5 and min(seen) >= 0.0


def test_lateness_is_measured_against_the_period():
    ticks = itertools.chain([0.0, 0.35], itertools.repeat(1.0))
    seen: list[float] = []
    monitor = LoopLagMonitor(seen.append, period_s=0.25, clock=lambda: next(ticks))

    async def one_tick() -> None:
        task = asyncio.create_task(monitor.run())
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(one_tick())
    assert seen[0] == 0.35 - 0.25
