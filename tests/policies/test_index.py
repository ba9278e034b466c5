"""Cloud index tracking (policies/index.py) and trace replay (policies/hopping.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.hopping import Fleet, Phase, replay, rolling_mean_std, synthetic_prices
from policies.index import (
    Market,
    Need,
    Policy,
    WindowStats,
    decide,
    gain,
    index_series,
    migration_loss,
    move_pays,
    normalized_prices,
    paper_trigger,
    scores,
    window_stats,
)

CPUS = np.array([2.0, 4.0, 8.0])
MEM = np.array([8.0, 16.0, 32.0])
ON_DEMAND = np.array([0.1, 0.2, 0.4])


def test_normalised_prices_divide_by_the_geometric_size():
    got = normalized_prices(np.array([0.4, 0.8, 1.6]), CPUS, MEM)
    np.testing.assert_allclose(got, [0.1, 0.1, 0.1])


def test_the_index_leaves_out_capped_and_missing_prices_and_non_members():
    prices = np.array(
        [
            [0.4, 0.8, 1.6],  # all normalised 0.1
            [0.4, 2.0, 3.2],  # VM 1 at 10 × on-demand (capped): left out
            [np.nan, 0.8, 3.2],  # VM 0 has no price
        ]
    )
    index = index_series(prices, CPUS, MEM, ON_DEMAND)
    np.testing.assert_allclose(index, [0.1, (0.1 + 0.2) / 2, (0.1 + 0.2) / 2])
    members = np.array([True, False, False])
    np.testing.assert_allclose(index_series(prices, CPUS, MEM, ON_DEMAND, members)[:2], [0.1, 0.1])
    assert math.isnan(index_series(prices, CPUS, MEM, ON_DEMAND, members)[2])


def test_gain_is_what_holding_a_vm_saved_against_the_index():
    prices = np.array([[0.2, 0.8, 1.6], [0.2, 0.8, 1.6]])
    index = index_series(prices, CPUS, MEM, ON_DEMAND)
    g = gain(prices, index, CPUS, MEM)
    # VM 0 costs 0.05 normalised against an index of 0.0833: it gains (0.0833-0.05)×4 per step.
    np.testing.assert_allclose(g[0], 2 * (index[0] - 0.05) * 4)
    # VMs 1 and 2 cost 0.1 normalised, above the index: holding them lost money.
    np.testing.assert_allclose(g[1:], 2 * (index[0] - 0.1) * np.sqrt(CPUS[1:] * MEM[1:]))
    assert g[1] < 0 and g[2] < 0


@given(st.floats(0.01, 5.0), st.floats(0.01, 5.0), st.floats(0.0, 100.0), st.floats(0.0, 1.0))
def test_the_migration_rule_is_saving_over_the_horizon_against_the_loss(p_from, p_to, h, tm):
    pays = bool(move_pays(p_from, p_to, h, tm))
    assert pays == ((p_from - p_to) * h > migration_loss(p_from, p_to, tm))
    if p_to >= p_from:
        assert not pays  # moving to a dearer VM never pays


def test_the_papers_literal_trigger_almost_never_fires():
    # 𝕀 > P̂ᵢ + 2·P̂ⱼ needs the index above twice the target's price plus the current one.
    assert not paper_trigger(0.10, 0.06, 0.05)
    assert paper_trigger(0.30, 0.06, 0.05)


def market(prices) -> Market:
    prices = np.atleast_2d(np.asarray(prices, dtype=float))
    return Market(prices, CPUS, MEM, ON_DEMAND, ON_DEMAND)


NEED = Need(cpus=2, memory_gb=8, remaining_h=10.0, migration_h=30 / 3600)


def test_cost_centric_picks_the_cheapest_per_used_unit_and_moves_when_it_pays():
    m = market([[0.05, 0.06, 0.30]])
    assert decide(Policy.COST, m, NEED, None).target == 0
    m = market([[0.09, 0.06, 0.30]])  # VM 1 became cheaper: moving pays over 10 h
    moved = decide(Policy.COST, m, NEED, current=0)
    assert moved.move and moved.target == 1
    short = Need(2, 8, remaining_h=30 / 3600, migration_h=30 / 3600)
    assert not decide(Policy.COST, m, short, current=0).move  # not over 30 s


def test_a_vm_priced_above_its_bid_is_not_usable_and_forces_a_move():
    m = market([[0.15, 0.06, 0.30]])  # VM 0 above its on-demand price 0.1: revoked
    decision = decide(Policy.STATIC, m, NEED, current=0)
    assert decision.move and decision.target == 1


def test_a_job_that_does_not_fit_is_never_placed():
    big = Need(cpus=6, memory_gb=20, remaining_h=1, migration_h=0.01)
    assert decide(Policy.COST, market([[0.01, 0.02, 0.3]]), big, None).target == 2
    huge = Need(cpus=64, memory_gb=20, remaining_h=1, migration_h=0.01)
    assert decide(Policy.COST, market([[0.01, 0.02, 0.3]]), huge, None).target is None


def test_availability_aware_prefers_the_steadiest_below_the_index_and_stays_below_it():
    rng = np.random.default_rng(1)
    steady = 0.040 + rng.normal(0, 0.0005, 100)
    jumpy = 0.035 + rng.normal(0, 0.01, 100)
    dear = np.full(100, 0.39)
    m = market(np.column_stack([steady, jumpy, dear]))
    assert decide(Policy.AVAILABILITY, m, NEED, None).target == 0
    assert decide(Policy.COST, m, NEED, None).target in (0, 1)
    assert not decide(Policy.AVAILABILITY, m, NEED, current=1).move  # below the index: stay


def test_balanced_takes_the_best_sharpe_ratio():
    rng = np.random.default_rng(2)
    cheap_jumpy = 0.03 + rng.normal(0, 0.012, 200).clip(-0.025, None)
    steady = 0.045 + rng.normal(0, 0.0005, 200)
    m = market(np.column_stack([cheap_jumpy, steady, np.full(200, 0.39)]))
    stats = window_stats(m, NEED)
    assert stats.std_price[0] > 10 * stats.std_price[1]
    assert decide(Policy.BALANCED, m, NEED, None).target == 1


def test_rolling_statistics_match_a_direct_computation():
    rng = np.random.default_rng(3)
    prices = rng.uniform(0.01, 0.1, (50, 3))
    prices[5, 1] = np.nan
    mean, std = rolling_mean_std(prices, 7)
    for t in (0, 3, 6, 20, 49):
        window = prices[max(0, t - 6) : t + 1]
        np.testing.assert_allclose(mean[t], np.nanmean(window, axis=0))
        np.testing.assert_allclose(std[t], np.nanstd(window, axis=0), atol=1e-12)


FLEET = Fleet(("a", "b", "c"), CPUS, MEM, ON_DEMAND, ON_DEMAND)


def test_replay_of_a_flat_market_runs_on_the_cheapest_vm_without_moving():
    prices = np.tile([0.03, 0.08, 0.3], (120, 1))
    result = replay(prices, 1 / 60, FLEET, [Phase(1.0, 2, 8)], Policy.COST, window_steps=30)
    assert result.finished and result.migrations == 0 and result.revocations == 0
    assert result.availability == 1.0
    assert result.cost_usd == pytest.approx(0.03 * 1.0)
    assert result.normalized_cost == pytest.approx(0.3)  # against m-size on demand (0.1)


def test_replay_counts_a_revocation_and_its_downtime():
    prices = np.tile([0.03, 0.08, 0.3], (120, 1))
    prices[60:70, 0] = 0.5  # above its bid (0.1) for 10 minutes
    result = replay(prices, 1 / 60, FLEET, [Phase(math.inf, 2, 8)], Policy.STATIC, window_steps=30)
    assert result.revocations == 1
    assert result.down_h == pytest.approx(90 / 3600)
    assert result.availability == pytest.approx(1 - (90 / 3600) / 2.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(list(Policy)))
def test_replay_accounting_holds_for_any_market(seed, policy):
    rng = np.random.default_rng(seed)
    prices = synthetic_prices(rng, [0.045, 0.085, 0.065], [0.005, 0.005, 0.02], 180)
    phases = [Phase(0.5, 4, 16), Phase(0.5, 2, 8)]
    result = replay(prices, 1 / 60, FLEET, phases, policy, window_steps=30)
    assert result.wall_h == pytest.approx(result.work_h + result.down_h)
    assert 0.0 <= result.availability <= 1.0
    if result.finished:
        assert result.work_h == pytest.approx(1.0, abs=1 / 60)
    steps = result.vm_steps[result.vm_steps >= 0]
    assert result.migrations <= np.count_nonzero(np.diff(steps)) + result.revocations
    if policy is Policy.STATIC:
        assert result.migrations == result.revocations


def test_window_statistics_index_matches_the_index_series():
    rng = np.random.default_rng(4)
    prices = rng.uniform(0.01, 0.5, (40, 3))
    prices[3, 0] = np.nan
    prices[7, 1] = 2.0  # capped (10 × 0.2)
    m = market(prices)
    need = Need(cpus=4, memory_gb=16, remaining_h=1, migration_h=0.01)
    stats = window_stats(m, need)
    fits = (CPUS >= 4) & (MEM >= 16)
    series = index_series(prices, CPUS, MEM, ON_DEMAND, fits)
    assert stats.index_now == pytest.approx(series[-1])
    assert stats.index_mean == pytest.approx(np.nanmean(series))
    np.testing.assert_allclose(stats.mean_price, np.nanmean(prices, axis=0))
    np.testing.assert_allclose(stats.std_price, np.nanstd(prices, axis=0))


def _rough_market(seed: int, steps: int) -> tuple[Fleet, np.ndarray]:
    """Five VM types whose prices jump, go missing (NaN) and rise far above their bids."""
    fleet = Fleet(
        ("a", "b", "c", "d", "e"),
        np.array([2.0, 4, 4, 8, 16]),
        np.array([8.0, 16, 30, 32, 64]),
        np.array([0.1, 0.2, 0.25, 0.4, 0.8]),
        np.array([0.1, 0.2, 0.25, 0.4, 0.8]),
    )
    rng = np.random.default_rng(seed)
    prices = synthetic_prices(
        rng, [0.04, 0.07, 0.09, 0.15, 0.3], [0.03, 0.05, 0.04, 0.1, 0.2], steps
    )
    prices[rng.random(prices.shape) < 0.02] = np.nan
    prices[rng.random(prices.shape) < 0.01] *= 40
    return fleet, prices


@pytest.mark.parametrize("policy", list(Policy))
def test_a_replay_scores_every_step_as_one_decision_does(policy):
    """The replay computes the policy's scores for a block of steps at once: at every
    step, the best VM, whether it is usable at all, and the usable VMs are those of
    `scores` over that step alone (the same element-wise arithmetic)."""
    from policies.hopping import _SCORE_BLOCK, _need_series

    steps = _SCORE_BLOCK + 500  # two blocks
    fleet, prices = _rough_market(3, steps)
    mean, std = rolling_mean_std(prices, 12)
    series = _need_series(prices, mean, std, fleet, policy, 4.0, 16.0, 12, 10.0)
    need = Need(4.0, 16.0, 10.0, 0.01)
    for t in range(steps):
        best, best_usable, usable = series.at(t)
        now = prices[t]
        market = Market(now[None, :], fleet.cpus, fleet.memory_gb, fleet.on_demand, fleet.bid)
        expected_usable = (
            series.fits & ~np.isnan(now) & (np.nan_to_num(now, nan=np.inf) <= fleet.bid)
        )
        stats = WindowStats(
            series.fits,
            expected_usable,
            now,
            mean[t],
            std[t],
            float(series.index[t]),
            float(series.index_mean[t]),
        )
        score = scores(policy, market, need, stats)
        assert best == int(np.argmin(score))
        assert best_usable == bool(np.isfinite(score[best]))
        assert usable.tolist() == expected_usable.tolist()


# (policy, paper's trigger) -> cost, migrations, revocations, work hours: printed by the
# replay before it scored steps in blocks (d7824d8), on _rough_market(0, 3000).
ROUGH_REPLAYS = {
    ("static", False): ("17.902804810990574", 1, 75, "247.7000000000107"),
    ("cost", False): ("8.840857557649981", 1958, 72, "231.4666666666614"),
    ("cost", True): ("26.499120471824323", 306, 101, "244.5083333333412"),
    ("availability", False): ("12.847847677742765", 1112, 69, "238.59166666666798"),
    ("balanced", False): ("14.220047941751753", 296, 72, "245.31666666667488"),
    ("balanced", True): ("18.365635303381506", 85, 72, "247.07500000001008"),
}


@pytest.mark.parametrize("key", sorted(ROUGH_REPLAYS))
def test_replays_of_a_rough_market_are_those_of_the_previous_code(key):
    policy, literal = key
    fleet, prices = _rough_market(0, 3000)
    result = replay(
        prices,
        1 / 12,
        fleet,
        [Phase(20, 2, 8), Phase(30, 4, 30), Phase(math.inf, 2, 4)],
        Policy(policy),
        window_steps=12,
        decide_every=1,
        literal_trigger=literal,
        keep_log=True,
        start_step=5,
    )
    cost, migrations, revocations, work_h = ROUGH_REPLAYS[key]
    assert (repr(result.cost_usd), result.migrations, result.revocations, repr(result.work_h)) == (
        cost,
        migrations,
        revocations,
        work_h,
    )
