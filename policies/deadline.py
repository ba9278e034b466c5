"""Finishing a bag by a deadline at the least expected cost: how many of its attempts
must run on on-demand VMs now (docs/design.md#deadlines).

The bag has K slots (VMs it may run at once). At time `now`, H = deadline − now hours
are left; some jobs wait in the queue (work w_j each: the estimate less the work
saved), some run on spot VMs (work left w_j on a VM of age a_j), some on on-demand
VMs (r_i hours left). Spot attempts checkpoint by the DP (policies/checkpoint.py), and
each job's completion time T_j on spot is known in distribution
(policies/completion_times.py: mean μ_j, variance σ_j², CDF F_j). On-demand VMs are
never preempted: a job there takes its work.

**The decision: keep the on-demand fallback** (`fallback_on_demand`). Spot is cheaper
in expectation whenever it is worth using at all (its price times the expected time
μ_j below the on-demand price times w_j: `spot_worth_using`), so the least expected
cost runs every attempt on spot that the deadline allows. What the deadline allows at
confidence c: after any decision, every slot must still be able to turn on-demand and
finish the bag in time. When a slot is free, its next attempt on spot commits it for
the attempt's time, so the rule is checked with the free slots already busy:

    LS(queue left; slots free at f_i) <= D − now − λ − δ_c

- the free slots take the next jobs, longest first: n of them on-demand (free at
  launch + w), the others on spot (launch + μ_j + launch: the expected time, then a
  switch) or, when spot cannot be had or is not worth it, waiting (free at λ + launch,
  their jobs left in the queue);
- running attempts keep their slots: on-demand ones for r_i, spot ones for μ_j(age)
  plus a launch;
- LS is list scheduling of the rest of the queue, longest first, on the slots as they
  free (Graham's bound W/K + max first; the exact schedule only when the bound does
  not fit);
- λ (`decision_lag_h`) is how long until the next look: a pass plus a launch;
- δ_c is how late the spot attempts may be at confidence c: while a round of queued
  jobs remains to be shared out, a late attempt only leaves its slot fewer of them, so
  the sum's spread counts, z_c·sqrt(Σσ_j²)/K; with less (the last round), δ_c = 0 and
  instead: (a) with no job left, every spot attempt ends in time to hand its slot
  over, Π_j F'_j(τ_j) >= c, where F'_j(τ) = 1 from the longest the attempt can take
  with an on-demand retry on (`CompletionTimes.worst_h`: a failed attempt's retry may
  go on-demand); (b) with jobs left, those list scheduled on the slots as they free
  without preemptions end in time, each spot attempt late by at most its slot's
  slack: Π_j F'_j(w_j + slack_j) >= c (which implies (a));
- with the scheduler bounding each spot attempt's checkpoint intervals by the
  deadline (`checkpoint_h` set; `deadline_checkpoint_interval_h`), an attempt with
  bounds ends by its time to switch whatever befalls it: F'_j = 1 there;
- a free slot holding a live spot VM reuses it (`free_spot_age_h`): its next attempt
  is planned at that age, without a launch;
- the queue is taken in the scheduler's order when it says so (`queue_ordered`);
- the check also holds if the spot attempt with the most work since its last
  checkpoint (`spot_unsaved_h`) loses its VM now (its job back in the queue with that
  work to redo): a preemption triggers a decision, but by then the loss is made.

The decision is the least n that fits (a binary search: fitting is monotone in n), so
m = (running on-demand attempts) + n slots on on-demand. Recomputed whenever a slot
frees: spot keeps every slot while the fallback fits (escalate late: at the latest
safe moment, not on a fixed line); slots turn on-demand one by one as the slack goes;
an on-demand slot that frees when the fallback fits without it goes back to spot (the
slack returned). When not even n = all free slots fits, the bag is *at risk*: the
fewest free slots that fit at the highest confidence still reachable go on-demand
(`_best_reachable_on_demand`), every slot only when not even even odds are.

**Idling costs slack** (`spot_line_on_demand`): when spot cannot be had or is not
worth its price, a free slot waits only while spot, once back (after the expected
outage), would still finish the bag in expectation (the queue at μ_j(0) each, list
scheduled); else the fewest free slots that restore that go on-demand, or, when spot
can be had at a price not worth paying (`spot_available`), spot is launched anyway,
as it is as soon as waiting one more look would leave spot alone short of the
confidence (`spot_after_wait_fits`).

**The projection** (`meet_probabilities`, `decide(project=True)`), for the status
pages and the `deadline_at_risk` notification: with m of the K slots on on-demand and
K_s = K − m on spot,

- on-demand slots take queued work until near the end (capacity Σ (H' − free_i)⁺ with
  H' = H − (1 − 1/m)·w_last), the share f of the queued work W_q;
- spot slots take the rest: a load L ~ N(μ_L, σ_L²) by the central limit theorem,
  μ_L = Σ_running μ_j + (1 − f)·Σ_queued μ_j, σ_L² likewise with σ_j²;
- list scheduling on K_s slots ends when the queue empties, at about L/K_s −
  E[residual], plus the longest residual of the last round's n = min(K_s, queued)
  attempts, max_k U_k·T_k (each started at a uniform point of its run): P(max <= x) =
  g(x)^n with g(x) = E[min(1, x/T)], E[residual] = E[T]/2;
- spot can be had a share α of the time (recent prices), not for o hours when it
  cannot now;
- with nothing queued, every job running on spot must finish in time: Π_j F_j(H).

P(m) = max_x Φ((α·K_s·(H − o − x + E[T]/2) − μ_L) / σ_L) · g(x)^n, or Π_j F_j(H) when
nothing is queued; the finish quantiles invert it in H.

**Against Uniform Progress** (Wu et al., NSDI'24; policies/uniform_progress.py): UP
needs no model of spot lifetimes: it keeps progress on the straight line from start
to deadline, uses on-demand when behind it and spot is unavailable, and switches
everything to on-demand for good at the last moment the remaining work fits (its
safety net, with a margin of two changeovers). This policy instead keeps the
on-demand fallback feasible slot by slot, with the completion-time spread the
preemption model and the checkpoint plan give, turns only as many slots on-demand as
that needs, and turns them back; it waits out spot outages and prices not worth
paying only while spot's expected pace still finishes the bag (UP runs on-demand in
an outage whenever it is behind its straight line).

Pure: arrays and dataclasses in, a decision out; no clock, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from policies.completion_times import CompletionTimes

DEFAULT_CONFIDENCE = 0.95


# scipy.special is imported where it is used: ~0.25 s of CPU that a bag without a
# deadline (and `spotbag simulate` of one) never needs. The daemon loads it with its
# other modules, off the event loop (controller/service.py).
def _ndtr(z: np.ndarray) -> np.ndarray:
    """Φ(z), the standard normal CDF."""
    from scipy.special import ndtr

    return ndtr(z)


def _ndtri(p: float) -> float:
    """Φ⁻¹(p), the standard normal quantile."""
    from scipy.special import ndtri

    return float(ndtri(p))


def _array(values) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


def slot_count(inputs: DeadlineInputs) -> int:
    """K: the bag's slots, at least one and at least as many as its attempts running
    (a scheduler may run more than the slots it was counted for: attempts queued ahead
    on an executor, jobs on other VM types)."""
    busy = len(_array(inputs.spot_work_h)) + len(_array(inputs.on_demand_left_h))
    return max(1, int(inputs.slots), busy)


@dataclass(frozen=True)
class DeadlineInputs:
    """A bag's state as the scheduler sees it at one pass (hours; prices USD/h per slot).

    `queued_work_h`: jobs waiting (work left each); `spot_work_h` / `spot_age_h`: jobs
    running on spot VMs (work left, VM age), `spot_unsaved_h` their work since their
    last checkpoint (what a preemption now would lose; empty: unknown, taken as 0);
    `spot_since_mark_h`: their time since their last checkpoint, not capped by their
    estimate as `spot_unsaved_h` is (a job may outrun it): what the checkpoint timer
    bounds their checkpoints from (`checkpoint_h`); None: `spot_unsaved_h`;
    `on_demand_left_h`: time left of the jobs running on on-demand VMs;
    `free_spot_age_h`: ages of the live spot VMs free slots hold (their next spot
    attempts reuse them, planned at those ages; empty: every next attempt on a fresh
    VM).
    `spot_availability` (0–1] is the share of recent time spot VMs could be launched
    at a price worth paying; `spot_outage_h` how long until
    they can again when they cannot now (0 when they can). `decision_lag_h` is how long
    escalating may wait: until the next pass, plus an on-demand VM's launch.
    `spot_available` says whether a spot VM can be launched now at all (its price at
    or below the bid), even when it is not worth its price; None (unknown) means it
    can exactly when `spot_outage_h` is 0. `queue_ordered`: `queued_work_h` is in the
    order the slots will take the jobs (e.g. retries first); else the policy assumes
    longest first, which packs the end better than some orders do."""

    now_h: float
    deadline_h: float
    slots: int
    queued_work_h: np.ndarray
    spot_work_h: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spot_age_h: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spot_unsaved_h: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spot_since_mark_h: np.ndarray | None = None
    free_spot_age_h: np.ndarray = field(default_factory=lambda: np.zeros(0))
    on_demand_left_h: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spot_price_per_hour: float = 0.0
    on_demand_price_per_hour: float = 1.0
    on_demand_launch_h: float = 0.0
    spot_availability: float = 1.0
    spot_outage_h: float = 0.0
    confidence: float = DEFAULT_CONFIDENCE
    decision_lag_h: float = 10 / 60
    spot_available: bool | None = None
    queue_ordered: bool = False
    checkpoint_h: float | None = None


@dataclass(frozen=True)
class DeadlineDecision:
    """What the scheduler does until the next pass.

    `on_demand_slots`: how many slots should run on on-demand VMs (new attempts go there
    while fewer do; on-demand VMs beyond it take no new attempt). `launch_spot`: new
    spot attempts are worth launching now (else the other slots wait). `p_meet`: the
    projected probability of finishing by the deadline with this decision;
    `finish_quantiles_h`: (q, projected finish time) pairs; `latest_switch_h`: the last
    moment at which all the work left still fits on on-demand VMs; `at_risk`: no number
    of on-demand slots reaches the confidence."""

    on_demand_slots: int
    launch_spot: bool
    p_meet: float
    finish_quantiles_h: tuple[tuple[float, float], ...]
    latest_switch_h: float
    at_risk: bool


@dataclass(frozen=True)
class _Loads:
    """The sums the projection needs, computed once per decision."""

    queued_work_h: float
    queued_mean_h: float
    queued_var_h2: float
    running_mean_h: float
    running_var_h2: float
    last_work_h: float  # the queue's smallest work: the last job list scheduling starts
    last_round_work_h: float  # the median work of the K smallest queued jobs (the last round)
    queued_jobs: int
    on_demand_left_sorted_h: np.ndarray
    spot_busy_sorted_h: np.ndarray  # each spot slot until free: μ_j + z_c·σ_j, idle ones 0


def _loads(inputs: DeadlineInputs, times: CompletionTimes) -> _Loads:
    queued = _array(inputs.queued_work_h)
    q_mean, q_var = times.fresh_moments(queued)
    r_mean, r_var = times.aged_moments(_array(inputs.spot_work_h), _array(inputs.spot_age_h))
    return _Loads(
        queued_work_h=float(queued.sum()),
        queued_mean_h=float(q_mean.sum()),
        queued_var_h2=float(q_var.sum()),
        running_mean_h=float(r_mean.sum()),
        running_var_h2=float(r_var.sum()),
        last_work_h=float(queued.min()) if len(queued) else 0.0,
        last_round_work_h=(
            float(np.median(np.sort(queued)[: slot_count(inputs)])) if len(queued) else 0.0
        ),
        queued_jobs=len(queued),
        on_demand_left_sorted_h=np.sort(_array(inputs.on_demand_left_h)),
        spot_busy_sorted_h=np.sort(
            np.concatenate(
                [
                    np.zeros(
                        max(0, slot_count(inputs) - len(r_mean) - len(inputs.on_demand_left_h))
                    ),
                    r_mean + _ndtri(inputs.confidence) * np.sqrt(r_var),
                ]
            )
        ),
    )


def _running_spot_done(inputs: DeadlineInputs, times: CompletionTimes, horizon_h: float) -> float:
    """Π_j F_j(H): every job running on spot is done within the horizon."""
    work = _array(inputs.spot_work_h)
    if not len(work):
        return 1.0
    cdf = times.aged_cdf_at(work, _array(inputs.spot_age_h), np.full(len(work), horizon_h))
    return float(np.prod(cdf))


def meet_probabilities(
    inputs: DeadlineInputs, times: CompletionTimes, horizon_h: float | None = None
) -> np.ndarray:
    """P(m) for m = 0 .. K on-demand slots (module docstring): the projected chance of
    finishing within `horizon_h` (default: until the deadline)."""
    loads = _loads(inputs, times)
    return _probabilities(inputs, times, loads, horizon_h)


def _probabilities(
    inputs: DeadlineInputs, times: CompletionTimes, loads: _Loads, horizon_h: float | None
) -> np.ndarray:
    K = slot_count(inputs)
    H = inputs.deadline_h - inputs.now_h if horizon_h is None else horizon_h
    m = np.arange(K + 1)
    if H <= 0:
        return np.zeros(K + 1)
    spot_slots = K - m
    # On-demand capacity for queued work: the on-demand VMs finishing first are kept.
    od = loads.on_demand_left_sorted_h
    od_tail = np.where(m > 0, (1.0 - 1.0 / np.maximum(m, 1)) * loads.last_work_h, 0.0)
    usable = H - od_tail
    kept = np.minimum(m, len(od))
    free_after = np.concatenate(([0.0], np.cumsum(od)))  # Σ r_i of the first k
    # Σ_{i < kept} (H' − r_i)⁺: each kept on-demand VM takes queued work once its job ends.
    first = np.arange(len(od))[None, :] < kept[:, None]
    capacity_od = (np.maximum(usable[:, None] - od[None, :], 0.0) * first).sum(axis=1)
    # New on-demand slots come from spot slots as they free (idle ones first, then the
    # running spot jobs expected to end soonest) and a launch later take queued work.
    busy = loads.spot_busy_sorted_h
    new = np.minimum(np.maximum(m - len(od), 0), len(busy))
    newly = np.arange(len(busy))[None, :] < new[:, None]
    capacity_od = capacity_od + (
        np.maximum(usable[:, None] - inputs.on_demand_launch_h - busy[None, :], 0.0) * newly
    ).sum(axis=1)
    queued = max(loads.queued_work_h, 1e-12)
    share_od = np.minimum(1.0, capacity_od / queued) if loads.queued_work_h > 0 else np.ones(K + 1)
    released = free_after[-1] - free_after[kept]  # on-demand VMs beyond m: their load stays
    mean = loads.running_mean_h + (1.0 - share_od) * loads.queued_mean_h + released
    var = loads.running_var_h2 + (1.0 - share_od) * loads.queued_var_h2
    spot_work_left = (1.0 - share_od) * loads.queued_work_h > 1e-9
    availability = min(1.0, max(inputs.spot_availability, 0.0))
    # The end: the queue empties at ΣT/K_s − E[residual] and the bag ends with the
    # longest residual of the last round, max_k U_k·T_k (each last job started at a
    # uniform point of its run): P(max <= x) = g(x)^n, g(x) = E[min(1, x/T)].
    last_round = np.minimum(spot_slots, loads.queued_jobs)
    x, g, mean_residual = _residuals(times, loads.last_round_work_h)
    tail_ok = np.where(spot_work_left[None, :], g[:, None] ** last_round[None, :], 1.0)  # (x, m)
    shift = np.where(spot_work_left[None, :], x[:, None] - mean_residual, 0.0)
    capacity_spot = (
        availability * spot_slots[None, :] * np.maximum(H - inputs.spot_outage_h - shift, 0.0)
    )
    # With every slot on-demand, spot takes no queued work (spot_work_left is False
    # then unless on-demand cannot hold it all): the running spot jobs need no capacity
    # beyond their own slots (their finishing is the product below).
    capacity_spot = np.where(
        spot_slots[None, :] == 0,
        np.where(spot_work_left[None, :], 0.0, np.inf),
        capacity_spot,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(
            var[None, :] > 0,
            (capacity_spot - mean[None, :]) / np.sqrt(np.where(var > 0, var, 1.0))[None, :],
            np.where(capacity_spot >= mean[None, :], np.inf, -np.inf),
        )
    bulk = np.where(mean[None, :] <= 0, 1.0, _ndtr(z)) * tail_ok
    bulk = bulk.max(axis=0)  # the best split of the confidence between bulk and end
    if loads.queued_jobs:
        return bulk
    # The end game: nothing queued; the jobs running on spot must each finish in time.
    return bulk * _running_spot_done(inputs, times, H)


_TAIL_POINTS = 24


def _residuals(times: CompletionTimes, work_h: float) -> tuple[np.ndarray, np.ndarray, float]:
    """For a last-round job of `work_h` on spot: points x from E[T]/2 to T's 0.99999
    quantile, g(x) = E[min(1, x/T)] = P(U·T <= x) at each, and E[U·T] = E[T]/2."""
    if work_h <= 0:
        return np.zeros(1), np.ones(1), 0.0
    cdf = times.fresh_cdf[int(times._work_steps(np.array(work_h)))]
    pmf = np.diff(np.concatenate(([0.0], cdf)))
    tau = np.arange(len(cdf)) * times.step_h
    mean_t = float(times.fresh_moments(np.array([work_h]))[0][0])
    top = times.fresh_quantile_h(work_h, 0.99999)
    x = np.linspace(mean_t / 2.0, max(top, mean_t / 2.0), _TAIL_POINTS)
    with np.errstate(divide="ignore"):
        ratio = np.where(tau[None, :] > 0, x[:, None] / np.maximum(tau[None, :], 1e-12), 1.0)
    g = (pmf[None, :] * np.minimum(1.0, ratio)).sum(axis=1)
    return x, np.minimum(g, 1.0), mean_t / 2.0


def latest_switch_h(inputs: DeadlineInputs) -> float:
    """The last moment at which all the work left still fits on K on-demand slots by
    the deadline: deadline − (W/K + (1 − 1/K)·w_max + d_od) (list scheduling's bound),
    counting running jobs by their work left."""
    work = np.concatenate(
        [
            _array(inputs.queued_work_h),
            _array(inputs.spot_work_h),
            _array(inputs.on_demand_left_h),
        ]
    )
    if not len(work):
        return inputs.deadline_h
    K = slot_count(inputs)
    makespan = float(work.sum()) / K + (1.0 - 1.0 / K) * float(work.max())
    return inputs.deadline_h - makespan - inputs.on_demand_launch_h


def spot_worth_using(inputs: DeadlineInputs, times: CompletionTimes) -> bool:
    """Spot is worth launching when its expected cost per hour of work, price × μ/w for
    the bag's median queued job, is below the on-demand price."""
    queued = _array(inputs.queued_work_h)
    if not len(queued) or inputs.spot_outage_h > 0:
        return inputs.spot_outage_h <= 0
    work = float(np.median(queued))
    mean, _ = times.fresh_moments(np.array([work]))
    return inputs.spot_price_per_hour * float(mean[0]) < inputs.on_demand_price_per_hour * work


def decide(
    inputs: DeadlineInputs,
    times: CompletionTimes,
    quantiles: Sequence[float] = (0.5, 0.9, DEFAULT_CONFIDENCE),
    project: bool = True,
) -> DeadlineDecision:
    """How many slots run on on-demand VMs: those already there plus the fewest free
    slots that keep the on-demand fallback (module docstring) within the deadline;
    with `project`, the projected chance of meeting it and the finish at `quantiles`
    (each a bisection of ~20 projections)."""
    K = slot_count(inputs)
    loads = _loads(inputs, times)
    nothing_left = (
        loads.queued_work_h <= 0
        and not len(_array(inputs.spot_work_h))
        and not len(loads.on_demand_left_sorted_h)
    )
    if nothing_left:
        return DeadlineDecision(0, False, 1.0, (), inputs.deadline_h, False)
    launch_spot = spot_worth_using(inputs, times)
    busy = len(_array(inputs.spot_work_h)) + len(loads.on_demand_left_sorted_h)
    last_round = loads.queued_jobs < 2 * K - busy  # the free slots' jobs and one round more
    keep_line = 0
    if not launch_spot and loads.queued_jobs:
        # Waiting for spot spends slack: only while spot could still finish after it.
        keep_line = spot_line_on_demand(inputs, times)
        if (
            inputs.spot_available is True
            and not last_round
            and (keep_line or not spot_after_wait_fits(inputs, times))
        ):
            # Spot is there but dear: it beats idling (billed at the market price,
            # which may fall) and, unlike on-demand, commits to no price.
            launch_spot, keep_line = True, 0
        elif not launch_spot:
            # No spot: wait only while spot, once back, still meets the deadline at the
            # confidence; else as many slots on-demand now as that needs.
            keep_line = max(keep_line, outage_on_demand(inputs, times, loads))
    new_on_demand = fallback_on_demand(inputs, times, launch_spot)
    at_risk = new_on_demand is None
    if at_risk:
        new_on_demand = _best_reachable_on_demand(inputs, times, launch_spot)
    if new_on_demand is not None:
        new_on_demand = max(new_on_demand, keep_line)
    m = K if new_on_demand is None else len(loads.on_demand_left_sorted_h) + new_on_demand
    m = min(m, K)
    p_meet = math.nan
    finish: tuple[tuple[float, float], ...] = ()
    if project:
        p_meet = float(_probabilities(inputs, times, loads, None)[m])
        finish = tuple(
            (q, inputs.now_h + _finish_within(inputs, times, loads, m, q))
            for q in sorted(quantiles)
        )
    return DeadlineDecision(
        on_demand_slots=m,
        launch_spot=launch_spot,
        p_meet=p_meet,
        finish_quantiles_h=finish,
        latest_switch_h=float(latest_switch_h(inputs)),
        at_risk=at_risk,
    )


def _best_reachable_on_demand(
    inputs: DeadlineInputs, times: CompletionTimes, launch_spot: bool
) -> int | None:
    """At risk (no number of on-demand slots keeps the fallback at the confidence): the
    fewest that keep it at the highest confidence some number still reaches, down to
    even odds; None (every slot on-demand) when not even that. Buying every slot
    on-demand when what fails is the running spot attempts' tail (which on-demand
    slots for the next jobs do not change) costs much and buys little."""
    risk = 1.0 - inputs.confidence
    for lower in (1.0 - 2.0 * risk, 1.0 - 5.0 * risk, 0.9, 0.75, 0.5):
        if lower >= inputs.confidence or lower <= 0.0:
            continue
        n = fallback_on_demand(replace(inputs, confidence=lower), times, launch_spot)
        if n is not None:
            return n
    return None


def fallback_on_demand(
    inputs: DeadlineInputs, times: CompletionTimes, launch_spot: bool
) -> int | None:
    """The fewest of the free slots (those without an attempt) whose next attempts
    must go on-demand now so that, after `decision_lag_h`, every slot could still turn
    on-demand and finish the bag by the deadline (None: not even all of them).

    The free slots take the next jobs, longest first; on spot (when `launch_spot`) a
    slot is busy for its job's expected time plus a launch, on-demand for its work plus
    a launch; a waiting slot is free after the lag and a launch. Running attempts keep
    their slots: on-demand ones their time left, spot ones their expected time left
    plus a launch. The rest of the queue is list scheduled (in dispatch order) on the
    slots as they free, and must end by deadline − lag − how late the spot attempts
    may be at the confidence (`_margin_h`; in the last round, `_last_round_fits`
    instead), also when the spot attempt with the most unsaved work loses its VM
    now."""
    K = slot_count(inputs)
    H = inputs.deadline_h - inputs.now_h - inputs.decision_lag_h
    launch = inputs.on_demand_launch_h
    queued = _dispatch_order(inputs)
    spot_work = _array(inputs.spot_work_h)
    spot_mean, _ = times.aged_moments(spot_work, _array(inputs.spot_age_h))
    od_left = _array(inputs.on_demand_left_h)
    free = max(0, K - len(spot_work) - len(od_left))
    nxt, rest = queued[:free], queued[free:]
    next_mean, next_var = times.fresh_moments(nxt)
    spot_var = times.aged_moments(spot_work, _array(inputs.spot_age_h))[1]
    running = np.concatenate([od_left, spot_mean + launch])
    # The spot attempt with the most work since its last checkpoint, its VM dying
    # now: its slot free after a launch, its job (that work lost) back in the queue
    # ahead of the fresh jobs (retries go first).
    unsaved = _array(inputs.spot_unsaved_h)
    running_unsaved = unsaved if len(unsaved) == len(spot_work) else np.zeros(len(spot_work))
    since = (
        running_unsaved if inputs.spot_since_mark_h is None else _array(inputs.spot_since_mark_h)
    )
    running_since = since if len(since) == len(spot_work) else running_unsaved
    worst, retry = -1, np.zeros(0)
    if len(unsaved) == len(spot_work) and len(unsaved) and unsaved.max() > 0:
        i = int(np.argmax(unsaved))
        worst, retry = len(od_left) + i, np.array([spot_work[i] + unsaved[i]])

    def ends_by(free_at: np.ndarray, left: np.ndarray, limit: float) -> bool:
        bound = (float(free_at.sum()) + float(left.sum())) / K + max(
            float(free_at.max(initial=0.0)), float(left.max(initial=0.0))
        )
        return bound <= limit or list_schedule_h(left, free_at, inputs.queue_ordered) <= limit

    reuse_age = _array(inputs.free_spot_age_h)

    def next_on_spot(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The spot attempts of the next jobs beyond the n on on-demand: (work, VM
        age, slot busy until, variance). The first ones reuse the free slots' live
        spot VMs (no launch, planned at their ages), the others launch fresh ones."""
        work = nxt[n:]
        age = np.zeros(len(work))
        reused = min(len(reuse_age), len(work))
        age[:reused] = reuse_age[:reused]
        mean, var = times.aged_moments(work, age)
        mean[reused:], var[reused:] = next_mean[n + reused :], next_var[n + reused :]
        busy = mean + launch + np.where(np.arange(len(work)) < reused, 0.0, launch)
        return work, age, busy, var

    def fits(n: int) -> bool:
        """n of the next jobs on on-demand, the others on spot or waiting."""
        on_demand = nxt[:n] + launch
        spot_age_next = np.zeros(0)
        if launch_spot:
            spot_next, spot_age_next, others, spot_next_var = next_on_spot(n)
            left = rest
        else:  # waiting slots start nothing: their jobs stay queued
            others = np.full(len(nxt) - n, inputs.decision_lag_h + launch)
            left = np.concatenate([nxt[n:], rest])
            spot_next, spot_next_var = nxt[:0], next_var[:0]
            spot_age_next = np.zeros(0)
        idle = np.full(K - len(running) - len(nxt), launch)  # more slots than jobs
        free_at = np.concatenate([running, on_demand, others, idle])[:K]
        if len(rest) >= K:
            limit = H - _margin_h(inputs, float(spot_next_var.sum() + spot_var.sum()))
            if limit <= 0 or not ends_by(free_at, left, limit):
                return False
        else:
            limit = H
            if limit <= 0 or not ends_by(free_at, left, limit):
                return False
            spot_slot = np.zeros(len(free_at), dtype=bool)
            spot_slot[len(od_left) : len(running)] = True
            spot_slot[len(running) + n : len(running) + n + len(spot_next)] = True
            spot = (
                np.concatenate([spot_work, spot_next]),
                np.concatenate([_array(inputs.spot_age_h), spot_age_next]),
                # a launch before a next attempt on a fresh VM
                np.concatenate([np.zeros(len(spot_work)), np.where(spot_age_next > 0, 0, launch)]),
                np.concatenate([running_since, np.zeros(len(spot_next))]),
            )
            if not _last_round_fits(inputs, times, free_at, spot_slot, spot, left, limit):
                return False
        if worst < 0:
            return True
        retried = free_at.copy()
        retried[worst] = launch
        return ends_by(retried, np.concatenate([retry, left]), limit)

    if fits(0):
        return 0
    if not fits(len(nxt)):
        return None
    low, high = 0, len(nxt)  # fits(high) and not fits(low)
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


def outage_on_demand(inputs: DeadlineInputs, times: CompletionTimes, loads: _Loads) -> int:
    """While spot cannot be had (or is not worth its price and cannot be launched): the
    fewest free slots whose next jobs must go on-demand now so that the projection with
    the expected outage (`spot_outage_h`, at least the lag) still meets the deadline at
    the confidence, P(m) >= c with m the on-demand slots then; every free slot when no
    m reaches it. Waiting up to the expectation line (`spot_line_on_demand`) idles the
    slack spot's spread needs, and buys more on-demand hours later than this buys now
    (seed 15 of bench/deadlines_simulate.py at 1.5×: 1,801 against Uniform Progress's
    1,369)."""
    K = slot_count(inputs)
    running = len(loads.on_demand_left_sorted_h)
    free = max(0, K - len(_array(inputs.spot_work_h)) - running)
    free = min(free, loads.queued_jobs)
    if not free:
        return 0
    waiting = replace(inputs, spot_outage_h=max(inputs.spot_outage_h, inputs.decision_lag_h))
    p = _probabilities(waiting, times, loads, None)
    for n in range(free + 1):
        if p[min(running + n, K)] >= inputs.confidence:
            return n
    return free


def spot_after_wait_fits(inputs: DeadlineInputs, times: CompletionTimes) -> bool:
    """Whether the bag may wait one more look (`decision_lag_h`) for a spot price worth
    paying: after it, spot alone (no slot on-demand) would still finish by the deadline
    at the confidence (the projection's P(0), `meet_probabilities`). Waiting until spot
    would only just finish in expectation (`spot_line_on_demand`) leaves nothing for
    spot's own spread: the slots then turn on-demand, dearer than the spot that was
    there."""
    later = replace(inputs, now_h=inputs.now_h + inputs.decision_lag_h)
    return float(meet_probabilities(later, times)[0]) >= inputs.confidence


def spot_finish_h(inputs: DeadlineInputs, times: CompletionTimes, n: int, wait_h: float) -> float:
    """The expected finish (hours from now) when n of the free slots' next jobs (the
    longest) run on on-demand and every other slot runs spot once it can be had again
    (after `wait_h`): running attempts keep their slots (on-demand ones their time
    left, spot ones their expected time left μ_j(age)), and the queue is list
    scheduled on the slots as they free, each job taking its expected time on a fresh
    spot VM, μ_j(0)."""
    K = slot_count(inputs)
    launch = inputs.on_demand_launch_h
    queued = _dispatch_order(inputs)
    spot_work = _array(inputs.spot_work_h)
    spot_mean, _ = times.aged_moments(spot_work, _array(inputs.spot_age_h))
    od_left = _array(inputs.on_demand_left_h)
    free = max(0, K - len(spot_work) - len(od_left))
    n = min(n, free, len(queued))
    on_demand, rest = queued[:n] + launch, queued[n:]
    rest_mean, _ = times.fresh_moments(rest)
    free_at = np.concatenate([od_left, spot_mean, on_demand, np.full(free - n, wait_h + launch)])
    return list_schedule_h(rest_mean, free_at, inputs.queue_ordered)


def spot_line_on_demand(inputs: DeadlineInputs, times: CompletionTimes) -> int:
    """While spot cannot be had or is not worth its price: the fewest free slots that
    must run on-demand now so that spot, once back (after the expected outage, at
    least the lag), still finishes the bag by the deadline in expectation
    (`spot_finish_h`). A slot left idle loses its hours for good; when spot alone
    would then finish late, on-demand hours are needed anyway, and bought now they
    use capacity that would otherwise idle instead of displacing spot later (the
    role of Uniform Progress's rule 1, with spot's own expected pace as the line)."""
    H = inputs.deadline_h - inputs.now_h
    wait = max(inputs.spot_outage_h, inputs.decision_lag_h)
    K = slot_count(inputs)
    free = max(0, K - len(_array(inputs.spot_work_h)) - len(_array(inputs.on_demand_left_h)))
    free = min(free, len(_array(inputs.queued_work_h)))
    if spot_finish_h(inputs, times, 0, wait) <= H:
        return 0
    if free == 0 or spot_finish_h(inputs, times, free, wait) > H:
        return free
    low, high = 0, free  # fits(high) and not fits(low)
    while high - low > 1:
        mid = (low + high) // 2
        if spot_finish_h(inputs, times, mid, wait) <= H:
            high = mid
        else:
            low = mid
    return high


def _margin_h(inputs: DeadlineInputs, var_h2: float) -> float:
    """How much later than their means the spot attempts may end, at the confidence,
    while the fallback has at least a round of jobs to share out (K or more queued
    beyond the next): a late attempt only leaves its slot less of them, so the delay
    is the spread of their sum over K slots, z_c·sqrt(Σσ²)/K."""
    K = slot_count(inputs)
    return _ndtri(inputs.confidence) * math.sqrt(max(var_h2, 0.0)) / K


def _last_round_fits(
    inputs: DeadlineInputs,
    times: CompletionTimes,
    free_at: np.ndarray,
    spot_slot: np.ndarray,
    spot: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    left: np.ndarray,
    limit: float,
) -> bool:
    """The last round (module docstring): (a) every spot attempt (work, VM age, launch
    before it) ends in time for its slot to switch, and (b) the jobs left, on on-demand
    in the fallback, still end by the limit: list scheduled on the slots as they would
    free if no spot VM died (a spot attempt's slot at its work + launches), each slot's
    jobs then end at e_i; a spot attempt may be late by the slack limit − e_i of its
    slot, its jobs only shifting, so the fallback holds when
    Π_j F'_j(w_j + limit − e_j) >= c (F' as in (a)). (b)'s times are never later than
    (a)'s (e_j >= w_j + launches), so (b) implies (a) and takes the whole risk 1 − c;
    (a) alone when no job is left. A slot may take two short jobs in turn, which
    counting slots free by limit − w_max, one a job (an earlier (b)), did not see: it
    bought on-demand VMs a bag at 1.1× did not need. `spot`: the spot attempts' work
    left, VM age, launch before them and time since their last checkpoint (`spot_since_mark_h`).

    With `checkpoint_h` set the scheduler keeps each spot attempt's checkpoints within
    the deadline's bounds where there are some (`deadline_checkpoint_interval_h`): its
    worst case then ends by its time to switch, F'_j = 1 there."""
    work, age, before, since = spot
    launch = inputs.on_demand_launch_h
    risk = 1.0 - inputs.confidence
    # Each attempt's own time to the switch (a): with its checkpoints within the
    # deadline's bounds (`checkpoint_h` set), its worst case ends by then.
    switch_by = limit - before - launch
    worst = times.worst_h(work, age)
    if inputs.checkpoint_h is not None:
        # Planned at its last checkpoint (`since` ago, `work + since` left then), as
        # the checkpoint timer plans it: the slack is the same now. The restart is the
        # on-demand launch, as the timer's bounds take it.
        shortest, longest, to_end = deadline_checkpoint_interval_h(
            work + since, switch_by + since, inputs.checkpoint_h, launch
        )
        # Bounded while its next checkpoint, due by `longest` after the last, can still
        # be written in time (or it may run to its end): past that (a checkpoint that
        # failed, or none planned) its worst case is its own.
        kept = to_end | (since <= longest + inputs.checkpoint_h)
        worst = np.where(~np.isnan(shortest) & kept, np.minimum(worst, switch_by), worst)
    if not len(left):
        return _attempts_end_in_time(times, work, age, switch_by, worst, risk)
    slots = np.flatnonzero(spot_slot)  # in the order of the spot attempts
    soonest = free_at.copy()
    soonest[slots] = work + before + launch
    ends = list_schedule_ends_h(left, soonest, inputs.queue_ordered)
    if float(ends.max()) > limit:
        return False
    late_by = limit - ends[slots]
    return _attempts_end_in_time(times, work, age, work + late_by, worst, risk)


def _attempts_end_in_time(
    times: CompletionTimes,
    work: np.ndarray,
    age: np.ndarray,
    by_h: np.ndarray,
    worst_h: np.ndarray,
    risk: float,
) -> bool:
    """P(every spot attempt ends by its time) >= 1 − risk, lifetimes independent. An
    attempt whose VM dies has its retry go on-demand if need be (the decision at the
    preemption sees it): whatever befalls it, it ends by `worst_h`
    (`CompletionTimes.worst_h`: the end of its worst checkpoint segment, a restart, the
    work left at that segment's start; or, within the deadline's checkpoint bounds,
    its time to switch)."""
    if not len(work):
        return True
    in_time = times.aged_cdf_at(work, age, by_h)
    in_time = np.where(by_h >= worst_h, 1.0, in_time)
    return float(np.prod(in_time)) >= 1.0 - risk


# How far past a bound `deadline_checkpoint_interval_h` still counts as on it (hours):
# 3.6 ms. A plan at its shortest bound leaves every later check an equality, and hours
# computed from epoch seconds carry ~1e-10 h of rounding a step (one in six such plans
# lost its bounds mid-tail with a relative 1e-12); the worst case may end that much late.
BOUNDS_TOLERANCE_H = 1e-6


def deadline_checkpoint_interval_h(work_h, hours_h, checkpoint_h: float, restart_h: float):
    """The checkpoint intervals that let a spot attempt end within `hours_h` of its
    last checkpoint whatever befalls it, its retry after a preemption on an on-demand
    VM (docs/design.md#deadline-checkpoints): (shortest, longest, to_end) for `work_h`
    left at that checkpoint, hours from it; shortest and longest nan where no plan
    does; to_end where running to the end without another checkpoint does.

    A preemption just before a checkpoint is written loses the interval i since the
    last one; the retry, after a restart R, redoes it and the rest. With s = hours − w
    − R the slack, that ends in time when i + δ <= s; a checkpoint leaves the slack
    s − δ for the work w − i left, and running to the end ends in time when w <= s
    (all of it lost just before the end). So n more checkpoints cover at most
    Σ_{k=1..n} (s − k·δ) + (s − n·δ) of work, and a plan exists when w <= F(s),
    F(s) = max over n >= 0 of (n + 1)·s − δ·n·(n + 3)/2 (`_most_work_h`). Longest:
    s − δ (its own segment fits). Shortest: the checkpoint must leave a plan for what
    is left, w − i <= F(s − δ); when that is above the longest, only running to the
    end fits (and then does: F(s) = max(s, s − δ + F(s − δ))). Any choice between
    them, made afresh at every checkpoint, keeps the bound: the scheduler clips the
    checkpoint DP's interval to them (controller/scheduler/checkpoints.py).
    Vectorised over `work_h` and `hours_h`."""
    work = np.asarray(work_h, dtype=float)
    slack = np.asarray(hours_h, dtype=float) - work - restart_h
    most = _most_work_h(slack, checkpoint_h)
    # An interval at the shortest bound leaves the next checks equalities, up to the
    # rounding of the clock's epoch seconds (BOUNDS_TOLERANCE_H).
    feasible = (slack > 0) & (work <= most + BOUNDS_TOLERANCE_H)
    longest = np.where(feasible, slack - checkpoint_h, np.nan)
    least = np.maximum(0.0, work - _most_work_h(slack - checkpoint_h, checkpoint_h))
    to_end = feasible & (work <= slack + BOUNDS_TOLERANCE_H)
    # Where the end does not fit, a plan that exists has shortest <= longest: above it
    # only by rounding (intervals at the bound all along), it is the longest.
    least = np.where(to_end, least, np.minimum(least, longest))
    shortest = np.where(feasible, least, np.nan)
    return shortest, longest, to_end


def _most_work_h(slack_h, checkpoint_h: float) -> np.ndarray:
    """F(s) = max over n >= 0 of (n + 1)·s − δ·n·(n + 3)/2: the most work a plan of n
    more checkpoints, each interval the longest its slack allows (s − δ, s − 2δ, ...),
    then the run to the end, keeps within slack s whatever befalls it. Concave in n:
    the best n is next to s/δ − 3/2. Without a checkpoint cost, unbounded."""
    s = np.asarray(slack_h, dtype=float)
    if checkpoint_h <= 0:
        return np.where(s > 0, np.inf, s)
    low = np.floor(np.maximum(s / checkpoint_h - 1.5, 0.0))
    high = low + 1.0
    return np.maximum(
        (low + 1.0) * s - checkpoint_h * low * (low + 3.0) / 2.0,
        (high + 1.0) * s - checkpoint_h * high * (high + 3.0) / 2.0,
    )


def _dispatch_order(inputs: DeadlineInputs) -> np.ndarray:
    """The queue in the order slots will take it: as given when `queue_ordered`,
    else longest first."""
    queued = _array(inputs.queued_work_h)
    return queued if inputs.queue_ordered else np.sort(queued)[::-1]


def list_schedule_h(works_h, free_at_h, ordered: bool = False) -> float:
    """Makespan of list scheduling on slots free from `free_at_h` (the time the last
    slot ends): each job, longest first (in the given order when `ordered`), to the
    slot free first."""
    loads = sorted(float(b) for b in free_at_h)
    if not loads:
        return 0.0
    works = [float(w) for w in works_h]
    for w in works if ordered else sorted(works, reverse=True):
        heapq.heapreplace(loads, loads[0] + w)
    return max(loads)


def list_schedule_ends_h(works_h, free_at_h, ordered: bool = False) -> np.ndarray:
    """List scheduling as `list_schedule_h`, giving each slot's end (the end of the last
    job it takes, or when it frees if it takes none), in the slots' order."""
    heap = [(float(b), i) for i, b in enumerate(free_at_h)]
    heapq.heapify(heap)
    works = [float(w) for w in works_h]
    if heap:
        for w in works if ordered else sorted(works, reverse=True):
            at, i = heap[0]
            heapq.heapreplace(heap, (at + w, i))
    ends = np.zeros(len(heap))
    for at, i in heap:
        ends[i] = at
    return ends


def _finish_within(
    inputs: DeadlineInputs, times: CompletionTimes, loads: _Loads, m: int, q: float
) -> float:
    """The least horizon h (hours from now) with P_m(finish within h) >= q, by bisection
    (infinite when even the table's horizon is not enough)."""
    low, high = 0.0, max(1.0, inputs.deadline_h - inputs.now_h)
    while _probabilities(inputs, times, loads, high)[m] < q:
        high *= 2.0
        if high > 1e5:
            return math.inf
    for _ in range(40):
        mid = (low + high) / 2.0
        if _probabilities(inputs, times, loads, mid)[m] >= q:
            high = mid
        else:
            low = mid
        if high - low < 1e-3:
            break
    return float(high)
