"""controller/burst_log.py: events that come in bursts are logged once per burst, with
a count, not once each (issue 23)."""

from __future__ import annotations

import asyncio
import logging

from controller.burst_log import BurstLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_burst_is_its_first_event_then_one_count_per_interval(caplog):
    clock = Clock()
    burst = BurstLog(logging.getLogger("t"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, "t"):
        for i in range(5000):  # 5,000 events in 100 s
            clock.now = i * 0.02
            burst.event("refused %s", f"client {i}")
    assert lines(caplog) == [
        "refused client 0",
        "refused client 3000 [3,000 such events in 60 s, the last shown]",
    ]
    assert burst.unsaid == 1999
    # A quiet minute ends the burst: the next event starts another, after the count of
    # the last one.
    clock.now = 200.0
    caplog.clear()
    with caplog.at_level(logging.WARNING, "t"):
        burst.event("refused %s", "client x")
    assert lines(caplog) == [
        "refused client 4999 [1,999 such events in 140 s, the last shown]",
        "refused client x",
    ]
    assert burst.unsaid == 0


async def test_on_the_event_loop_the_count_is_said_when_the_interval_ends(caplog):
    burst = BurstLog.on_loop(logging.getLogger("t"), interval_s=0.2)
    with caplog.at_level(logging.WARNING, "t"):
        for _ in range(3):
            burst.event("cannot accept: %s", "EMFILE")
        assert lines(caplog) == ["cannot accept: EMFILE"]
        for _ in range(100):  # said by the loop's timer, ~0.2 s on (5 s at most here)
            if len(caplog.records) > 1:
                break
            await asyncio.sleep(0.05)
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage().startswith("cannot accept: EMFILE [2 such events in")
