"""The hopper's market in the planner and the store: types for new VMs by policy, moves
by the policy's rule, drained VMs, and price samples with retention."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from controller.planner import CatalogType, DemandGroup, Launch, Snapshot, Terminate, VmView, plan
from controller.store import Store
from drivers.base import VmState
from policies.index import Need, Policy, TypeMarket
from policies.packing import Shape

SMALL = CatalogType("small", "z1", Shape(2, 0, 8.0), 0.02)
BIG = CatalogType("big", "z1", Shape(8, 0, 32.0), 0.12)
STEADY = CatalogType("steady", "z1", Shape(2, 0, 8.0), 0.03)
JOB = Shape(2, 0, 4.0)


def market(policy: Policy, now, mean=None, std=None, names=("small", "big", "steady")):
    now = np.array(now, dtype=float)
    return TypeMarket(
        policy=policy,
        names=tuple(names),
        cpus=np.array([2.0, 8.0, 2.0]),
        memory_gb=np.array([8.0, 32.0, 8.0]),
        on_demand=np.array([0.1, 0.4, 0.1]),
        bid=np.array([0.1, 0.4, 0.1]),
        now_price=now,
        mean_price=now if mean is None else np.array(mean, dtype=float),
        std_price=np.zeros(3) if std is None else np.array(std, dtype=float),
    )


def snapshot(m: TypeMarket | None, vms=()) -> Snapshot:
    return Snapshot(
        now=1000.0,
        demand=[DemandGroup("b1", JOB, 1)],
        vms=list(vms),
        catalog=[SMALL, BIG, STEADY],
        alive_vms=len(vms),
        max_vms=10,
        idle_timeout_s=60.0,
        market=m,
    )


def test_without_a_market_the_catalog_price_decides():
    assert plan(snapshot(None)).launches == [Launch("small", 1, "b1")]


def test_the_live_price_decides_under_the_cost_policy():
    # small became dear: 0.09 per one slot; steady 0.03; big 0.12 / 4 slots = 0.03 per slot.
    m = market(Policy.COST, [0.09, 0.12, 0.029])
    assert plan(snapshot(m)).launches == [Launch("steady", 1, "b1")]


def test_balanced_prefers_a_steady_price_to_a_jumpy_cheaper_one():
    m = market(Policy.BALANCED, [0.02, 0.3, 0.03], mean=[0.025, 0.3, 0.03], std=[0.02, 0.0, 0.0005])
    assert plan(snapshot(m)).launches == [Launch("steady", 1, "b1")]
    flat = market(Policy.BALANCED, [0.02, 0.3, 0.03])  # flat prices: the cheapest
    assert plan(snapshot(flat)).launches == [Launch("small", 1, "b1")]


def test_a_type_priced_above_its_bid_is_not_launched():
    m = market(Policy.COST, [0.5, 0.3, 0.2])  # small and steady above their bids (0.1)
    assert plan(snapshot(m)).launches == [Launch("big", 1, "b1")]


def test_moves_follow_each_policys_rule():
    need = Need(2, 4, remaining_h=5.0, migration_h=0.01)
    cost = market(Policy.COST, [0.09, 0.3, 0.03])
    move, why = cost.move_decision(0, 2, need)
    assert move and why.startswith("cost: small 0.0900 -> steady 0.0300")
    assert not cost.move_decision(2, 0, need)[0]  # to a dearer type: never
    short = Need(2, 4, remaining_h=0.001, migration_h=0.01)
    assert not cost.move_decision(0, 2, short)[0]  # not worth it for what is left
    static = dataclasses.replace(cost, policy=Policy.STATIC)
    assert not static.move_decision(0, 2, need)[0]
    revoked = dataclasses.replace(static, now_price=np.array([0.2, 0.3, 0.03]))
    assert static.move_decision(0, 2, need)[1] == "static: stays until revoked"
    assert revoked.move_decision(0, 2, need)[0]  # above its bid: every policy leaves
    # availability: small at 0.09/4 is above the index of the three: it may move.
    availability = dataclasses.replace(cost, policy=Policy.AVAILABILITY)
    assert availability.index_now(2, 4) == pytest.approx((0.09 / 4 + 0.3 / 16 + 0.03 / 4) / 3)
    assert availability.move_decision(0, 2, need)[0]
    calm = dataclasses.replace(availability, now_price=np.array([0.031, 0.3, 0.03]))
    assert calm.move_decision(0, 2, need) == (False, "availability: at or below the index")


def test_a_draining_vm_takes_no_job_and_ends_when_empty():
    def view(jobs: int) -> VmView:
        return VmView(
            "v1",
            "small",
            "z1",
            VmState.RUNNING,
            SMALL.capacity,
            Shape(0, 0, 0.0) if jobs else SMALL.capacity,
            jobs,
            None if jobs else 900.0,
            draining="moving away",
        )

    busy = plan(snapshot(None, [view(1)]))
    assert busy.launches == [Launch("small", 1, "b1")] and not busy.places
    assert busy.terminations == []
    empty = plan(snapshot(None, [view(0)]))
    assert not empty.places and empty.terminations == [Terminate("v1", "drained: moving away")]


async def test_price_samples_are_kept_and_pruned_but_the_price_in_effect_stays(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    rows = [("t", "z", float(at), 0.01 * at) for at in range(1, 11)]
    rows += [("u", "z", 1.0, 0.5)]
    await store.add_price_samples(rows)
    await store.add_price_samples(rows[:3])  # repeats are ignored
    assert len(await store.price_samples(0.0)) == 11
    assert await store.price_samples(9.0, vm_types=["t"]) == [
        ("t", "z", 9.0, pytest.approx(0.09)),
        ("t", "z", 10.0, pytest.approx(0.1)),
    ]
    deleted = await store.prune_price_samples(before=5.5)
    assert deleted == 4  # t at 1..4; t at 5 is the price in effect at 5.5, u's only sample stays
    left = await store.price_samples(0.0)
    assert [(r[0], r[2]) for r in left] == [("u", 1.0)] + [("t", float(a)) for a in range(5, 11)]
    await store.close()


def test_a_packed_vm_moves_only_if_the_vms_its_jobs_need_cost_less():
    # Four jobs on a big VM at 0.12; small VMs hold one each at 0.04: 4 × 0.04 > 0.12.
    m = market(Policy.COST, [0.04, 0.12, 0.05])
    need = Need(8, 16, remaining_h=5.0, migration_h=0.01)
    assert not m.move_decision(1, 0, need, target_vms=4)[0]
    move, why = m.move_decision(1, 0, need, target_vms=2)  # 2 × 0.04 < 0.12
    assert move and "2 × small 0.0800" in why


def test_only_the_latest_sample_of_a_history_counts():
    from controller.hopper import latest_per_series
    from drivers.base import PriceSample

    history = [
        PriceSample("m5.large", "us-east-1a", 0.05, 200.0),
        PriceSample("m5.large", "us-east-1a", 0.03, 100.0),
        PriceSample("m5.large", "us-east-1b", 0.04, 150.0),
    ]
    latest = {(s.zone, s.price_per_hour) for s in latest_per_series(history)}
    assert latest == {("us-east-1a", 0.05), ("us-east-1b", 0.04)}
