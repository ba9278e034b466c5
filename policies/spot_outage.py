"""How long a spot outage under way is expected to last (pure; no scipy, so that the
trace readers importing it stay light): the deadline policy's `spot_outage_h`, as the
pure simulator (policies/deadline_sim.py) and `spotbag simulate`'s price trace
(controller/traces/price_trace.py) both estimate it, from the past only."""

from __future__ import annotations


def expected_outage_left(mean_past: float, so_far: float) -> float:
    """How much longer an outage (the spot price above the bid) that has lasted
    `so_far` is expected to last: the mean length of the recent past's outages less
    what has passed, and at least as long again as it has lasted (a long outage says
    the market is in a long one). Any unit, the same for both."""
    return max(mean_past - so_far, so_far)
