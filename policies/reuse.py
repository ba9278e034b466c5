"""Reusing an idle VM for a job, or launching a fresh one (docs/design.md#preemption-models–3).

A job of length T (hours, no checkpoints) restarts from scratch on a fresh VM
after every preemption; getting a fresh VM costs R hours (launch + setup). With
M(a, b) = E[ℒ; a < ℒ <= b] and P(a, b) = P(a < ℒ <= b) (deadline mass included):

    E0 = [T·S(T) + M(0, T) + R·P(0, T)] / S(T)
         expected completion time on a fresh VM, restarting on fresh VMs until success;
    Es = [T·S(s+T) + M(s, s+T) - s·P(s, s+T) + (R + E0)·P(s, s+T)] / S(s)
         the same when starting on a VM of age s, given that it is alive at s.

Reuse the VM when Es <= R + Es(R): a replacement costs R and, as ages count from
the launch, starts at age R (docs/design.md#reuse's E0 + R for R = 0; see `should_reuse`).
For a memoryless model this always holds. `ReuseTable` tabulates the decision over ages and job
lengths per model so that the scheduler decides by lookup, with only a rough
runtime estimate; `crossover_h` gives T*(s), the longest job worth starting at
age s. The paper's own formulas (eq. 7 and 8: one failure at most, t instead of
t - s, no conditioning on survival) are kept as `paper_*` for comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from policies.preemption import LifetimeModel

ArrayLike = float | np.ndarray


def _safe_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.inf
        )


def expected_makespan_fresh_h(
    model: LifetimeModel, length_h: ArrayLike, launch_h: float
) -> np.ndarray:
    """E0: expected time to finish a job of length T started on a fresh VM."""
    t = np.asarray(length_h, dtype=float)
    survive = model.sf(t)
    numerator = t * survive + model.first_moment(0.0, t) + launch_h * model.mass(0.0, t)
    return _safe_divide(numerator, survive)


def expected_makespan_reuse_h(
    model: LifetimeModel, age_h: ArrayLike, length_h: ArrayLike, launch_h: float
) -> np.ndarray:
    """Es: expected time to finish a job of length T started now on a VM of age s."""
    s, t = np.broadcast_arrays(np.asarray(age_h, dtype=float), np.asarray(length_h, dtype=float))
    fresh = expected_makespan_fresh_h(model, t, launch_h)
    fail = model.mass(s, s + t)
    lost = model.first_moment(s, s + t) - s * fail
    with np.errstate(invalid="ignore"):
        numerator = t * model.sf(s + t) + lost + np.where(fail > 0, (launch_h + fresh) * fail, 0.0)
    return _safe_divide(numerator, model.sf(s))


REUSE_TOLERANCE = 1e-9  # relative: equal expectations must not be split by rounding


def should_reuse(
    model: LifetimeModel, age_h: ArrayLike, length_h: ArrayLike, launch_h: float
) -> np.ndarray:
    """True where starting the job on the VM of age s is no worse than releasing it for
    a replacement: Es(s) <= R + Es(R).

    docs/design.md#reuse writes E0 + R, with E0 from age 0. Ages here count from the launch, so a
    replacement is already R old when its job starts: comparing with Es(R) keeps a VM
    that just booted from being refused in favour of an identical one (which would
    loop forever); for R = 0 the two rules are the same. A VM no older than a
    replacement is always used, one past its life (S(s) = 0) never."""
    s, t = np.broadcast_arrays(np.asarray(age_h, dtype=float), np.asarray(length_h, dtype=float))
    here = expected_makespan_reuse_h(model, s, t, launch_h)
    replacement = launch_h + expected_makespan_reuse_h(
        model, np.full_like(s, launch_h), t, launch_h
    )
    alive = model.sf(s) > 0
    with np.errstate(invalid="ignore"):
        better = here <= replacement * (1.0 + REUSE_TOLERANCE) + REUSE_TOLERANCE
        hopeless = np.isinf(here) & np.isinf(replacement)  # no VM can finish it: do not churn
    return alive & (better | hopeless | (s <= launch_h))


def is_stable(model: LifetimeModel, age_h: ArrayLike, horizon_h: float = 1.0) -> np.ndarray:
    """A VM past its risky start: its chance of being preempted within the next
    `horizon_h` is at most half a fresh VM's (the paper keeps such VMs as hot spares;
    "half" keeps a VM a few minutes old, barely safer than a new one, out of it)."""
    fresh = model.conditional_failure(0.0, horizon_h)
    return model.conditional_failure(age_h, horizon_h) <= 0.5 * fresh


def failure_probability(
    model: LifetimeModel, age_h: ArrayLike, length_h: ArrayLike, launch_h: float, policy: str
) -> np.ndarray:
    """Probability that a job of length T meant to start on a VM of age s is preempted:
    "always" reuses the VM (memoryless thinking); "model" reuses it only when
    `should_reuse` says so, else the job runs on a fresh VM."""
    on_this_vm = model.conditional_failure(age_h, length_h)
    if policy == "always":
        return on_this_vm
    if policy != "model":
        raise ValueError(f"unknown policy {policy!r}; known: always, model")
    on_fresh = model.conditional_failure(launch_h, length_h)  # a replacement starts at age R
    return np.where(should_reuse(model, age_h, length_h, launch_h), on_this_vm, on_fresh)


# --- the paper's literal formulas (for comparison) ---------------------------------


def paper_expected_runtime_h(model: LifetimeModel, length_h: ArrayLike) -> np.ndarray:
    """Paper eq. 7: E[T] = T + ∫_0^T t f(t) dt (one failure at most, no restart cost)."""
    t = np.asarray(length_h, dtype=float)
    return t + model.first_moment(0.0, t)


def paper_expected_runtime_at_age_h(
    model: LifetimeModel, age_h: ArrayLike, length_h: ArrayLike
) -> np.ndarray:
    """Paper eq. 8: E[T_s] = T + ∫_s^{s+T} t f(t) dt (integrates t, not t - s; not
    conditioned on survival to s)."""
    s, t = np.broadcast_arrays(np.asarray(age_h, dtype=float), np.asarray(length_h, dtype=float))
    return t + model.first_moment(s, s + t)


def paper_should_reuse(model: LifetimeModel, age_h: ArrayLike, length_h: ArrayLike) -> np.ndarray:
    """The paper's rule: reuse when E[T_s] <= E[T_0]."""
    return paper_expected_runtime_at_age_h(model, age_h, length_h) <= paper_expected_runtime_h(
        model, length_h
    )


# --- tabulated decisions -------------------------------------------------------------


@dataclass(frozen=True)
class ReuseTable:
    """The reuse decision tabulated over VM ages and job lengths (hours) for one model.

    `reuse_ok` looks up the nearest grid point (a decision in O(1) without numpy);
    beyond the table, ages are clipped to the last row (the deadline) and lengths to
    the longest tabulated job.
    """

    age_step_h: float
    length_step_h: float
    decisions: np.ndarray  # [age index, length index] -> bool
    stable: np.ndarray  # [age index] -> bool
    crossover: np.ndarray  # [age index] -> T*(s), hours
    rows: list[list[bool]] = field(repr=False, compare=False, default_factory=list)
    stable_rows: list[bool] = field(repr=False, compare=False, default_factory=list)

    @classmethod
    def build(
        cls,
        model: LifetimeModel,
        launch_h: float,
        *,
        age_step_h: float = 0.1,
        length_step_h: float = 0.1,
        max_length_h: float | None = None,
        spare_horizon_h: float = 1.0,
    ) -> ReuseTable:
        end = model.L if model.L is not None else max(24.0, 3 * model.expected_lifetime_h())
        if not math.isfinite(end):
            end = 24.0
        ages = np.arange(0.0, end + age_step_h / 2, age_step_h)
        longest = max_length_h if max_length_h is not None else max(end, 1.0)
        lengths = np.arange(length_step_h, longest + length_step_h / 2, length_step_h)
        grid = should_reuse(model, ages[:, None], lengths[None, :], launch_h)
        stable = is_stable(model, ages, spare_horizon_h)
        crossover = crossover_h(model, ages, launch_h, lengths)
        return cls(
            age_step_h, length_step_h, grid, stable, crossover, grid.tolist(), stable.tolist()
        )

    def _age_index(self, age_h: float) -> int:
        return min(len(self.rows) - 1, max(0, round(age_h / self.age_step_h)))

    def reuse_ok(self, age_h: float, length_h: float) -> bool:
        rows = self.rows  # `_age_index` spelt out: the planner asks for every candidate VM
        row = rows[min(len(rows) - 1, max(0, round(age_h / self.age_step_h)))]
        column = min(len(row) - 1, max(0, round(length_h / self.length_step_h) - 1))
        return row[column]

    def is_stable(self, age_h: float) -> bool:
        return self.stable_rows[self._age_index(age_h)]

    def unfit_from_h(self, age_h: float, length_h: float) -> float | None:
        """The first tabulated age, at or after `age_h`, at which a job of `length_h`
        should no longer start on the VM (a fresh VM does better); None if it never
        comes within the table (the table's last row is the deadline)."""
        column_of = min(len(self.rows[0]) - 1, max(0, round(length_h / self.length_step_h) - 1))
        for index in range(self._age_index(age_h), len(self.rows)):
            if not self.rows[index][column_of]:
                return max(age_h, index * self.age_step_h)
        return None


def crossover_h(
    model: LifetimeModel, ages_h: np.ndarray, launch_h: float, lengths_h: np.ndarray | None = None
) -> np.ndarray:
    """T*(s): the longest job length (on the grid) for which reuse at age s still pays;
    0 where no job is worth starting there."""
    ages = np.asarray(ages_h, dtype=float)
    lengths = lengths_h if lengths_h is not None else np.arange(0.1, 24.05, 0.1)
    grid = should_reuse(model, ages[:, None], lengths[None, :], launch_h)
    # Longest T whose whole prefix (all shorter jobs) is reused.
    prefix = np.cumprod(grid, axis=1).astype(bool)
    count = prefix.sum(axis=1)
    return np.where(count > 0, lengths[np.maximum(count - 1, 0)], 0.0)
