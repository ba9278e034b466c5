"""Checkpoint schedules with preemption notices (docs/design.md#checkpoint-notices): the
recursion without notices is the notice-less table's, its expected makespans agree with
a Monte Carlo run of the same policy, and knowing about notices never costs more and
checkpoints less."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from policies.checkpoint import CheckpointTable, build_table
from policies.checkpoint_notices import (
    Notices,
    build_notice_table,
    simulate_makespan_with_notices,
    solve_with_notices,
)
from policies.preemption import Bathtub, Exponential, LifetimeModel, Weibull

N1_HIGHCPU_16 = Bathtub(A=0.351, tau1=2.31, tau2=109.7, b=0.001, L=24)  # the shipped model
PAPERLIKE = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
WEIBULL = Weibull(k=0.7, lam=5.0, L=24.0)
EXPONENTIAL = Exponential(mttf_h=3.0)  # no deadline

STEP_H = 1 / 12  # 5 minutes: small tables, fast tests
GCE_NOTICE = Notices(lead_h=30 / 3600)  # GCE: about 30 s
EC2_NOTICE = Notices(lead_h=2 / 60)  # EC2: two minutes


@functools.cache
def notice_table(
    model: LifetimeModel, work_h: float, delta_h: float, notices: Notices, restart_h: float
) -> CheckpointTable:
    return build_notice_table(model, work_h, delta_h, notices, restart_h, STEP_H)


@pytest.mark.parametrize("model", [N1_HIGHCPU_16, PAPERLIKE, WEIBULL, EXPONENTIAL])
@pytest.mark.parametrize(("delta_h", "restart_h"), [(STEP_H, 0.0), (2 * STEP_H, 0.1)])
def test_without_notices_the_recursion_is_the_notice_less_one(model, delta_h, restart_h):
    plain = build_table(model, 3.0, delta_h, restart_h, STEP_H)
    # A share of 0 through the recursion itself (build_notice_table would not call it).
    none = solve_with_notices(
        model, 3.0, delta_h, Notices(lead_h=1.0, share=0.0), restart_h, STEP_H
    )
    finite = np.isfinite(plain.makespan)
    assert (finite == np.isfinite(none.makespan)).all()
    # build_table ranks candidates in float32 and may keep one a hair worse (1e-6):
    # the float64 recursion is never above it (but for rounding where S(t) is tiny).
    np.testing.assert_allclose(none.makespan[finite], plain.makespan[finite], rtol=1e-5)
    assert (none.makespan[finite] <= plain.makespan[finite] * (1 + 1e-6)).all()
    for work_h in (0.5, 1.0, 3.0):
        a, b = plain.schedule(work_h), none.schedule(work_h)
        assert b.expected_makespan_h == pytest.approx(a.expected_makespan_h, rel=1e-5)


def test_a_notice_too_short_to_checkpoint_is_no_notice():
    short = Notices(lead_h=STEP_H / 2)
    table = build_notice_table(N1_HIGHCPU_16, 2.0, STEP_H, short, 0.0, STEP_H)
    plain = build_table(N1_HIGHCPU_16, 2.0, STEP_H, 0.0, STEP_H)
    np.testing.assert_array_equal(table.makespan, plain.makespan)
    assert not short.useful(STEP_H) and not Notices(1.0, share=0.0).useful(STEP_H)


@pytest.mark.parametrize(
    ("model", "notices", "delta_h", "restart_h", "work_h"),
    [
        (N1_HIGHCPU_16, GCE_NOTICE, GCE_NOTICE.lead_h, 0.05, 5.0),
        (PAPERLIKE, Notices(lead_h=2 / 60, share=0.5), 1 / 60, 0.1, 3.0),
        (WEIBULL, EC2_NOTICE, 1 / 60, 0.0, 4.0),
        (EXPONENTIAL, Notices(lead_h=0.1, share=0.8), 0.1, 0.05, 2.0),
    ],
    ids=["gce-30s", "paperlike-half-noticed", "weibull-2min", "exponential-no-deadline"],
)
def test_the_expected_makespan_is_what_a_monte_carlo_run_of_the_policy_takes(
    model, notices, delta_h, restart_h, work_h
):
    table = notice_table(model, work_h, delta_h, notices, restart_h)
    expected = table.schedule(work_h).expected_makespan_h
    mean, stderr, _ = simulate_makespan_with_notices(
        model,
        table,
        work_h,
        delta_h,
        notices,
        np.random.default_rng(20261126),
        restart_h,
        runs=4000,
    )
    assert math.isfinite(expected)
    assert abs(mean - expected) <= 4 * stderr + 1e-9 * expected, (mean, stderr, expected)


@pytest.mark.parametrize(
    ("model", "notices", "delta_h", "restart_h"),
    [
        (N1_HIGHCPU_16, GCE_NOTICE, GCE_NOTICE.lead_h, 0.05),
        (PAPERLIKE, EC2_NOTICE, 1 / 60, 0.05),
        (PAPERLIKE, Notices(lead_h=2 / 60, share=0.5), 1 / 60, 0.05),
    ],
    ids=["gce-30s", "paperlike-2min", "paperlike-half-noticed"],
)
def test_knowing_of_notices_checkpoints_less_and_costs_no_more(model, notices, delta_h, restart_h):
    """Both plans run under the same notices (the controller signals every job at a
    notice either way); the one that plans for them spends fewer checkpoints and takes
    no longer."""
    work_h = 4.0
    aware = notice_table(model, work_h, delta_h, notices, restart_h)
    unaware = build_table(model, work_h, delta_h, restart_h, STEP_H)
    assert aware.schedule(work_h).checkpoints <= unaware.schedule(work_h).checkpoints
    if notices.share == 1.0:  # every preemption noticed: scheduled checkpoints buy nothing
        assert aware.schedule(work_h).checkpoints == 0
    rng = np.random.default_rng(7)
    runs = 3000
    aware_mean, aware_err, aware_lost = simulate_makespan_with_notices(
        model, aware, work_h, delta_h, notices, rng, restart_h, runs
    )
    unaware_mean, unaware_err, _ = simulate_makespan_with_notices(
        model, unaware, work_h, delta_h, notices, rng, restart_h, runs
    )
    assert aware_mean <= unaware_mean + 3 * math.hypot(aware_err, unaware_err)
    # Better than without notices at all, which loses work since the last checkpoint.
    without = build_table(model, work_h, delta_h, restart_h, STEP_H).schedule(work_h)
    assert aware.schedule(work_h).expected_makespan_h < without.expected_makespan_h
    assert aware_lost < work_h


def test_the_whole_plan_is_a_table_like_the_notice_less_one():
    table = notice_table(PAPERLIKE, 3.0, 1 / 60, Notices(lead_h=2 / 60, share=0.5), 0.05)
    for age_h in (0.0, 5.0, 20.0):
        plan = table.schedule(3.0, age_h)
        assert sum(plan.intervals_h) == pytest.approx(3.0)
        assert plan.expected_makespan_h >= 3.0


@pytest.mark.parametrize(("lead_h", "share"), [(-1.0, 1.0), (math.inf, 1.0), (0.1, 1.5)])
def test_bad_notices_are_refused(lead_h, share):
    with pytest.raises(ValueError):
        Notices(lead_h=lead_h, share=share)
