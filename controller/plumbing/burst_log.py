"""Logging events that come in bursts: the first at once, then a count.

Some events repeat as fast as a client or the kernel can make them: connections refused
over a cap (thousands a second under a flood), accept() out of descriptors, attempts
the executor cannot start. One line each wrote 12.9 MB of log in 30 s (issue 23) and
hid everything else. `BurstLog` logs the first event of a burst as it comes; the ones
after it are counted, and said in one line (the last one's text and the count) at most
once per `interval_s` while the burst lasts. A burst ends when `interval_s` pass
without an event. The count is said when the interval is over: by a timer when one is
given (`call_later`, the event loop's), else with the next event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any


class BurstLog:
    """One logger's lines for one kind of event, bounded per interval (see the module)."""

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter,
        *,
        level: int = logging.WARNING,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        self._logger = logger
        self._level = level
        self._interval_s = interval_s
        self._clock = clock
        self._call_later = call_later
        self._timer_set = False
        self._last_event_at: float | None = None
        self._last_line_at = 0.0
        self._unsaid = 0  # events since the last line
        self._last: tuple[str, tuple[Any, ...]] = ("", ())

    @classmethod
    def on_loop(cls, logger: logging.Logger | logging.LoggerAdapter, **kwargs: Any) -> BurstLog:
        """A BurstLog whose counts are said by a timer of the running event loop."""
        return cls(logger, call_later=asyncio.get_running_loop().call_later, **kwargs)

    @property
    def unsaid(self) -> int:
        """Events counted but not yet logged."""
        return self._unsaid

    def event(self, message: str, *args: Any) -> None:
        """One event: logged now if it starts a burst, else counted."""
        now = self._clock()
        quiet = self._last_event_at is None or now - self._last_event_at >= self._interval_s
        self._last_event_at = now
        if quiet:
            self._say_unsaid(now)
            self._logger.log(self._level, message, *args)
            self._last_line_at = now
            return
        self._unsaid += 1
        self._last = (message, args)
        if now - self._last_line_at >= self._interval_s:
            self._say_unsaid(now)
        elif self._call_later is not None and not self._timer_set:
            self._timer_set = True
            self._call_later(self._last_line_at + self._interval_s - now, self._on_timer)

    def _on_timer(self) -> None:
        self._timer_set = False
        self._say_unsaid(self._clock())

    def _say_unsaid(self, now: float) -> None:
        if not self._unsaid:
            return
        message, args = self._last
        summary = (
            f" [{self._unsaid:,} such events in {now - self._last_line_at:.0f} s, the last shown]"
        )
        self._logger.log(self._level, message + summary.replace("%", "%%"), *args)
        self._unsaid = 0
        self._last_line_at = now
