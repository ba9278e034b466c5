"""How long a job takes on spot VMs: the distribution of its completion time under a
preemption model and the checkpoint DP (docs/design.md#deadline-job-times).

policies/checkpoint.py gives a job's *expected* time M(J, t) under the DP policy. A
deadline needs its spread too. With the DP's path from (work J, VM age a) — segment k
starts at age s_k with J_k work left and lasts d_k (work i_k plus δ, the last without
δ) — and a fresh VM after every preemption (R hours to get it, then the fresh plan for
the work left), the completion time T(J, a) of a job alive at a satisfies

    P(T(J, a) <= τ) = 1{D <= τ}·S(a + D)/S(a)
                      + Σ_k Σ_{x ∈ (s_k, s_k + d_k]} P(ℒ = x | ℒ > a) · P(T(J_k, 0) <= τ - (x - a) - R)

(D = Σ d_k the path's length: it finishes when nothing fails; otherwise the VM dies at
age x in some segment k, the work since that segment's start is lost, and the job
restarts fresh with J_k left). On the DP's grid of `step_h` this is a sum of
convolutions. For a fresh VM (a = 0) the first segment's J_0 = J puts T(J, 0) on both
sides: a renewal equation, solved by fixed-point iteration (each round multiplies the
error by the first segment's failure probability, < 1). A preemption is placed at the
end of its grid step (at most one step late: conservative).

`CompletionTimes` holds these distributions for every amount of work on a fresh VM
(the grid of the checkpoint table) and for a coarser grid of (work, age) for running
jobs, with their means and variances, so that a deadline decision looks them up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.checkpoint import CheckpointTable, _snap
from policies.preemption import LifetimeModel

_FIXED_POINT_ROUNDS = 200  # renewal iterations at most (they stop at 1e-13)


@dataclass(frozen=True)
class CompletionTimes:
    """Completion-time distributions of jobs run on spot VMs with the DP's checkpoints.

    `fresh_cdf[J, i]` = P(T(J·step, 0) <= i·step): J steps of work on a fresh VM.
    `aged_cdf[w, a, i]` = P(T(work_grid_h[w], age_grid_h[a]) <= i·step): a job already
    running on a VM of that age (alive now), its next attempts on fresh VMs.
    Means and variances come from the same distributions (truncated at the horizon,
    where the mass left is below 1e-6 for the shipped models)."""

    step_h: float
    restart_h: float
    fresh_cdf: np.ndarray
    fresh_mean_h: np.ndarray
    fresh_var_h2: np.ndarray
    work_grid_h: np.ndarray
    age_grid_h: np.ndarray
    aged_cdf: np.ndarray
    aged_mean_h: np.ndarray
    aged_var_h2: np.ndarray
    aged_worst_h: np.ndarray | None = None  # [w, a]: the longest with an on-demand retry

    def worst_h(self, work_h, age_h) -> np.ndarray:
        """The longest a running job of `work_h` on a VM of `age_h` can take if its
        retry after a preemption goes on-demand (`_Renewal.worst`): work rounded up to
        the grid, the larger of the two grid ages around its age. Without the table,
        2·w plus a restart plus ten per cent (a path is at most w and its checkpoints)."""
        w = np.asarray(work_h, dtype=float)
        if self.aged_worst_h is None:
            return 2.2 * w + self.restart_h
        upper = np.clip(
            np.searchsorted(self.work_grid_h, np.minimum(w, self.work_grid_h[-1]) - 1e-9),
            0,
            len(self.work_grid_h) - 1,
        )
        spacing = self.age_grid_h[1] - self.age_grid_h[0] if len(self.age_grid_h) > 1 else 1.0
        low = np.clip(
            np.floor(np.asarray(age_h, dtype=float) / spacing + 1e-9).astype(int),
            0,
            len(self.age_grid_h) - 1,
        )
        high = np.minimum(low + 1, len(self.age_grid_h) - 1)
        worst = np.maximum(self.aged_worst_h[upper, low], self.aged_worst_h[upper, high])
        return np.where(w <= 0, 0.0, worst)

    @property
    def max_work_h(self) -> float:
        return (len(self.fresh_cdf) - 1) * self.step_h

    @property
    def horizon_h(self) -> float:
        return (self.fresh_cdf.shape[1] - 1) * self.step_h

    def _work_steps(self, work_h: np.ndarray) -> np.ndarray:
        steps = np.rint(np.asarray(work_h, dtype=float) / self.step_h).astype(int)
        return np.clip(steps, 0, len(self.fresh_cdf) - 1)

    def fresh_moments(self, work_h) -> tuple[np.ndarray, np.ndarray]:
        """(mean h, variance h²) of T(work, 0) for each work (rounded to the grid)."""
        j = self._work_steps(work_h)
        return self.fresh_mean_h[j], self.fresh_var_h2[j]

    def fresh_quantile_h(self, work_h: float, q: float) -> float:
        """The q-quantile of T(work, 0) (the horizon if it lies beyond)."""
        cdf = self.fresh_cdf[int(self._work_steps(np.array(work_h)))]
        at = int(np.searchsorted(cdf, q - 1e-12))
        return min(at, len(cdf) - 1) * self.step_h

    def _aged_weights(self, work_h, age_h) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Indices and weights for a running job: linear in work between grid points
        (below the first point towards T = 0), the grid age at or below its age (older
        VMs are nearer their deadline: planning from a younger age overstates the time
        left before it, by at most the grid's spacing)."""
        w = np.clip(np.asarray(work_h, dtype=float), 0.0, self.work_grid_h[-1])
        grid = np.concatenate(([0.0], self.work_grid_h))
        upper = np.clip(np.searchsorted(grid, w, side="left"), 1, len(grid) - 1)
        lower = upper - 1
        span = grid[upper] - grid[lower]
        frac = np.where(span > 0, (w - grid[lower]) / span, 1.0)
        spacing = self.age_grid_h[1] - self.age_grid_h[0] if len(self.age_grid_h) > 1 else 1.0
        a = np.clip(
            np.floor(np.asarray(age_h, dtype=float) / spacing + 1e-9).astype(int),
            0,
            len(self.age_grid_h) - 1,
        )
        return lower, upper, frac, a

    def aged_moments(self, work_h, age_h) -> tuple[np.ndarray, np.ndarray]:
        """(mean h, variance h²) of T(work, age) for running jobs (work interpolated,
        age rounded down to the grid). Zero work takes no time."""
        lower, upper, frac, a = self._aged_weights(work_h, age_h)
        mean = np.pad(self.aged_mean_h, ((1, 0), (0, 0)))
        var = np.pad(self.aged_var_h2, ((1, 0), (0, 0)))
        return (
            (1 - frac) * mean[lower, a] + frac * mean[upper, a],
            (1 - frac) * var[lower, a] + frac * var[upper, a],
        )

    def aged_cdf_at(self, work_h, age_h, tau_h) -> np.ndarray:
        """P(T(work, age) <= tau) for running jobs, element-wise."""
        lower, upper, frac, a = self._aged_weights(work_h, age_h)
        i = np.clip(
            np.floor(np.asarray(tau_h, dtype=float) / self.step_h + 1e-9).astype(int),
            -1,
            self.aged_cdf.shape[2] - 1,
        )
        at_upper = self.aged_cdf[upper - 1, a, np.maximum(i, 0)]
        # Grid point 0 is "no work left": done at once.
        at_lower = np.where(
            lower > 0, self.aged_cdf[np.maximum(lower - 1, 0), a, np.maximum(i, 0)], 1.0
        )
        return np.where(i < 0, 0.0, (1 - frac) * at_lower + frac * at_upper)


def _moments(cdf: np.ndarray, step_h: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of a grid distribution from its CDF rows (values on the grid):
    E[T] = Σ_i P(T > i)·step, E[T²] = Σ_i (2i + 1)·P(T > i)·step²."""
    tail = 1.0 - cdf
    i = np.arange(cdf.shape[-1])
    mean = tail.sum(axis=-1) * step_h
    second = (tail * (2 * i + 1)).sum(axis=-1) * step_h**2
    return mean, np.maximum(second - mean**2, 0.0)


class _Renewal:
    """The grid arithmetic of the module docstring for one (model, table, horizon)."""

    def __init__(self, model: LifetimeModel, table: CheckpointTable, taus: int) -> None:
        self.table = table
        self.taus = taus
        self.delta = table.delta_steps
        self.restart = round(table.restart_h / table.step_h)
        self.reach = table.ages + table.max_steps * (1 + self.delta) + 2
        ages_h = _snap(model, np.arange(self.reach) * table.step_h)
        self.F = np.asarray(model.cdf(ages_h), dtype=float)
        self.S = 1.0 - self.F

    def path(self, work: int, age: int) -> tuple[list[tuple[int, int, int]], bool]:
        """(work left, start age, duration) of each segment when nothing fails, and
        whether the path ends the work (it stops at an age where no VM is alive)."""
        segments, left = [], work
        while left > 0 and age < self.reach - 1 and self.S[age] > 0:
            first = int(self.table.choice[left, min(age, self.table.ages - 1)])
            first = max(1, min(first, left))
            duration = first + (self.delta if first < left else 0)
            segments.append((left, age, duration))
            age += duration
            left -= first
        return segments, left == 0

    def worst(self, work: int, age: int) -> int:
        """The longest the job can take (steps) if, at its first preemption, its retry
        goes on-demand (no further preemption): the VM dies at the end of some
        segment k, losing it, and the work left at that segment's start, J_k, is done
        after a restart: max_k (s_k + d_k − a + R + J_k); a path cut by the VM's
        deadline restarts what is left there."""
        if work == 0:
            return 0
        if self.S[min(age, self.reach - 1)] <= 0:
            return self.restart + work
        worst, left, at = work, work, age
        while left > 0 and at < self.reach - 1 and self.S[at] > 0:
            first = int(self.table.choice[left, min(at, self.table.ages - 1)])
            first = max(1, min(first, left))
            at += first + (self.delta if first < left else 0)
            worst = max(worst, at - age + self.restart + left)
            left -= first
        if left > 0:  # the VM's deadline cut the path
            worst = max(worst, at - age + self.restart + left)
        return worst

    def place(self, out: np.ndarray, masses: np.ndarray, offset: int, cdf: np.ndarray) -> None:
        """out[offset + n] += Σ_k masses[k]·cdf[n - k]: restarts after failures at
        offsets offset, offset + 1, .. with the given probabilities."""
        if offset >= self.taus or not masses.any():
            return
        conv = np.convolve(masses, cdf)[: self.taus - offset]
        out[offset : offset + len(conv)] += conv

    def attempt(self, work: int, age: int, fresh: np.ndarray) -> np.ndarray:
        """P(T(work, age) <= i·step) for every i; `fresh` holds T(J, 0) for the work
        left after a failure (for age 0, T(work, 0) itself is solved here)."""
        if work == 0:
            return np.ones(self.taus)
        out = np.zeros(self.taus)
        alive = self.S[min(age, self.reach - 1)]
        if alive <= 0:  # the VM is gone (its deadline): the job restarts on a fresh one
            self.place(out, np.ones(1), self.restart, fresh[work])
            return out
        segments, finishes = self.path(work, age)
        renewal: tuple[np.ndarray, int] | None = None
        for k, (left, start, duration) in enumerate(segments):
            masses = np.diff(self.F[start : start + duration + 1]) / alive
            offset = start + 1 - age + self.restart
            if k == 0 and age == 0:
                renewal = (masses, offset)  # T(work, 0) on both sides
            else:
                self.place(out, masses, offset, fresh[left])
        if finishes and segments:
            end = segments[-1][1] + segments[-1][2]
            if end - age < self.taus:
                out[end - age :] += self.S[min(end, self.reach - 1)] / alive
        if renewal is not None:
            base = out.copy()
            for _ in range(_FIXED_POINT_ROUNDS):
                again = base.copy()
                self.place(again, renewal[0], renewal[1], out)
                change = float(np.max(np.abs(again - out)))
                out = again
                if change < 1e-13:
                    break
        return np.minimum(out, 1.0)


def build_completion_times(
    model: LifetimeModel,
    table: CheckpointTable,
    horizon_h: float | None = None,
    work_every_h: float = 0.25,
    age_every_h: float = 0.5,
) -> CompletionTimes:
    """Solve the completion-time distributions for `table`'s model, δ and R (module
    docstring). `horizon_h` is how far the distributions go (default: 24 h or six times
    the longest work, whichever is more); running jobs are tabulated every
    `work_every_h` of work and `age_every_h` of age. About 0.5 s for 4 h of work at
    1-minute steps under a 24-hour deadline."""
    step = table.step_h
    n = table.max_steps
    horizon = horizon_h if horizon_h is not None else max(24.0, 6.0 * table.max_work_h)
    grid = _Renewal(model, table, round(horizon / step) + 1)
    fresh = np.zeros((n + 1, grid.taus))
    fresh[0] = 1.0
    for J in range(1, n + 1):
        fresh[J] = grid.attempt(J, 0, fresh)
    fresh_mean, fresh_var = _moments(fresh, step)

    work_grid_h = (
        np.arange(1, math.floor(table.max_work_h / work_every_h + 1e-9) + 1) * work_every_h
    )
    age_grid = np.arange(0, table.ages, max(1, round(age_every_h / step)))
    aged = np.zeros((len(work_grid_h), len(age_grid), grid.taus))
    worst = np.zeros((len(work_grid_h), len(age_grid)))
    for w, work_h in enumerate(work_grid_h):
        J = min(n, round(work_h / step))
        for a, age in enumerate(age_grid):
            aged[w, a] = grid.attempt(J, int(age), fresh) if age else fresh[J]
            worst[w, a] = grid.worst(J, int(age)) * step
    aged_mean, aged_var = _moments(aged, step)
    return CompletionTimes(
        step_h=step,
        restart_h=grid.restart * step,
        fresh_cdf=fresh,
        fresh_mean_h=fresh_mean,
        fresh_var_h2=fresh_var,
        work_grid_h=work_grid_h,
        age_grid_h=age_grid * step,
        aged_cdf=aged,
        aged_mean_h=aged_mean,
        aged_var_h2=aged_var,
        aged_worst_h=worst,
    )
