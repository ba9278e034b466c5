"""What every VM has cost so far, and the fleet's totals (GET /v1/vms, so `spotbag
vms`, `spotbag status`'s "all VMs" line and `spotbag simulate`'s summary), priced by the
reports' rule (controller/costs/report.py `vm_costs`: docs/design.md#cost-reports's price paid, which for a
spot VM is its type's sampled spot price while price samples exist): so the fleet total
equals the sum of the reports of all bags, and a bag alone on its VMs costs what the
fleet cost.

    cost_usd(vm)           = ∫ p(t) dt over its billed life (running → ended, or T)
    on_demand_cost_usd(vm) = billed_hours × its on-demand price
    fleet totals           = Σ over every VM that ran, and per VM type

as of an instant T (`FleetCost.as_of`). An ended VM's cost never changes, so it is
priced once and kept; later computations price only the VMs still running or new since.
Pricing all of them takes time (5,000 VMs over a month of samples of 30 series: ~1.3 s
the first time; with 100 of them alive, started within a day, ~0.1 s after that), so
the figures are kept and refreshed by the rule of the bag views' costs
(controller/costs/bag_cost.py): served while younger than `stale_factor` × the time computing
them took (and at least `min_refresh_s`); older and cheap (at most `sync_budget_s`),
computed again, T = now; older and expensive, served at once while one refresh runs in
the background, unless older than `max_stale_s`. Whenever a VM has started running or
ended since the kept figures were read (`Store.vm_set_fingerprint`), they are computed
again before they are served: the list of VMs is never stale, only live VMs' growing
costs may be (by as much as the rule above allows; `cost_as_of` says as of when). The SQL runs in the store's reader
pool, the arithmetic and the sums in a thread: never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.costs.report import vm_costs
from controller.costs.shared_result import settle
from controller.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VmCost:
    """One VM's billed life up to `FleetCost.as_of` and what it cost over it."""

    vm_type: str
    preempted: bool
    billed_hours: float
    cost_usd: float  # at the price it paid (sampled spot prices, else its own)
    on_demand_cost_usd: float  # the same hours at its on-demand price


@dataclass(frozen=True, slots=True)
class FleetCost:
    """Every VM that ran, by id, and their sums (`totals`), as of `as_of`."""

    vms: dict[str, VmCost]
    totals: dict[str, Any]  # "total" and "by_vm_type": see `totals_of`
    as_of: float  # the instant (epoch seconds) the figures are of
    took_s: float  # wall time of the computation that gave it
    vm_set: tuple = ()  # Store.vm_set_fingerprint() when it was read


def totals_of(vms: Mapping[str, VmCost]) -> dict[str, Any]:
    """Sums over the VMs, in all ("total") and per VM type ("by_vm_type"): how many,
    how many were preempted, VM-hours (billed life, idle included), their cost and
    on-demand cost."""
    total: dict[str, Any] = {
        "vms": 0,
        "vms_preempted": 0,
        "vm_hours": 0.0,
        "spot_cost_usd": 0.0,
        "on_demand_cost_usd": 0.0,
    }
    types: dict[str, dict[str, Any]] = {}
    for vm in vms.values():
        entry = types.get(vm.vm_type)
        if entry is None:
            entry = types[vm.vm_type] = {"vm_type": vm.vm_type} | {
                k: 0 * v for k, v in total.items()
            }
        for group in (entry, total):
            group["vms"] += 1
            group["vms_preempted"] += int(vm.preempted)
            group["vm_hours"] += vm.billed_hours
            group["spot_cost_usd"] += vm.cost_usd
            group["on_demand_cost_usd"] += vm.on_demand_cost_usd
    return {"total": total, "by_vm_type": [types[name] for name in sorted(types)]}


def fleet_cost_of(
    rows: dict[str, list[tuple]], now: float, final: Mapping[str, VmCost]
) -> tuple[dict[str, VmCost], dict[str, Any]]:
    """Each VM's cost as of `now`: those of `final`, and those of
    `Store.fleet_cost_rows()` priced now; and their totals."""
    costs = vm_costs(rows["vms"], rows["prices"], now)
    vms = dict(final)
    for vm, life_h, usd, od in zip(
        rows["vms"], costs.life_h, costs.cost_usd, costs.on_demand_usd, strict=True
    ):
        vms[vm[0]] = VmCost(vm[1], vm[4] == "preempted", float(life_h), float(usd), float(od))
    return vms, totals_of(vms)


async def compute_fleet_cost(
    store: Store, now: float, final: Mapping[str, VmCost] | None = None
) -> tuple[FleetCost, set[str]]:
    """The fleet's costs as of `now`, computed now (off the event loop), and the VMs
    among them that had ended (whose cost never changes). VMs in `final` are taken
    from it, not priced again."""
    started = time.perf_counter()
    known = final or {}
    rows = await store.fleet_cost_rows(known=frozenset(known))
    ended = {vm[0] for vm in rows["vms"] if vm[13] is not None}
    vms, totals = await asyncio.to_thread(fleet_cost_of, rows, now, known)
    return FleetCost(vms, totals, now, time.perf_counter() - started, rows["fingerprint"]), ended


class FleetCosts:
    """The daemon's fleet costs: computed as the module says, kept, refreshed."""

    def __init__(
        self,
        store: Store,
        now: Callable[[], float],
        *,
        sync_budget_s: float = 0.05,
        stale_factor: float = 20.0,
        min_refresh_s: float = 1.0,
        max_stale_s: float = 60.0,
    ) -> None:
        self.store, self.now = store, now
        self.sync_budget_s = sync_budget_s
        self.stale_factor = stale_factor
        self.min_refresh_s = min_refresh_s
        self.max_stale_s = max_stale_s
        self._kept: FleetCost | None = None
        # Ended VMs' costs: computed once (a month of price samples over thousands of
        # VMs takes ~1 s to price; the few live VMs, milliseconds).
        self._final: dict[str, VmCost] = {}
        # One computation at a time: views that need it meanwhile await it.
        self._computing: asyncio.Future[tuple[FleetCost, set[str]]] | None = None
        self._refresh: asyncio.Task[Any] | None = None

    async def get(self) -> FleetCost:
        kept = self._kept
        # A VM that started or ended since: the kept figures would leave it out or bill
        # it as running, so they are computed again (cheap: ended VMs are priced once),
        # however young they are or long the last computation took (the first, at
        # start-up, prices every VM that ever ran).
        if kept is not None and await self.store.vm_set_fingerprint() != kept.vm_set:
            return await self._compute()
        if kept is not None:
            age_s = self.now() - kept.as_of
            fresh = age_s <= max(self.min_refresh_s, self.stale_factor * kept.took_s)
            expensive = kept.took_s > self.sync_budget_s
            if fresh:
                return kept
            if expensive and age_s <= self.max_stale_s:
                self.refresh_in_background()
                return kept
        return await self._compute()

    def refresh_in_background(self) -> None:
        """Start one computation, unless one runs (at start-up: the first prices every
        VM that ever ran, which the first view then need not wait for in full)."""
        if self._computing is None and self._refresh is None:
            self._refresh = asyncio.create_task(self._compute(), name="fleet cost")
            self._refresh.add_done_callback(self._refresh_done)

    async def close(self) -> None:
        """Stop a background refresh (before the store closes)."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)

    def _refresh_done(self, task: asyncio.Task[Any]) -> None:
        self._refresh = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("refreshing the fleet's cost failed: %s", task.exception())

    async def _compute(self) -> FleetCost:
        if self._computing is not None:
            fleet, _ = await asyncio.shield(self._computing)
            return fleet
        future: asyncio.Future[tuple[FleetCost, set[str]]]
        future = asyncio.get_running_loop().create_future()
        self._computing = future
        try:
            fleet, ended = await settle(
                future, compute_fleet_cost(self.store, self.now(), self._final)
            )
        finally:
            self._computing = None
        self._final.update((vm_id, fleet.vms[vm_id]) for vm_id in ended)
        if self._kept is None or fleet.as_of >= self._kept.as_of:
            self._kept = fleet
        return fleet
