"""The fleet's costs (GET /v1/vms: each VM's and the totals) are priced by the reports'
rule: with spot prices recorded that differ from the configured ones, the real
scheduler and store on a virtual clock run one bag alone on its VMs, and at every
instant each VM's cost is the plain integral of its price samples over its billed life,
the fleet totals are the bag's report totals (and per VM type its report's groups), so
a bag alone on its VMs costs what the fleet cost."""

from __future__ import annotations

import bisect
import itertools
import sqlite3
from pathlib import Path

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.costs.fleet_cost import FleetCosts, compute_fleet_cost
from controller.costs.report import CostRule, build_report
from controller.costs.summary import fleet_view
from controller.store import Store
from tests.controller.simworld import bag, config, run_until, world

SMALL = {  # no zone: priced from its type's samples in any zone
    "name": "small",
    "cpus": 2,
    "memory_gb": 4,
    "spot_price_per_hour": 0.02,
    "on_demand_price_per_hour": 0.08,
}
BIG = {
    "name": "big",
    "zone": "z1",
    "cpus": 8,
    "memory_gb": 32,
    "spot_price_per_hour": 0.12,
    "on_demand_price_per_hour": 0.40,
}
# Recorded spot prices, none equal to the configured ones, changing while VMs live.
PRICES = [
    ("small", "z9", 0.0, 0.05),
    ("big", "z1", 0.0, 0.30),
    ("big", "z2", 0.0, 0.01),  # another zone of big: not big's VMs' (they are in z1)
    ("small", "z9", 2000.0, 0.011),
    ("big", "z1", 2500.0, 0.07),
    ("small", "z9", 6000.0, 0.09),
    ("big", "z1", 6000.0, 0.55),
]


def integral_cost(db: Path, now: float) -> dict[str, float]:
    """Each VM's cost read plainly: the price in effect (its type's last sample in its
    zone, else in any zone, at or before t; its configured price before any) integrated
    over running → ended (or now), stretch by stretch."""
    with sqlite3.connect(db) as conn:
        vms = conn.execute(
            "SELECT id, vm_type, zone, running_at, coalesce(ended_at, ?), spot_price_per_hour "
            "FROM vms WHERE running_at IS NOT NULL",
            (now,),
        ).fetchall()
    out = {}
    for vm_id, vm_type, zone, start, end, own in vms:
        samples = [(at, p) for t, z, at, p in PRICES if t == vm_type and z == zone] or [
            (at, p) for t, _, at, p in PRICES if t == vm_type
        ]
        samples.sort(key=lambda s: s[0])
        times = [at for at, _ in samples]
        cuts = sorted({start, end, *(at for at in times if start < at < end)})
        cost = 0.0
        for t0, t1 in itertools.pairwise(cuts):
            k = bisect.bisect_right(times, t0) - 1
            cost += (t1 - t0) / 3600.0 * (samples[k][1] if k >= 0 else own)
        out[vm_id] = cost
    return out


async def test_fleet_and_each_vm_cost_what_the_report_says_under_sampled_prices(tmp_path):
    cfg = config(**{"scheduler.max_vms": 3, "vm_types": [SMALL, BIG]})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 7, cfg)
    store = scheduler.store
    await store.add_price_samples(PRICES)
    spec = bag(6, 3000, resources={"cpus": 1, "memory_gb": 2})
    spec["simulation"] = {"runtime_cv": 0.4}
    bag_id = "b0000000001"
    await admit(
        spec,
        store=store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=bag_id,
        now=clock.now(),
        max_jobs=1000,
        offload=False,
    )
    rule = CostRule.of(cfg)
    fleet_costs = FleetCosts(store, clock.now, min_refresh_s=0.0, stale_factor=0.0)
    checked_live = False
    # VMs alive and jobs running; some ended; long after the end.
    for stop in (1500.0, 4000.0, 7000.0, 30 * 3600.0):
        await run_until(scheduler, clock, stop)
        now = clock.now()
        fleet = await fleet_costs.get()
        assert fleet.as_of == now
        plain = integral_cost(tmp_path / "spotbag.db", now)
        assert set(fleet.vms) == set(plain) and plain
        for vm_id, cost in fleet.vms.items():
            assert cost.cost_usd == pytest.approx(plain[vm_id], rel=1e-9), vm_id
        view = fleet_view(fleet)
        report = await build_report(store, bag_id=bag_id, now=now, rule=rule)
        total, totals = view["total"], report["totals"]
        assert view["cost_as_of"] == now
        assert total["vms"] == totals["vms"]
        assert total["vm_hours"] == pytest.approx(totals["vm_h"], rel=1e-9)
        assert total["spot_cost_usd"] == pytest.approx(totals["spot_cost_usd"], rel=1e-9)
        assert total["on_demand_cost_usd"] == pytest.approx(totals["on_demand_cost_usd"], rel=1e-9)
        assert total["spot_cost_usd"] == pytest.approx(sum(plain.values()), rel=1e-9)
        by_type = {g["vm_type"]: g for g in report["by_vm_type"]}
        for group in view["by_vm_type"]:
            reported = by_type[f"{group['vm_type']} (spot)"]
            assert group["spot_cost_usd"] == pytest.approx(reported["spot_cost_usd"], rel=1e-9)
            assert group["vms"] == reported["vms"]
        checked_live = checked_live or any(
            vm.id in fleet.vms for vm in scheduler.world.vms.values()
        )
    assert checked_live  # some instant had VMs alive (costs still growing)
    assert report["price_samples"] > 0
    # Not the configured prices: those would have given another total.
    with sqlite3.connect(tmp_path / "spotbag.db") as conn:
        configured = conn.execute(
            "SELECT sum((ended_at - running_at) * spot_price_per_hour) / 3600.0 FROM vms "
            "WHERE running_at IS NOT NULL"
        ).fetchone()[0]
    assert abs(configured - total["spot_cost_usd"]) > 0.01 * total["spot_cost_usd"]
    await store.close()


async def test_a_vm_pays_its_series_last_sample_before_it_started_whatever_other_types_did(
    tmp_path,
):
    """Each series' price in effect when the first VM started is in the samples read,
    even when another type was sampled later (before it started): the window is per
    series, so a VM costs the same in any report or fleet view that includes it."""
    store = Store(tmp_path / "spotbag.db")
    await store.open()
    await store.add_price_samples([("a", "z", 0.0, 0.9), ("b", "z", 5.0, 0.1)])
    with sqlite3.connect(tmp_path / "spotbag.db") as conn:
        conn.execute(
            "INSERT INTO vms (id, driver, vm_type, zone, spot, state, cpus, gpus, memory_gb, "
            "spot_price_per_hour, on_demand_price_per_hour, requested_at, running_at, ended_at) "
            "VALUES ('vm-1', 'sim', 'a', 'z', 1, 'ended', 2, 0, 4.0, 0.02, 0.08, 10, 10, 3610)"
        )
    rows = await store.fleet_cost_rows()
    assert [p[:3] for p in rows["prices"]] == [("a", "z", 0.0)]  # b is not a VM's type
    fleet, ended = await compute_fleet_cost(store, 7200.0)
    assert ended == {"vm-1"}
    assert fleet.vms["vm-1"].cost_usd == pytest.approx(0.9)  # not the configured 0.02
    assert fleet.vms["vm-1"].billed_hours == pytest.approx(1.0)
    await store.close()


async def test_kept_fleet_figures_are_computed_again_when_a_vm_starts_or_ends(tmp_path):
    # However fresh by age (here: forever), figures read before a VM started running or
    # ended are not served (make demo showed "0 VMs" after a bag that ran on 4: the
    # start-up computation, slow while the daemon started, was kept 20 times as long).
    cfg = config(**{"scheduler.max_vms": 2, "vm_types": [SMALL]})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 3, cfg)
    store = scheduler.store
    await store.add_price_samples(PRICES)  # integral_cost reads these
    fleet_costs = FleetCosts(store, clock.now, min_refresh_s=1e12, stale_factor=1e12)
    assert (await fleet_costs.get()).vms == {}
    await admit(
        bag(4, 600, resources={"cpus": 1, "memory_gb": 1}),
        store=store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=1000,
        offload=False,
    )
    await run_until(scheduler, clock, 300.0)
    running = {vm.id for vm in scheduler.world.vms.values() if vm.state == "running"}
    assert running
    assert set((await fleet_costs.get()).vms) >= running
    await run_until(scheduler, clock, 4 * 3600.0)
    fleet = await fleet_costs.get()
    plain = integral_cost(tmp_path / "spotbag.db", clock.now())
    assert set(fleet.vms) == set(plain)
    with sqlite3.connect(tmp_path / "spotbag.db") as conn:
        ended = {r[0] for r in conn.execute("SELECT id FROM vms WHERE ended_at IS NOT NULL")}
    assert ended & running  # VMs seen running earlier have ended since
    for vm_id in ended:  # billed to their end, not to the instant of kept figures
        assert fleet.vms[vm_id].cost_usd == pytest.approx(plain[vm_id], rel=1e-9), vm_id
    await store.close()
