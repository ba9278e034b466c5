"""Replaying a bag with a deadline on spot and on-demand VMs, for comparing deadline
strategies (docs/design.md#deadline-simulator). Pure: a seeded numpy Generator, no clock.

A bag of N jobs (work w_j hours each, the estimate exact) runs on K slots, one job per
VM. The market is a spot price series on a grid (the shipped 2015 EC2 trace in
bench/deadlines.py) and a fixed on-demand price; the bid is the on-demand price.

- A spot VM can be launched when the price is at or below the bid. It lives a lifetime
  drawn from the preemption model (the bathtub fitted to Google's lifetimes), or until
  the price first rises above the bid, whichever is first. It is billed the trace's
  price over its life.
- An on-demand VM is never preempted and is billed the on-demand price.
- Every VM takes `launch_h` to boot (billed). A slot that changes kind, or whose VM
  died, launches a new one; a slot that keeps its kind reuses its VM.
- A job on spot checkpoints by the DP plan for its work left and its VM's age
  (policies/checkpoint.py); a preemption loses the work since the last checkpoint and
  the job goes back to the queue, ahead of jobs not yet started. Jobs not yet started
  go longest first. On-demand attempts run without checkpoints.
- A strategy chooses, whenever a slot is free (and for waiting slots every `pass_h`),
  what its next attempt runs on: spot, on-demand, or nothing yet (wait):
  `all_spot`, `all_on_demand`, `uniform_progress` (policies/uniform_progress.py) or
  `spotbag` (policies/deadline.py). Running attempts are never moved. Slots freeing
  at one instant share one spotbag decision, which counts them all as free.

The result: whether the bag met its deadline, what it cost, its makespan, and every
VM's life (for checking that cost is Σ price × time).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from policies import deadline as spotbag_policy
from policies import uniform_progress as up
from policies.checkpoint import CheckpointTable
from policies.completion_times import CompletionTimes
from policies.deadline import list_schedule_h
from policies.preemption import LifetimeModel
from policies.spot_outage import expected_outage_left

STRATEGIES = ("all_spot", "all_on_demand", "uniform_progress", "spotbag")
_LIFETIME_BATCH = 4096


@dataclass(frozen=True)
class Market:
    """Spot prices (USD/h) on a grid of `step_h` from the bag's start; beyond the grid
    the last price holds."""

    step_h: float
    spot_price: np.ndarray
    on_demand_price: float

    @property
    def bid(self) -> float:
        return self.on_demand_price

    def index(self, t_h: float) -> int:
        """The grid step in effect at t (a time on a step's boundary, to rounding, is
        in the step it starts)."""
        return min(len(self.spot_price) - 1, max(0, int(t_h / self.step_h + 1e-9)))


@dataclass(frozen=True)
class VmLife:
    kind: str  # "spot" or "on_demand"
    start_h: float
    end_h: float
    cost_usd: float


@dataclass(frozen=True)
class SimResult:
    strategy: str
    met: bool
    cost_usd: float
    makespan_h: float
    spot_vm_h: float
    on_demand_vm_h: float
    preemptions: int
    jobs_done: int
    work_done_h: float
    vms: tuple[VmLife, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class BagRun:
    """One bag under one strategy. `max_h` ends a run that has not finished (it then
    missed its deadline; its makespan is infinite)."""

    works_h: np.ndarray
    slots: int
    deadline_h: float
    market: Market
    model: LifetimeModel
    table: CheckpointTable
    times: CompletionTimes
    strategy: str
    launch_h: float = 3 / 60
    confidence: float = 0.99
    pass_h: float = 5 / 60
    window_h: float = 24.0
    max_h: float | None = None


def all_on_demand_makespan_h(works_h: np.ndarray, slots: int, launch_h: float) -> float:
    """The bag on K on-demand slots, longest job first (the simulator's order)."""
    return list_schedule_h(works_h, [launch_h] * max(1, slots))


class _MarketView:
    """What a scheduler can know of the market at a time: the price now, whether spot
    can be had (and is worth having), and from the past window only, how often it
    could and how long its outages last."""

    def __init__(self, market: Market, worth_ratio: float, window_h: float) -> None:
        price = market.spot_price
        self.market = market
        self.available = price <= market.bid
        self.usable = self.available & (price * worth_ratio < market.on_demand_price)
        self.cumulative = np.concatenate(([0.0], np.cumsum(price * market.step_h)))
        n = len(price)
        # First grid index >= i where spot is not available (n if none).
        self.next_unavailable = np.full(n + 1, n)
        for i in range(n - 1, -1, -1):
            self.next_unavailable[i] = i if not self.available[i] else self.next_unavailable[i + 1]
        window = max(1, round(window_h / market.step_h))
        kernel = np.concatenate(([0.0], np.cumsum(self.usable)))
        start = np.maximum(np.arange(n) - window + 1, 0)
        self.share_usable = (kernel[1:] - kernel[start]) / (np.arange(n) + 1 - start)
        # Length (steps) of the outage each index is in, so far; mean outage over the window.
        run = np.zeros(n)
        for i in range(n):
            run[i] = 0 if self.usable[i] else (run[i - 1] + 1 if i else 1)
        ended = np.zeros(n)  # outage lengths, recorded where each outage ends
        ended[1:] = np.where(self.usable[1:] & ~self.usable[:-1], run[:-1], 0)
        total = np.concatenate(([0.0], np.cumsum(ended)))
        count = np.concatenate(([0.0], np.cumsum(ended > 0)))
        sums = total[1:] - total[start]
        counts = count[1:] - count[start]
        self.mean_outage_steps = np.where(counts > 0, sums / np.maximum(counts, 1), run)
        self.outage_run = run

    def cost(self, start_h: float, end_h: float) -> float:
        """∫ price over [start, end] (piecewise constant prices: exact)."""
        step = self.market.step_h
        grid = np.arange(len(self.cumulative)) * step

        def integral(t: float) -> float:
            if t >= grid[-1]:
                return float(self.cumulative[-1] + (t - grid[-1]) * self.market.spot_price[-1])
            return float(np.interp(t, grid, self.cumulative))

        return integral(end_h) - integral(start_h)

    def revoked_at(self, launch_h: float) -> float:
        """When the price first rises above the bid after a launch (∞ if never)."""
        i = self.market.index(launch_h) + 1
        if i >= len(self.available):
            return math.inf
        j = int(self.next_unavailable[i])
        return math.inf if j >= len(self.available) else j * self.market.step_h

    def outage_left_h(self, t_h: float) -> float:
        """0 when spot is usable now; else how much longer the outage is expected to
        last: the window's mean outage, at least as long again as this one so far."""
        i = self.market.index(t_h)
        if self.usable[i]:
            return 0.0
        steps = expected_outage_left(float(self.mean_outage_steps[i]), float(self.outage_run[i]))
        return steps * self.market.step_h


class _Simulation:
    def __init__(self, run: BagRun, rng: np.random.Generator) -> None:
        self.run = run
        self.rng = rng
        self.works = np.asarray(run.works_h, dtype=float)
        self.left = self.works.copy()
        self.n = len(self.works)
        median = float(np.median(self.works))
        mean, _ = run.times.fresh_moments(np.array([median]))
        self.view = _MarketView(run.market, float(mean[0]) / median, run.window_h)
        self.fresh = list(np.argsort(-self.works, kind="stable"))[::-1]  # pop() = longest
        self.retries: deque[int] = deque()
        K = run.slots
        self.kind: list[str | None] = [None] * K
        self.launched = [0.0] * K
        self.ready = [0.0] * K
        self.death = [math.inf] * K
        self.job = [-1] * K
        self.att_start = [0.0] * K
        self.att_work = [0.0] * K
        self.att_ratio = [1.0] * K  # work per hour of the attempt's path
        self.att_end = [0.0] * K
        self.att_saved = [0.0] * K
        self.att_checkpoints: list[list[tuple[float, float]]] = [[] for _ in range(K)]
        self.token = [0] * K
        self.waiting: set[int] = set()
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.vms: list[VmLife] = []
        self.done = 0
        self.done_work = 0.0
        self.preemptions = 0
        self.lifetimes = np.zeros(0)
        self.safety_net = False
        self.decision: spotbag_policy.DeadlineDecision | None = None
        self.decided_at = -math.inf

    # --- bookkeeping ---------------------------------------------------------------

    def push(self, t: float, what: str, slot: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, slot, self.token[slot]))

    def lifetime(self) -> float:
        if not len(self.lifetimes):
            self.lifetimes = self.run.model.sample_h(self.rng, _LIFETIME_BATCH)[::-1].copy()
        value, self.lifetimes = float(self.lifetimes[-1]), self.lifetimes[:-1]
        return value

    def release(self, s: int, t: float) -> None:
        kind = self.kind[s]
        if kind is None:
            return
        start = self.launched[s]
        cost = (
            self.view.cost(start, t)
            if kind == "spot"
            else self.run.market.on_demand_price * (t - start)
        )
        self.vms.append(VmLife(kind, start, t, cost))
        self.kind[s] = None
        self.token[s] += 1

    def queue_empty(self) -> bool:
        return not self.retries and not self.fresh

    def pop_job(self) -> int:
        return self.retries.popleft() if self.retries else int(self.fresh.pop())

    def queued_work(self) -> np.ndarray:
        """Work left of the queued jobs in the order they will start: retries, then
        fresh jobs longest first."""
        fresh = self.works[np.asarray(self.fresh[::-1], dtype=int)] if self.fresh else np.zeros(0)
        retries = self.left[list(self.retries)] if self.retries else np.zeros(0)
        return np.concatenate([retries, fresh])

    def progress_h(self, t: float) -> float:
        """Work done so far, saved or in running attempts (UP's cp(t))."""
        saved = float(self.works.sum() - self.left.sum())
        running = 0.0
        for s, j in enumerate(self.job):
            if j >= 0:
                running += min(self.att_work[s], (t - self.att_start[s]) * self.att_ratio[s])
        return saved + running

    # --- strategies --------------------------------------------------------------------

    def choose(self, s: int, t: float) -> str:
        strategy = self.run.strategy
        i = self.run.market.index(t)
        if strategy == "all_on_demand":
            return "on_demand"
        if strategy == "all_spot":
            return "spot" if self.view.available[i] else "wait"
        alive = self.kind[s] if self.kind[s] is not None and self.ready[s] <= t else None
        if strategy == "uniform_progress":
            return self.choose_uniform_progress(alive, t, bool(self.view.available[i]))
        return self.choose_spotbag(s, alive, t)

    def choose_uniform_progress(self, alive: str | None, t: float, available: bool) -> str:
        work_left = self.on_demand_time_left_h(t)
        current = {None: up.Kind.WAIT, "spot": up.Kind.SPOT, "on_demand": up.Kind.ON_DEMAND}[alive]
        state = up.ProgressState(
            now_h=t,
            start_h=0.0,
            deadline_h=self.run.deadline_h,
            total_work_h=float(self.works.sum()),
            progress_h=self.progress_h(t),
            work_left_h=work_left,
            changeover_h=self.run.launch_h,
            spot_available=available,
            current=current,
            safety_net=self.safety_net,
        )
        kind, self.safety_net = up.decide(state)
        return {up.Kind.WAIT: "wait", up.Kind.SPOT: "spot", up.Kind.ON_DEMAND: "on_demand"}[kind]

    def on_demand_time_left_h(self, t: float) -> float:
        """UP's C(t) for a bag: how long the rest takes on K on-demand slots, list
        scheduling from now (each running attempt's work left occupying its slot, idle
        slots a launch away). Where even Graham's bound W/K + w_max leaves more than
        the safety margin, that bound is returned: the rule cannot fire either way."""
        K = self.run.slots
        busy = []
        for s, j in enumerate(self.job):
            if j < 0:
                busy.append(self.run.launch_h)
            elif self.kind[s] == "on_demand":
                busy.append(max(self.att_end[s] - t, 0.0))
            else:
                done = (t - self.att_start[s]) * self.att_ratio[s]
                busy.append(max(self.att_work[s] - done, 0.0) + self.run.launch_h)
        queued = self.queued_work()
        bound = (sum(busy) + float(queued.sum())) / K + max([*busy, float(queued.max(initial=0))])
        if self.run.deadline_h - t > bound + 2 * self.run.launch_h:
            return bound
        return list_schedule_h(queued, busy)

    def spotbag_decision(self, t: float) -> spotbag_policy.DeadlineDecision:
        # Slots freed at the same instant (a pass, a revocation of many VMs) share
        # one decision: it says how many of the free slots go on-demand.
        if self.decision is not None and t == self.decided_at:
            return self.decision
        spot_work, spot_age, spot_unsaved, od_left, reusable = [], [], [], [], []
        for s, j in enumerate(self.job):
            if j < 0 or self.ending_now(s, t):
                # Free, or freeing at this instant (its event comes next): its next
                # spot attempt reuses its spot VM if that lives on.
                if self.kind[s] == "spot" and self.ready[s] <= t < self.death[s] - 1e-12:
                    reusable.append(t - self.launched[s])
                continue
            if self.kind[s] == "spot":
                done = (t - self.att_start[s]) * self.att_ratio[s]
                spot_work.append(max(self.att_work[s] - done, 1 / 60))
                spot_age.append(t - self.launched[s])
                saved = max((v for at, v in self.att_checkpoints[s] if at <= t), default=0.0)
                spot_unsaved.append(max(min(done, self.att_work[s]) - saved, 0.0))
            else:
                od_left.append(max(self.att_end[s] - t, 0.0))
        market = self.run.market
        inputs = spotbag_policy.DeadlineInputs(
            now_h=t,
            deadline_h=self.run.deadline_h,
            slots=self.run.slots,
            queued_work_h=self.queued_work(),
            spot_work_h=np.array(spot_work),
            spot_age_h=np.array(spot_age),
            spot_unsaved_h=np.array(spot_unsaved),
            free_spot_age_h=np.array(reusable),
            on_demand_left_h=np.array(od_left),
            spot_price_per_hour=float(market.spot_price[market.index(t)]),
            on_demand_price_per_hour=market.on_demand_price,
            on_demand_launch_h=self.run.launch_h,
            spot_availability=float(self.view.share_usable[market.index(t)]),
            spot_outage_h=self.view.outage_left_h(t),
            confidence=self.run.confidence,
            spot_available=bool(self.view.available[market.index(t)]),
            queue_ordered=True,
        )
        self.decision = spotbag_policy.decide(inputs, self.run.times, quantiles=(), project=False)
        self.decided_at = t
        return self.decision

    def ending_now(self, s: int, t: float) -> bool:
        """Slot s's attempt ends (or its VM dies) at t, its event not yet handled."""
        return self.job[s] >= 0 and self.att_end[s] <= t + 1e-12

    def choose_spotbag(self, s: int, alive: str | None, t: float) -> str:
        decision = self.spotbag_decision(t)
        # The decision counts the on-demand attempts that go on past t; slots freeing
        # at t are free slots to it, whatever VM they hold until their event comes.
        others_on_demand = sum(
            1
            for k, kind in enumerate(self.kind)
            if kind == "on_demand" and k != s and not self.ending_now(k, t)
        )
        if others_on_demand < decision.on_demand_slots:
            return "on_demand"
        return "spot" if decision.launch_spot else "wait"

    # --- the events ----------------------------------------------------------------------

    def free(self, s: int, t: float) -> None:
        """Slot s has no attempt: start the next one, launch a VM for it, or wait."""
        self.waiting.discard(s)
        if self.queue_empty():
            self.release(s, t)
            return
        want = self.choose(s, t)
        if want == "spot" and not self.view.available[self.run.market.index(t)]:
            want = "wait"  # no spot VM can be had at this price
        if want == "wait":
            self.release(s, t)
            self.waiting.add(s)
            return
        if self.kind[s] == want and self.ready[s] <= t < self.death[s]:
            self.start(s, t)
            return
        self.release(s, t)
        self.kind[s] = want
        self.launched[s] = t
        self.ready[s] = t + self.run.launch_h
        self.death[s] = math.inf
        if want == "spot":
            self.death[s] = min(t + self.lifetime(), self.view.revoked_at(t))
        if self.death[s] <= self.ready[s]:
            self.push(self.death[s], "died", s)
        else:
            self.push(self.ready[s], "ready", s)

    def start(self, s: int, t: float) -> None:
        j = self.pop_job()
        w = float(self.left[j])
        self.job[s] = j
        self.att_start[s] = t
        self.att_work[s] = w
        self.token[s] += 1
        if self.kind[s] == "on_demand":
            self.att_ratio[s], self.att_end[s], self.att_saved[s] = 1.0, t + w, w
            self.push(t + w, "end", s)
            return
        table = self.run.table
        intervals = table.schedule(min(w, table.max_work_h), t - self.launched[s]).intervals_h
        delta = table.delta_steps * table.step_h
        at, saved, death = t, 0.0, self.death[s]
        checkpoints = []
        for k, interval in enumerate(intervals):
            duration = interval + (delta if k < len(intervals) - 1 else 0.0)
            if at + duration >= death:
                break
            at += duration
            saved += interval
            checkpoints.append((at, saved))
        self.att_checkpoints[s] = checkpoints
        finished = saved >= sum(intervals) - 1e-9
        path = sum(intervals) + delta * (len(intervals) - 1)
        self.att_ratio[s] = w / path if path > 0 else 1.0
        if finished:
            self.att_saved[s], self.att_end[s] = w, at
            self.push(at, "end", s)
        else:
            self.att_saved[s], self.att_end[s] = saved, death
            self.push(death, "died", s)

    def handle(self, t: float, what: str, s: int) -> None:
        if what == "ready":
            if self.queue_empty():
                self.release(s, t)
            else:
                self.start(s, t)
        elif what == "end":
            j = self.job[s]
            self.job[s] = -1
            self.left[j] = 0.0
            self.done += 1
            self.done_work += self.works[j]
            self.free(s, t)
        elif what == "died":
            j = self.job[s]
            if j >= 0:
                self.left[j] = max(self.left[j] - self.att_saved[s], 0.0)
                self.job[s] = -1
                self.retries.append(j)
                self.preemptions += 1
            self.release(s, t)
            self.free(s, t)

    def run_all(self) -> SimResult:
        run = self.run
        limit = run.max_h if run.max_h is not None else 20.0 * max(run.deadline_h, 1.0)
        t = 0.0
        for s in range(run.slots):
            self.free(s, 0.0)
        next_pass = run.pass_h
        while self.done < self.n:
            upcoming = self.events[0][0] if self.events else math.inf
            if next_pass <= upcoming:
                t = next_pass
                if t > limit:
                    break
                next_pass += run.pass_h
                for s in sorted(self.waiting):
                    self.free(s, t)
                continue
            t, _, what, s, token = heapq.heappop(self.events)
            if token != self.token[s]:
                continue
            self.handle(t, what, s)
        finished = self.done >= self.n
        for s in range(run.slots):
            self.release(s, t)
        makespan = t if finished else math.inf
        return SimResult(
            strategy=run.strategy,
            met=finished and makespan <= run.deadline_h + 1e-9,
            cost_usd=sum(v.cost_usd for v in self.vms),
            makespan_h=makespan,
            spot_vm_h=sum(v.end_h - v.start_h for v in self.vms if v.kind == "spot"),
            on_demand_vm_h=sum(v.end_h - v.start_h for v in self.vms if v.kind == "on_demand"),
            preemptions=self.preemptions,
            jobs_done=self.done,
            work_done_h=self.done_work,
            vms=tuple(self.vms),
        )


def simulate(run: BagRun, rng: np.random.Generator) -> SimResult:
    """Replay one bag under `run.strategy` (module docstring)."""
    if run.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {run.strategy!r}; known: {', '.join(STRATEGIES)}")
    return _Simulation(run, rng).run_all()
