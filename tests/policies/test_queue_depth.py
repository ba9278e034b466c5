"""policies/queue_depth.py: the depth of an executor's queue for short jobs."""

import pytest

from policies.queue_depth import MAX_QUEUE_AHEAD, queue_ahead_for


def test_short_jobs_get_a_queue_that_lasts_until_the_next_spaced_pass():
    """queue_ahead_for: the configured queue_ahead, or for jobs so short that it would
    run dry before the next pass at the executor's backlog spacing, two intervals' worth
    (at most MAX_QUEUE_AHEAD VM-fulls); executors that do not space passes, and a
    queue_ahead of 0 (only what fits), are left as they are."""
    assert queue_ahead_for(1.0, 0.05, 60.0) == 1.0  # a minute's jobs: as configured
    assert queue_ahead_for(1.0, 0.05, 0.025) == pytest.approx(4.0)  # 2 * 0.05 / 0.025
    assert queue_ahead_for(1.0, 0.05, 0.001) == MAX_QUEUE_AHEAD
    assert queue_ahead_for(0.0, 0.05, 0.001) == 0.0
    assert queue_ahead_for(1.0, 0.0, 0.001) == 1.0  # Slurm's, the simulator's
    assert queue_ahead_for(2.5, 0.05, 0.1) == 2.5  # 1.0 of its own would be less
