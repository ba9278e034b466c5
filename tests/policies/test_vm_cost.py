"""policies.vm_cost against a brute-force reference (split_costs on every interval
between events, one VM at a time), hand-worked examples, and conservation: each VM's
attempts + idle + spare + unallocated add up to its cost, hours and on-demand cost."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.allocation import split_costs
from policies.vm_cost import split_vm_costs


def reference(vms, attempts, samples, idle_timeout_s):
    """Per attempt (vm_h, cost, on-demand) and per VM (idle, spare, unallocated) hours
    and costs, by walking every VM's intervals."""
    per_attempt = np.zeros((len(attempts), 3))
    per_vm = np.zeros((len(vms), 9))
    for v, (start, end, cap, paid, od) in enumerate(vms):
        mine = [
            (j, max(start, min(s, end)), min(end, max(e, max(start, min(s, end)))), res)
            for j, (vm, s, e, res) in enumerate(attempts)
            if vm == v
        ]
        # Samples at one time: the last given wins.
        changes = sorted(
            ((max(at, start), at, p) for vm, at, p in samples if vm == v and at < end),
            key=lambda c: c[:2],
        )
        bounds = sorted(
            {start, end, *(c[0] for c in changes), *(x for _, s, e, _ in mine for x in (s, e))}
        )
        idle_since = start
        for lo, hi in itertools.pairwise(bounds):
            price = paid
            for at_clipped, _, p in changes:
                if at_clipped <= lo:
                    price = p
            hours = (hi - lo) / 3600.0
            active = [(j, res) for j, s, e, res in mine if s <= lo and e >= hi and e > s]
            if not active:
                idle = min(hours, max(0.0, idle_timeout_s - (lo - idle_since)) / 3600.0)
                per_vm[v, 0:3] += np.array([idle, idle * price, idle * od])
                spare = hours - idle
                per_vm[v, 3:6] += np.array([spare, spare * price, spare * od])
                continue
            idle_since = hi
            for measure, rate in ((0, 1.0), (1, price), (2, od)):
                split = split_costs(cap, rate * hours, np.array([res for _, res in active]))
                for (j, _), cost in zip(active, split.job_cost, strict=True):
                    per_attempt[j, measure] += cost
                per_vm[v, 6 + measure] += float(split.unallocated)
    return per_attempt, per_vm


def run(vms, attempts, samples=(), idle_timeout_s=0.0):
    vm_cols = list(zip(*vms, strict=True))
    a_cols = list(zip(*attempts, strict=True)) if attempts else [[], [], [], np.zeros((0, 3))]
    s_cols = list(zip(*samples, strict=True)) if samples else None
    return split_vm_costs(
        np.array(vm_cols[0], float),
        np.array(vm_cols[1], float),
        np.array(vm_cols[2], float),
        np.array(vm_cols[3], float),
        np.array(vm_cols[4], float),
        np.array(a_cols[0], dtype=np.int64),
        np.array(a_cols[1], float),
        np.array(a_cols[2], float),
        np.array(a_cols[3], float).reshape(-1, 3),
        idle_timeout_s=idle_timeout_s,
        price_samples=None
        if s_cols is None
        else (
            np.array(s_cols[0], np.int64),
            np.array(s_cols[1], float),
            np.array(s_cols[2], float),
        ),
    )


HOUR = 3600.0
VM8 = ([8, 32, 0], 0.80, 2.0)


def test_two_jobs_overlapping_for_an_hour_share_that_hour_and_pay_alone_otherwise():
    # One 8-vCPU/32 GB VM at $0.80/h from 0 to 4 h; two 4-vCPU/16 GB jobs, [0, 2 h) and
    # [1 h, 3 h). Each reserves half of everything: alone it pays the whole VM (the
    # unused half is shared by utilisation, and it is the only user); together, half.
    vms = [(0.0, 4 * HOUR, *VM8)]
    half = [4, 16, 0]
    costs = run(vms, [(0, 0.0, 2 * HOUR, half), (0, HOUR, 3 * HOUR, half)], idle_timeout_s=600)
    # Job 0: 1 h alone (0.80) + 1 h shared (0.40); job 1: 1 h shared + 1 h alone.
    assert costs.attempt_cost_usd == pytest.approx([1.20, 1.20])
    assert costs.attempt_vm_h == pytest.approx([1.5, 1.5])
    assert costs.attempt_on_demand_usd == pytest.approx([3.0, 3.0])
    # The last hour is idle: 10 minutes idle, 50 minutes spare.
    assert costs.idle_h == pytest.approx([1 / 6]) and costs.spare_h == pytest.approx([5 / 6])
    assert costs.idle_cost_usd + costs.spare_cost_usd == pytest.approx([0.80])
    assert costs.cost_usd == pytest.approx([3.20]) and costs.unallocated_h == pytest.approx([0.0])


def test_a_cpu_job_on_a_gpu_vm_leaves_the_gpu_cost_unallocated():
    # 4 vCPU, 16 GB, 1 GPU: weights 0.9·4 + 0.1·16 + 9·1 = 14.2; the GPU is 9/14.2.
    vms = [(0.0, HOUR, [4, 16, 1], 1.42, 3.0)]
    costs = run(vms, [(0, 0.0, HOUR, [4, 16, 0])])
    assert costs.unallocated_cost_usd == pytest.approx([1.42 * 9 / 14.2])
    assert costs.attempt_cost_usd == pytest.approx([1.42 * 5.2 / 14.2])
    assert costs.idle_h == pytest.approx([0.0])


def test_price_samples_change_the_price_mid_life():
    vms = [(0.0, 2 * HOUR, *VM8)]
    costs = run(vms, [(0, 0.0, 2 * HOUR, [8, 32, 0])], samples=[(0, -5.0, 0.5), (0, HOUR, 1.0)])
    assert costs.cost_usd == pytest.approx([1.5]) and costs.attempt_cost_usd == pytest.approx([1.5])


def test_attempts_of_no_length_and_bad_input():
    costs = run([(0.0, HOUR, *VM8)], [(0, 50.0, 50.0, [8, 32, 0]), (0, 10.0, 5.0, [1, 1, 0])])
    assert costs.attempt_cost_usd.tolist() == [0.0, 0.0]
    assert costs.idle_cost_usd + costs.spare_cost_usd == pytest.approx([0.8])
    with pytest.raises(ValueError, match="attempt_vm"):
        split_vm_costs([0], [1], [[1, 1, 0]], [1], [1], [3], [0], [1], [[1, 1, 0]])
    with pytest.raises(ValueError, match="vm_end_s"):
        split_vm_costs([5], [1], [[1, 1, 0]], [1], [1], [], [], [], np.zeros((0, 3)))
    with pytest.raises(ValueError, match="attempt_reserved"):
        split_vm_costs([0], [1], [[1, 1, 0]], [1], [1], [0], [0], [1], [[-1, 1, 0]])


def test_no_vms_split_nothing():
    # A bag whose jobs have not run yet: its report, and so its view, costs nothing.
    costs = split_vm_costs([], [], np.zeros((0, 3)), [], [], [], [], [], np.zeros((0, 3)))
    assert costs.attempt_cost_usd.shape == costs.cost_usd.shape == costs.idle_h.shape == (0,)


times = st.integers(0, 20).map(lambda k: k * 900.0)
resources = st.tuples(st.integers(0, 8), st.integers(0, 32), st.integers(0, 2)).map(list)


@st.composite
def worlds(draw):
    n_vms = draw(st.integers(1, 4))
    vms = []
    for _ in range(n_vms):
        a, b = sorted(draw(st.tuples(times, times)))
        cap = draw(resources)
        vms.append((a, b, cap, draw(st.floats(0, 5)), draw(st.floats(0, 10))))
    attempts = [
        (draw(st.integers(0, n_vms - 1)), *sorted(draw(st.tuples(times, times))), draw(resources))
        for _ in range(draw(st.integers(0, 10)))
    ]
    samples = [
        (draw(st.integers(0, n_vms - 1)), draw(times) - 1000.0, draw(st.floats(0, 5)))
        for _ in range(draw(st.integers(0, 4)))
    ]
    return vms, attempts, samples, draw(st.sampled_from([0.0, 600.0, 3600.0]))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_matches_the_brute_force_split_and_adds_up_per_vm(world):
    vms, attempts, samples, timeout = world
    costs = run(vms, attempts, samples, timeout)
    per_attempt, per_vm = reference(vms, attempts, samples, timeout)
    got = np.stack([costs.attempt_vm_h, costs.attempt_cost_usd, costs.attempt_on_demand_usd], 1)
    assert got == pytest.approx(per_attempt.reshape(got.shape), rel=1e-9, abs=1e-9)
    mine = np.stack(
        [
            costs.idle_h, costs.idle_cost_usd, costs.idle_on_demand_usd,
            costs.spare_h, costs.spare_cost_usd, costs.spare_on_demand_usd,
            costs.unallocated_h, costs.unallocated_cost_usd, costs.unallocated_on_demand_usd,
        ],
        1,
    )  # fmt: skip
    assert mine == pytest.approx(per_vm, rel=1e-9, abs=1e-9)
    vm_of = np.array([a[0] for a in attempts], dtype=np.int64)
    for measure, attempt_part, total in (
        ("h", costs.attempt_vm_h, costs.life_h),
        ("cost_usd", costs.attempt_cost_usd, costs.cost_usd),
        ("on_demand_usd", costs.attempt_on_demand_usd, costs.on_demand_usd),
    ):
        summed = np.bincount(vm_of, attempt_part, minlength=len(vms)) + sum(
            getattr(costs, f"{part}_{measure}") for part in ("idle", "spare", "unallocated")
        )
        assert summed == pytest.approx(total, rel=1e-9, abs=1e-9)
