"""How deep an executor's queue of attempts may be beyond what a VM runs.

An executor that refills a VM's slots from its own queue (the local one) lets the
scheduler space its passes while every VM has attempts waiting
(docs/architecture.md#local-queue). Jobs so short that the configured `queue_ahead`
would run dry between two such passes get a queue two pass intervals deep.
"""

from __future__ import annotations

# The most an executor's queue may hold for jobs too short for `queue_ahead` to last
# until the next pass (`queue_ahead_for`), in VM-fulls.
MAX_QUEUE_AHEAD = 16.0


def queue_ahead_for(queue_ahead: float, backlog_pass_interval_s: float, runtime_s: float) -> float:
    """How much an executor's queue may hold beyond what a VM runs, as a fraction of
    its capacity: `queue_ahead`, or for jobs of `runtime_s` (real seconds; the scheduler
    gives the longest among the waiting bags') so short that a VM would run through it
    before the next pass at the executor's backlog spacing, enough for two such
    intervals (2 * interval / runtime), at most MAX_QUEUE_AHEAD. 2,000 jobs of `echo`
    (1-3 ms): 16 VM-fulls. Executors that do not space passes (interval 0) and a
    queue_ahead of 0 (only what fits) keep theirs."""
    if queue_ahead <= 0 or backlog_pass_interval_s <= 0 or runtime_s <= 0:
        return queue_ahead
    return max(queue_ahead, min(MAX_QUEUE_AHEAD, 2.0 * backlog_pass_interval_s / runtime_s))
