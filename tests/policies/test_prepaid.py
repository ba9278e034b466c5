"""Prepaid vs on-demand cores (docs/design.md#cost-reports): the exact optimum against a brute-force
search over every core count, the residual on hand-computed examples, concavity,
break-even, and the edge cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prepaid import (
    break_even_utilisation,
    optimal_by_core_type,
    optimal_prepaid_cores,
    prepaid_hourly_price,
    residual_on_demand_core_hours,
    savings,
    usage_levels,
)

# --- a brute force that shares nothing with the policy ---------------------------------


def brute_usage(starts, ends, cores, lo, hi):
    """Elementary segments between all clipped endpoints, and the cores in use in each
    one, counted interval by interval at its midpoint (O(n·m), plain Python)."""
    cuts = sorted({lo, hi} | {min(max(t, lo), hi) for t in [*starts, *ends]})
    segments = []
    for a, b in itertools.pairwise(cuts):
        if b <= a:
            continue
        middle = (a + b) / 2
        busy = sum(c for s, e, c in zip(starts, ends, cores, strict=True) if s <= middle < e)
        segments.append((b - a, busy))
    return segments


def brute_residual(segments, x):
    return sum(length * max(0, busy - x) for length, busy in segments)


def brute_search(starts, ends, cores, lo, hi, on_demand, prepaid):
    """Savings for every x from 0 to all cores together; the best x (ties within
    rounding: the largest, as docs/design.md#cost-reports words the rule)."""
    segments = brute_usage(starts, ends, cores, lo, hi)
    everything = brute_residual(segments, 0)
    period = hi - lo
    xs = range(sum(cores) + 2)
    curve = [
        on_demand * (everything - brute_residual(segments, x)) - prepaid * x * period for x in xs
    ]
    best = max(curve)
    tolerance = 1e-9 * (on_demand * everything + 1.0)
    chosen = max(x for x in xs if curve[x] >= best - tolerance)
    return chosen, curve, segments


def random_intervals(rng, n, span=50.0, whole=False, max_cores=6):
    starts = rng.uniform(-5.0, span, n)
    lengths = rng.exponential(span / 6, n)
    if whole:  # integer endpoints: ties between events and exact ties in savings
        starts, lengths = np.round(starts), np.round(lengths)
    cores = rng.integers(0, max_cores + 1, n)
    return starts.tolist(), (starts + lengths).tolist(), cores.tolist()


def check_against_brute_force(starts, ends, cores, lo, hi, on_demand, prepaid):
    usage = usage_levels(starts, ends, cores, lo, hi)
    result = optimal_prepaid_cores(usage, on_demand, prepaid)
    chosen, curve, segments = brute_search(starts, ends, cores, lo, hi, on_demand, prepaid)
    scale = 1e-9 * (on_demand * brute_residual(segments, 0) + 1.0)
    assert result.optimal_cores == chosen
    assert result.savings == pytest.approx(curve[chosen], rel=1e-9, abs=scale)
    peak = max((busy for _, busy in segments), default=0)
    assert result.max_cores == peak
    np.testing.assert_array_equal(result.curve_cores, np.arange(peak + 1))
    np.testing.assert_allclose(result.curve_savings, curve[: peak + 1], rtol=1e-9, atol=scale)
    residual = residual_on_demand_core_hours(usage, np.arange(peak + 3))
    expected = [brute_residual(segments, x) for x in range(peak + 3)]
    np.testing.assert_allclose(residual, expected, rtol=1e-9, atol=1e-9)
    assert result.residual_core_hours == pytest.approx(expected[min(chosen, peak + 2)], abs=1e-9)


# --- acceptance: the exact optimum equals brute force --------------------------------


@pytest.mark.parametrize("whole", [False, True])
def test_the_optimum_equals_brute_force_on_seeded_random_interval_sets(whole):
    rng = np.random.default_rng(20240611 + whole)
    for _ in range(150):
        n = int(rng.integers(1, 25))
        starts, ends, cores = random_intervals(rng, n, whole=whole)
        lo, hi = (0.0, 50.0) if rng.random() < 0.5 else (min(starts), max(ends))
        on_demand = float(rng.uniform(0.01, 2.0))
        prepaid = on_demand * float(rng.choice([0.25, 0.5, 0.6, 0.75, rng.uniform(0.01, 0.99)]))
        check_against_brute_force(starts, ends, cores, lo, hi, on_demand, prepaid)


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.integers(-10, 60), st.integers(0, 30), st.integers(0, 8)
        ),  # start, length, cores
        min_size=0,
        max_size=20,
    ),
    ratio=st.sampled_from([0.1, 0.25, 1 / 3, 0.5, 0.63, 0.75, 0.9, 0.999]),
)
def test_the_optimum_equals_brute_force_on_any_interval_set(jobs, ratio):
    starts = [float(s) for s, _, _ in jobs]
    ends = [float(s + n) for s, n, _ in jobs]
    cores = [c for _, _, c in jobs]
    check_against_brute_force(starts, ends, cores, 0.0, 48.0, 1.0, ratio)


# --- hand-computed examples ------------------------------------------------------------

# Two jobs: 2 cores on [0, 4), 1 core on [2, 6); the period [0, 8).
# u(t) = 2 on [0, 2), 3 on [2, 4), 1 on [4, 6), 0 on [6, 8): 2 h at each of 0, 1, 2, 3.
HAND = ([0.0, 2.0], [4.0, 6.0], [2, 1], 0.0, 8.0)


def test_levels_and_residual_by_hand():
    usage = usage_levels(*HAND)
    assert usage.levels.tolist() == [0, 1, 2, 3]
    assert usage.hours.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert usage.period_h == 8.0
    assert usage.core_hours == 12.0  # 2·4 + 1·4
    assert usage.max_cores == 3
    # R(x) = ∫ max(0, u - x): x=1: (2-1)·2 + (3-1)·2 = 6; x=2: (3-2)·2 = 2; x=2.5: 1.
    assert residual_on_demand_core_hours(usage, [0, 1, 2, 2.5, 3, 10]).tolist() == [
        12.0,
        6.0,
        2.0,
        1.0,
        0.0,
        0.0,
    ]
    assert float(residual_on_demand_core_hours(usage, 1)) == 6.0
    # T(≥x): 8 h with at least 0 cores, 6 h with >= 1, 4 with >= 2, 2 with >= 3.
    assert usage.time_at_least_h(np.arange(5)).tolist() == [8.0, 6.0, 4.0, 2.0, 0.0]


@pytest.mark.parametrize(
    ("prepaid", "optimum", "saved"),
    [
        # threshold ratio·8 h: 0.5 -> 4 h: T(≥2) = 4 reaches it (a tie with x=1: the largest).
        (0.5, 2, 1.0 * (12 - 2) - 0.5 * 2 * 8),
        (0.6, 1, 1.0 * (12 - 6) - 0.6 * 1 * 8),  # 4.8 h: only T(≥1) = 6
        (0.2, 3, 1.0 * 12 - 0.2 * 3 * 8),  # 1.6 h: even the third core
        (0.8, 0, 0.0),  # 6.4 h: no core is busy that long
    ],
)
def test_the_optimum_by_hand(prepaid, optimum, saved):
    result = optimal_prepaid_cores(usage_levels(*HAND), 1.0, prepaid)
    assert result.optimal_cores == optimum
    assert result.savings == pytest.approx(saved)
    assert result.break_even_utilisation == pytest.approx(prepaid)
    assert result.all_core_hours == 12.0
    assert result.all_on_demand_cost == 12.0
    assert result.savings_fraction == pytest.approx(saved / 12.0)


def test_the_period_clips_the_intervals():
    # [1, 5): 2 cores on [1, 4), 1 core on [2, 5): u = 2, 3, 3, 1 -> 1 h at 1 and 2, 2 h at 3.
    usage = usage_levels([0.0, 2.0], [4.0, 6.0], [2, 1], 1.0, 5.0)
    assert usage.levels.tolist() == [1, 2, 3]
    assert usage.hours.tolist() == [1.0, 1.0, 2.0]
    assert usage.core_hours == 9.0
    # Default period: the span of the intervals, [0, 6).
    usage = usage_levels([0.0, 2.0], [4.0, 6.0], [2, 1], None, None)
    assert usage.period_h == 6.0 and usage.hours.tolist() == [2.0, 2.0, 2.0]


def test_epoch_seconds_give_the_same_answer_as_hours():
    rng = np.random.default_rng(5)
    starts, ends, cores = random_intervals(rng, 200, span=500.0)
    base = 1.6e9  # 2020 in epoch seconds
    in_hours = usage_levels(starts, ends, cores, 0.0, 500.0)
    in_seconds = usage_levels(
        base + 3600 * np.array(starts),
        base + 3600 * np.array(ends),
        cores,
        base,
        base + 3600 * 500.0,
        hours_per_unit=1 / 3600,
    )
    np.testing.assert_array_equal(in_seconds.levels, in_hours.levels)
    np.testing.assert_allclose(in_seconds.hours, in_hours.hours, rtol=1e-9, atol=1e-6)


def test_savings_is_on_demand_for_the_covered_hours_minus_the_commitment():
    usage = usage_levels(*HAND)
    x = np.array([0, 1, 2, 3, 4])
    expected = 0.9 * (12 - np.array([12, 6, 2, 0, 0])) - 0.4 * x * 8
    np.testing.assert_allclose(savings(usage, x, 0.9, 0.4), expected)
    assert float(savings(usage, 2, 0.9, 0.4)) == pytest.approx(expected[2])


# --- shape of the curve ---------------------------------------------------------------------


def test_savings_is_concave_and_its_slope_is_the_marginal_rule():
    rng = np.random.default_rng(11)
    starts, ends, cores = random_intervals(rng, 400, span=300.0, max_cores=16)
    usage = usage_levels(starts, ends, cores, 0.0, 300.0)
    result = optimal_prepaid_cores(usage, 0.05, 0.03)
    curve = result.curve_savings
    assert np.all(np.diff(curve, 2) <= 1e-9 * np.abs(curve).max())
    # The x-th core saves c_od·T(≥x) - c_pp·P.
    x = result.curve_cores[1:]
    marginal = 0.05 * usage.time_at_least_h(x) - 0.03 * usage.period_h
    np.testing.assert_allclose(np.diff(curve), marginal, atol=1e-9 * np.abs(curve).max())
    # The optimum: the last core with a non-negative marginal saving.
    k = result.optimal_cores
    assert 0 < k < result.max_cores
    assert marginal[k - 1] >= 0 > marginal[k]
    assert result.savings == pytest.approx(curve.max())
    assert result.optimal_utilisation >= result.break_even_utilisation
    assert result.curve_utilisation[k + 1] < result.break_even_utilisation


def test_a_sampled_curve_keeps_the_exact_optimum():
    rng = np.random.default_rng(3)
    starts, ends, cores = random_intervals(rng, 300, span=100.0, max_cores=40)
    usage = usage_levels(starts, ends, cores, 0.0, 100.0)
    full = optimal_prepaid_cores(usage, 1.0, 0.55)
    sampled = optimal_prepaid_cores(usage, 1.0, 0.55, max_curve_points=11)
    assert sampled.optimal_cores == full.optimal_cores and sampled.savings == full.savings
    assert sampled.curve_cores[0] == 0 and sampled.curve_cores[-1] == full.max_cores
    assert full.optimal_cores in sampled.curve_cores
    assert len(sampled.curve_cores) <= 12
    np.testing.assert_allclose(sampled.curve_savings, full.curve_savings[sampled.curve_cores])


# --- prices -----------------------------------------------------------------------------


def test_break_even_and_upfront_prices():
    assert break_even_utilisation(0.0475, 0.03) == pytest.approx(0.6316, abs=1e-4)
    assert prepaid_hourly_price(262.8, 1) == pytest.approx(0.03)  # 262.8 / 8760
    assert prepaid_hourly_price(262.8, 3) == pytest.approx(0.01)  # 262.8 / 26280
    with pytest.raises(ValueError, match="on-demand price"):
        break_even_utilisation(0.0, 0.03)
    with pytest.raises(ValueError, match="prepaid price"):
        break_even_utilisation(0.05, -0.01)
    with pytest.raises(ValueError, match="upfront"):
        prepaid_hourly_price(-1.0, 1)


@pytest.mark.parametrize("prepaid", [1.0, 1.5])
def test_prepaid_at_or_above_on_demand_buys_nothing(prepaid):
    usage = usage_levels([0.0], [10.0], [4], 0.0, 10.0)  # 4 cores busy all the time
    result = optimal_prepaid_cores(usage, 1.0, prepaid)
    assert result.optimal_cores == 0 and result.savings == 0.0
    assert result.prepaid_never_pays
    assert result.residual_core_hours == 40.0
    assert np.all(result.curve_savings <= 1e-12)


def test_free_prepaid_cores_cover_the_peak():
    usage = usage_levels(*HAND)
    result = optimal_prepaid_cores(usage, 1.0, 0.0)
    assert result.optimal_cores == 3 and result.savings == 12.0 and result.residual_core_hours == 0


# --- edge cases ------------------------------------------------------------------------------


def test_an_empty_history():
    for period in ((None, None), (0.0, 24.0)):
        usage = usage_levels([], [], [], *period)
        result = optimal_prepaid_cores(usage, 0.05, 0.03)
        assert result.optimal_cores == 0 and result.savings == 0.0
        assert result.all_core_hours == 0.0 and result.savings_fraction == 0.0
        assert result.curve_cores.tolist() == [0] and result.curve_savings.tolist() == [0.0]
    assert usage_levels([], [], [], 0.0, 24.0).hours.tolist() == [24.0]


def test_intervals_outside_the_period_count_for_nothing():
    usage = usage_levels([0.0, 30.0], [5.0, 40.0], [8, 8], 10.0, 20.0)
    assert usage.levels.tolist() == [0] and usage.hours.tolist() == [10.0]
    result = optimal_prepaid_cores(usage, 1.0, 0.1)
    assert result.optimal_cores == 0 and result.all_core_hours == 0.0


def test_zero_length_jobs_and_zero_cores_change_nothing():
    plain = usage_levels(*HAND)
    starts, ends, cores, lo, hi = HAND
    padded = usage_levels(
        [*starts, 3.0, 3.0, 1.0], [*ends, 3.0, 3.0, 7.0], [*cores, 50, 7, 0], lo, hi
    )
    np.testing.assert_array_equal(padded.levels, plain.levels)
    np.testing.assert_array_equal(padded.hours, plain.hours)
    # Back-to-back jobs: one ends when the next starts; no spike to 2 at the seam.
    seam = usage_levels([0.0, 5.0], [5.0, 10.0], [1, 1], 0.0, 10.0)
    assert seam.levels.tolist() == [1] and seam.max_cores == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0.0], [1.0, 2.0], [1]), "differ in length"),
        (([2.0], [1.0], [1]), "ends before it starts"),
        (([0.0], [1.0], [-1]), "whole numbers"),
        (([0.0], [1.0], [1.5]), "whole numbers"),
        (([np.nan], [1.0], [1]), "finite"),
        (([0.0], [1.0], [1], 5.0, 2.0), "period"),
    ],
)
def test_bad_intervals_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        usage_levels(*args)


def test_negative_prepaid_cores_are_refused():
    with pytest.raises(ValueError, match="negative"):
        residual_on_demand_core_hours(usage_levels(*HAND), -1)


# --- per core type ---------------------------------------------------------------------


def test_each_core_type_is_its_own_problem_over_the_shared_period():
    rng = np.random.default_rng(8)
    starts, ends, cores = random_intervals(rng, 120, span=100.0)
    types = rng.choice(["c5", "m5", "gpu"], len(starts))
    results = optimal_by_core_type(starts, ends, cores, types, 1.0, 0.45, 0.0, 100.0)
    assert list(results) == ["c5", "gpu", "m5"]
    for name, result in results.items():
        mask = types == name
        subset = [np.asarray(a)[mask] for a in (starts, ends, cores)]
        alone = optimal_prepaid_cores(usage_levels(*subset, 0.0, 100.0), 1.0, 0.45)
        assert result.optimal_cores == alone.optimal_cores
        assert result.savings == pytest.approx(alone.savings)
        assert result.period_h == 100.0
    together = optimal_by_core_type(starts, ends, cores, None, 1.0, 0.45, 0.0, 100.0)
    assert list(together) == ["all"]
    assert together["all"].all_core_hours == pytest.approx(
        sum(r.all_core_hours for r in results.values())
    )
    # The default period is the span of all types together.
    spanned = optimal_by_core_type(starts, ends, cores, types, 1.0, 0.45)
    assert {r.period_h for r in spanned.values()} == {max(ends) - min(starts)}
