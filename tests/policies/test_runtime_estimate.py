"""The runtime estimate: its quantile is numpy.quantile's to the last bit, and a bag's
recent runtimes stay sorted as they come and go."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.scheduler.runs import RECENT_RUNTIMES, RecentRuntimes
from policies.runtime_estimate import quantile_of_sorted, runtime_estimate_s

runtimes = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=300)
@given(
    values=st.lists(runtimes, min_size=1, max_size=60),
    quantile=st.one_of(st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.95, 1.0]), st.floats(0.0, 1.0)),
)
def test_the_quantile_is_numpys_to_the_last_bit(values, quantile):
    expected = float(np.quantile(np.asarray(values, dtype=float), quantile))
    assert quantile_of_sorted(sorted(values), quantile) == expected


def test_the_quantile_of_a_thousand_runtimes_is_numpys():
    rng = random.Random(3)
    for n in (5, 6, 999, 1000):
        values = [rng.lognormvariate(8.0, rng.choice([0.0, 0.1, 2.0])) for _ in range(n)]
        for quantile in (0.9, 0.5, 0.99):
            expected = float(np.quantile(np.asarray(values), quantile))
            assert quantile_of_sorted(sorted(values), quantile) == expected
            assert runtime_estimate_s(values, None, 7200.0, quantile) == expected


def test_the_estimate_trusts_the_hint_until_enough_jobs_finished():
    assert runtime_estimate_s([10.0, 20.0], 3600.0, 7200.0) == 3600.0
    assert runtime_estimate_s([10.0, 20.0], None, 7200.0) == 7200.0
    assert runtime_estimate_s([10.0] * 5, 3600.0, 7200.0) == 10.0


def test_recent_runtimes_keep_the_latest_sorted():
    rng = random.Random(5)
    recent, latest = RecentRuntimes(), deque(maxlen=RECENT_RUNTIMES)
    for _ in range(3 * RECENT_RUNTIMES):
        runtime_s = round(rng.uniform(0, 100), 1)  # ties: one of equal values leaves
        recent.append(runtime_s)
        latest.append(runtime_s)
        assert len(recent) == len(latest)
    assert list(recent.order) == list(latest)
    assert recent.ascending == sorted(latest)
    recent.extend([1.0, 2.0])
    latest.extend([1.0, 2.0])
    assert recent.ascending == sorted(latest)
