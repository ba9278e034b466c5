"""Driver and executor calls as the scheduler makes them: at most
`scheduler.max_concurrent_calls` at a time, a failure logged and swallowed (the next
pass retries), background calls kept until done, and the starts handed to the executor
in the background tracked so that the executor can be told to stop attempts only once
it has every attempt it was given.

`Calls` owns no part of the world; the scheduler's collaborators that call the driver or
the executor (controller/scheduler/events.py, actions.py, recovery.py, slurm_pools.py and
loop.py) share one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("spotbag.scheduler")

T = TypeVar("T")


class Calls:
    """Bounded, logged driver/executor calls, and the starts under way."""

    def __init__(self, max_concurrent_calls: int) -> None:
        self.max_concurrent_calls = max_concurrent_calls
        self._slots = asyncio.Semaphore(max_concurrent_calls)
        # Starts handed to the executor in the background (actions.py).
        self.starting: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[object]] = set()

    async def call(self, awaitable: Awaitable[T]) -> T | None:
        """Await a driver/executor call; log and swallow its failure (the next pass retries)."""
        try:
            return await awaitable
        except Exception:
            log.exception("driver/executor call failed")
            return None

    async def run_all(self, calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
        """Run driver/executor calls, at most max_concurrent_calls at a time."""
        if self.max_concurrent_calls == 1:
            return [await call() for call in calls]

        async def bounded(call: Callable[[], Awaitable[T]]) -> T:
            async with self._slots:
                return await call()

        return await asyncio.gather(*(bounded(call) for call in calls))

    def spawn(self, coroutine: Awaitable[object]) -> None:
        """Run a driver/executor call in the background, its failure logged (a pass
        does not wait for it)."""
        task = asyncio.ensure_future(self.call(coroutine))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def start_in_background(self, starting: Awaitable[None]) -> None:
        """Track starts handed to the executor without waiting for them."""
        task = asyncio.ensure_future(starting)
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)

    async def starts_settled(self) -> None:
        """Wait for the starts handed to the executor in the background (actions.py):
        before it is told to stop attempts (a cancel, a VM lost, a shutdown, a
        recovery), it has every attempt it was given, so none starts after it was
        stopped."""
        while self.starting:
            await asyncio.wait(list(self.starting))
