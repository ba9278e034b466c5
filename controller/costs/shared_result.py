"""One computation, many waiters: the cost views (controller/costs/bag_cost.py,
controller/costs/fleet_cost.py) let a request that needs figures already being computed await
that computation's future rather than start another."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def settle(future: asyncio.Future[T], work: Awaitable[T]) -> T:
    """Await `work` and give its outcome to `future` as well: its result, its exception
    (marked retrieved here, so an unawaited future does not log it again) or its
    cancellation."""
    try:
        result = await work
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as exc:
        future.set_exception(exc)
        future.exception()
        raise
    future.set_result(result)
    return result
