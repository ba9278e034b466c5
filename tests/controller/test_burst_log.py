"""controller/plumbing/burst_log.py and the scheduler's back-off: events that come in bursts
are logged once per burst, with a count, not once each (issue 23)."""

from __future__ import annotations

import asyncio
import errno
import logging

from controller.config import SchedulerConfig
from controller.executors.base import ExecutorUnavailable, start_error
from controller.plumbing.burst_log import BurstLog
from controller.scheduler.backoff import Backoff


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


def test_resource_errors_at_a_start_are_the_controllers_others_the_jobs():
    out = start_error("starting", OSError(errno.EMFILE, "Too many open files"))
    assert isinstance(out, ExecutorUnavailable)
    assert "ran out of resources" in str(out)
    for number in (errno.ENOMEM, errno.ENOSPC, errno.EAGAIN, errno.ENFILE):
        assert isinstance(start_error("starting", OSError(number, "x")), ExecutorUnavailable)
    not_ours = start_error("starting", OSError(errno.ENOENT, "No such file or directory"))
    assert not isinstance(not_ours, ExecutorUnavailable)


def test_starts_held_back_are_logged_once_per_burst_however_many_passes(caplog):
    backoff = Backoff(SchedulerConfig(launch_backoff_s=1.0, launch_backoff_max_s=8.0), "local")
    error = ExecutorUnavailable("cannot start /bin/sh: ran out of resources: [Errno 24]")
    with caplog.at_level(logging.DEBUG, "spotbag.scheduler"):
        for now in range(10):  # ten passes in a row that could not start anything
            backoff.after_starts(error, float(now), True)
        backoff.after_starts(None, 10.0, False)  # a pass with nothing to start
        backoff.after_starts(None, 11.0, True)  # starts went through
        backoff.after_starts(None, 12.0, True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("the local executor cannot take attempts (cannot start")
    assert "none is counted against its job's max_attempts; no new ones for 1 s" in warnings[0]
    assert warnings[1] == "the local executor takes attempts again"
    assert backoff.starts_backoff_s == 0.0
    # Doubling, up to the maximum, while it lasted.
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert [m.rsplit("for ", 1)[1] for m in debug] == ["2 s", "4 s"] + ["8 s"] * 7
