"""Checkpoint timing: when to signal each running checkpointable attempt (docs/design.md#checkpoints).

`CheckpointTimer` owns the due queue, a heap of (when, attempt id, signal or review)
in the daemon's real seconds. Whenever an attempt starts running, completes a
checkpoint, or reaches a planned review, its next checkpoint is looked up from its
VM's age and its job's remaining work, both in model hours, in the VM's preemption
model: `policies.checkpoint.next_checkpoint_h` (the "optimal" policy reads a solved
table from `controller.checkpoint_tables.TableCache`; the remaining work is
`policies.checkpoint.planned_work_left`). When the schedule says to run to the end,
the plan is reviewed when the job should have ended.

In the tail of a bag with a deadline (the deadline policy's, `when_needed`), the
interval is clipped to the deadline's bounds (`Deadlines.checkpoint_interval_bounds_s`,
docs/design.md#deadline-checkpoints): short enough that a preemption just before the
checkpoint leaves its retry on an on-demand VM time to end before the policy's switch,
long enough that a plan is left for the rest.

A preemption loses the work since the last checkpoint; the retry resumes from it on a
fresh VM, where the schedule starts again from age 0. The scheduler records what the
checkpoints did (controller/scheduler/events.py); this module only says when.

It reads the scheduler's `World` (controller/scheduler/world.py: its open bags, VMs and
attempts) and writes nothing there but the attempts' `due_at` and `signalled_at`.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable

from controller.config import CheckpointConfig
from controller.preemption.checkpoint_tables import TableCache
from controller.scheduler.runs import AttemptRun
from controller.scheduler.world import World
from controller.states import AttemptState
from policies.checkpoint import next_checkpoint_h, planned_work_left

log = logging.getLogger("spotbag.scheduler")


class CheckpointTimer:
    """The due queue of checkpoint signals and reviews, and the plans that fill it."""

    def __init__(
        self,
        *,
        settings: CheckpointConfig,
        tables: TableCache,
        time_scale: float,
        world: World,
        wake: Callable[[], None],
        interval_bounds_s: Callable[[AttemptRun, float], tuple[float, float, bool] | None]
        | None = None,
    ) -> None:
        self.settings = settings
        # A deadline's bounds on an attempt's next interval (Deadlines.checkpoint_interval_bounds_s)
        self.interval_bounds_s = interval_bounds_s
        self.tables = tables
        self.time_scale = time_scale  # model seconds per real second
        self._world = world
        self._wake = wake
        self._due: list[tuple[float, str, bool]] = []  # (when, attempt id, signal or review)
        self._replan = False  # a table was solved: plan the running attempts again
        tables.on_ready = self.tables_ready

    def tables_ready(self) -> None:
        """A checkpoint table finished solving: plan the running jobs with it."""
        self._replan = True
        self._wake()

    def clear(self) -> None:
        """Forget every plan (the scheduler's memory is rebuilt from the store)."""
        self._due.clear()

    def signal_now(self, attempt: AttemptRun, now: float) -> None:
        """Ask `attempt` to checkpoint at the next pass (it is to move elsewhere)."""
        attempt.due_at = now
        heapq.heappush(self._due, (now, attempt.id, True))

    def plan(self, attempt: AttemptRun, now: float) -> None:
        """When to signal a running checkpointable attempt next (docs/design.md#checkpoints), from its VM's
        age and its job's remaining work, both in model hours. When the schedule says to
        run to the end, the plan is reviewed when the job should have ended (a job that
        outruns its estimate is planned again with a tenth of the estimate left)."""
        attempt.due_at = None
        if attempt.migrating and attempt.signalled_at is None:  # moving: checkpoint now
            self.signal_now(attempt, now)
            return
        bag = self._world.bags.get(attempt.bag_id)
        vm = self._world.vms.get(attempt.vm_id)
        settings = self.settings
        if (
            bag is None
            or vm is None
            or vm.belief is None
            or not bag.spec.checkpointable
            or settings.policy == "none"
            or attempt.cancelling
            or attempt.missed_checkpoints >= 3
        ):
            return
        to_h = self.time_scale / 3600.0  # real seconds -> model hours
        step_s = settings.step_s / self.time_scale  # one grid step in real seconds
        estimate_s = bag.runtime_estimate_s
        done_s = attempt.saved_s + max(0.0, now - attempt.mark_at)
        left_s = planned_work_left(estimate_s, done_s, step_s)
        age_h = max(0.0, now - vm.requested_at) * to_h
        delta_h = bag.spec.checkpoint_cost_s * to_h
        model = vm.belief.model
        table = None
        if settings.policy == "optimal" and math.isfinite(model.expected_lifetime_h()):
            table = self.tables.lookup(model, delta_h, left_s * to_h)
        interval_h = next_checkpoint_h(settings.policy, model, left_s * to_h, age_h, delta_h, table)
        bounds = self.interval_bounds_s(attempt, now) if self.interval_bounds_s else None
        if bounds is not None:
            # A deadline's bounds (docs/design.md#deadline-checkpoints): the DP's interval,
            # from the last checkpoint, kept within them, so that the deadline policy's
            # bound on the attempt's worst case holds.
            shortest_s, longest_s, to_end = bounds
            wanted_s = math.inf if interval_h is None else now - attempt.mark_at + interval_h / to_h
            if shortest_s > longest_s or (to_end and math.isinf(wanted_s)):
                interval_h = None  # to the end (when shortest > longest, to_end holds)
                due = now + left_s  # review
            else:
                interval_s = min(max(wanted_s, shortest_s), longest_s)
                # The floor between checkpoints (`min_interval_s`, real s) gives way to the
                # longest bound: at a large time_scale one real second is many model
                # minutes, and the policy counts on a checkpoint by the bound.
                interval_s = min(max(interval_s, settings.min_interval_s), longest_s)
                due = max(attempt.mark_at + interval_s, now)
                interval_h = interval_s * to_h
        elif interval_h is None:
            due = now + left_s  # review
        else:
            due = max(now + interval_h / to_h, attempt.mark_at + settings.min_interval_s)
        attempt.due_at = due
        heapq.heappush(self._due, (due, attempt.id, interval_h is not None))
        log.debug(
            "%s: %s in %.1f s",
            attempt.id,
            "checkpoint" if interval_h is not None else "review",
            due - now,
        )

    def next_due(self) -> float | None:
        """When the earliest signal or review is due (None: none is planned)."""
        attempts = self._world.attempts
        while self._due:
            due, attempt_id, _ = self._due[0]
            attempt = attempts.get(attempt_id)
            if attempt is not None and attempt.due_at == due:
                return due
            heapq.heappop(self._due)  # stale: the attempt ended or was planned again
        return None

    def due_signals(self, now: float) -> list[tuple[str, float]]:
        """Attempts to signal now, with how long each may take to confirm; plans that
        were due for review are made again."""
        if self._replan:
            self._replan = False
            for attempt in self._world.attempts.values():
                if attempt.due_at is not None and attempt.signalled_at is None:
                    self.plan(attempt, now)
        signals = []
        while (due := self.next_due()) is not None and due <= now:
            _, attempt_id, signal = heapq.heappop(self._due)
            attempt = self._world.attempts[attempt_id]
            attempt.due_at = None
            if attempt.state is not AttemptState.RUNNING or attempt.cancelling:
                continue
            if not signal:
                self.plan(attempt, now)
                continue
            attempt.signalled_at = now
            log.debug("%s: asked to checkpoint", attempt_id)
            spec = self._world.bags[attempt.bag_id].spec
            timeout_s = max(self.settings.confirm_timeout_s, 5 * spec.checkpoint_cost_s)
            signals.append((attempt_id, timeout_s))
        return signals
