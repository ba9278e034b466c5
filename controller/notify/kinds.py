"""The kinds of event spotbag notifies (docs/notifications.md#kinds)."""

from __future__ import annotations

from typing import Literal

EventKind = Literal["finished", "failed", "deadline_at_risk", "budget_reached", "preemption_storm"]
EVENT_KINDS: tuple[str, ...] = (
    "finished",  # a bag ended: every job succeeded, or it was cancelled
    "failed",  # a bag ended with failed jobs
    "deadline_at_risk",  # a bag may miss its deadline (raised by the deadline policy)
    "budget_reached",  # a budget holds a bag: its next attempt would pass it
    "preemption_storm",  # at least [notify] storm_preemptions in storm_window_s
)
# The same, typed as the kinds (a webhook's default list).
ALL_EVENT_KINDS: tuple[EventKind, ...] = (
    "finished",
    "failed",
    "deadline_at_risk",
    "budget_reached",
    "preemption_storm",
)
