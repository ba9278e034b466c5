"""Retrying a cloud SDK call: full-jitter exponential backoff over typed errors, shared
by the cloud drivers (drivers/aws.py, drivers/gce.py).

Attempt k (from 0) that fails with a retryable error waits U(0, min(max, base·2ᵏ))
seconds ("full jitter", so that many clients throttled at once do not retry in step),
or the server's Retry-After if that is longer (capped at max); after `max_retries`
retries the last error is raised as a TransientError that says how many attempts were
made.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, overload

from drivers.base import DriverError, TransientError

log = logging.getLogger("spotbag.drivers.retry")

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    max_retries: int  # retries after the first attempt
    base_s: float
    max_s: float

    def delay_s(self, attempt: int, rng: random.Random, retry_after_s: float | None) -> float:
        delay = rng.uniform(0.0, min(self.max_s, self.base_s * 2**attempt))
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.max_s))
        return delay


@overload
async def with_retries(
    run: Callable[[], Awaitable[T]],
    classify: Callable[[BaseException, str], DriverError | None],
    what: str,
    backoff: Backoff,
    rng: random.Random,
    *,
    retryable: type[DriverError],
) -> T: ...


@overload
async def with_retries(
    run: Callable[[], Awaitable[T]],
    classify: Callable[[BaseException, str], DriverError | None],
    what: str,
    backoff: Backoff,
    rng: random.Random,
    *,
    retryable: type[DriverError],
    accept: tuple[type[DriverError], ...],
) -> T | None: ...


async def with_retries(
    run: Callable[[], Awaitable[T]],
    classify: Callable[[BaseException, str], DriverError | None],
    what: str,
    backoff: Backoff,
    rng: random.Random,
    *,
    retryable: type[DriverError],
    accept: tuple[type[DriverError], ...] = (),
) -> T | None:
    """`await run()`, retrying errors `classify` maps to `retryable`; other typed errors
    are raised (those in `accept` are returned as None), untyped ones pass through."""
    attempt = 0
    while True:
        try:
            return await run()
        except Exception as exc:
            error = classify(exc, what)
            if error is None:
                raise
            if accept and isinstance(error, accept):
                return None
            if not isinstance(error, retryable):
                raise error from exc
            if attempt >= backoff.max_retries:
                final = TransientError(f"{error} (still failing after {attempt + 1} attempts)")
                final.retry_after_s = error.retry_after_s
                raise final from exc
            delay_s = backoff.delay_s(attempt, rng, error.retry_after_s)
            log.debug("%s; retry %d in %.3f s", error, attempt + 1, delay_s)
            attempt += 1
            await asyncio.sleep(delay_s)
