"""A bag's cost as its views show it is its cost report's (docs/design.md#cost-reports's split-cost
allocation): the real scheduler and store on a virtual clock run two bags whose jobs
reserve unequal shares of the same VMs; at every instant the bag views' cost equals the
report of that instant and a plain re-reading of docs/design.md#cost-reports over the store's rows."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.costs.bag_cost import BagCosts
from controller.costs.report import CostRule, build_report
from controller.costs.summary import bag_view
from controller.store import Store
from policies.allocation import Weights
from tests.controller.simworld import bag, config, run_until, world

BIG = {
    "name": "big",
    "cpus": 8,
    "memory_gb": 32,
    "spot_price_per_hour": 0.12,
    "on_demand_price_per_hour": 0.40,
}
WEIGHTS = {"cpus": 0.9, "memory_gb": 0.1, "gpus": 9.0}  # docs/design.md#cost-reports's defaults


def spec_split(db: Path, now: float) -> dict[str, dict[str, float]]:
    """Each bag's VM-hours, cost and on-demand cost by docs/design.md#cost-reports read literally, with
    usage = reservation: over each stretch of a VM's life in which the same attempts
    run, unit cost = hourly VM cost / Σ(weight × capacity); an attempt's split cost is
    Σ_r (allocated / total) × capacity × unit cost × weight (total: the capacity, or the
    allocations' sum when they exceed it) plus its part of the unused capacity's cost,
    in proportion to its utilisation ratio / (1 - unused ratio). Time no attempt holds
    (no attempt running, or a resource none reserved) is shared among the bags on the
    VM in proportion to their VM-hours on it."""
    with sqlite3.connect(db) as conn:
        reserved = {
            bag_id: {r: json.loads(spec)["resources"].get(r, 0) for r in WEIGHTS}
            for bag_id, spec in conn.execute("SELECT id, spec FROM bags")
        }
        vms = conn.execute(
            "SELECT id, running_at, coalesce(ended_at, :now), cpus, memory_gb, gpus, "
            "CASE WHEN spot THEN spot_price_per_hour ELSE on_demand_price_per_hour END, "
            "on_demand_price_per_hour FROM vms WHERE running_at IS NOT NULL",
            {"now": now},
        ).fetchall()
        attempts = conn.execute(
            "SELECT bag_id, vm_id, started_at, coalesce(ended_at, :now) FROM attempts",
            {"now": now},
        ).fetchall()
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for vm_id, start, end, cpus, memory_gb, gpus, price, on_demand in vms:
        capacity = {"cpus": cpus, "memory_gb": memory_gb, "gpus": gpus}
        mine = [(b, max(s, start), min(e, end)) for b, v, s, e in attempts if v == vm_id and e > s]
        cuts = sorted({start, end, *(s for _, s, _ in mine), *(e for _, _, e in mine)})
        job = defaultdict(lambda: [0.0, 0.0, 0.0])  # per bag on this VM: h, usd, on-demand usd
        nobody = [0.0, 0.0, 0.0]
        for t0, t1 in itertools.pairwise(cuts):
            if not start <= t0 < end:
                continue
            hours = (t1 - t0) / 3600.0
            measures = (hours, hours * price, hours * on_demand)  # the VM over the stretch
            running = [b for b, s, e in mine if s <= t0 < e]
            weighted = sum(WEIGHTS[r] * capacity[r] for r in WEIGHTS)
            for r in WEIGHTS:
                resource_part = WEIGHTS[r] * capacity[r] / weighted  # capacity × unit × weight
                allocated = sum(reserved[b][r] for b in running)
                if allocated == 0:
                    for m in range(3):
                        nobody[m] += resource_part * measures[m]
                    continue
                total = max(capacity[r], allocated)
                unused_ratio = 1 - allocated / total
                for b in running:
                    ratio = reserved[b][r] / total
                    split = ratio + unused_ratio * ratio / (1 - unused_ratio)
                    for m in range(3):
                        job[b][m] += split * resource_part * measures[m]
        job_h = sum(h for h, _, _ in job.values())
        for b, figures in job.items():
            for m, key in enumerate(("vm_h", "spot_cost_usd", "on_demand_cost_usd")):
                out[b][key] += figures[m] + nobody[m] * figures[0] / job_h
    return out


async def two_bags_on_shared_vms(tmp_path: Path):
    cfg = config(**{"scheduler.max_vms": 2, "vm_types": [BIG]})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 3, cfg)
    shapes = {
        "b0000000001": bag(10, 3600, resources={"cpus": 1, "memory_gb": 2}),
        "b0000000002": bag(3, 5400, resources={"cpus": 2, "memory_gb": 8}),
    }
    for bag_id, spec in shapes.items():
        spec["simulation"] = {"runtime_cv": 0.3}
        await admit(
            spec,
            store=scheduler.store,
            scheduler=scheduler,
            catalog=cfg.catalog(),
            bag_id=bag_id,
            now=clock.now(),
            max_jobs=1000,
            offload=False,
        )
    return cfg, clock, scheduler, list(shapes)


async def test_bag_views_cost_what_their_reports_and_spec_7_say_at_every_instant(tmp_path):
    cfg, clock, scheduler, bag_ids = await two_bags_on_shared_vms(tmp_path)
    rule = CostRule.of(cfg)
    costs = BagCosts(scheduler.store, rule, clock.now)
    db = tmp_path / "spotbag.db"
    running_seen = set()
    # Mid-run (attempts of both bags running), after some ended, and long after the end.
    for stop in (1800.0, 5000.0, 7000.0, 40 * 3600.0):
        await run_until(scheduler, clock, stop)
        now = clock.now()
        got = await costs.of(bag_ids)
        spec = spec_split(db, now)
        for bag_id in bag_ids:
            report = await build_report(scheduler.store, bag_id=bag_id, now=now, rule=rule)
            totals = report["totals"]
            cost = got[bag_id]
            assert cost.as_of == now
            assert cost.vm_hours == pytest.approx(totals["vm_h"], rel=1e-12)
            assert cost.spot_cost_usd == pytest.approx(totals["spot_cost_usd"], rel=1e-12)
            assert cost.on_demand_cost_usd == pytest.approx(totals["on_demand_cost_usd"], rel=1e-12)
            assert cost.vm_hours == pytest.approx(spec[bag_id]["vm_h"], rel=1e-9)
            assert cost.spot_cost_usd == pytest.approx(spec[bag_id]["spot_cost_usd"], rel=1e-9)
            assert cost.on_demand_cost_usd == pytest.approx(
                spec[bag_id]["on_demand_cost_usd"], rel=1e-9
            )
            view = bag_view(await scheduler.store.get_bag(bag_id), now, cost)
            assert view["usage"]["spot_cost_usd"] == cost.spot_cost_usd
            assert view["usage"]["vm_hours"] == cost.vm_hours
            assert view["usage"]["cost_as_of"] == now
            # Its attempts' time: the ended ones' kept totals and the running ones so far.
            with sqlite3.connect(db) as conn:
                ((attempt_h, running),) = conn.execute(
                    "SELECT sum(coalesce(ended_at, ?) - started_at) / 3600.0, "
                    "sum(ended_at IS NULL) FROM attempts WHERE bag_id = ?",
                    (now, bag_id),
                ).fetchall()
            assert view["usage"]["attempt_hours"] == pytest.approx(attempt_h, rel=1e-9)
            running_seen.add(running > 0)
    # The jobs shared VMs (both bags on one VM at once), so the split mattered.
    with sqlite3.connect(db) as conn:
        (shared,) = conn.execute(
            "SELECT count(*) FROM attempts a JOIN attempts b ON a.vm_id = b.vm_id "
            "AND a.bag_id < b.bag_id AND a.started_at < b.ended_at AND b.started_at < a.ended_at"
        ).fetchone()
        ((vm_usd, vm_h),) = conn.execute(
            "SELECT sum((ended_at - running_at) * spot_price_per_hour) / 3600.0, "
            "sum(ended_at - running_at) / 3600.0 FROM vms WHERE running_at IS NOT NULL"
        ).fetchall()
    assert shared > 0 and running_seen == {True, False}
    # Everything has ended: the costs are final and the two bags paid the VMs' whole cost.
    assert all(got[b].final for b in bag_ids)
    assert sum(got[b].spot_cost_usd for b in bag_ids) == pytest.approx(vm_usd, rel=1e-12)
    assert sum(got[b].vm_hours for b in bag_ids) == pytest.approx(vm_h, rel=1e-12)
    await scheduler.store.close()


async def test_a_final_cost_is_kept_and_an_expensive_one_is_served_then_refreshed(tmp_path):
    cfg, clock, scheduler, bag_ids = await two_bags_on_shared_vms(tmp_path)
    rule = CostRule.of(cfg)
    store = scheduler.store
    await run_until(scheduler, clock, 1800.0)
    # Every computation counts as expensive: served from what was computed, refreshed in
    # the background after 20 × its duration (at least 1 s), waited for after 60 s.
    costs = BagCosts(store, rule, clock.now, sync_budget_s=-1.0, min_refresh_s=1.0)
    first = (await costs.of(bag_ids[:1]))[bag_ids[0]]
    assert first.as_of == 1800.0 and not first.final
    clock.advance_to(1800.5)
    assert (await costs.of(bag_ids[:1]))[bag_ids[0]] is first  # fresh enough
    clock.advance_to(1830.0)
    assert (await costs.of(bag_ids[:1]))[bag_ids[0]] is first  # stale: refresh started
    await asyncio.gather(*costs._refreshes)
    refreshed = (await costs.of(bag_ids[:1]))[bag_ids[0]]
    assert refreshed.as_of == 1830.0 and refreshed.spot_cost_usd > first.spot_cost_usd
    report = await build_report(store, bag_id=bag_ids[0], now=1830.0, rule=rule)
    assert refreshed.spot_cost_usd == pytest.approx(report["totals"]["spot_cost_usd"], rel=1e-12)
    clock.advance_to(1900.0)  # past max_stale_s: the view waits for a fresh computation
    assert (await costs.of(bag_ids[:1]))[bag_ids[0]].as_of == 1900.0

    # A cheap cost is served for a second, then computed again when a view asks.
    cheap = BagCosts(store, rule, clock.now)
    clock.advance_to(1900.25)
    computed = (await cheap.of(bag_ids))[bag_ids[1]]
    assert computed.as_of == 1900.25
    clock.advance_to(1901.0)
    assert (await cheap.of(bag_ids))[bag_ids[1]] is computed
    clock.advance_to(1901.5)
    assert (await cheap.of(bag_ids))[bag_ids[1]].as_of == 1901.5
    assert not cheap._refreshes  # waited for, not in the background

    # Once the bags and their VMs have ended, the figures never change: kept as they are.
    await run_until(scheduler, clock, 40 * 3600.0)
    final = (await cheap.of(bag_ids))[bag_ids[1]]
    assert final.final
    clock.advance_to(50 * 3600.0)
    assert (await cheap.of(bag_ids))[bag_ids[1]] is final
    await costs.close()
    await store.close()

    # A restart serves the final costs kept in the store, exactly, without splitting
    # again; under other split settings they are computed again.
    store = Store(tmp_path / "spotbag.db")
    await store.open()
    restored = (await BagCosts(store, rule, clock.now).of(bag_ids))[bag_ids[1]]
    assert restored.took_s == 0.0  # read, not computed
    assert (restored.vm_hours, restored.spot_cost_usd, restored.on_demand_cost_usd) == (
        final.vm_hours,
        final.spot_cost_usd,
        final.on_demand_cost_usd,
    )
    assert restored.final and restored.as_of == final.as_of
    other_rule = dataclasses.replace(rule, weights=Weights(cpu=0.5, memory=0.5, gpu=9.0))
    other = (await BagCosts(store, other_rule, clock.now).of(bag_ids))[bag_ids[1]]
    assert other.took_s > 0.0 and other.spot_cost_usd != final.spot_cost_usd
    await store.close()
