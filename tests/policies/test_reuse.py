"""The reuse policy: its formulas against Monte Carlo, the decision, the tables, and
the paper's scheduling result."""

from __future__ import annotations

import numpy as np
import pytest

from policies.preemption import Bathtub, Exponential
from policies.reuse import (
    ReuseTable,
    crossover_h,
    expected_makespan_fresh_h,
    expected_makespan_reuse_h,
    failure_probability,
    is_stable,
    paper_expected_runtime_at_age_h,
    paper_expected_runtime_h,
    paper_should_reuse,
    should_reuse,
)

PAPERLIKE = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)


def simulate_makespan(
    model, age_h: float, length_h: float, launch_h: float, rng, runs: int = 40_000
) -> float:
    """Monte Carlo of the policy's world: start on a VM of age s (alive at s); on a
    preemption, wait R for a fresh VM and restart from scratch there."""
    total = np.zeros(runs)
    # First try, on the VM of age s: its lifetime conditional on surviving to s.
    draws = model.sample_h(rng, runs * 8)
    alive = draws[draws > age_h][:runs]
    assert len(alive) == runs
    remaining = alive - age_h
    done = remaining > length_h  # reclaimed exactly when the job would end: it failed
    total += np.where(done, length_h, remaining + launch_h)
    pending = ~done
    while pending.any():
        lives = model.sample_h(rng, int(pending.sum()))
        ok = lives > length_h
        step = np.where(ok, length_h, lives + launch_h)
        total[pending] += step
        index = np.flatnonzero(pending)
        pending[index[ok]] = False
    return float(total.mean())


@pytest.mark.parametrize(
    ("age", "length"),
    [(0.0, 3.0), (5.0, 6.0), (12.0, 4.0), (19.0, 3.0), (18.0, 6.0), (20.0, 3.0), (22.5, 2.0)],
)
def test_expected_makespans_agree_with_monte_carlo(age, length):
    rng = np.random.default_rng(7)
    launch = 0.05
    exact = float(expected_makespan_reuse_h(PAPERLIKE, age, length, launch))
    if age == 0.0:
        assert exact == pytest.approx(float(expected_makespan_fresh_h(PAPERLIKE, length, launch)))
    assert simulate_makespan(PAPERLIKE, age, length, launch, rng) == pytest.approx(exact, rel=0.02)


def test_memoryless_lifetimes_always_reuse():
    model = Exponential(6.0)
    ages = np.linspace(0.0, 30.0, 31)[:, None]
    lengths = np.linspace(0.25, 20.0, 40)[None, :]
    assert should_reuse(model, ages, lengths, 0.1).all()
    assert np.allclose(
        expected_makespan_reuse_h(model, ages, lengths, 0.1),
        expected_makespan_fresh_h(model, lengths, 0.1),
    )


def test_the_paper_scheduling_result():
    """6-hour jobs: always-reuse fails for sure late in a VM's life; the model policy
    keeps the failure probability at a fresh VM's."""
    ages = np.arange(0.0, 24.0, 1.0)
    always = failure_probability(PAPERLIKE, ages, 6.0, 0.05, "always")
    model = failure_probability(PAPERLIKE, ages, 6.0, 0.05, "model")
    fresh = float(PAPERLIKE.conditional_failure(0.05, 6.0))  # a replacement starts at age R
    assert np.all(always[ages >= 18.0] == 1.0)
    assert np.all(model[ages >= 18.0] == pytest.approx(fresh))
    assert (
        model[1:].max() <= fresh + 1e-9
    )  # once past its own start, never worse than a replacement
    assert model.mean() < 0.6 * always.mean()
    # The policy minimises expected completion time, not failure probability: at 17 h
    # a failure on the old VM would come late and waste most of the job, so a fresh VM
    # (more likely to fail, but early and cheaply) is the better bet.
    assert model[17] == pytest.approx(fresh) and always[17] < fresh


def test_tables_match_the_exact_decision_and_crossover():
    table = ReuseTable.build(PAPERLIKE, 0.05)
    rng = np.random.default_rng(3)
    ages = np.round(rng.uniform(0, 24, 2000), 1)
    lengths = np.round(rng.uniform(0.1, 20, 2000), 1)
    exact = should_reuse(PAPERLIKE, ages, lengths, 0.05)
    looked_up = np.array([table.reuse_ok(a, t) for a, t in zip(ages, lengths, strict=True)])
    assert np.mean(exact == looked_up) > 0.995
    # T*(s): late in life only short jobs are worth starting; it shrinks toward the deadline.
    star = crossover_h(PAPERLIKE, np.array([2.0, 10.0, 20.0, 23.0]), 0.05)
    assert list(star) == sorted(star, reverse=True)
    assert star[-1] < 1.0 < star[2] < 4.0
    assert table.is_stable(10.0) and not table.is_stable(0.0) and not table.is_stable(23.5)
    assert is_stable(PAPERLIKE, np.array([0.0, 10.0]), 1.0).tolist() == [False, True]


def test_the_age_from_which_a_warm_vm_is_unfit_for_a_job_length():
    table = ReuseTable.build(PAPERLIKE, 0.05)
    for length_h in (1.0, 6.0):
        unfit_h = table.unfit_from_h(0.0, length_h)
        assert unfit_h is not None and 0.0 < unfit_h < 24.0
        # Every tabulated age before it is fit, the age itself is not.
        assert all(table.reuse_ok(a, length_h) for a in np.arange(0.0, unfit_h - 0.05, 0.1))
        assert not table.reuse_ok(unfit_h, length_h)
        # Asked from later on, the answer is that age or the one asked about.
        assert table.unfit_from_h(unfit_h + 0.3, length_h) == pytest.approx(unfit_h + 0.3)
        assert table.unfit_from_h(unfit_h / 2, length_h) == pytest.approx(unfit_h)
    # Longer jobs become unfit earlier in a VM's life.
    assert table.unfit_from_h(0.0, 6.0) < table.unfit_from_h(0.0, 1.0)
    # No deadline and no ageing: never unfit.
    memoryless = ReuseTable.build(Exponential(mttf_h=10.0), 0.05, max_length_h=4.0)
    assert memoryless.unfit_from_h(0.0, 1.0) is None


def test_the_papers_literal_formulas_are_kept_for_comparison():
    # Eq. 7 and 8 count one failure at most and integrate t, not t - s.
    assert float(paper_expected_runtime_h(PAPERLIKE, 4.0)) == pytest.approx(
        4.0 + float(PAPERLIKE.first_moment(0.0, 4.0))
    )
    late = paper_expected_runtime_at_age_h(PAPERLIKE, 20.0, 6.0)
    assert float(late) > float(paper_expected_runtime_h(PAPERLIKE, 6.0))
    assert not bool(paper_should_reuse(PAPERLIKE, 20.0, 6.0))
