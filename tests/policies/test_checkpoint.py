"""Checkpoint schedules (docs/design.md#checkpoints): the vectorised DP against the pure-Python
reference, the exact evaluator against the table and against Monte Carlo, the DP
against Young–Daly and every fixed period, the shape of the paper's 5-hour plan,
and edge cases."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from policies.checkpoint import (
    CheckpointTable,
    Schedule,
    build_table,
    expected_makespan,
    fixed_schedule,
    optimal_schedule,
    reference_table,
    simulate_makespan,
    young_daly_schedule,
)
from policies.preemption import Bathtub, Exponential, LifetimeModel, Weibull

N1_HIGHCPU_16 = Bathtub(A=0.351, tau1=2.31, tau2=109.7, b=0.001, L=24)  # the shipped model
PAPERLIKE = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
WEIBULL = Weibull(k=0.7, lam=5.0, L=24.0)  # early failures, then the deadline
EXPONENTIAL = Exponential(mttf_h=6.0)  # no deadline: ages run to the 48 h horizon
# Every fresh VM is reclaimed at 1 h, and a 1-hour checkpoint never completes: at
# most 3 steps of 15 min (one segment ending before L) can ever finish.
HOPELESS = Exponential(mttf_h=0.5, L=1.0)

REL = 1e-9


def assert_same(value: float, expected: float, rel: float = REL) -> None:
    """Equal to `rel`, or both infinite."""
    if math.isinf(expected):
        assert math.isinf(value), (value, expected)
    else:
        assert value == pytest.approx(expected, rel=rel, abs=0.0)


@functools.cache
def table_for(
    model: LifetimeModel, max_work_h: float, delta_h: float, restart_h: float, step_h: float
) -> CheckpointTable:
    return build_table(model, max_work_h, delta_h, restart_h, step_h)


# --- 1. build_table against reference_table -------------------------------------------

REFERENCE_CASES = {
    # name: (model, delta_h); all at step 1/4 h for 2 h of work (8 steps)
    "n1-highcpu-16": (N1_HIGHCPU_16, 0.5),
    "paperlike": (PAPERLIKE, 0.25),
    "exponential-no-deadline": (EXPONENTIAL, 0.25),
    "weibull": (WEIBULL, 0.5),
    "hopeless": (HOPELESS, 1.0),
}
REFERENCE_STEP_H = 0.25
REFERENCE_WORK_H = 2.0


@functools.cache
def reference_for(case: str, restart_h: float) -> dict[tuple[int, int], tuple[float, int]]:
    model, delta_h = REFERENCE_CASES[case]
    return reference_table(model, REFERENCE_WORK_H, delta_h, restart_h, REFERENCE_STEP_H)


def reference_candidate(
    model: LifetimeModel,
    reference: dict[tuple[int, int], tuple[float, int]],
    J: int,
    t: int,
    i: int,
    delta_steps: int,
    restart_h: float,
    step_h: float,
    ages: int,
) -> float:
    """docs/design.md#checkpoints: the value of checkpointing after i steps at (J, t), with the reference
    table's values for everything that follows."""

    def value(work: int, age: int) -> float:
        return 0.0 if work == 0 else reference[(work, min(age, ages - 1))][0]

    d = i + (delta_steps if i < J else 0)
    p, lost = _survive_and_loss(model, t * step_h, d * step_h)
    if t == 0:  # M(J, 0) on both sides: closed form
        if p <= 0:
            return math.inf
        return (p * (d * step_h + value(J - i, d)) + (1 - p) * (lost + restart_h)) / p
    ahead = value(J - i, t + d) if p > 0 else 0.0
    return p * (d * step_h + ahead) + (1 - p) * (lost + restart_h + value(J, 0))


def _survive_and_loss(model: LifetimeModel, age_h: float, duration_h: float) -> tuple[float, float]:
    """p = S(t + d)/S(t) and E[x - t | t < x <= t + d], straight from the model (a segment
    ending at the deadline is reclaimed there)."""
    alive = float(model.sf(age_h))
    if alive <= 0:
        return 0.0, 0.0
    end = age_h + duration_h
    if model.L is not None and abs(end - model.L) < 1e-9:
        end = model.L
    fail = float(model.mass(age_h, end))
    lost = float(model.expected_loss_h(age_h, end - age_h)) if fail > 0 else 0.0
    return max(0.0, 1.0 - fail / alive), lost


@pytest.mark.parametrize("chunk", [1, 3, 96])
@pytest.mark.parametrize("restart_h", [0.0, 0.2])
@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_table_matches_the_reference_dp(case, restart_h, chunk):
    model, delta_h = REFERENCE_CASES[case]
    reference = reference_for(case, restart_h)
    table = build_table(
        model,
        REFERENCE_WORK_H,
        delta_h,
        restart_h,
        REFERENCE_STEP_H,
        max_interval_h=None,
        chunk=chunk,
    )
    n = round(REFERENCE_WORK_H / REFERENCE_STEP_H)
    assert table.max_steps == n and table.delta_steps == round(delta_h / REFERENCE_STEP_H)
    assert set(reference) == {(J, t) for J in range(1, n + 1) for t in range(table.ages)}
    assert np.all(table.makespan[0] == 0.0)
    for (J, t), (expected, _) in reference.items():
        assert_same(float(table.makespan[J, t]), expected)
        if math.isinf(expected):
            continue
        # Ties may pick another first interval: the table's pick must achieve the value.
        i = int(table.choice[J, t])
        assert 1 <= i <= J
        if i == reference[(J, t)][1]:
            continue
        achieved = reference_candidate(
            model, reference, J, t, i, table.delta_steps, restart_h, REFERENCE_STEP_H, table.ages
        )
        assert_same(achieved, expected)


def test_reference_cases_cover_infinite_and_finite_entries():
    """The hopeless model has both: up to 3 steps fit before L, 4 or more never finish."""
    reference = reference_for("hopeless", 0.0)
    assert all(math.isfinite(reference[(J, 0)][0]) for J in (1, 2, 3))
    assert all(math.isinf(value) for (J, _), (value, _) in reference.items() if J >= 4)


class _TableValues:
    """A CheckpointTable seen as a reference dict {(J, t): (M, choice)}."""

    def __init__(self, table: CheckpointTable) -> None:
        self.table = table

    def __getitem__(self, key: tuple[int, int]) -> tuple[float, int]:
        return float(self.table.makespan[key]), int(self.table.choice[key])


def bellman_residuals(model, table, restart_h, entries) -> list[float]:
    """(M(J, t) - min_i candidate_i) / M(J, t), the candidates computed in float64 from
    the table's own values of the states that follow: zero where the table picked the
    best first interval."""
    values = _TableValues(table)
    out = []
    for J, t in entries:
        best = min(
            reference_candidate(
                model, values, J, t, i, table.delta_steps, restart_h, table.step_h, table.ages
            )
            for i in range(1, J + 1)
        )
        out.append((float(table.makespan[J, t]) - best) / best)
    return out


def test_one_minute_table_is_bellman_optimal():
    """The reference DP is too slow at 1-minute steps; instead check, on a sample of
    entries of the shipped model's table, that each is the minimum over all first
    intervals (which, with the exact closed form at t = 0, characterises the DP)."""
    table = table_for(N1_HIGHCPU_16, 0.75, 1 / 60, 0.1, 1 / 60)
    rng = np.random.default_rng(5)
    works, ages = rng.integers(1, 46, 60), rng.integers(0, 1441, 60)
    entries = [(int(J), int(t)) for J, t in zip(works, ages, strict=True)]
    entries += [(45, 0), (45, 1), (45, 1380), (45, 1439), (45, 1440), (1, 1440)]
    assert max(abs(r) for r in bellman_residuals(N1_HIGHCPU_16, table, 0.1, entries)) < REL


@pytest.mark.xfail(
    strict=True,
    reason="known limitation: build_table ranks candidates in float32 where S(t) >= 0.05 "
    "(float64 below); of near ties it may keep one worse by up to 2.8e-6 relative (paper-like "
    "model, 1-minute steps, near the deadline): 0.05 s on a 5-hour job",
)
def test_one_minute_near_ties_near_the_deadline_are_ranked_exactly():
    table = table_for(PAPERLIKE, 0.75, 1 / 60, 0.0, 1 / 60)
    entries = [(32, 1399), (32, 1402), (32, 1403), (23, 1431)]  # S(t) = 0.36 .. 0.18
    assert max(bellman_residuals(PAPERLIKE, table, 0.0, entries)) < REL


# --- 2. the exact evaluator reproduces the table ------------------------------------------


EVALUATOR_AGES_H = (0.0, 1 / 12, 5.0, 17.0, 21.5, 23.0, 23.75, 23 + 11 / 12, 24.0, 27.0)


@pytest.mark.parametrize("restart_h", [0.0, 0.2])
@pytest.mark.parametrize(
    "model",
    [N1_HIGHCPU_16, PAPERLIKE, WEIBULL, EXPONENTIAL],
    ids=["n1-highcpu-16", "paperlike", "weibull", "exponential"],
)
def test_exact_evaluator_reproduces_the_table(model, restart_h):
    step = delta = 1 / 12
    table = table_for(model, 6.0, delta, restart_h, step)
    for work in (0.25, 1.0, 2.5, 6.0):
        for age in EVALUATOR_AGES_H:
            plan = table.schedule(work, age)
            assert sum(plan.intervals_h) == pytest.approx(work)
            assert plan.work_h == pytest.approx(work)
            replanned = expected_makespan(model, plan.intervals_h, delta, age, restart_h, table)
            assert_same(replanned, plan.expected_makespan_h)
            # Resuming the same intervals after a restart is one more grid policy: M is
            # the optimum over those, so it can never be better.
            resumed = expected_makespan(model, plan.intervals_h, delta, age, restart_h)
            assert resumed >= plan.expected_makespan_h * (1 - REL)


# --- 3. acceptance: never worse than Young–Daly or any fixed period ----------------------

# The DP is optimal among grid-aligned policies that replan after every restart. A fixed
# schedule on the grid is such a policy both ways: resuming its own remaining intervals
# on the new VM (`replan=None`: the plan for (J', 0) is a suffix of the list) or switching
# to the DP after the first restart (`replan=table`). So M(W, t) <= both is a theorem,
# not an empirical fact, PROVIDED every interval, δ and the start age are on the grid.
# Young–Daly's period sqrt(2·δ·MTTF) is generally not on the grid; with step 1/4 h,
# δ = 1/2 h and MTTF = 1 h it is exactly 1 h = 4 steps, so it is covered by the theorem
# too (off-grid periods: the next test).
ACCEPT_STEP_H = 0.25
ACCEPT_DELTA_H = 0.5
ACCEPT_WORK_H = (0.5, 1.5, 3.0, 5.5, 8.0)
ACCEPT_AGES_H = (0.0, 2.0, 6.0, 12.0, 18.0, 21.0, 22.0, 23.0, 23.5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "restart_h"),
    [(N1_HIGHCPU_16, 0.0), (PAPERLIKE, 0.2)],
    ids=["n1-highcpu-16", "paperlike-restart"],
)
def test_dp_never_worse_than_young_daly_or_any_fixed_period(model, restart_h):
    step, delta = ACCEPT_STEP_H, ACCEPT_DELTA_H
    table = table_for(model, max(ACCEPT_WORK_H), delta, restart_h, step)
    gains = []
    for work in ACCEPT_WORK_H:
        for age in ACCEPT_AGES_H:
            best = table.schedule(work, age).expected_makespan_h
            young_daly = young_daly_schedule(
                model, work, delta, mttf_h=1.0, start_age_h=age, restart_h=restart_h
            )
            assert young_daly.intervals_h[0] == (1.0 if work > 1.0 else work)  # on the grid
            rivals = [young_daly]
            rivals += [
                fixed_schedule(model, work, k * step, delta, age, restart_h)
                for k in range(1, round(work / step) + 1)  # every period up to one interval
            ]
            for rival in rivals:
                resumed = rival.expected_makespan_h  # evaluated with replan=None
                replanned = expected_makespan(
                    model, rival.intervals_h, delta, age, restart_h, replan=table
                )
                assert best <= resumed * (1 + REL), (work, age, rival)
                assert best <= replanned * (1 + REL), (work, age, rival)
            gains.append(1 - best / young_daly.expected_makespan_h)
    # And not only by ties: under a bathtub the DP clearly beats Young–Daly somewhere.
    assert max(gains) > 0.02


@pytest.mark.parametrize("model", [N1_HIGHCPU_16, WEIBULL], ids=["n1-highcpu-16", "weibull"])
def test_off_grid_young_daly_gains_at_most_one_step_near_the_deadline(model):
    """With step = δ = 5 min, Young–Daly's period sqrt(2·δ·1 h) = 24.5 min is off the grid,
    so the theorem above does not apply. Where Young–Daly's failure-free run ends before
    the deadline, the DP still wins (empirically by >= 4% here: off the grid an interval
    only gains to second order). Near the deadline an off-grid schedule can end a
    checkpoint closer to L than any grid point can (e.g. 1 h of work at 23 h: 42 + 5 min
    fits before L, 45 + 5 min does not), and so carries up to one step less work past
    L: the DP really loses there (by up to 15%). The loss is bounded by about what one
    more step of work costs from a fresh VM, max_J M(J + 1, 0) - M(J, 0): a grid policy
    that checkpoints at Young–Daly's positions rounded down survives whenever Young–Daly
    does and restarts with at most one more step left. That is a heuristic bound (the
    runs after the restart differ too), checked here; observed up to 0.8 of it.
    Only `replan=None` is compared: with `replan=table`, work left off the grid is
    rounded to the grid by `CheckpointTable.schedule`, so that evaluation is not of the
    same job."""
    step = delta = 1 / 12
    restart_h = 0.1
    table = table_for(model, 9.0, delta, restart_h, step)
    one_step = float(np.max(np.diff(table.makespan[:, 0])))
    near_deadline_losses = 0
    for work in (0.5, 1.0, 2.0, 3.5, 6.0, 9.0):
        for age in [*range(24), 21.5, 22.5, 23.5]:
            best = table.schedule(work, age).expected_makespan_h
            young_daly = young_daly_schedule(
                model, work, delta, mttf_h=1.0, start_age_h=age, restart_h=restart_h
            )
            assert young_daly.intervals_h[0] * 12 % 1 > 0.1  # really off the grid
            failure_free_end = age + work + young_daly.checkpoints * delta
            if failure_free_end < model.L:
                assert best <= young_daly.expected_makespan_h * (1 + REL), (work, age)
            else:
                assert best <= young_daly.expected_makespan_h + one_step, (work, age)
                near_deadline_losses += best > young_daly.expected_makespan_h
    # The exception is real (documented here so that it is not mistaken for a bug).
    assert near_deadline_losses > 0


# --- 4. Monte Carlo --------------------------------------------------------------------

MC_STEP_H = MC_DELTA_H = 1 / 12


def _dp_plan(model, work, age, restart_h):
    return table_for(model, work, MC_DELTA_H, restart_h, MC_STEP_H).schedule(work, age).intervals_h


@pytest.mark.parametrize(
    ("model", "work", "age", "restart_h", "plan", "seed"),
    [
        pytest.param(N1_HIGHCPU_16, 3.0, 0.0, 0.1, "dp", 1, id="n1-fresh-dp"),
        # These two run into the 24 h deadline.
        pytest.param(PAPERLIKE, 5.0, 20.0, 0.2, "dp", 2, id="paperlike-20h-dp"),
        pytest.param(N1_HIGHCPU_16, 5.0, 20.0, 0.2, "fixed", 3, id="n1-20h-fixed"),
        pytest.param(WEIBULL, 4.0, 6.0, 0.05, "fixed", 4, id="weibull-6h-fixed"),
        pytest.param(N1_HIGHCPU_16, 23 / 12, 22.0, 0.1, "ends-at-deadline", 5, id="n1-at-L"),
    ],
)
@pytest.mark.parametrize("replan", [False, True], ids=["resume", "replan"])
def test_monte_carlo_agrees_with_the_exact_evaluator(
    model, work, age, restart_h, plan, seed, replan
):
    table = table_for(model, work, MC_DELTA_H, restart_h, MC_STEP_H)
    if plan == "dp":
        intervals = _dp_plan(model, work, age, restart_h)
    elif plan == "ends-at-deadline":
        # The first segment ends at 23 h, the second at 24 h (up to rounding in the sums):
        # reclaimed there with the deadline mass, in the evaluator and the simulation alike.
        intervals = (11 / 12, 1.0)
    else:
        intervals = fixed_schedule(model, work, 0.5, MC_DELTA_H, age, restart_h).intervals_h
    with_table = table if replan else None
    exact = expected_makespan(model, intervals, MC_DELTA_H, age, restart_h, replan=with_table)
    rng = np.random.default_rng(seed)
    mean, stderr = simulate_makespan(
        model, intervals, MC_DELTA_H, rng, age, restart_h, runs=4000, replan=with_table
    )
    assert 0 < stderr < 0.02 * exact
    assert abs(mean - exact) < 3.5 * stderr, (mean, exact, stderr)


def test_replanning_matters_near_the_deadline():
    """The Monte Carlo case above where replan and resume differ (so both paths of the
    evaluator are really exercised): after a reclaim at 24 h the DP plans the rest anew."""
    intervals = _dp_plan(PAPERLIKE, 5.0, 20.0, 0.2)
    table = table_for(PAPERLIKE, 5.0, MC_DELTA_H, 0.2, MC_STEP_H)
    resumed = expected_makespan(PAPERLIKE, intervals, MC_DELTA_H, 20.0, 0.2)
    replanned = expected_makespan(PAPERLIKE, intervals, MC_DELTA_H, 20.0, 0.2, replan=table)
    assert replanned < resumed * (1 - 1e-3)


# --- 5. the paper's 5-hour plan -----------------------------------------------------------


def test_five_hour_plan_on_a_fresh_n1_highcpu_16_grows_its_intervals():
    delta = step = 1 / 60
    plan = optimal_schedule(N1_HIGHCPU_16, 5.0, delta, 0.0, 0.0, step)
    intervals = plan.intervals_h
    assert sum(intervals) == pytest.approx(5.0)
    assert plan.checkpoints == len(intervals) - 1 >= 3
    # Non-decreasing while the early-failure hazard fades; the last interval takes the rest.
    full = intervals[:-1]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(full))
    assert full[-1] > 1.5 * full[0]
    assert plan.overhead < 0.05
    young_daly = young_daly_schedule(N1_HIGHCPU_16, 5.0, delta, mttf_h=1.0)
    assert plan.overhead < young_daly.overhead
    # Its value is the DP policy's exact value.
    table = build_table(N1_HIGHCPU_16, 5.0, delta, 0.0, step)
    assert_same(
        expected_makespan(N1_HIGHCPU_16, intervals, delta, replan=table), plan.expected_makespan_h
    )


# --- 6. edge cases ------------------------------------------------------------------------


@pytest.mark.parametrize("age", [0.0, 10.0, 23.0])
def test_work_shorter_than_a_checkpoint_runs_in_one_go(age):
    """δ = 1 h, 45 min of work: any checkpointed first segment (>= 1 h 15 min) would end
    after the job could have finished without one, so one interval is strictly best."""
    restart_h = 0.1
    table = table_for(N1_HIGHCPU_16, 2.0, 1.0, restart_h, 0.25)
    plan = table.schedule(0.75, age)
    assert plan.intervals_h == (0.75,)
    assert plan.checkpoints == 0 and plan.checkpoint_times_h() == []
    one_go = expected_makespan(N1_HIGHCPU_16, [0.75], 1.0, age, restart_h)
    assert_same(plan.expected_makespan_h, one_go)
    assert_same(expected_makespan(N1_HIGHCPU_16, [0.75], 1.0, age, restart_h, table), one_go)


@pytest.mark.parametrize("age", [0.0, 6.0, 22.0])
def test_free_checkpoints_are_taken_after_every_step(age):
    """δ = 0: splitting an interval never hurts (same timeline, less lost on a failure),
    so checkpointing after every step is optimal."""
    step, restart_h = 0.25, 0.1
    table = table_for(N1_HIGHCPU_16, 3.0, 0.0, restart_h, step)
    assert table.delta_steps == 0
    plan = table.schedule(3.0, age)
    every_step = [step] * 12
    assert_same(
        plan.expected_makespan_h, expected_makespan(N1_HIGHCPU_16, every_step, 0.0, age, restart_h)
    )
    assert_same(
        plan.expected_makespan_h,
        expected_makespan(N1_HIGHCPU_16, every_step, 0.0, age, restart_h, table),
    )
    # Strictly better than anything coarser (the hazard is positive everywhere).
    assert plan.expected_makespan_h < expected_makespan(
        N1_HIGHCPU_16, [0.5] * 6, 0.0, age, restart_h
    )
    if age == 0.0:
        assert plan.intervals_h == tuple(every_step)
        assert plan.checkpoint_times_h() == pytest.approx([0.25 * k for k in range(1, 12)])


@pytest.mark.parametrize("restart_h", [0.0, 0.3])
def test_a_vm_at_or_past_its_deadline_restarts_fresh(restart_h):
    step = delta = 1 / 12
    table = table_for(PAPERLIKE, 3.0, delta, restart_h, step)
    assert table.ages == 24 * 12 + 1
    # The whole deadline column is R + M(J, 0).
    assert table.makespan[1:, -1] == pytest.approx(restart_h + table.makespan[1:, 0], rel=REL)
    fresh = table.schedule(3.0, 0.0)
    assert len(fresh.intervals_h) >= 3  # the whole path restarts, not only its first step
    for age in (24.0, 30.0):
        dead = table.schedule(3.0, age)
        assert dead.intervals_h == fresh.intervals_h
        assert_same(dead.expected_makespan_h, restart_h + fresh.expected_makespan_h)
        assert_same(
            expected_makespan(PAPERLIKE, dead.intervals_h, delta, age, restart_h, table),
            dead.expected_makespan_h,
        )


def test_schedule_checkpoint_times_and_overhead():
    plan = Schedule((1.0, 2.0, 0.5), 4.2, 3.5, 0.25, "test")
    assert plan.checkpoints == 2
    assert plan.checkpoint_times_h() == pytest.approx([1.0, 3.25])  # 1 + 0.25 + 2
    assert plan.overhead == pytest.approx(0.2)
    assert Schedule((2.0,), 2.0, 2.0, 0.25, "test").checkpoint_times_h() == []
    assert Schedule((), 0.0, 0.0, 0.25, "none").overhead == 0.0
    # A DP plan: checkpoint k starts after the first k intervals and k - 1 checkpoints.
    dp = optimal_schedule(PAPERLIKE, 4.0, 1 / 12, 3.0, 0.1, 1 / 12)
    expected = np.cumsum(dp.intervals_h[:-1]) + np.arange(dp.checkpoints) / 12
    assert dp.checkpoint_times_h() == pytest.approx(list(expected))


def test_memoryless_plans_are_stationary_near_young_daly():
    """Exponential lifetimes, no deadline: the optimal period does not depend on age or
    on how much work is done, and is close to sqrt(2·δ·MTTF)."""
    mttf, step = 4.0, 1 / 12
    delta = step
    table = table_for(Exponential(mttf), 12.0, delta, 0.0, step)
    plan = table.schedule(12.0, 0.0)
    middle = np.array(plan.intervals_h[2:-2]) / step
    assert len(middle) >= 8
    assert middle.max() - middle.min() <= 1
    young_daly = math.sqrt(2 * delta * mttf)
    assert abs(np.median(middle) * step - young_daly) < 0.25 * young_daly
    # Memoryless: M(J, t) = M(J, 0) at every age, here up to 18 h (S >= 0.011); older
    # VMs: see the next test.
    ages = np.arange(0, round(18.0 / step) + 1)
    assert np.allclose(table.makespan[1:, ages], table.makespan[1:, [0]], rtol=REL, atol=0)


def test_memoryless_table_is_flat_in_age_on_old_vms():
    """Where S(t) is small the candidates of (J, t), scaled by S(t), differ by little:
    they must still be ranked and valued right (float32 ranking could not)."""
    model, step = Exponential(4.0), 1 / 12  # 12 h of work; S(48 h) = 6e-6
    table = table_for(model, 12.0, step, 0.0, step)
    old = [round(age / step) for age in (22.0, 26.0, 30.0, 40.0, 48.0)]
    assert np.allclose(table.makespan[1:, old], table.makespan[1:, [0]], rtol=1e-8, atol=0)
    # MTTF 1 h, 1-minute steps: S(15 h) = 3e-7. The value is M(J, t)·S(t) divided by
    # S(t), so rounding grows like 1/S(t): compare to 1e-6.
    model, step = Exponential(1.0), 1 / 60
    table = table_for(model, 2.0, step, 0.0, step)
    fresh = table.schedule(2.0, 0.0)
    for age in (12.0, 15.0):
        plan = table.schedule(2.0, age)
        assert plan.expected_makespan_h == pytest.approx(fresh.expected_makespan_h, rel=1e-6)
        assert max(plan.intervals_h[:-1]) - min(plan.intervals_h[:-1]) <= step + 1e-12


def test_a_value_is_never_below_the_work_even_where_survival_is_negligible():
    """Without a deadline the table stops where all but 1e-6 of VMs are gone (past it
    the values, divided by S(t), would be rounding noise); older VMs are planned like
    that age, which for a memoryless model is exact."""
    model, step = Exponential(1.0), 1 / 60
    table = table_for(model, 2.0, step, 0.0, step)
    fresh = table.schedule(2.0, 0.0).expected_makespan_h
    for age in (25.0, 30.0):  # S = 1e-11, 1e-13
        plan = table.schedule(2.0, age)
        assert plan.expected_makespan_h >= 2.0
        assert plan.expected_makespan_h == pytest.approx(fresh, rel=1e-3)


def test_work_that_can_never_finish_is_infinite_everywhere():
    delta, step = 1.0, 0.25
    for restart_h in (0.0, 0.2):
        table = table_for(HOPELESS, 2.0, delta, restart_h, step)
        assert np.all(np.isfinite(table.makespan[:4]))
        assert np.all(np.isinf(table.makespan[4:]))
        for work in (1.0, 2.0):
            for age in (0.0, 0.5, 1.0):
                plan = table.schedule(work, age)
                assert math.isinf(plan.expected_makespan_h)
                for intervals in (plan.intervals_h, [work], [0.25] * round(work / 0.25)):
                    assert math.isinf(expected_makespan(HOPELESS, intervals, delta, age, restart_h))
                    assert math.isinf(
                        expected_makespan(HOPELESS, intervals, delta, age, restart_h, table)
                    )
        # What fits finishes, and is evaluated consistently.
        plan = table.schedule(0.75, 0.0)
        assert plan.intervals_h == (0.75,)
        assert math.isfinite(plan.expected_makespan_h)
        assert_same(
            expected_makespan(HOPELESS, plan.intervals_h, delta, 0.0, restart_h, table),
            plan.expected_makespan_h,
        )


def test_long_schedules_are_evaluated_without_recursion():
    # 24 h of Young–Daly with δ = 10 s and MTTF 1 h: 322 intervals.
    plan = young_daly_schedule(N1_HIGHCPU_16, 24.0, 10 / 3600, 1.0)
    assert len(plan.intervals_h) > 300
    assert math.isfinite(plan.expected_makespan_h) and plan.expected_makespan_h > 24.0
    # On a VM that (practically) never dies the makespan is the work plus the checkpoints.
    never = Exponential(mttf_h=1e12)
    exact = expected_makespan(never, plan.intervals_h, 10 / 3600)
    assert exact == pytest.approx(24.0 + plan.checkpoints * 10 / 3600, rel=1e-9)


def test_a_table_refuses_more_work_than_it_covers_and_the_simulator_what_never_ends():
    table = table_for(N1_HIGHCPU_16, 2.0, 0.25, 0.0, 0.25)
    with pytest.raises(ValueError, match="up to 2 h of work, not 5 h"):
        table.schedule(5.0)
    assert table.schedule(2.1).work_h == 2.0  # rounded to the grid
    mean, se = simulate_makespan(HOPELESS, [2.0], 1.0, np.random.default_rng(1), runs=10)
    assert math.isinf(mean) and se == 0.0


def test_without_a_deadline_old_vms_are_planned_like_the_horizon_not_like_new_ones():
    model, step = Exponential(mttf_h=1.0), 1 / 12
    table = table_for(model, 3.0, step, 0.0, step)
    assert not table.deadline and (table.ages - 1) * step < 48.0  # stopped where S <= 1e-6
    far = table.schedule(3.0, 100.0)
    assert far.intervals_h == table.schedule(3.0, (table.ages - 1) * step).intervals_h
    assert far.expected_makespan_h == pytest.approx(table.schedule(3.0, 0.0).expected_makespan_h)
