"""Cost reports from real runs (the scheduler and store on the virtual clock), checked
against what the store says: the cost is every VM's price × life, the parts add up,
the bags sharing VMs split them exactly, and the hours lost, checkpointing and
CPU-hours equal the bag's own counters and the ledger's charges."""

from __future__ import annotations

import csv
import io
import re

import pytest

from controller.bags.admission import admit
from controller.cli.render import report_tables
from controller.clock import SimClock
from controller.costs import report_render
from controller.costs.report import CostRule, ReportScopeEmpty, build_report
from controller.simulation import simulate
from controller.store import Store
from tests.controller.simworld import bag, config, rows, run_until, world
from tests.controller.test_checkpointing import BATHTUB, checkpointable

HOUR = 3600.0


def vm_totals(state_dir, where: str = "1") -> tuple[float, float, float]:
    """(VM-hours, cost, on-demand cost) of the VMs that ran attempts, from the vms table."""
    return rows(
        state_dir,
        "SELECT sum(ended_at - running_at) / 3600.0, "
        "sum((ended_at - running_at) * spot_price_per_hour) / 3600.0, "
        "sum((ended_at - running_at) * on_demand_price_per_hour) / 3600.0 FROM vms "
        f"WHERE running_at IS NOT NULL AND id IN (SELECT vm_id FROM attempts WHERE {where})",
    )[0]


async def report_of(state_dir, **scope) -> dict:
    store = Store(state_dir / "spotbag.db")
    await store.open()
    try:
        now = rows(state_dir, "SELECT max(ended_at) FROM vms")[0][0]
        return await build_report(store, now=now, rule=CostRule(idle_timeout_s=120.0), **scope)
    finally:
        await store.close()


async def test_a_bag_report_accounts_for_every_vm_second_and_agrees_with_the_store(tmp_path):
    cfg = config(**BATHTUB)
    result = await simulate(checkpointable(30), cfg, seed=5, state_dir=tmp_path)
    usage = result.bag["usage"]
    assert usage["interrupted_attempts"] > 0 and usage["checkpoints"] > 0
    report = await report_of(tmp_path, bag_id=result.bag["id"])
    totals = report["totals"]

    vm_h, cost, on_demand = vm_totals(tmp_path)
    assert totals["vm_h"] == pytest.approx(vm_h, rel=1e-9)
    assert totals["spot_cost_usd"] == pytest.approx(cost, rel=1e-9)
    assert totals["on_demand_cost_usd"] == pytest.approx(on_demand, rel=1e-9)
    assert totals["savings_usd"] == pytest.approx(on_demand - cost, rel=1e-9)
    parts = ("job", "idle", "spare", "unallocated")
    assert sum(totals[f"{p}_cost_usd"] for p in parts) == pytest.approx(cost, rel=1e-12)
    assert sum(totals[f"{p}_vm_h"] for p in parts) == pytest.approx(vm_h, rel=1e-12)
    # VMs wait (boot done, jobs between rounds, the idle timeout) and are not always full.
    assert totals["idle_vm_h"] > 0 and totals["job_vm_h"] < vm_h

    # The bag's own counters and the ledger say the same.
    assert totals["attempts"] == usage["attempts"]
    assert totals["preemptions"] == usage["interrupted_attempts"]
    assert totals["lost_h"] == pytest.approx(usage["lost_hours"], rel=1e-9)
    assert totals["checkpoint_h"] == pytest.approx(usage["checkpoint_hours"], rel=1e-9)
    assert totals["checkpoints"] == usage["checkpoints"]
    charged = rows(tmp_path, "SELECT sum(cpu_h) FROM ledger WHERE kind = 'charge'")[0][0]
    assert totals["cpu_h"] == pytest.approx(charged, rel=1e-9)
    assert totals["vms"] == rows(tmp_path, "SELECT count(DISTINCT vm_id) FROM attempts")[0][0]
    assert (
        totals["vm_preemptions"]
        == rows(
            tmp_path,
            "SELECT count(*) FROM vms WHERE state = 'preempted' AND id IN (SELECT vm_id FROM attempts)",
        )[0][0]
    )

    # Per VM type the figures add up to the totals.
    for name in ("vm_h", "spot_cost_usd", "on_demand_cost_usd", "lost_h", "cpu_h"):
        assert sum(row[name] for row in report["by_vm_type"]) == pytest.approx(totals[name])
    assert sum(row["attempts"] for row in report["by_vm_type"]) == totals["attempts"]
    assert [b["bag_id"] for b in report["by_bag"]] == [result.bag["id"]]

    # CSV: one row per group with every figure; HTML: one page, charts inline, nothing fetched.
    table = list(csv.DictReader(io.StringIO(report_render.to_csv(report))))
    assert [r["section"] for r in table] == ["total"] + ["vm_type"] * len(report["by_vm_type"]) + [
        "bag"
    ]
    assert float(table[0]["spot_cost_usd"]) == pytest.approx(cost, rel=1e-9)
    page = report_render.to_html(report)
    assert page.startswith("<!doctype html>") and page.count("<svg") == 2
    # (Only references within the page: matplotlib's clip paths are url(#id).)
    assert not re.search(r"<script|<link|<img|src=|url\((?!#)|href=\"(?!#)", page)
    assert "Preemption timeline" in page and "Cost by VM type" in page


async def test_bags_sharing_vms_split_their_cost_exactly_and_an_account_report_adds_them(tmp_path):
    # Two accounts' bags of 1-cpu jobs at once: they share the 2-cpu VMs.
    cfg = config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})
    clock = SimClock(1_000_000.0)
    scheduler = await world(tmp_path, clock, 7, cfg)
    ids = []
    for number, (account, n) in enumerate((("a", 9), ("b", 7), ("a", 4)), start=1):
        bag_id = f"b000000000{number}"
        spec = dict(bag(n, runtime_s=2 * HOUR, max_attempts=20), account=account)
        await admit(
            spec,
            store=scheduler.store,
            scheduler=scheduler,
            catalog=cfg.catalog(),
            bag_id=bag_id,
            now=clock.now(),
            max_jobs=100,
            offload=False,
        )
        ids.append(bag_id)
    await run_until(scheduler, clock, clock.now() + 60 * HOUR)
    assert not scheduler.has_work()
    await scheduler.store.close()
    shared = rows(
        tmp_path,
        "SELECT count(*) FROM (SELECT vm_id FROM attempts GROUP BY vm_id "
        "HAVING count(DISTINCT bag_id) > 1)",
    )[0][0]
    assert shared > 0

    reports = [await report_of(tmp_path, bag_id=bag_id) for bag_id in ids]
    _, cost, on_demand = vm_totals(tmp_path)
    assert sum(r["totals"]["spot_cost_usd"] for r in reports) == pytest.approx(cost, rel=1e-9)
    assert sum(r["totals"]["on_demand_cost_usd"] for r in reports) == pytest.approx(
        on_demand, rel=1e-9
    )
    account = await report_of(tmp_path, account="a")
    assert [b["bag_id"] for b in account["by_bag"]] == [ids[0], ids[2]]
    for name in ("vm_h", "spot_cost_usd", "idle_vm_h", "cpu_h", "lost_h"):
        expected = reports[0]["totals"][name] + reports[2]["totals"][name]
        assert account["totals"][name] == pytest.approx(expected, rel=1e-9)
        assert account["by_bag"][1][name] == pytest.approx(reports[2]["totals"][name], rel=1e-9)
    assert account["totals"]["attempts"] == sum(reports[i]["totals"]["attempts"] for i in (0, 2))
    assert len(report_tables(account)) == 2

    with pytest.raises(ReportScopeEmpty):
        await report_of(tmp_path, account="nobody")
    with pytest.raises(ReportScopeEmpty):
        await report_of(tmp_path, bag_id="b0000000099")


def test_sampled_prices_price_each_vm_and_give_the_index_beside():
    import numpy as np

    from controller.costs.report import SampledMarket
    from policies.vm_cost import split_vm_costs

    prices = [
        ("a", "z1", 0.0, 0.02),
        ("a", "z2", 0.0, 0.03),  # a's dearer zone: the index takes a's cheapest
        ("b", "z1", 0.0, 0.06),
        ("a", "z1", 3600.0, 0.04),
        ("b", "z1", 3600.0, 3.0),  # capped (10 × on-demand 0.3): left out of the index
    ]
    sizes = [("a", 2, 2.0, 0.1), ("b", 4, 4.0, 0.3)]
    market = SampledMarket.from_rows(prices, sizes)
    assert market.count == 5
    np.testing.assert_allclose(market.index, [(0.02 / 2 + 0.06 / 4) / 2, 0.04 / 2])
    start, end = np.array([1800.0, 0.0]), np.array([5400.0, 1800.0])
    index_usd = market.index_cost_usd(start, end, np.array([2.0, 2.0]), np.array([2.0, 2.0]))
    np.testing.assert_allclose(index_usd, [(0.0125 * 0.5 + 0.02 * 0.5) * 2, 0.0125 * 0.5 * 2])

    samples = market.vm_price_samples(["a", "a"], ["z1", "z9"], np.array([True, True]), start, end)
    assert samples is not None
    # Only each VM's life's samples: the one in effect at its start and the later ones
    # before its end (VM 1, 0 s to 1800 s, gets one t=0 sample, the later row, and
    # neither t=3600 one).
    assert sorted(zip(samples[0].tolist(), samples[1].tolist(), strict=True)) == [
        (0, 0.0),
        (0, 3600.0),
        (1, 0.0),
    ]
    costs = split_vm_costs(
        start,
        end,
        np.array([[2, 2, 0], [2, 2, 0]], float),
        np.array([0.5, 0.5]),
        np.array([0.1, 0.1]),
        np.zeros(0, dtype=np.int64),
        np.zeros(0),
        np.zeros(0),
        np.zeros((0, 3)),
        price_samples=samples,
    )
    # VM 0 (zone z1): 0.02 for half an hour, then 0.04 for half an hour. VM 1's zone has no
    # series: a's samples of every zone in time order (of the two at t=0, the later row).
    np.testing.assert_allclose(costs.cost_usd, [0.02 * 0.5 + 0.04 * 0.5, 0.03 * 0.5])
