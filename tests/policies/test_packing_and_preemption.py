"""Pure policies used by the core: packing arithmetic, cost shares, lifetime sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.packing import PricedType, Shape, cheapest_type, copies_that_fit, zone_allowed
from policies.preemption import Exponential, NoPreemption
from policies.preemption import fit as preemption_fit


def test_copies_that_fit_takes_the_tightest_dimension():
    assert copies_that_fit(Shape(1, 0, 1.0), Shape(8, 0, 4.0)) == 4
    assert copies_that_fit(Shape(2, 1, 1.0), Shape(8, 2, 64.0)) == 2
    assert copies_that_fit(Shape(3, 0, 0.1), Shape(2, 0, 64.0)) == 0
    assert copies_that_fit(Shape(1, 0, 0.1), Shape(1, 0, 0.3)) == 1
    assert copies_that_fit(Shape(0, 0, 0.1), Shape(1, 0, 0.3)) == 3  # 0.1 * 3 fits 0.3


@given(
    st.integers(1, 16),
    st.integers(0, 2),
    st.floats(0.1, 16),
    st.integers(1, 64),
    st.integers(0, 8),
    st.floats(0.5, 256),
)
def test_copies_that_fit_is_exact(cpus, gpus, mem, cap_cpus, cap_gpus, cap_mem):
    job, vm = Shape(cpus, gpus, mem), Shape(cap_cpus, cap_gpus, cap_mem)
    n = copies_that_fit(job, vm)
    assert n == 0 or job.fits_in(vm.minus(job, n - 1))  # n copies fit ...
    assert not Shape(cpus * (n + 1), gpus * (n + 1), mem * (n + 1) - 1e-6).fits_in(
        vm
    )  # ... n + 1 do not


def test_cheapest_type_by_price_per_slot_then_smaller():
    a = PricedType("a", Shape(2, 0, 8.0), 0.02)  # 0.01 per slot
    b = PricedType("b", Shape(4, 0, 16.0), 0.04)  # 0.01 per slot, bigger
    c = PricedType("c", Shape(8, 0, 32.0), 0.10)
    assert cheapest_type(Shape(1, 0, 1.0), [c, b, a]) == (a, 2)
    assert cheapest_type(Shape(1, 0, 1.0), [c, b, a], allowed=["b", "c"]) == (b, 4)
    assert cheapest_type(Shape(16, 0, 1.0), [a, b, c]) is None


def test_zone_allowed_matches_regions_and_their_zones():
    assert zone_allowed("us-central1-c", ["us-central1"])
    assert zone_allowed("us-central1-c", ["us-central1-c"])
    assert not zone_allowed("us-central10-a", ["us-central1"])
    assert zone_allowed("anything", None)


def test_exponential_sampling_matches_its_mean_and_deadline():
    rng = np.random.default_rng(0)
    model = Exponential(mttf_h=5.0)
    assert model.sample_h(rng, 200_000).mean() == pytest.approx(5.0, rel=0.01)
    capped = Exponential(mttf_h=10.0, L=24.0)
    draws = capped.sample_h(rng, 200_000)
    assert draws.max() == 24.0
    assert (draws == 24.0).mean() == pytest.approx(math.exp(-2.4), abs=0.005)
    assert draws.mean() == pytest.approx(capped.expected_lifetime_h(), rel=0.01)
    assert capped.cdf(24.0) == 1.0 and capped.cdf(23.99) < 1.0
    assert np.all(np.diff(capped.cdf(np.linspace(0, 30, 301))) >= 0)


def test_no_preemption_and_the_public_fit():
    assert np.all(np.isinf(NoPreemption().sample_h(np.random.default_rng(0), 3)))
    draws = Exponential(3.0, L=24.0).sample_h(np.random.default_rng(1), 4000)
    result = preemption_fit(draws, np.ones(len(draws), bool), model="exponential")
    assert result.model.mttf_h == pytest.approx(3.0, rel=0.05)
    with pytest.raises(ValueError, match="mttf_h"):
        Exponential(0.0)
