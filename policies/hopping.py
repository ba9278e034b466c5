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
and so do the policy's scores of every VM at every step (in blocks of steps, the same
element-wise arithmetic as one decision's), so a step left to Python is a few scalar
tests: a 6-month trace at 5-minute steps replays in a fraction of a second per policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.index import (
    DEFAULT_CAP_FACTOR,
    Decision,
    Need,
    Policy,
    WindowStats,
    decide_given_best,
    index_series,
    policy_scores,
)

# Steps whose scores are computed at once (bounds the temporary arrays of long traces).
_SCORE_BLOCK = 8192


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
    needs_cache: dict[tuple[float, float], _NeedSeries] = {}

    def per_need(cpus: float, memory_gb: float) -> _NeedSeries:
        key = (cpus, memory_gb)
        if key not in needs_cache:
            needs_cache[key] = _need_series(
                prices, mean, std, fleet, policy, cpus, memory_gb, window_steps, cap_factor
            )
        return needs_cache[key]

    run = _Run()
    on_steps = np.full(steps, -1)
    for t in range(start_step, steps):
        if run.phase_no >= len(phases):
            result.finished = True
            break
        phase = phases[run.phase_no]
        series = per_need(phase.cpus, phase.memory_gb)
        now = prices[t]
        if run.current is not None and not (now[run.current] <= fleet.bid[run.current]):
            result.revocations += 1  # (NaN: gone)
            if keep_log:
                result.log.append((t * step_h, f"revoked on {fleet.names[run.current]}"))
            run.current = None
            run.down_left_h = revocation_h
        remaining_h = phase.work_h - run.done_in_phase_h
        if math.isinf(remaining_h):
            remaining_h = (steps - t) * step_h
        move_h = (
            migration_h
            if migration_s_per_gb is None
            else phase.memory_gb * migration_s_per_gb / 3600
        )
        if run.current is None or t % decide_every == 0:
            stats = _window(series, t, now, mean, std)
            need = Need(phase.cpus, phase.memory_gb, remaining_h, move_h)
            decision = decide_given_best(
                policy,
                stats.best,
                stats.best_usable,
                stats.window,
                fleet.cpus,
                fleet.memory_gb,
                need,
                run.current,
                literal_trigger=literal_trigger,
            )
            _follow(decision, run, result, now, move_h, revocation_h, t * step_h, keep_log)
        _serve_step(run, result, phases, series, t, now, step_h, on_steps)
    else:
        result.finished = run.phase_no >= len(phases) or math.isinf(phases[-1].work_h)
    result.vm_steps = on_steps
    return result


@dataclass
class _Run:
    """Where a replayed job is: its phase, the work done in it, its VM (None: waiting
    for a usable one) and the downtime it still has to serve (a move or a restart)."""

    phase_no: int = 0
    done_in_phase_h: float = 0.0
    current: int | None = None
    down_left_h: float = 0.0


@dataclass
class _Window:
    best: int  # the VM with the best score
    best_usable: bool  # its score is finite
    window: WindowStats


def _window(
    series: _NeedSeries, t: int, now: np.ndarray, mean: np.ndarray, std: np.ndarray
) -> _Window:
    """The policy's view at step t: the best VMs and the window's statistics."""
    best, best_usable, usable = series.at(t)
    stats = WindowStats(
        series.fits,
        usable,
        now,
        mean[t],
        std[t],
        float(series.index[t]),
        float(series.index_mean[t]),
    )
    return _Window(best, best_usable, stats)


def _follow(
    decision: Decision,
    run: _Run,
    result: Replay,
    now: np.ndarray,
    move_h: float,
    revocation_h: float,
    at_h: float,
    keep_log: bool,
) -> None:
    """Act on a decision: a move pays the old VM meanwhile and costs its downtime; a
    start after waiting for a usable VM costs a restart."""
    if decision.target is None or decision.target == run.current:
        return
    if run.current is not None:
        result.migrations += 1
        result.cost_usd += float(now[run.current]) * move_h  # the old VM, meanwhile
        run.down_left_h = max(run.down_left_h, move_h)
    elif result.wall_h > 0 and run.down_left_h == 0:
        run.down_left_h = revocation_h  # a restart after waiting for a usable VM
    if keep_log:
        result.log.append((at_h, decision.reason))
    run.current = decision.target


def _serve_step(
    run: _Run,
    result: Replay,
    phases: Sequence[Phase],
    series: _NeedSeries,
    t: int,
    now: np.ndarray,
    step_h: float,
    on_steps: np.ndarray,
) -> None:
    """One step: pay the VM, serve downtime, then work (moving to the next phases)."""
    phase = phases[run.phase_no]
    result.wall_h += step_h
    result.on_demand_usd += series.on_demand * step_h
    if not math.isnan(series.index[t]):
        result.index_usd += (
            float(series.index[t]) * math.sqrt(phase.cpus * phase.memory_gb) * step_h
        )
    if run.current is None:
        result.down_h += step_h
        result.waiting_h += step_h
        return
    on_steps[t] = run.current
    result.cost_usd += float(now[run.current]) * step_h
    down_h = min(run.down_left_h, step_h)
    run.down_left_h -= down_h
    result.down_h += down_h
    work_h = step_h - down_h
    result.work_h += work_h
    run.done_in_phase_h += work_h
    while run.phase_no < len(phases) and run.done_in_phase_h >= phases[run.phase_no].work_h - 1e-12:
        run.done_in_phase_h -= phases[run.phase_no].work_h
        run.phase_no += 1


@dataclass
class _NeedSeries:
    """What a replay needs per job size: which VMs fit, the index over them and its
    window mean, the cheapest fitting on-demand price, and for each step the usable VMs
    and the policy's best one (policies.index.decide's scores, computed a block of
    steps at a time as the replay reaches them)."""

    prices: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    fleet: Fleet
    policy: Policy
    used: float
    fits: np.ndarray
    index: np.ndarray
    index_mean: np.ndarray
    on_demand: float
    block: int = -1
    best: np.ndarray | None = None
    best_usable: np.ndarray | None = None
    usable: np.ndarray | None = None

    def at(self, t: int) -> tuple[int, bool, np.ndarray]:
        """(the best VM, whether its score is finite, the usable VMs) at step t."""
        block, row = divmod(t, _SCORE_BLOCK)
        if block != self.block:
            self._score(block)
        assert self.best is not None and self.best_usable is not None and self.usable is not None
        return int(self.best[row]), bool(self.best_usable[row]), self.usable[row]

    def _score(self, block: int) -> None:
        rows = slice(block * _SCORE_BLOCK, (block + 1) * _SCORE_BLOCK)
        now = self.prices[rows]
        fleet = self.fleet
        # As `decide` sees one step: the same element-wise operations, row by row.
        usable = self.fits & ~np.isnan(now) & (np.nan_to_num(now, nan=np.inf) <= fleet.bid)
        stats = WindowStats(
            self.fits,
            usable,
            now,
            self.mean[rows],
            self.std[rows],
            self.index[rows, None],  # type: ignore[arg-type]  # a column: one per step
            self.index_mean[rows, None],  # type: ignore[arg-type]
        )
        score = policy_scores(self.policy, fleet.cpus, fleet.memory_gb, self.used, stats)
        best = np.argmin(score, axis=1)
        self.best = best
        self.best_usable = np.isfinite(score[np.arange(len(best)), best])
        self.usable = usable
        self.block = block


def _need_series(
    prices: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    fleet: Fleet,
    policy: Policy,
    cpus: float,
    memory_gb: float,
    window_steps: int,
    cap_factor: float,
) -> _NeedSeries:
    fits = (fleet.cpus >= cpus) & (fleet.memory_gb >= memory_gb)
    index = index_series(prices, fleet.cpus, fleet.memory_gb, fleet.on_demand, fits, cap_factor)
    on_demand = float(np.min(fleet.on_demand[fits])) if fits.any() else math.nan
    return _NeedSeries(
        prices,
        mean,
        std,
        fleet,
        policy,
        np.sqrt(cpus * memory_gb),
        fits,
        index,
        rolling_mean(index, window_steps),
        on_demand,
    )


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
