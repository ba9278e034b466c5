"""Uniform Progress, the baseline deadline policy (docs/design.md#uniform-progress).

From Z. Wu, W.-L. Chiang, Z. Mao, Z. Yang, E. Friedman, S. Shenker, I. Stoica, *Can't
Be Late: Optimizing Spot Instance Savings under Deadlines*, NSDI '24, as the paper
describes it (no code of theirs is used). A job of C hours of compute must finish by
the deadline D; changing VMs costs d hours (the restart overhead). Its expected
progress is the straight line from start to deadline,

    ep(t) = C·(t − t0)/(D − t0),

its current progress cp(t) the compute done so far, R(t) = D − t the time left and
C(t) = C − cp(t) the compute left. The rules, at every decision:

1. *Uniform progress*: idle (no VM) and cp(t) < ep(t): use on-demand, to catch up.
2. *Taking risks*: spot whenever it is available, even behind the line; stay on spot
   until preempted (exploitation).
3. *Hysteresis*: on on-demand, stay there until cp(t) >= ep(t + 2d).
4. *Safety net*: idle and R(t) < C(t) + 2d: on-demand until the end.

Otherwise (idle, ahead of the line, no spot) wait. UP assumes nothing about how long
spot VMs live: that is its point, and what spotbag's deadline policy adds
(policies/deadline.py).

**For a bag** (the paper schedules one job, on one or several instances at once): the
bag is the job, C its total work, cp(t) the work done by all its attempts (saved or
in progress), and each of its K slots applies the rules when it is free; C(t), the
time the work left needs, is list scheduling's bound on K on-demand slots, W/K + (1 −
1/K)·w_max (a bag's jobs are not divisible). A slot decides between attempts (a bag's
attempts are short beside its deadline), so it is "idle" at every decision: the
safety net is checked then, and once it fires it holds for the whole bag; a slot
already on spot stays there (rule 2) otherwise. Spot is "available" when a spot VM
can be launched (its price at or below the bid).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Kind(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"
    WAIT = "wait"  # idle: no VM


@dataclass(frozen=True)
class ProgressState:
    """One slot's view at a decision (hours): `current` is what it runs on now (WAIT
    when it has no VM); `work_left_h` is C(t), the compute the rest needs."""

    now_h: float
    start_h: float
    deadline_h: float
    total_work_h: float
    progress_h: float
    work_left_h: float
    changeover_h: float
    spot_available: bool
    current: Kind
    safety_net: bool = False  # already fired (it holds until the end)


def expected_progress_h(
    total_work_h: float, start_h: float, deadline_h: float, at_h: float
) -> float:
    """ep(t) = C·(t − t0)/(D − t0), clipped to [0, C]."""
    span = deadline_h - start_h
    if span <= 0:
        return total_work_h
    return min(total_work_h, max(0.0, total_work_h * (at_h - start_h) / span))


def safety_net_fires(state: ProgressState) -> bool:
    """Rule 4: R(t) < C(t) + 2d."""
    return state.deadline_h - state.now_h < state.work_left_h + 2.0 * state.changeover_h


def decide(state: ProgressState) -> tuple[Kind, bool]:
    """(what the slot should run on, whether the safety net now holds)."""
    d = state.changeover_h
    if state.safety_net or safety_net_fires(state):
        return Kind.ON_DEMAND, True
    line_now = expected_progress_h(state.total_work_h, state.start_h, state.deadline_h, state.now_h)
    if state.current == Kind.SPOT and state.spot_available:
        return Kind.SPOT, False  # rule 2: stay on spot until preempted
    if state.current == Kind.ON_DEMAND:
        ahead = state.progress_h >= expected_progress_h(
            state.total_work_h, state.start_h, state.deadline_h, state.now_h + 2.0 * d
        )
        if ahead and state.spot_available:
            return Kind.SPOT, False  # rule 3 satisfied: back to spot
        return Kind.ON_DEMAND, False
    if state.spot_available:
        return Kind.SPOT, False  # rule 2
    if state.progress_h < line_now:
        return Kind.ON_DEMAND, False  # rule 1
    return Kind.WAIT, False


@dataclass(frozen=True)
class BagPlan:
    """The rules applied to a bag's slots at once (the daemon's planner takes a count of
    on-demand slots, not a choice per slot): `on_demand_slots` run on on-demand VMs,
    the others on spot when `launch_spot`, else they wait; `safety_net`: it fired."""

    on_demand_slots: int
    launch_spot: bool
    safety_net: bool


def plan_bag(state: ProgressState, slots: int, on_demand_running: int) -> BagPlan:
    """Each slot's rule, for the bag's K = `slots` slots, `on_demand_running` of them on
    on-demand VMs. An idle slot (`decide` with current WAIT) says what new attempts run
    on: on-demand (the safety net: every slot, for good; rule 1: every slot while
    behind the line and spot cannot be had), spot (rule 2) or nothing (wait). A slot on
    an on-demand VM stays there (rule 3) until cp(t) >= ep(t + 2d) with spot available:
    those slots stay on-demand meanwhile; slots on spot VMs stay on spot (rule 2)."""
    idle, net = decide(replace(state, current=Kind.WAIT))
    if net:
        return BagPlan(slots, False, True)
    if idle == Kind.ON_DEMAND:
        return BagPlan(slots, False, False)
    stay, _ = decide(replace(state, current=Kind.ON_DEMAND))
    keep = on_demand_running if stay == Kind.ON_DEMAND else 0
    return BagPlan(keep, idle == Kind.SPOT, False)
