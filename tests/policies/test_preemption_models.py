"""Lifetime models: distribution properties (property-based), closed forms against
quadrature, sampling, and fitting that recovers known parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fitting import at_deadline, fit, kaplan_meier
from policies.preemption import (
    Bathtub,
    Exponential,
    GompertzMakeham,
    NoPreemption,
    Weibull,
    make_model,
    quad_first_moment,
)

bathtubs = st.builds(
    Bathtub,
    A=st.floats(0.05, 1.0),
    tau1=st.floats(0.1, 20.0),
    tau2=st.floats(0.1, 50.0),
    b=st.floats(1.0, 60.0),
    L=st.sampled_from([24.0, 12.0]),
)
classics = st.one_of(
    st.builds(Exponential, mttf_h=st.floats(0.2, 100.0), L=st.sampled_from([None, 24.0])),
    st.builds(
        Weibull, k=st.floats(0.3, 4.0), lam=st.floats(0.5, 60.0), L=st.sampled_from([None, 24.0])
    ),
    st.builds(
        GompertzMakeham,
        lam=st.floats(1e-4, 1.0),
        alpha=st.floats(1e-8, 0.1),
        beta=st.floats(0.01, 1.0),
        L=st.sampled_from([None, 24.0]),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(bathtubs, classics))
def test_cdf_is_monotone_in_0_1_with_the_deadline_mass(model):
    t = np.linspace(0.0, 30.0, 3001)
    F = model.cdf(t)
    assert F[0] == 0.0
    assert np.all((F >= 0.0) & (F <= 1.0))
    assert np.all(np.diff(F) >= -1e-12)
    assert np.allclose(model.sf(t), 1.0 - F)
    if model.L is not None:
        assert np.all(model.cdf(t[t >= model.L]) == 1.0)
        below = float(model.cdf(np.nextafter(model.L, 0.0)))
        assert model.deadline_mass() == pytest.approx(1.0 - below, abs=1e-9)
    assert np.all(model.pdf(t) >= 0.0)


@settings(max_examples=60, deadline=None)
@given(st.one_of(bathtubs, classics))
def test_integrals_agree_with_quadrature(model):
    # Where the mass is: from the 20% to the 80% quantile of the continuous part ...
    top = float(model.cdf(np.nextafter(model.end_h, 0.0)))
    a, b = (float(model._ppf_c(np.array(q * top))) for q in (0.2, 0.8))
    assert float(model.first_moment(a, b)) == pytest.approx(
        quad_first_moment(model, a, b), rel=2e-3, abs=1e-5
    )
    if model.L is not None:
        from scipy import integrate

        # Across the deadline: the point mass counts as L times its weight ...
        start = 0.5 * model.L
        expected = quad_first_moment(model, start, model.L) + model.L * model.deadline_mass()
        assert float(model.first_moment(start, model.L + 1.0)) == pytest.approx(
            expected, rel=2e-3, abs=1e-5
        )
        # ... and the density integrates to the continuous part of the CDF.
        # (the density's jump where a bathtub's F_c reaches 1 is a breakpoint)
        points = [model.end_h] if model.end_h < model.L else None
        total, _ = integrate.quad(
            lambda x: float(model.pdf(x)), 0.0, model.L, limit=200, points=points
        )
        assert total + model.deadline_mass() == pytest.approx(1.0, abs=2e-3)


def test_a_bathtub_that_saturates_before_the_deadline_checks_against_quadrature():
    # Examples hypothesis found: F_c reaches 1 at ~12.01 h (a sliver past the test's
    # start at L/2) and at ~1.5 h; quadrature without the breakpoint missed the mass.
    for model in (
        Bathtub(A=1.0, tau1=11.65625, tau2=38.5, b=1.0, L=24.0),
        Bathtub(A=1.0, tau1=11.75, tau2=1.5, b=1.0, L=24.0),
    ):
        assert model.deadline_mass() == 0.0
        assert float(model.first_moment(12.0, 25.0)) == pytest.approx(
            quad_first_moment(model, 12.0, 24.0), rel=1e-6, abs=1e-12
        )
        assert float(model.first_moment(0.0, 25.0)) == pytest.approx(
            quad_first_moment(model, 0.0, 24.0), rel=1e-6
        )
    assert Bathtub(A=1.0, tau1=1.0, tau2=18.589314014958017, b=56.42995710170877).cdf(0.0) == 0.0


def test_expected_lifetime_counts_the_deadline_mass():
    model = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
    expected = quad_first_moment(model, 0.0, 24.0) + 24.0 * model.deadline_mass()
    assert model.expected_lifetime_h() == pytest.approx(expected, rel=1e-6)
    assert model.cdf(0.0) == 0.0  # the paper's F(0) = A·e^{-b/tau2} is subtracted
    assert Exponential(2.0).expected_lifetime_h() == 2.0
    assert Exponential(10.0, L=24.0).expected_lifetime_h() == pytest.approx(
        10 * (1 - math.exp(-2.4))
    )


def test_conditional_failure_and_loss():
    model = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
    # A 6-hour job started at 18 h or later runs into the deadline.
    assert np.all(model.conditional_failure([18.0, 20.0], 6.0) == 1.0)
    p = model.conditional_failure(5.0, 2.0)
    assert p == pytest.approx((model.cdf(7.0) - model.cdf(5.0)) / model.sf(5.0))
    loss = float(model.expected_loss_h(5.0, 2.0))
    assert 0.0 < loss < 2.0
    # Memoryless: the conditional failure does not depend on age.
    memoryless = Exponential(5.0)
    assert memoryless.conditional_failure(0.0, 3.0) == pytest.approx(
        memoryless.conditional_failure(7.0, 3.0)
    )


@pytest.mark.parametrize(
    "model",
    [
        Bathtub(A=0.4, tau1=1.5, tau2=0.8, b=22.0, L=24.0),
        Weibull(k=0.6, lam=10.0, L=24.0),
        GompertzMakeham(lam=0.02, alpha=1e-4, beta=0.4, L=24.0),
        Exponential(8.0, L=24.0),
    ],
)
def test_samples_follow_the_model(model):
    draws = model.sample_h(np.random.default_rng(3), 40_000)
    assert np.mean(draws == 24.0) == pytest.approx(model.deadline_mass(), abs=0.01)
    grid = np.linspace(0.5, 23.5, 47)
    empirical = np.searchsorted(np.sort(draws), grid, side="right") / len(draws)
    assert np.max(np.abs(empirical - model.cdf(grid))) < 0.015


def test_kaplan_meier_on_a_small_example():
    # Lifetimes 1, 2+, 3, 4+, 5: S(1) = 4/5, S(3) = 4/5 · 2/3, S(5) = 0.
    km = kaplan_meier(np.array([1, 2, 3, 4, 5.0]), np.array([True, False, True, False, True]))
    assert list(km.times) == [1.0, 3.0, 5.0]
    assert km.survival == pytest.approx([0.8, 0.8 * 2 / 3, 0.0])
    assert km.cdf([0.5, 2.0, 4.0, 6.0]) == pytest.approx([0.0, 0.2, 1 - 0.8 * 2 / 3, 1.0])


def censored_sample(model, n, seed, censor_mean_h=15.0):
    """Lifetimes of `model` with independent user stops (exponential), as the data has."""
    rng = np.random.default_rng(seed)
    life = model.sample_h(rng, n)
    stop = rng.exponential(censor_mean_h, n)
    return np.minimum(life, stop), life <= stop


@pytest.mark.parametrize(
    "truth",
    [
        Bathtub(
            A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0
        ),  # docs/design.md's typical fit: a sharp rise before L
        Bathtub(A=0.4, tau1=1.5, tau2=1.0, b=25.0, L=24.0),
    ],
)
def test_mle_recovers_bathtub_parameters_from_censored_samples(truth):
    t, preempted = censored_sample(truth, 6000, seed=1)
    assert 0.3 < preempted.mean() < 0.8
    result = fit(t, preempted, "bathtub", "mle", L=24.0)
    fitted = result.model
    grid = np.linspace(0.0, 24.0, 481)
    assert np.max(np.abs(fitted.cdf(grid) - truth.cdf(grid))) < 0.025
    assert fitted.A == pytest.approx(truth.A, rel=0.1)
    assert fitted.tau1 == pytest.approx(truth.tau1, rel=0.2)
    assert fitted.deadline_mass() == pytest.approx(truth.deadline_mass(), abs=0.025)
    assert result.ks < 0.03 and result.r2 > 0.99


@pytest.mark.parametrize(
    ("truth", "name"),
    [(Weibull(k=0.7, lam=12.0, L=24.0), "weibull"), (Exponential(9.0, L=24.0), "exponential")],
)
def test_mle_recovers_classic_parameters(truth, name):
    t, preempted = censored_sample(truth, 5000, seed=2)
    fitted = fit(t, preempted, name, "mle", L=24.0).model
    for key, value in truth.parameters.items():
        assert getattr(fitted, key) == pytest.approx(value, rel=0.1), key


@pytest.mark.slow
def test_least_squares_on_preempted_only_is_biased_short_and_mle_is_not():
    truth = Bathtub(A=0.4, tau1=1.5, tau2=1.0, b=25.0, L=24.0)
    t, preempted = censored_sample(truth, 3000, seed=4, censor_mean_h=6.0)
    mle = fit(t, preempted, "bathtub", "mle").model.expected_lifetime_h()
    lsq = fit(t, preempted, "bathtub", "lsq").model.expected_lifetime_h()
    true = truth.expected_lifetime_h()
    assert abs(mle - true) < 0.05 * true
    assert lsq < true - 0.15 * true


def test_deadline_preemptions_are_the_point_mass():
    t = np.array([0.5, 23.9, 24.3, 10.0, 24.5])
    event = np.array([True, True, True, False, False])
    assert list(at_deadline(t, event, 24.0, 0.25)) == [
        0.5,
        24.0,
        24.0,
        10.0,
        np.nextafter(24.0, 0.0),
    ]


def test_models_rebuild_from_their_parameters():
    model = Bathtub(A=0.3, tau1=2.0, tau2=0.7, b=23.0, L=24.0)
    assert make_model("bathtub", model.parameters, 24.0) == model
    assert make_model("none", {}, None) == NoPreemption()
    with pytest.raises(ValueError, match="unknown preemption model"):
        make_model("lognormal", {}, None)
    with pytest.raises(ValueError, match="tau1 must be > 0"):
        Bathtub(A=0.3, tau1=0.0, tau2=1.0, b=23.0)


def test_mean_residual_life_is_memoryless_for_the_exponential_and_shrinks_to_the_deadline():
    exponential = Exponential(mttf_h=5.0)
    assert exponential.mean_residual_life_h([0.0, 3.0, 10.0]) == pytest.approx(5.0, rel=1e-3)
    assert NoPreemption().mean_residual_life_h(7.0) == math.inf
    bathtub = Bathtub(A=0.35, tau1=2.3, tau2=0.8, b=24.0, L=24.0)
    # At age 0 it is the expected lifetime; a VM alive at the deadline has nothing left.
    assert bathtub.mean_residual_life_h(0.0) == pytest.approx(
        bathtub.expected_lifetime_h(), rel=1e-3
    )
    ages = np.array([6.0, 12.0, 18.0, 23.0, 24.0])
    left = bathtub.mean_residual_life_h(ages)
    assert np.all(left <= 24.0 - ages + 1e-9) and left[-1] == 0.0
    assert np.all(np.diff(left[:-1]) < 0)  # in the stable middle and after, life left shrinks


def test_the_drawing_horizon_is_the_deadline_or_where_nearly_all_have_died():
    assert Bathtub(A=0.35, tau1=2.3, tau2=0.8, b=24.0, L=24.0).drawing_horizon_h() == 24.0
    horizon = Exponential(mttf_h=5.0).drawing_horizon_h()
    assert Exponential(mttf_h=5.0).cdf(horizon) >= 0.99 and horizon < 64
    assert Exponential(mttf_h=5.0).drawing_horizon_h(oldest_age_h=100.0) == pytest.approx(110.0)


def _log_likelihood_from_the_definition(model, t, event, window_h):
    """The censored log-likelihood written with cdf, sf and pdf as before the split
    evaluation (policies.preemption.LifetimeModel.split_log_likelihood)."""
    start = model.L - window_h if model.L is not None else math.inf
    at_deadline = t >= start
    early, late, censored = event & ~at_deadline, event & at_deadline, ~event
    if model.L is not None:
        t = np.where(censored, np.minimum(t, model.L - 1e-9), t)
    window_mass = float(model.sf(start)) if late.any() else 1.0
    if window_mass <= 0:
        return -math.inf
    with np.errstate(divide="ignore"):
        total = (
            float(np.sum(np.log(model.pdf(t[early]))))
            + float(late.sum()) * math.log(window_mass)
            + float(np.sum(np.log(model.sf(t[censored]))))
        )
    return total if math.isfinite(total) else -math.inf


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(bathtubs, classics),
    st.lists(
        st.tuples(
            # 0, negative and beyond-the-deadline lifetimes too: the masks cdf and pdf apply
            st.one_of(st.floats(0.0, 30.0), st.sampled_from([0.0, -1.0, 23.9, 24.0, 25.0])),
            st.booleans(),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([0.0, 0.25, 2.0]),
)
def test_the_split_log_likelihood_is_the_definitions_to_the_last_bit(model, rows, window_h):
    t = np.array([lifetime for lifetime, _ in rows])
    event = np.array([preempted for _, preempted in rows])
    expected = _log_likelihood_from_the_definition(model, t, event, window_h)
    assert model.log_likelihood(t, event, window_h) == expected
