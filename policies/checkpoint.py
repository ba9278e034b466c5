"""Checkpoint schedules under a preemption model (docs/design.md#checkpoints).

A job has W hours of work. It may stop after i hours of work since its last
checkpoint to write a checkpoint, which takes δ hours; the last segment needs
none. When the VM is preempted the job loses the work since its last checkpoint,
waits R hours for a fresh VM (age 0) and resumes there.

`optimal_schedule` is the dynamic program of docs/design.md#checkpoints (the paper's recursion
with its typos corrected): on a grid of `step_h`, with J steps of work left on a
VM of age t and segment duration d (i + δ, or i for the last segment),

    p    = S(t + d) / S(t)                    the segment survives
    lost = E[x - t | t < x <= t + d]          time lost if it does not
    M(J, t) = min_i  p·(d + M(J - i, t + d)) + (1 - p)·(lost + R + M(J, 0))

with M(J, 0) solved in closed form first. After every restart the remaining
schedule is recomputed from (J, 0), which is what `expected_makespan_h` assumes.
The table is kept skewed, N[J, J + t] = M(J, t), so that M(J - i, t + i + δ) for
all i is one contiguous slice: each J is a few whole-array numpy operations.

`expected_makespan` evaluates ANY fixed list of intervals exactly under the model
(after a restart the same remaining intervals resume on a fresh VM);
`simulate_makespan` is its Monte Carlo counterpart; `young_daly_schedule` and
`fixed_schedule` are the classic periodic schedules.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.preemption import LifetimeModel


@dataclass(frozen=True)
class Schedule:
    intervals_h: tuple[float, ...]  # work between consecutive checkpoints, in order
    expected_makespan_h: float
    work_h: float
    delta_h: float
    policy: str

    @property
    def checkpoints(self) -> int:
        return max(0, len(self.intervals_h) - 1)

    @property
    def overhead(self) -> float:
        """Expected time beyond the work itself, as a fraction of the work."""
        return self.expected_makespan_h / self.work_h - 1.0 if self.work_h > 0 else 0.0

    def checkpoint_times_h(self) -> list[float]:
        """When (hours after the start, if nothing fails) each checkpoint begins."""
        times, elapsed = [], 0.0
        for interval in self.intervals_h[:-1]:
            elapsed += interval
            times.append(elapsed)
            elapsed += self.delta_h
        return times


_FLOAT32_SAFE_S = 0.05  # ages with S(t) below this are ranked in float64 (build_table)
_SNAP_H = 1e-9  # ages this close to the deadline are the deadline (sums of steps round)


def _snap(model: LifetimeModel, t_h):
    """Ages within _SNAP_H of the deadline L are L: a segment that ends at L is
    reclaimed with the deadline mass, whatever rounding put it a hair before."""
    if model.L is None:
        return t_h
    return np.where(np.abs(np.asarray(t_h, dtype=float) - model.L) <= _SNAP_H, model.L, t_h)


def _segment(model: LifetimeModel, age_h: float, duration_h: float) -> tuple[float, float]:
    """(p survive, expected loss if not) of a segment of `duration_h` started at `age_h`."""
    age_h = float(_snap(model, age_h))
    end_h = float(_snap(model, age_h + duration_h))
    alive = float(model.sf(age_h))
    if alive <= 0:
        return 0.0, 0.0
    fail = float(model.mass(age_h, end_h))
    p = max(0.0, 1.0 - fail / alive)
    lost = (float(model.first_moment(age_h, end_h)) - age_h * fail) / fail if fail > 0 else 0.0
    # The loss lies in [0, duration]; a tiny failure mass can round it outside.
    return p, min(max(lost, 0.0), end_h - age_h)


def expected_makespan(
    model: LifetimeModel,
    intervals_h,
    delta_h: float,
    start_age_h: float = 0.0,
    restart_h: float = 0.0,
    replan: CheckpointTable | Callable[[float], Sequence[float]] | None = None,
) -> float:
    """Exact expected makespan of a schedule (intervals of work between checkpoints).

    E(k, t): expected time to finish segments k.. from VM age t (alive at t):
        E(k, t) = p·(d_k + E(k+1, t + d_k)) + (1 - p)·(lost + R + E'(k)),
    where E'(k), the time to finish after a preemption in segment k, is E(k, 0) when
    the same remaining intervals resume on the new VM (solved in closed form, as it
    is on both sides), or, with `replan` (a CheckpointTable, or a function from the
    remaining work to the intervals to use on a fresh VM), the value of the new
    schedule for the work left, evaluated the same way: the DP policy, which
    recomputes the schedule after every restart (docs/design.md#checkpoints). Infinite when some
    segment can never survive."""
    if replan is None:
        return _fixed_makespan(model, _positive(intervals_h), delta_h, start_age_h, restart_h)
    plan_fresh = (
        (lambda work_h: replan.schedule(work_h, 0.0).intervals_h)
        if isinstance(replan, CheckpointTable)
        else replan
    )

    @functools.cache
    def fresh(work_key: float) -> float:
        intervals = _positive(plan_fresh(work_key))
        return _fixed_makespan(model, intervals, delta_h, 0.0, restart_h, after_failure, True)

    def after_failure(work_left_h: float) -> float:
        return fresh(round(work_left_h, 9))

    intervals = _positive(intervals_h)
    return _fixed_makespan(model, intervals, delta_h, start_age_h, restart_h, after_failure)


def _positive(intervals_h) -> list[float]:
    return [float(i) for i in intervals_h if i > 0]


def _fixed_makespan(
    model: LifetimeModel,
    intervals: list[float],
    delta_h: float,
    start_age_h: float,
    restart_h: float,
    after_failure: Callable[[float], float] | None = None,
    is_fresh_plan: bool = False,
) -> float:
    """E(0, start age) of `expected_makespan`. `after_failure(work left)`, when given, is
    the time to finish after a restart; but a schedule that IS the fresh plan for its
    work (`is_fresh_plan`) restarts itself after a failure in its first segment, which
    puts E(0, 0) on both sides: closed form.

    Iterative (no recursion limit on long schedules): E(k, 0) after a restart at
    segment k is solved for k = n-1 down to 0, each from the no-failure path that
    starts there on a fresh VM; the segment probabilities of a path are one
    vectorised model call. O(n²) arithmetic, O(n) model calls."""
    n = len(intervals)
    if n == 0:
        return 0.0
    durations = np.array([w + (delta_h if k < n - 1 else 0.0) for k, w in enumerate(intervals)])
    work_from = np.cumsum(np.asarray(intervals, dtype=float)[::-1])[::-1]

    def closed_form(k: int) -> bool:
        return after_failure is None or (k == 0 and is_fresh_plan)

    from_restart = np.zeros(n + 1)  # E(k, 0) after a preemption in segment k

    def along_path(k0: int, age_h: float) -> float:
        """E(k0, age): the segments k0.. from a VM of that age, failures restarting."""
        if k0 == n:
            return 0.0
        d = durations[k0:]
        ages = age_h + np.concatenate(([0.0], np.cumsum(d[:-1])))
        p, lost = _segments(model, ages, d)
        value = 0.0
        for j in range(n - 1, k0 - 1, -1):
            pj, again = p[j - k0], from_restart[j]
            if math.isinf(again) and pj < 1:
                value = math.inf
                continue
            ahead = value if pj > 0 else 0.0
            value = pj * (d[j - k0] + ahead) + (1 - pj) * (lost[j - k0] + restart_h + again)
        return float(value)

    for k in range(n - 1, -1, -1):
        if after_failure is not None and not closed_form(k):
            from_restart[k] = after_failure(float(work_from[k]))
            continue
        p0, lost0 = _segment(model, 0.0, float(durations[k]))
        if p0 <= 0:
            from_restart[k] = math.inf
            continue
        rest = along_path(k + 1, float(durations[k]))
        from_restart[k] = (p0 * (durations[k] + rest) + (1 - p0) * (lost0 + restart_h)) / p0
    if float(start_age_h) == 0.0 and closed_form(0):
        return float(from_restart[0])
    return along_path(0, float(start_age_h))


def _segments(
    model: LifetimeModel, ages_h: np.ndarray, durations_h: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`_segment` for many segments at once: (p survive, expected loss if not)."""
    ages = _snap(model, np.asarray(ages_h, dtype=float))
    ends = _snap(model, ages + durations_h)
    alive = np.asarray(model.sf(ages), dtype=float)
    fail = np.asarray(model.mass(ages, ends), dtype=float)
    moment = np.asarray(model.first_moment(ages, ends), dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(alive > 0, np.maximum(0.0, 1.0 - fail / np.where(alive > 0, alive, 1.0)), 0.0)
        lost = np.where(
            (alive > 0) & (fail > 0), (moment - ages * fail) / np.where(fail > 0, fail, 1.0), 0.0
        )
    return p, np.clip(lost, 0.0, ends - ages)


def _split(work_h: float, period_h: float) -> tuple[float, ...]:
    count = max(1, math.ceil(work_h / period_h - 1e-9))
    intervals = [period_h] * (count - 1)
    intervals.append(work_h - period_h * (count - 1))
    return tuple(i for i in intervals if i > 1e-12)


def fixed_schedule(
    model: LifetimeModel,
    work_h: float,
    period_h: float,
    delta_h: float,
    start_age_h: float = 0.0,
    restart_h: float = 0.0,
    policy: str = "fixed",
) -> Schedule:
    """Checkpoint after every `period_h` of work (the last interval takes the rest)."""
    intervals = _split(work_h, period_h)
    makespan = expected_makespan(model, intervals, delta_h, start_age_h, restart_h)
    return Schedule(intervals, makespan, work_h, delta_h, policy)


def young_daly_schedule(
    model: LifetimeModel,
    work_h: float,
    delta_h: float,
    mttf_h: float | None = None,
    start_age_h: float = 0.0,
    restart_h: float = 0.0,
) -> Schedule:
    """Young–Daly: a period of sqrt(2·δ·MTTF) (memoryless thinking), evaluated exactly
    under `model`. MTTF defaults to the model's expected lifetime."""
    mttf = mttf_h if mttf_h is not None else model.expected_lifetime_h()
    period = math.sqrt(2.0 * delta_h * mttf)
    return fixed_schedule(
        model, work_h, period, delta_h, start_age_h, restart_h, f"young-daly (mttf {mttf:g} h)"
    )


def delta_steps(delta_h: float, step_h: float) -> int:
    """δ on the grid: the nearest number of steps, but at least one when δ > 0 (a
    checkpoint that took no time would be taken after every step)."""
    steps = round(delta_h / step_h)
    return max(1, steps) if delta_h > 0 else 0


@dataclass(frozen=True)
class CheckpointTable:
    """The solved dynamic program for one (model, δ, R, step), for jobs up to `max_steps`
    of work and VM ages up to the deadline (ages past it mean a dead VM: restart) or,
    for a model without one, up to a horizon (older VMs are planned like it)."""

    step_h: float
    delta_steps: int
    restart_h: float
    max_steps: int  # of work
    ages: int  # age grid points 0 .. ages - 1 (the last is the deadline or horizon)
    makespan: np.ndarray  # makespan[J, t] = M(J, t), in hours
    choice: np.ndarray  # choice[J, t] = the best first interval, in steps
    deadline: bool = True  # the last age is the model's deadline (else a horizon)

    @property
    def max_work_h(self) -> float:
        return self.max_steps * self.step_h

    def _at(self, work_steps: int, age_steps: int) -> tuple[float, int]:
        age_steps = min(age_steps, self.ages - 1)
        return float(self.makespan[work_steps, age_steps]), int(self.choice[work_steps, age_steps])

    def schedule(self, work_h: float, start_age_h: float = 0.0) -> Schedule:
        """The optimal intervals for `work_h` starting on a VM of `start_age_h`, by lookup:
        the first interval for (J, t), then for what is left at the age it ends, and so on
        (the path when nothing fails; after a failure the caller asks again from age 0).
        The work is rounded to the grid; more than the table covers is an error."""
        if work_h > self.max_work_h + self.step_h / 2:
            raise ValueError(
                f"this table plans up to {self.max_work_h:g} h of work, not {work_h:g} h"
            )
        steps = min(self.max_steps, max(1, round(work_h / self.step_h)))
        age = max(0, round(start_age_h / self.step_h))
        expected, _ = self._at(steps, age)
        intervals, left = [], steps
        while left > 0:
            if age >= self.ages - 1:
                # At the deadline the VM is gone: the rest runs on a new one. Past a
                # horizon (no deadline) it lives on, planned like the horizon.
                age = 0 if self.deadline else self.ages - 1
            _, first = self._at(left, age)
            first = max(1, min(first, left))
            intervals.append(first * self.step_h)
            age += first + (self.delta_steps if first < left else 0)
            left -= first
        return Schedule(
            tuple(intervals),
            expected,
            steps * self.step_h,
            self.delta_steps * self.step_h,
            "optimal",
        )


def build_table(
    model: LifetimeModel,
    max_work_h: float,
    delta_h: float,
    restart_h: float = 0.0,
    step_h: float = 1 / 60,
    max_interval_h: float | None = None,
    chunk: int = 96,
) -> CheckpointTable:
    """Solve the DP for every amount of work up to `max_work_h` and every VM age (up to
    the deadline L, or 48 h without one), on a grid of `step_h`.

    Multiplying the recursion by S(t), with u = t + d the end of the first segment,
    G(u) = E[X; X <= u] the partial first moment and C = R + M(J, 0):

        S(t)·candidate_i = T(J - i, u) + C·F(u)  -  t - G(t) + t·F(t) - C·F(t),
        T(J', u) = S(u)·(u + M(J', u)) + G(u)

    ((1 - p)·lost is (G(u) - G(t) - t·(F(u) - F(t))) / S(t), and -t·S(u) - t·F(u) = -t).
    Only the first two terms depend on i. T is kept skewed and transposed,
    Tk[J' + u, n - J'], so that the checkpointed candidates of (J, t) for i = 1, 2, ..
    are consecutive entries of row J + δ + t: for each J the candidates of every age
    form one (ages × i) block, and F(t + i + δ) is a sliding window over F. One
    multiply-add and one argmin over that block solve the whole row J. The float32
    block only ranks candidates; the winner is re-evaluated in float64.
    At t = 0, M(J, 0) is on both sides and solves to min_i (T_i + R·F_i) / S(u_i).

    `max_interval_h` bounds the work before the first checkpoint (finishing in one go
    is always considered); None allows any interval. The bound only saves time.
    `chunk` is how many first intervals are ranked per block (a speed knob; any value
    gives the same table)."""
    n = max(1, round(max_work_h / step_h))
    delta = delta_steps(delta_h, step_h)
    longest = n if max_interval_h is None else max(1, min(n, round(max_interval_h / step_h)))
    horizon_h = _horizon_h(model, step_h)
    ages = round(horizon_h / step_h) + 1  # t = 0 .. ages - 1 (the last is the deadline)
    reach = ages + n + delta + 1  # ages a segment can end at
    u = _snap(model, np.arange(reach) * step_h)
    F = np.asarray(model.cdf(u), dtype=float)
    G = np.asarray(model.first_moment(0.0, u), dtype=float)
    S = 1.0 - F
    makespan = np.zeros((n + 1, ages))
    choice = np.zeros((n + 1, ages), dtype=np.int32)
    Tk = np.zeros((n + reach + 1, n + 1), dtype=np.float32)  # Tk[J' + u, n - J']
    Tk[0:reach, n] = S * u + G  # M(0, u) = 0
    F_window = np.lib.stride_tricks.sliding_window_view(F.astype(np.float32), max(1, longest))
    # Candidates of age t differ by S(t)·(their difference), so float32 cannot rank them
    # once S(t) is small (very old VMs of a model without a deadline): those ages are
    # ranked in float64, from a float64 copy of Tk kept only when such ages exist.
    fragile = (S[:ages] < _FLOAT32_SAFE_S) & (S[:ages] > 0)
    precise_from = int(np.argmax(fragile)) if fragile.any() else ages
    Tk64 = None
    if precise_from < ages:
        Tk64 = np.zeros(Tk.shape)
        Tk64[0:reach, n] = S * u + G
    F_window64 = np.lib.stride_tricks.sliding_window_view(F, max(1, longest))
    dead_from = int(np.argmax(S <= 0)) if (S <= 0).any() else reach + ages  # first dead age
    t = np.arange(ages)
    th = t * step_h
    S_t, F_t = S[:ages], F[:ages]
    alive = S_t > 0
    tail = -th - G[:ages] + th * F_t  # the i-independent terms, without -C·F(t)
    block = np.empty((ages, min(chunk, max(1, longest))), dtype=np.float32)
    block64 = np.empty((max(0, ages - precise_from), block.shape[1]))

    def ahead(rows: np.ndarray, ages_at: np.ndarray) -> np.ndarray:
        """M(rows, ages_at) with ages past the horizon like the horizon (S = 0 there
        under a deadline, so their value never counts)."""
        return makespan[rows, np.minimum(ages_at, ages - 1)]

    for J in range(1, n + 1):
        # M(J, 0) in closed form over all first intervals i = 1 .. J (float64).
        firsts = np.arange(1, J + 1)
        ends = firsts + np.where(firsts < J, delta, 0)
        survive = S[ends]
        with np.errstate(divide="ignore", invalid="ignore"):
            t_i = survive * (u[ends] + _finite(ahead(J - firsts, ends))) + G[ends]
            at_zero = np.where(survive > 0, (t_i + restart_h * F[ends]) / survive, np.inf)
        best0 = int(np.argmin(at_zero))
        m0 = float(at_zero[best0])
        C = restart_h + m0 if math.isfinite(m0) else 0.0
        # Finishing in one go (u = t + J, no checkpoint) ...
        end = t + J
        best = S[end] * u[end] + G[end] + C * F[end]
        chosen = np.full(ages, J, dtype=np.int32)
        # ... against checkpointing after i = 1 .. min(J - 1, longest) steps, in chunks of
        # i so that segments ending past the deadline (certain loss; finishing in one go
        # is never worse than them) are left out: about a third less work.
        top = min(J - 1, longest)
        rank = np.full(ages, np.inf)
        first = np.zeros(ages, dtype=np.int64)
        for i0 in range(1, top + 1, chunk) if math.isfinite(m0) else ():
            i1 = min(top, i0 + chunk - 1)
            rows = min(ages, dead_from - i0 - delta)  # ages t whose segment i0 can survive
            if rows <= 0:
                break
            quick = min(rows, precise_from)  # ages ranked in float32
            if quick > 0:
                cand = block[:quick, : i1 - i0 + 1]
                np.multiply(
                    F_window[delta + 1 : delta + 1 + quick, i0 - 1 : i1], np.float32(C), out=cand
                )
                cand += Tk[J + delta : J + delta + quick, n - J + i0 : n - J + i1 + 1]
                _keep_best(cand, i0, rank[:quick], first[:quick])
            if rows > precise_from:
                assert Tk64 is not None  # made above whenever some ages rank in float64
                lo = precise_from
                cand64 = block64[: rows - lo, : i1 - i0 + 1]
                np.multiply(
                    F_window64[delta + 1 + lo : delta + 1 + rows, i0 - 1 : i1], C, out=cand64
                )
                cand64 += Tk64[J + delta + lo : J + delta + rows, n - J + i0 : n - J + i1 + 1]
                _keep_best(cand64, i0, rank[lo:rows], first[lo:rows])
        some = first > 0
        if some.any():
            at = np.where(some, t + first + delta, 0)
            exact = S[at] * (u[at] + _finite(ahead(J - first, at))) + G[at] + C * F[at]
            better = some & (exact < best)
            best = np.where(better, exact, best)
            chosen = np.where(better, first, chosen).astype(np.int32)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(alive, (best + tail - C * F_t) / np.where(alive, S_t, 1.0), C)
        # A VM past its deadline is already gone: restart (R) and start over from age 0.
        chosen = np.where(alive, chosen, firsts[best0]).astype(np.int32)
        values[0], chosen[0] = m0, firsts[best0]
        if not math.isfinite(m0):
            values[:] = np.inf  # this much work can never finish under the model
        makespan[J], choice[J] = values, chosen
        # Ages past the horizon (no deadline) behave like the horizon.
        extended = np.concatenate([values, np.full(reach - ages, values[-1])])
        Tk[J : J + reach, n - J] = S * (u + _finite(extended)) + G
        if Tk64 is not None:
            Tk64[J : J + reach, n - J] = S * (u + _finite(extended)) + G
    return CheckpointTable(
        step_h, delta, restart_h, n, ages, makespan, choice, deadline=model.L is not None
    )


_HORIZON_H = 48.0  # ages planned for when a model has no deadline ...
_HORIZON_SURVIVAL = 1e-6  # ... or until so few VMs are still alive


def _horizon_h(model: LifetimeModel, step_h: float) -> float:
    """The oldest age a table plans for: the deadline L; without one, 48 h or the age
    (on the grid) by which all but 1e-6 of VMs are gone, whichever comes first. Beyond
    it values would be rounding noise: the DP's values are divided by S(t)."""
    if model.L is not None:
        return model.L
    grid = np.arange(round(_HORIZON_H / step_h) + 1) * step_h
    rare = np.flatnonzero(np.asarray(model.sf(grid)) <= _HORIZON_SURVIVAL)
    return float(grid[max(int(rare[0]), 1)]) if len(rare) else _HORIZON_H


def _keep_best(cand: np.ndarray, i0: int, rank: np.ndarray, first: np.ndarray) -> None:
    """Fold a block of candidates (ages × first intervals i0, i0 + 1, ..) into the best
    so far, in place."""
    pick = np.argmin(cand, axis=1)
    low = cand[np.arange(len(cand)), pick]
    improved = low < rank
    rank[improved] = low[improved]
    first[improved] = pick[improved] + i0


def _finite(values: np.ndarray) -> np.ndarray:
    """Infinite makespans only ever appear where the survival weight is 0: drop them."""
    return np.where(np.isfinite(values), values, 0.0)


def reference_table(
    model: LifetimeModel,
    max_work_h: float,
    delta_h: float,
    restart_h: float = 0.0,
    step_h: float = 1 / 60,
) -> dict[tuple[int, int], tuple[float, int]]:
    """The same DP as a straightforward pure-Python recursion over (J, t), for checking
    `build_table` and measuring its speed-up: {(J, t): (M(J, t), best first interval)}."""
    n, delta = max(1, round(max_work_h / step_h)), delta_steps(delta_h, step_h)
    horizon = _horizon_h(model, step_h)
    ages = round(horizon / step_h) + 1
    table: dict[tuple[int, int], tuple[float, int]] = {}

    def value(J: int, t: int) -> float:
        if J == 0:
            return 0.0
        return table[(J, min(t, ages - 1))][0]

    for J in range(1, n + 1):
        options = []
        for i in range(1, J + 1):
            d = i + (delta if i < J else 0)
            p, lost = _segment(model, 0.0, d * step_h)
            if p > 0:
                options.append(
                    ((p * (d * step_h + value(J - i, d)) + (1 - p) * (lost + restart_h)) / p, i)
                )
        m0, c0 = min(options) if options else (math.inf, J)
        table[(J, 0)] = (m0, c0)
        for t in range(1, ages):
            best = (math.inf, J)
            for i in range(1, J + 1):
                d = i + (delta if i < J else 0)
                p, lost = _segment(model, t * step_h, d * step_h)
                ahead = value(J - i, t + d) if p > 0 else 0.0
                best = min(best, (p * (d * step_h + ahead) + (1 - p) * (lost + restart_h + m0), i))
            table[(J, t)] = best
    return table


def optimal_schedule(
    model: LifetimeModel,
    work_h: float,
    delta_h: float,
    start_age_h: float = 0.0,
    restart_h: float = 0.0,
    step_h: float = 1 / 60,
) -> Schedule:
    """The DP schedule for one job (builds the table up to `work_h`)."""
    return build_table(model, work_h, delta_h, restart_h, step_h).schedule(work_h, start_age_h)


def simulate_makespan(
    model: LifetimeModel,
    intervals_h,
    delta_h: float,
    rng: np.random.Generator,
    start_age_h: float = 0.0,
    restart_h: float = 0.0,
    runs: int = 20_000,
    replan: CheckpointTable | None = None,
) -> tuple[float, float]:
    """Monte Carlo makespan (mean, standard error): run the segments, lose the work
    since the last checkpoint on a preemption, wait R, resume on a fresh VM. With
    `replan`, the remaining schedule is looked up again after every restart (the DP
    policy); otherwise the same remaining intervals resume."""
    intervals = [float(i) for i in intervals_h if i > 0]
    if not math.isfinite(expected_makespan(model, intervals, delta_h, start_age_h, restart_h)):
        return math.inf, 0.0  # some segment can never survive: it would never end
    totals = np.empty(runs)
    for run in range(runs):
        plan = list(intervals)
        age = start_age_h
        life = _life_from(model, rng, age)
        total = 0.0
        while plan:
            work = plan[0]
            duration = work + (delta_h if len(plan) > 1 else 0.0)
            if age + duration < life - _SNAP_H:
                total += duration
                age += duration
                plan.pop(0)
                continue
            total += (life - age) + restart_h
            age, life = 0.0, _life_from(model, rng, 0.0)
            if replan is not None:
                plan = list(replan.schedule(sum(plan), 0.0).intervals_h)
        totals[run] = total
    return float(totals.mean()), float(totals.std(ddof=1) / math.sqrt(runs))


def _life_from(model: LifetimeModel, rng: np.random.Generator, age_h: float) -> float:
    """A lifetime conditional on being alive at `age_h`."""
    while True:
        draws = model.sample_h(rng, 64)
        alive = draws[draws > age_h]
        if len(alive):
            return float(alive[0])


def planned_work_left(estimate: float, done: float, step: float) -> float:
    """The work a running job is planned to have left (any one unit): its estimate less
    what it has done, but at least a tenth of the estimate (a job that outruns its
    estimate is not about to end) and at least one grid step."""
    return max(estimate - done, 0.1 * estimate, step)


def next_checkpoint_h(
    policy: str,
    model: LifetimeModel,
    work_left_h: float,
    age_h: float,
    delta_h: float,
    table: CheckpointTable | None = None,
) -> float | None:
    """Work (hours) before a running job should next checkpoint, or None to run to the
    end without one. `policy`: "optimal" looks up the DP `table` at (work left, VM age)
    and falls back to Young–Daly while none is at hand; "young-daly" checkpoints every
    sqrt(2·δ·MTTF) (MTTF from the model); "none" never checkpoints. A VM that is never
    preempted needs no checkpoints."""
    if policy == "none" or work_left_h <= 0 or not math.isfinite(model.expected_lifetime_h()):
        return None
    if policy == "optimal" and table is not None:
        # Longer work than the table covers is planned as if the table's length were left.
        intervals = table.schedule(min(work_left_h, table.max_work_h), age_h).intervals_h
        return intervals[0] if len(intervals) > 1 else None
    period_h = math.sqrt(2.0 * delta_h * model.expected_lifetime_h())
    return period_h if period_h < work_left_h else None
