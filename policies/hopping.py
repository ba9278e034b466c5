"""Replaying a spot price trace under a hopping policy (docs/design.md#index-tracking): what a job pays,
how often it is down, how often it moves and how often it is revoked.

The trace is a price matrix on a regular grid (T steps of `step_h` hours × N VMs,
NaN where a VM has no price). A job is a sequence of phases (work hours, vCPUs and
GB used; the last may be endless: the job runs to the end of the trace). Every
`decide_every` steps the policy (policies.index.decide) looks at a window of
`window_steps` steps and may move the job; at every step a VM whose price is above
its bid (the on-demand price by default) revokes the job, which is down for
`revocation_h` and then restarts on the policy's pick. A move is down for
`migration_h`, during which both VMs are paid. While down, the job does no work.

Measures (`Replay`): cost (USD), cost normalised to running the whole time on the
cheapest on-demand VM that fits each phase, availability (the fraction of the job's
wall time it was running), migrations, revocations and the work done.

The window statistics come from cumulative sums over the whole trace, computed once,
so a step costs O(N) and a 6-month trace at 5-minute steps replays in well under a
second per policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.index import (
    DEFAULT_CAP_FACTOR,
    Market,
    Need,
    Policy,
    WindowStats,
    decide,
    index_series,
)


@dataclass(frozen=True)
class Phase:
    work_h: float  # math.inf: until the trace ends
    cpus: float
    memory_gb: float


@dataclass(frozen=True)
class Fleet:
    """The VMs of a trace: size, on-demand price and bid per VM (a type in a zone)."""

    names: tuple[str, ...]
    cpus: np.ndarray
    memory_gb: np.ndarray
    on_demand: np.ndarray
    bid: np.ndarray  # price above this revokes


@dataclass
class Replay:
    policy: str
    cost_usd: float = 0.0
    on_demand_usd: float = 0.0  # the cheapest fitting on-demand VM over the same wall time
    index_usd: float = 0.0  # the index price of the job's used size over the same wall time
    wall_h: float = 0.0
    down_h: float = 0.0
    work_h: float = 0.0
    migrations: int = 0
    revocations: int = 0
    waiting_h: float = 0.0  # no usable VM at all
    finished: bool = False
    log: list[tuple[float, str]] = field(default_factory=list)  # (hours from start, what)
    vm_steps: np.ndarray | None = None  # which VM each step ran on (-1: none)

    @property
    def normalized_cost(self) -> float:
        return self.cost_usd / self.on_demand_usd if self.on_demand_usd > 0 else math.nan

    @property
    def index_normalized_cost(self) -> float:
        return self.cost_usd / self.index_usd if self.index_usd > 0 else math.nan

    @property
    def availability(self) -> float:
        return 1.0 - self.down_h / self.wall_h if self.wall_h > 0 else math.nan


def rolling_mean_std(prices: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation per VM over the last `window` rows ending at each row
    (fewer at the start), ignoring NaNs: (T, N) each."""
    valid = ~np.isnan(prices)
    filled = np.where(valid, prices, 0.0)
    zero = np.zeros((1, prices.shape[1]))
    sums = np.concatenate([zero, np.cumsum(filled, axis=0)])
    squares = np.concatenate([zero, np.cumsum(filled * filled, axis=0)])
    counts = np.concatenate([zero, np.cumsum(valid, axis=0)])
    end = np.arange(1, prices.shape[0] + 1)
    start = np.maximum(end - window, 0)
    n = counts[end] - counts[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (sums[end] - sums[start]) / n
        variance = (squares[end] - squares[start]) / n - mean * mean
    return mean, np.sqrt(np.maximum(variance, 0.0))


def rolling_mean(series: np.ndarray, window: int) -> np.ndarray:
    mean, _ = rolling_mean_std(series[:, None], window)
    return mean[:, 0]


def replay(
    prices: np.ndarray,
    step_h: float,
    fleet: Fleet,
    phases: Sequence[Phase],
    policy: Policy,
    *,
    window_steps: int,
    decide_every: int = 1,
    migration_h: float = 30 / 3600,
    revocation_h: float = 90 / 3600,
    migration_s_per_gb: float | None = None,
    literal_trigger: bool = False,
    cap_factor: float = DEFAULT_CAP_FACTOR,
    keep_log: bool = False,
    start_step: int = 0,
) -> Replay:
    """Run the job of `phases` over the trace under `policy` (module docstring).
    `migration_s_per_gb`, if given, makes a move take that many seconds per GB the job
    uses (stop-and-copy of its memory, ~1 s/GB in the paper) instead of `migration_h`.
    The job starts at `start_step`; the rows before it are history for the windows."""
    steps = prices.shape[0]
    result = Replay(policy=policy.value)
    mean, std = rolling_mean_std(prices, window_steps)
    needs_cache: dict[tuple[float, float], tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}

    def per_need(cpus: float, memory_gb: float):
        key = (cpus, memory_gb)
        if key not in needs_cache:
            fits = (fleet.cpus >= cpus) & (fleet.memory_gb >= memory_gb)
            index = index_series(
                prices, fleet.cpus, fleet.memory_gb, fleet.on_demand, fits, cap_factor
            )
            on_demand = float(np.min(fleet.on_demand[fits])) if fits.any() else math.nan
            needs_cache[key] = (fits, index, rolling_mean(index, window_steps), on_demand)
        return needs_cache[key]

    phase_no, done_in_phase_h = 0, 0.0
    current: int | None = None
    down_left_h = 0.0  # downtime still to serve (a move or a restart)
    on_steps = np.full(steps, -1)
    for t in range(start_step, steps):
        if phase_no >= len(phases):
            result.finished = True
            break
        phase = phases[phase_no]
        fits, index, index_mean, on_demand_price = per_need(phase.cpus, phase.memory_gb)
        now = prices[t]
        if current is not None and not (now[current] <= fleet.bid[current]):  # NaN: gone
            result.revocations += 1
            if keep_log:
                result.log.append((t * step_h, f"revoked on {fleet.names[current]}"))
            current = None
            down_left_h = revocation_h
        remaining_h = phase.work_h - done_in_phase_h
        if math.isinf(remaining_h):
            remaining_h = (steps - t) * step_h
        move_h = (
            migration_h
            if migration_s_per_gb is None
            else phase.memory_gb * migration_s_per_gb / 3600
        )
        need = Need(phase.cpus, phase.memory_gb, remaining_h, move_h)
        if current is None or t % decide_every == 0:
            usable = fits & ~np.isnan(now) & (np.nan_to_num(now, nan=np.inf) <= fleet.bid)
            stats = WindowStats(
                fits, usable, now, mean[t], std[t], float(index[t]), float(index_mean[t])
            )
            market = Market(
                now[None, :], fleet.cpus, fleet.memory_gb, fleet.on_demand, fleet.bid, cap_factor
            )
            decision = decide(
                policy, market, need, current, literal_trigger=literal_trigger, stats=stats
            )
            if decision.target is not None and decision.target != current:
                if current is not None:
                    result.migrations += 1
                    result.cost_usd += float(now[current]) * move_h  # the old VM, meanwhile
                    down_left_h = max(down_left_h, move_h)
                elif result.wall_h > 0 and down_left_h == 0:
                    down_left_h = revocation_h  # a restart after waiting for a usable VM
                if keep_log:
                    result.log.append((t * step_h, decision.reason))
                current = decision.target
        # The step: pay the VM, serve downtime, then work.
        result.wall_h += step_h
        result.on_demand_usd += on_demand_price * step_h
        if not math.isnan(index[t]):
            result.index_usd += float(index[t]) * math.sqrt(phase.cpus * phase.memory_gb) * step_h
        if current is None:
            result.down_h += step_h
            result.waiting_h += step_h
            continue
        on_steps[t] = current
        result.cost_usd += float(now[current]) * step_h
        down_h = min(down_left_h, step_h)
        down_left_h -= down_h
        result.down_h += down_h
        work_h = step_h - down_h
        result.work_h += work_h
        done_in_phase_h += work_h
        while phase_no < len(phases) and done_in_phase_h >= phases[phase_no].work_h - 1e-12:
            done_in_phase_h -= phases[phase_no].work_h
            phase_no += 1
    else:
        result.finished = phase_no >= len(phases) or math.isinf(phases[-1].work_h)
    result.vm_steps = on_steps
    return result


def synthetic_prices(
    rng: np.random.Generator,
    means: Sequence[float],
    stds: Sequence[float],
    steps: int,
    floor: float = 1e-4,
) -> np.ndarray:
    """Independent uniform prices per VM and step with the given means and standard
    deviations (the paper's synthetic market draws each minute's price uniformly:
    U(m - √3·σ, m + √3·σ) has mean m and deviation σ), floored at `floor`: (steps, N)."""
    mean = np.asarray(means, dtype=float)
    half_width = math.sqrt(3.0) * np.asarray(stds, dtype=float)
    draws = rng.uniform(mean - half_width, mean + half_width, size=(steps, len(mean)))
    return np.maximum(draws, floor)


def volatility(series: np.ndarray) -> float:
    """Coefficient of variation (std / mean) of a price series, NaNs ignored."""
    return float(np.nanstd(series) / np.nanmean(series))
