#!/usr/bin/env python3
"""Benchmark: the cost report of a 100,000-job bag (target: <= 1 s).

Runs the real scheduler on a virtual clock (`spotbag simulate`) over 100,000
half-hour 2-vCPU jobs on up to 250 eight-vCPU spot VMs, so four jobs share each VM
and its cost is split among them, with preemptions (exponential lifetimes, 24 h mean,
24 h deadline) and retries. Then, on the resulting SQLite store, times building the
report (the store's queries and the cost arithmetic, as GET /v1/reports does) and
rendering it as CSV and as the self-contained HTML page, and checks that the report's
cost equals the VMs' whole cost (price × life, summed over the VMs). Then times the
bag's view as GET /v1/bags/{id} builds it (controller/costs/bag_cost.py: the first view
computes the report's split, later ones are served from it) and checks that its cost
is the report's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against
from tee import Tee

from controller.config import load_config
from controller.costs import report_render
from controller.costs.bag_cost import BagCosts
from controller.costs.report import CostRule, build_report
from controller.costs.summary import bag_view
from controller.simulation import simulate
from controller.store import Store

N = 100_000
CONFIG = load_config(
    None,
    **{
        "scheduler.max_vms": 250,
        "scheduler.idle_timeout_s": 300.0,
        "preemption.model": "exponential",
        "preemption.mttf_h": 24.0,
        "preemption.max_lifetime_h": 24.0,
        "vm_types": [
            {
                "name": "n2-standard-8",
                "cpus": 8,
                "memory_gb": 32,
                "spot_price_per_hour": 0.0776,
                "on_demand_price_per_hour": 0.3885,
            }
        ],
    },
)
BAG = {
    "account": "bench",
    "command": "run {i}",
    "parameters": {"i": {"range": [0, N]}},
    "resources": {"cpus": 2, "memory_gb": 8},
    "max_runtime_s": 3600,
    "estimated_runtime_s": 1800,
    "max_attempts": 10,
    "simulation": {"runtime_cv": 0.1},
}


async def time_report(db: Path, bag_id: str, now: float, repeat: int = 5) -> float:
    store = Store(db)
    await store.open()
    try:
        times, report = [], None
        for _ in range(repeat):
            started = time.perf_counter()
            report = await build_report(store, bag_id=bag_id, now=now, rule=CostRule.of(CONFIG))
            times.append(time.perf_counter() - started)
    finally:
        await store.close()
    started = time.perf_counter()
    csv_text = report_render.to_csv(report)
    csv_s = time.perf_counter() - started
    started = time.perf_counter()
    page = report_render.to_html(report)
    html_s = time.perf_counter() - started

    with sqlite3.connect(db) as conn:
        vm_cost, attempts = conn.execute(
            "SELECT sum((coalesce(ended_at, :now) - running_at) * spot_price_per_hour / 3600.0), "
            "(SELECT count(*) FROM attempts) FROM vms WHERE running_at IS NOT NULL",
            {"now": now},
        ).fetchone()
    totals = report["totals"]
    print(
        f"report of a {N:,}-job bag ({attempts:,} attempts on {totals['vms']:,} VMs): "
        f"median {statistics.median(times):.3f} s (runs: {', '.join(f'{t:.3f}' for t in times)} s) "
        f"{against(statistics.median(times), 1, 's')}"
    )
    print(
        f"  rendered as CSV in {csv_s * 1000:.1f} ms, as HTML ({len(page) / 1024:,.0f} KiB) "
        f"in {html_s:.2f} s; CSV {len(csv_text):,} bytes"
    )
    print(
        f"  VM-hours {totals['vm_h']:,.1f} (jobs {totals['job_vm_h']:,.1f}, idle "
        f"{totals['idle_vm_h']:,.1f}, spare {totals['spare_vm_h']:,.1f}, unreserved "
        f"{totals['unallocated_vm_h']:,.1f}); cost ${totals['spot_cost_usd']:,.2f} vs on-demand "
        f"${totals['on_demand_cost_usd']:,.2f}: saved {totals['savings_pct']:.1f}%"
    )
    print(
        f"  attempts preempted {totals['preemptions']:,}, VMs preempted "
        f"{totals['vm_preemptions']:,}, hours lost {totals['lost_h']:,.1f}, CPU-hours "
        f"{totals['cpu_h']:,.1f}"
    )
    print(
        f"  the report's cost equals the VMs' whole cost: ${totals['spot_cost_usd']:,.6f} vs "
        f"${vm_cost:,.6f} (difference {abs(totals['spot_cost_usd'] - vm_cost):.2e})"
    )
    return float(totals["spot_cost_usd"])


async def time_bag_view(db: Path, bag_id: str, now: float, report_usd: float) -> None:
    store = Store(db)
    await store.open()
    costs = BagCosts(store, CostRule.of(CONFIG), lambda: now)
    try:
        times, view = [], None
        for _ in range(21):
            started = time.perf_counter()
            bag = await store.get_bag(bag_id)
            assert bag is not None
            view = bag_view(bag, now, (await costs.of([bag_id]))[bag_id])
            times.append(time.perf_counter() - started)
    finally:
        await costs.close()
        await store.close()
    assert view is not None
    usage = view["usage"]
    print(
        f"bag view (GET /v1/bags/{{id}}): first {times[0]:.3f} s (computes the split), then "
        f"median {statistics.median(times[1:]) * 1000:.1f} ms (final: {usage['cost_final']}); "
        f"its cost ${usage['spot_cost_usd']:,.6f} vs the report's ${report_usd:,.6f}"
    )


RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    tee = Tee(sys.stdout)
    sys.stdout = tee
    try:
        run()
    finally:
        sys.stdout = tee.stream
        (RESULTS / "report.txt").write_text("".join(tee.parts))


def run() -> None:
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-report-") as tmp:
        started = time.perf_counter()
        result = asyncio.run(simulate(BAG, CONFIG, seed=1, state_dir=Path(tmp)))
        print(f"simulated the bag in {time.perf_counter() - started:.1f} s wall")
        with sqlite3.connect(Path(tmp) / "spotbag.db") as conn:
            now = conn.execute("SELECT max(ended_at) FROM vms").fetchone()[0]
        report_usd = asyncio.run(time_report(Path(tmp) / "spotbag.db", result.bag["id"], now))
        asyncio.run(time_bag_view(Path(tmp) / "spotbag.db", result.bag["id"], now, report_usd))


if __name__ == "__main__":
    main()
