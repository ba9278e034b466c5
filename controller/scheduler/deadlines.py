"""Deadlines in the daemon: the deadline policy (policies/deadline.py) decides, for each
bag with `on_demand: when_needed` and a deadline, how many of its slots run on on-demand
VMs; Planning passes that to the planner, which launches them (docs/design.md#deadlines).

- `on_demand: always`: every slot of the bag is on-demand, spot is never used.
- `when_needed`: `decide(project=False)` (the cheap path) whenever the bag's state
  changes (a slot frees, a job is queued or ends) and at least every `DECIDE_EVERY_S`
  (or `DECIDE_EVERY_H` model hours, if shorter); the projection (`project=True`,
  P(meet) and the finish quantiles) at most every `PROJECT_EVERY_S` per bag and for
  one bag per pass, for the API and the `deadline_at_risk` event (once per bag until
  it is no longer at risk).
- `never` (or no book of preemption models): spot only, as without a deadline.
- `deadline_policy: uniform_progress` (with `when_needed`): Uniform Progress
  (policies/uniform_progress.py `plan_bag`, the baseline) decides instead, from the
  same inputs, when and as often as the deadline policy would (it waits for the same
  completion-time tables, which it does not use, to be built).

The policy's inputs come from the World, in model hours, as the simulator
(policies/deadline_sim.py) gives them: the queue in the order the scheduler takes it
(retries first: `queue_ordered`), each job at the bag's runtime estimate less the work
its checkpoints saved; running attempts' work left, their VMs' ages and their work
since their last checkpoint (`spot_unsaved_h`: what a preemption now loses); the ages
of the running spot VMs whose free room the bag's next attempts would take
(`free_spot_age_h`); whether spot can be launched now (`spot_available`: not while
every type that holds a job is backed off after failed launches, `spot_outage_h` until
then); prices of the cheapest type for the bag's jobs (per slot; spot at the hopping
market's price now where it knows one), the launch delay of the book. Its
completion-time tables (policies/completion_times.py) are built once per (model,
checkpoint table), inline in the simulator and in a worker thread in the daemon (the
bag stays on spot until they are ready).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from controller.planner import CatalogType
from controller.preemption.checkpoint_tables import TableCache
from controller.preemption.model_book import ModelBook
from controller.scheduler.backoff import Backoff
from controller.scheduler.runs import AttemptRun, BagRun
from controller.scheduler.world import World
from controller.store import WriteBatch
from drivers.base import VmType
from policies import uniform_progress as up
from policies.checkpoint import CheckpointTable
from policies.completion_times import CompletionTimes, build_completion_times
from policies.deadline import (
    DeadlineDecision,
    DeadlineInputs,
    deadline_checkpoint_interval_h,
    decide,
    list_schedule_h,
    slot_count,
)
from policies.packing import PricedType, cheapest_type, copies_that_fit, zone_allowed
from policies.preemption import LifetimeModel

log = logging.getLogger("spotbag.scheduler")

DECIDE_EVERY_S = 10.0  # real seconds: the cheap decision at least this often per bag,
DECIDE_EVERY_H = 0.1  # and at least every this many model hours (a time-scaled daemon)
PROJECT_EVERY_S = 30.0  # real seconds: the projection at most this often per bag
QUANTILES = (0.5, 0.9, 0.95)
ALL_SLOTS = 1 << 30  # `always`: more on-demand slots than any bag has

_TimesKey = tuple[LifetimeModel, int]  # (model, id of its checkpoint table)
TIMES_KEPT = 8  # completion-time tables kept (~10 MB each at 1-min steps over 24 h)
RETRY_BUILD_S = 60.0  # after a failed build, real seconds before the next try
MIN_OUTBID_S = 60.0  # the least a spot price above the bid is expected to stay there


class SpotPriceFeed(Protocol):
    """A spot price that moves, known to the scheduler beside the driver (`spotbag
    simulate --price-trace`: controller/traces/price_trace.py TraceMarket)."""

    def price_at(self, vm_type: str, zone: str, at: float) -> float:
        """The spot price (USD/h) in effect at `at`."""
        ...

    def outage_left_s(self, vm_type: str, zone: str, bid: float, at: float) -> float:
        """0 while the price is at or below `bid`; else how much longer it is expected
        to stay above it (from the past only)."""
        ...


def outbid_s(feed: SpotPriceFeed, vm_type: str, zone: str, bid: float, now: float) -> float:
    """Real seconds the spot price of the type is expected to stay above `bid`: 0 while
    it is at or below; else the feed's expectation, at least `MIN_OUTBID_S` (an outage
    just begun, with none before it, is expected to last as long again as so far: 0)."""
    if feed.price_at(vm_type, zone, now) <= bid:
        return 0.0
    return max(MIN_OUTBID_S, feed.outage_left_s(vm_type, zone, bid, now))


@dataclass
class _BagDeadline:
    decision: DeadlineDecision | None = None
    decided_at: float = -float("inf")
    decided_for: tuple[int, int] = (-1, -1)  # (queued, live attempts) it was decided for
    projected: DeadlineDecision | None = None
    projected_at: float = -float("inf")
    at_risk_told: bool = False
    up_safety_net: bool = False  # Uniform Progress's safety net fired: on-demand to the end
    slots: int = 0  # K, the bag's slots the decision was made for


@dataclass(frozen=True)
class OnDemandPlan:
    """What the planner is told for one bag (planner.DemandGroup's fields)."""

    slots: int
    running: int
    use_spot: bool
    # Of the bag's slots, those left to spot VMs (K − m) and its attempts on them now:
    # its spot attempts stay within them, so that a slot the policy turned on-demand
    # waits for an on-demand VM instead of taking the next spot VM that frees (None:
    # no cap, `always`).
    spot_slots: int | None = None
    spot_running: int = 0


class Deadlines:
    """Per bag, the deadline policy's decision and projection (module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        book: ModelBook | None,
        tables: TableCache,
        max_vms: int,
        backoff: Backoff | None = None,
        spot_feed: SpotPriceFeed | None = None,
    ) -> None:
        self.world = world
        # A moving spot price (simulate's trace): the policy's price now, whether spot
        # can be had, and for how long it cannot.
        self.spot_feed = spot_feed
        self.backoff = backoff  # VM types backed off after failed launches: spot_available
        self.book = book
        self.tables = tables
        self.max_vms = max_vms
        self._bags: dict[str, _BagDeadline] = {}
        # bag -> its jobs' own estimated runtimes (s, by index), read once (`_own_estimates_h`)
        self._own_s: dict[str, np.ndarray] = {}
        # Keyed by the table's id, kept with the table: an id is only unique while its
        # object lives, so an entry is used only while its own table is the one asked
        # for (a table the cache dropped may leave its id to another). Oldest first.
        self._times: dict[_TimesKey, tuple[CheckpointTable, CompletionTimes]] = {}
        self._building: dict[_TimesKey, asyncio.Task[None]] = {}
        self._failed_at: dict[_TimesKey, float] = {}  # key -> when its build failed
        self.on_ready: Callable[[], None] | None = None  # wakes the scheduler
        # bag -> its attempts on (on-demand, spot) VMs, counted once a pass
        self._counts: dict[str, tuple[int, int]] | None = None
        # How often a bag's projection is made (real s); it changes no decision (views and
        # `deadline_at_risk` only): a simulation may make it rarer (simulation.py).
        self.project_every_s = PROJECT_EVERY_S
        # How long a decision stands when nothing changes (real s): the policy's lag.
        self.decide_every_s = min(DECIDE_EVERY_S, DECIDE_EVERY_H * 3600.0 / world.time_scale)
        # Whether the checkpoint timer plans checkpoints (not with `checkpoint.policy =
        # "none"`): without, no attempt keeps the deadline's bounds.
        self.checkpoints_planned = True

    def forget(self) -> None:
        """Drop every bag's decision and projection (after a recovery: they are made
        again from the rebuilt world; a bag still at risk is told so again)."""
        self._bags.clear()
        self._own_s.clear()
        self._counts = None

    # --- what Planning asks ---------------------------------------------------------

    def plan_for(self, bag: BagRun, now: float) -> OnDemandPlan | None:
        """The bag's on-demand slots now; None: spot only (as without a deadline)."""
        mode = bag.spec.on_demand_mode
        if mode == "never":
            return None
        running, spot_running = self._running_by_market(bag.id)
        if mode == "always":
            return OnDemandPlan(ALL_SLOTS, running, False)
        decision = self._decision(bag, now)
        if decision is None:
            return None
        state = self._bags[bag.id]
        return OnDemandPlan(
            decision.on_demand_slots,
            running,
            decision.launch_spot,
            max(0, state.slots - decision.on_demand_slots),
            spot_running,
        )

    def project(self, batch: WriteBatch, now: float) -> None:
        """The projection of one bag with a deadline per pass (tens of ms each, on the
        loop: bags due together take turns), each at most every PROJECT_EVERY_S;
        `deadline_at_risk` once per bag until it is no longer at risk."""
        for gone in [bag_id for bag_id in self._bags if bag_id not in self.world.bags]:
            del self._bags[gone]  # ended bags are forgotten
        due: tuple[float, BagRun, _BagDeadline] | None = None
        for bag in self.world.bags.values():
            if bag.deadline_at is None or bag.spec.on_demand_mode == "never":
                continue
            state = self._bags.setdefault(bag.id, _BagDeadline())
            if now - state.projected_at >= self.project_every_s and (
                due is None or state.projected_at < due[0]
            ):
                due = (state.projected_at, bag, state)
        if due is None:
            return
        _, bag, state = due
        inputs_times = self._inputs(bag, now)
        if inputs_times is None:
            return
        inputs, times = inputs_times
        state.projected = decide(inputs, times, QUANTILES, project=True)
        state.projected_at = now
        if state.projected.at_risk and not state.at_risk_told:
            state.at_risk_told = True
            self.world.notices.deadline_at_risk(bag, now, batch, self._detail(bag, state))
        elif not state.projected.at_risk:
            state.at_risk_told = False

    def view(self, bag_id: str) -> dict[str, Any] | None:
        """The bag's deadline for the API (GET /v1/bags/{id}), without the figures the
        store has (`at`, `confidence`, `on_demand_share`); None: none known."""
        bag = self.world.bags.get(bag_id)
        state = self._bags.get(bag_id)
        if bag is None or state is None:
            return None
        return self._detail(bag, state)

    def _detail(self, bag: BagRun, state: _BagDeadline) -> dict[str, Any]:
        to_s = 3600.0 / self.world.time_scale  # model hours -> real seconds
        projected = state.projected
        finish = {}
        p_meet: float | None = None
        if projected is not None:
            p_meet = projected.p_meet if math.isfinite(projected.p_meet) else None
            finish = {  # a finish beyond the model's horizon is left out (JSON has no inf)
                f"p{round(q * 100)}": float(h * to_s)
                for q, h in projected.finish_quantiles_h
                if math.isfinite(h)
            }
        decision = state.decision or projected
        return {
            "at": bag.deadline_at,
            "confidence": bag.spec.deadline_confidence,
            "p_meet": p_meet,
            "finish": finish,
            "at_risk": bool(projected.at_risk) if projected is not None else False,
            "on_demand_slots": decision.on_demand_slots if decision is not None else 0,
        }

    # --- the decision -----------------------------------------------------------------

    def _decision(self, bag: BagRun, now: float) -> DeadlineDecision | None:
        state = self._bags.setdefault(bag.id, _BagDeadline())
        key = (len(bag.queue), bag.live_attempts)
        if state.decision is not None and (
            key == state.decided_for and now - state.decided_at < self.decide_every_s
        ):
            return state.decision
        inputs_times = self._inputs(bag, now)
        if inputs_times is None:
            return state.decision
        inputs, times = inputs_times
        if bag.spec.deadline_policy == "uniform_progress":
            decision = self._uniform_progress(bag, state, inputs)
        else:
            decision = decide(inputs, times, (), project=False)
        if state.decision is None or decision.on_demand_slots != state.decision.on_demand_slots:
            log.info(
                "bag %s: %d slot(s) on on-demand (deadline in %.2f model h)",
                bag.id,
                decision.on_demand_slots,
                inputs.deadline_h - inputs.now_h,
            )
        state.decision, state.decided_at, state.decided_for = decision, now, key
        state.slots = slot_count(inputs)
        return decision

    def _uniform_progress(
        self, bag: BagRun, state: _BagDeadline, inputs: DeadlineInputs
    ) -> DeadlineDecision:
        """Uniform Progress (policies/uniform_progress.py `plan_bag`), the baseline a bag
        chooses with `deadline_policy: uniform_progress`, from the same inputs as the
        deadline policy's: C, the bag's work (its jobs × the runtime estimate); cp(t), C
        less the work left (queued, and running attempts' left); C(t), list scheduling
        of the work left on the bag's slots all on-demand; spot available when the
        deadline policy would say so (no back-off, the price at or below the bid)."""
        to_h = self.world.time_scale / 3600.0
        estimate_h = bag.runtime_estimate_s * to_h
        launch_h = inputs.on_demand_launch_h
        left_h = float(
            inputs.queued_work_h.sum() + inputs.spot_work_h.sum() + inputs.on_demand_left_h.sum()
        )
        own_h = self._own_estimates_h(bag, estimate_h)
        total_h = (
            max(bag.jobs_total, bag.open_jobs) * estimate_h if own_h is None else float(own_h.sum())
        )
        running = len(inputs.spot_work_h) + len(inputs.on_demand_left_h)
        busy_h = [
            *inputs.on_demand_left_h.tolist(),
            *(w + launch_h for w in inputs.spot_work_h.tolist()),
            *[launch_h] * max(inputs.slots - running, 0),
        ]
        progress = up.ProgressState(
            now_h=inputs.now_h,
            start_h=bag.submitted_at * to_h,
            deadline_h=inputs.deadline_h,
            total_work_h=total_h,
            progress_h=max(total_h - left_h, 0.0),
            work_left_h=list_schedule_h(inputs.queued_work_h, busy_h),
            changeover_h=launch_h,
            spot_available=inputs.spot_available is not False and inputs.spot_outage_h == 0.0,
            current=up.Kind.WAIT,
            safety_net=state.up_safety_net,
        )
        plan = up.plan_bag(progress, inputs.slots, self._running_by_market(bag.id)[0])
        state.up_safety_net = plan.safety_net
        return DeadlineDecision(
            on_demand_slots=plan.on_demand_slots,
            launch_spot=plan.launch_spot,
            p_meet=math.nan,
            finish_quantiles_h=(),
            latest_switch_h=math.nan,
            at_risk=False,
        )

    def next_due(self, now: float) -> float | None:
        """When a decision that keeps a bag's queued jobs waiting (no spot worth
        launching now, no on-demand slot for them) stands no longer: nothing else may
        happen before then (no VM alive, on a virtual clock no timer), and the wait must
        be decided again. None: no bag waits on its decision."""
        due = None
        for bag_id, state in self._bags.items():
            decision = state.decision
            bag = self.world.bags.get(bag_id)
            if decision is None or decision.launch_spot or bag is None or not len(bag.queue):
                continue
            at = state.decided_at + self.decide_every_s
            if at <= now:  # not decided again (its tables are being built): no busy loop
                at = now + self.decide_every_s
            due = at if due is None else min(due, at)
        return due

    def begin_pass(self) -> None:
        """A new planning pass: the attempts on on-demand VMs are counted again; the
        jobs' own estimates of bags that ended are dropped."""
        self._counts = None
        if self._own_s:
            for bag_id in [b for b in self._own_s if b not in self.world.bags]:
                del self._own_s[bag_id]

    def _running_by_market(self, bag_id: str) -> tuple[int, int]:
        """The bag's attempts on (on-demand, spot) VMs: counted for every bag in one
        sweep of the attempts per pass, not one per bag."""
        if self._counts is None:
            world = self.world
            counts: dict[str, list[int]] = {}
            for attempt in world.attempts.values():
                vm = world.vms.get(attempt.vm_id)
                if vm is not None and not attempt.cancelling:
                    counts.setdefault(attempt.bag_id, [0, 0])[1 if vm.spot else 0] += 1
            self._counts = {bag: (od, spot) for bag, (od, spot) in counts.items()}
        return self._counts.get(bag_id, (0, 0))

    def _inputs(self, bag: BagRun, now: float) -> tuple[DeadlineInputs, CompletionTimes] | None:
        """The policy's inputs for the bag now, in model hours; None while its
        completion-time tables are being built (or no book, no type fits)."""
        if bag.deadline_at is None or self.book is None:
            return None
        world = self.world
        to_h = world.time_scale / 3600.0  # real seconds -> model hours
        fitting = [
            t
            for t in world.catalog_view
            if (bag.allowed_types is None or t.name in bag.allowed_types)
        ]
        spot_price = self._spot_prices_now(now)
        spot = cheapest_type(
            bag.shape,
            [
                PricedType(t.name, t.capacity, spot_price.get(t.name, t.spot_price_per_hour))
                for t in fitting
            ],
        )
        od = cheapest_type(
            bag.shape,
            [
                PricedType(t.name, t.capacity, t.on_demand_price_per_hour or t.spot_price_per_hour)
                for t in fitting
            ],
        )
        if spot is None or od is None:
            return None
        spot_type, spot_slots = spot
        vm_type = world.catalog[spot_type.name]
        outbid_s = self._outbid_s(vm_type, now)
        model = self.book.belief(vm_type, vm_type.zone).model
        estimate_h = bag.runtime_estimate_s * to_h
        own_h = self._own_estimates_h(bag, estimate_h)  # per job (None: one for all)
        longest_h = estimate_h if own_h is None else max(estimate_h, float(own_h.max(initial=0)))
        # A job that cannot checkpoint restarts from scratch: a checkpoint as dear as the
        # job itself, which the DP never takes.
        delta_h = (
            bag.spec.checkpoint_cost_s * to_h if bag.spec.checkpointable else max(longest_h, 1e-3)
        )
        times = self._completion_times(model, delta_h, longest_h)
        if times is None:
            return None
        # One sweep over the attempts gives the running ones, each with its work left
        # (`_work_left_h`).
        spot_work, spot_age, spot_unsaved, spot_since, od_left = [], [], [], [], []
        for attempt in world.attempts.values():
            if attempt.bag_id != bag.id or attempt.cancelling:
                continue
            vm = world.vms.get(attempt.vm_id)
            if vm is None:
                continue
            job_h = estimate_h if own_h is None else float(own_h[attempt.idx])
            left_h, since_mark_h = _work_left_h(attempt, job_h, now, to_h)
            saved_h = attempt.saved_s * to_h
            if vm.spot:
                spot_work.append(left_h)
                spot_age.append(max(0.0, now - vm.requested_at) * to_h)
                # What a preemption now loses (World.finish_attempt's `work_lost`): the
                # work since its last checkpoint, at most the job's estimate left (as
                # the simulator's min(done, work) − saved).
                spot_unsaved.append(max(0.0, min(since_mark_h, job_h - saved_h)))
                spot_since.append(since_mark_h)  # as the checkpoint timer's bounds take it
            else:
                od_left.append(left_h)
        slots = max(1, min(bag.open_jobs, self.max_vms * spot_slots))
        outage_h = max(self._spot_blocked_h(bag, fitting, now), outbid_s) * to_h
        inputs = DeadlineInputs(
            now_h=now * to_h,
            deadline_h=bag.deadline_at * to_h,
            slots=slots,
            # In the order the scheduler takes the queue, retries first: queue_ordered.
            queued_work_h=self._queued_work_h(bag, estimate_h, own_h, to_h),
            spot_work_h=np.asarray(spot_work, dtype=float),
            spot_age_h=np.asarray(spot_age, dtype=float),
            spot_unsaved_h=np.asarray(spot_unsaved, dtype=float),
            spot_since_mark_h=np.asarray(spot_since, dtype=float),
            free_spot_age_h=np.asarray(
                self._reusable_spot_ages_h(bag, now, estimate_h, slots), dtype=float
            ),
            on_demand_left_h=np.asarray(od_left, dtype=float),
            spot_price_per_hour=spot_type.price_per_hour / spot_slots,
            on_demand_price_per_hour=od[0].price_per_hour / od[1],
            on_demand_launch_h=self.book.launch_h,
            spot_outage_h=outage_h,
            confidence=bag.spec.deadline_confidence,
            decision_lag_h=self.decide_every_s * to_h + self.book.launch_h,
            # Spot can be launched now unless every type that holds a job is backed off
            # after failed launches (the driver said no); unknown without the back-off.
            spot_available=(
                None if self.backoff is None and self.spot_feed is None else outage_h == 0.0
            ),
            queue_ordered=True,
            # The checkpoint timer keeps spot attempts' intervals within the deadline's
            # bounds (`checkpoint_interval_bounds_s`): the policy counts on it.
            checkpoint_h=delta_h if self._bounds_checkpoints(bag) else None,
        )
        return inputs, times

    def checkpoint_interval_bounds_s(
        self, attempt: AttemptRun, now: float
    ) -> tuple[float, float, bool] | None:
        """For a spot attempt of a bag with a deadline (the deadline policy's,
        `when_needed`), the shortest and longest it may run from its last checkpoint to
        its next (real s), and whether it may instead run to its end, so that, whatever
        befalls it, its retry on an on-demand VM still ends in time for the policy's
        switch, deadline − lag − launch (`deadline_checkpoint_interval_h` for its work
        left at that checkpoint, docs/design.md#deadline-checkpoints). None: no bounds
        (no plan fits, any does, or the bag has none). The checkpoint timer keeps its
        plan within them; the policy's last round counts on that
        (`DeadlineInputs.checkpoint_h`)."""
        bag = self.world.bags.get(attempt.bag_id)
        vm = self.world.vms.get(attempt.vm_id)
        if bag is None or vm is None or not vm.spot or self.book is None:
            return None
        if bag.deadline_at is None or not self._bounds_checkpoints(bag):
            return None
        to_h = self.world.time_scale / 3600.0
        job_h = self._job_estimate_h(bag, attempt.idx, to_h)
        left_h, unsaved_h = _work_left_h(attempt, job_h, now, to_h)
        launch_h = self.book.launch_h
        lag_h = self.decide_every_s * to_h + launch_h
        # From its last checkpoint (`mark_at`), with the work left then.
        work_h = left_h + unsaved_h
        hours_h = (bag.deadline_at - attempt.mark_at) * to_h - lag_h - launch_h
        shortest, longest, to_end = deadline_checkpoint_interval_h(
            work_h, hours_h, bag.spec.checkpoint_cost_s * to_h, launch_h
        )
        if math.isnan(shortest) or (shortest == 0 and to_end and longest >= work_h):
            return None  # no plan fits, or any does
        return float(shortest) / to_h, float(longest) / to_h, bool(to_end)

    def _job_estimate_h(self, bag: BagRun, idx: int, to_h: float) -> float:
        """One job's estimated work (model hours), as `_own_estimates_h` gives it for
        every job, without the array (the checkpoint timer asks at every plan)."""
        estimate_h = bag.runtime_estimate_s * to_h
        if not bag.spec.estimated_runtime_param:
            return estimate_h
        own_s = self._own_s.get(bag.id)
        if own_s is None:
            own_s = self._own_s[bag.id] = self._read_own_estimates_s(bag)
        own = float(own_s[idx]) if idx < len(own_s) else math.nan
        return estimate_h if math.isnan(own) else own * bag.estimate_scale() * to_h

    def _bounds_checkpoints(self, bag: BagRun) -> bool:
        """Whether the bag's spot attempts keep their checkpoints within its deadline's
        bounds: the deadline policy's bags that escalate and checkpoint (not Uniform
        Progress's, the baseline, which plans without them), while the checkpoint timer
        plans checkpoints at all (`checkpoints_planned`)."""
        spec = bag.spec
        return (
            self.checkpoints_planned
            and spec.checkpointable
            and spec.on_demand_mode == "when_needed"
            and spec.deadline_policy != "uniform_progress"
        )

    def _spot_prices_now(self, now: float) -> dict[str, float]:
        """Each type's spot price now (USD/h): the price feed's (simulate's trace) when
        there is one, else the hopping market's where it knows one (controller/hopper.py:
        the prices the planner launches at); the catalog's for the others. A spot market
        moves by the hour: the policy's cost of staying on spot is today's, not the price
        written in the configuration."""
        feed = self.spot_feed
        if feed is not None:  # the market simulate replays: every type's price now
            return {t.name: feed.price_at(t.name, t.zone, now) for t in self.world.catalog_view}
        market = self.world.market
        if market is None:
            return {}
        return {
            name: float(price)
            for name, price in zip(market.names, market.now_price, strict=True)
            if math.isfinite(price) and price > 0.0
        }

    def _outbid_s(self, vm_type: VmType, now: float) -> float:
        """Real seconds the spot price of `vm_type` is expected to stay above its bid
        (its on-demand price): 0 without a price feed or while it is at or below."""
        if self.spot_feed is None:
            return 0.0
        bid = vm_type.on_demand_price_per_hour or math.inf
        return outbid_s(self.spot_feed, vm_type.name, vm_type.zone, bid, now)

    def _queued_work_h(
        self, bag: BagRun, estimate_h: float, own_h: np.ndarray | None, to_h: float
    ) -> np.ndarray:
        """The bag's queued jobs' work left, in the order the scheduler takes them
        (`JobQueue`: retries first, then the jobs never run): the estimate (the job's own,
        `own_h`, when the bag has them) less what the job's checkpoints saved (a retry
        resumes there, planning's `resume_work_s`). Only the retries put first are
        looked up, not the whole queue: the rest are the admitted jobs, which never ran,
        and the ones a restart queued again behind them (taken at the whole estimate:
        what they saved is not counted, on the safe side)."""
        if own_h is None:
            work = np.full(len(bag.queue), estimate_h)
        else:
            work = own_h[np.fromiter(bag.queue, dtype=np.intp, count=len(bag.queue))]
        if not bag.spec.checkpointable:
            return work  # a retry starts from scratch
        jobs = self.world.jobs
        for i, idx in enumerate(bag.queue.first):
            job = jobs.get((bag.id, idx))
            if job is not None and job.work_saved_s > 0:
                work[i] = max(work[i] - job.work_saved_s * to_h, 0.01 * work[i])
        return work

    def _own_estimates_h(self, bag: BagRun, estimate_h: float) -> np.ndarray | None:
        """Each job's estimated work (model hours, by job index) when the bag names an
        `estimated_runtime_param`: its own estimate × the bag's `estimate_scale` (what
        its finished jobs took against theirs), the bag's estimate for a job without
        one. The estimates are read from the jobs' parameters once per bag. None: the
        bag has no such parameter."""
        if not bag.spec.estimated_runtime_param:
            return None
        own_s = self._own_s.get(bag.id)
        if own_s is None:
            own_s = self._own_s[bag.id] = self._read_own_estimates_s(bag)
        to_h = self.world.time_scale / 3600.0
        scaled = own_s * (bag.estimate_scale() * to_h)
        return np.where(np.isnan(scaled), estimate_h, scaled)

    def _read_own_estimates_s(self, bag: BagRun) -> np.ndarray:
        """The jobs' own estimated runtimes (s; NaN: none, or the job has ended) from the
        parameters of the jobs still open: a JobRun's, else the waiting job's packed
        ones."""
        jobs = self.world.jobs
        own = np.full(max(bag.jobs_total, 1), np.nan)
        for idx in range(bag.jobs_total):
            job = jobs.get((bag.id, idx))
            if job is not None:
                params = job.params
            else:
                packed = bag.fresh.get(idx)
                if packed is None:
                    continue
                params = json.loads(packed)
            estimate = bag.job_estimate_s(params)
            if estimate is not None:
                own[idx] = estimate
        return own

    def _reusable_spot_ages_h(
        self, bag: BagRun, now: float, runtime_h: float, slots: int
    ) -> list[float]:
        """The ages (model hours) of the running spot VMs whose free room the bag's next
        attempts would take, one per job that fits there (at most `slots`): those the
        planner would place them on (controller/planner.py `_pack`: the bag's types and
        regions, room for its shape, the reuse policy agreeing; best fit first). A sweep
        of the roomy VMs, not of every VM."""
        world = self.world
        to_h = world.time_scale / 3600.0
        found: list[tuple[int, float, str, float, int]] = []
        for vm_id in world.roomy:
            vm = world.vms[vm_id]
            if not vm.spot or (
                bag.allowed_types is not None and vm.vm_type.name not in bag.allowed_types
            ):
                continue
            if not zone_allowed(vm.zone, bag.regions):
                continue
            fit = copies_that_fit(bag.shape, vm.free)
            if fit == 0:
                continue
            age_h = max(0.0, now - vm.requested_at) * to_h
            if vm.table is not None and not vm.table.reuse_ok(age_h, runtime_h):
                continue  # the planner would not reuse it: the next attempt launches afresh
            found.append((vm.free.cpus, vm.free.memory_gb, vm.id, age_h, fit))
        found.sort()
        ages = [age_h for *_, age_h, fit in found for _ in range(fit)]
        return ages[:slots]

    def _spot_blocked_h(self, bag: BagRun, fitting: list[CatalogType], now: float) -> float:
        """Real seconds until a spot VM for the bag may be launched again: 0 unless every
        allowed type that holds one of its jobs is backed off after failed launches
        (controller/scheduler/backoff.py; the planner launches none of them until
        then). The hopping market's bid is not a bar: the planner falls back on the
        catalog's prices when it knows no type below it."""
        if self.backoff is None or not self.backoff.types:
            return 0.0
        holding = [t for t in fitting if copies_that_fit(bag.shape, t.capacity)]
        if not holding:
            return 0.0
        blocked = self.backoff.types
        return max(0.0, min(blocked.get(t.name, (0.0, 0.0))[0] for t in holding) - now)

    def _completion_times(
        self, model: LifetimeModel, delta_h: float, work_h: float
    ) -> CompletionTimes | None:
        """The completion-time tables for (model, its checkpoint table), built once and
        kept: inline when the table cache solves inline (simulator), else in a worker
        thread (None until ready)."""
        table = self.tables.lookup(model, delta_h, max(work_h, 1e-3))
        if table is None:
            return None
        key = (model, id(table))
        kept = self._times.get(key)
        if kept is not None and kept[0] is table:
            return kept[1]
        if self.tables.inline:
            times = build_completion_times(model, table)
            self._keep(key, table, times)
            return times
        failed_at = self._failed_at.get(key)
        if failed_at is not None and time.monotonic() - failed_at < RETRY_BUILD_S:
            return None
        if key not in self._building:
            self._building[key] = asyncio.create_task(self._build(key, model, table))
        return None

    def _keep(self, key: _TimesKey, table: CheckpointTable, times: CompletionTimes) -> None:
        self._times.pop(key, None)
        self._times[key] = (table, times)
        while len(self._times) > TIMES_KEPT:
            del self._times[next(iter(self._times))]

    async def _build(self, key: _TimesKey, model: LifetimeModel, table: CheckpointTable) -> None:
        """In a worker thread; once built, the scheduler is woken to use them. A failed
        build is logged and tried again after RETRY_BUILD_S, not at every pass."""
        try:
            times = await asyncio.to_thread(build_completion_times, model, table)
        except Exception:
            log.exception("building the completion-time tables for %r failed", model)
            self._failed_at[key] = time.monotonic()
            return
        finally:
            self._building.pop(key, None)
        self._failed_at.pop(key, None)
        self._keep(key, table, times)
        if self.on_ready is not None:
            self.on_ready()


def _work_left_h(attempt: AttemptRun, job_h: float, now: float, to_h: float) -> tuple[float, float]:
    """A running attempt's work left and its work since its last checkpoint (model h):
    the job's `job_h` less `saved_s` at `mark_at` (its start or last checkpoint) and the
    time since, while its program runs (runs.AttemptRun); one waiting in the executor's
    queue (`ran_at` None) has done nothing yet. At least a hundredth of the job is left
    (a job may outrun its estimate)."""
    since_mark_h = 0.0
    if attempt.ran_at is not None:
        since_mark_h = max(0.0, now - attempt.mark_at) * to_h
    left_h = max(job_h - attempt.saved_s * to_h - since_mark_h, 0.01 * job_h)
    return left_h, since_mark_h
