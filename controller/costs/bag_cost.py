"""Each bag's cost as its views show it (GET /v1/bags and /v1/bags/{id}, so `spotbag
status`, the web UI's bag page and `spotbag simulate`): the figures of the bag's cost
report (controller/costs/report.py: docs/design.md#cost-reports's split-cost allocation, policies/vm_cost.py),
computed by the same function from the same rows, so a view and a report of the same
instant never disagree.

What "so far" means: a bag's cost as of an instant T (`usage.cost_as_of`) is its report
generated at T. Every attempt on the VMs the bag's jobs used counts up to T (one still
running as if it ended at T), and each such VM's life up to T is split: at every
instant among the attempts running on it then, by their reservations (so an attempt's
cost over a past interval is fixed once that interval is past, whoever comes later),
with the VM's idle, spare and unreserved time up to T shared among the bags that used
it in proportion to their VM-hours on it. That last share moves while any of the VMs
lives on — also after the bag finished, while its VMs serve other bags — so a bag's
cost is final only when the bag and every VM its jobs ran on have ended.

How T relates to now (the computation takes ~1 ms for a small bag, ~0.6-1 s for a
100,000-job bag, so it is not run for every view):
- final: computed once and kept, in memory (the most recent MAX_ENTRIES bags) and in
  the store (`final_bag_costs`, with the split's settings: a change of `[cost]`
  weights or of the idle timeout computes it again), so a restart serves it as it
  was, exactly, without splitting a large bag again.
- fresh: the last figures are served while they are younger than `stale_factor` ×
  the time computing them took, and at least `min_refresh_s` (1 s).
- older, cheap (the last computation took at most `sync_budget_s`): the view waits
  for a new computation, T = now.
- older, expensive: the view gets the last figures at once and starts one refresh in
  the background, unless they are older than `max_stale_s`, when it waits for a new
  computation. So now - T <= max_stale_s (plus one computation's duration), and a
  bag polled steadily is recomputed at most once per stale_factor × its duration
  (5% of one CPU with the default 20: a 100,000-job bag watched in the web UI is
  re-split every ~15-20 s).
The SQL runs in the store's reader pool and the arithmetic in a thread: never on the
event loop. A cost not yet final is not kept in the store: after a restart the first
view computes it again from the same rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.costs.report import CostRule, compute_report
from controller.costs.shared_result import settle
from controller.errors import SpotbagError
from controller.states import BagState
from controller.store import Store

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096  # bags whose figures are kept


@dataclass(frozen=True, slots=True)
class BagCost:
    """A bag's share of its VMs (docs/design.md#cost-reports) as of `as_of`."""

    vm_hours: float  # its attempts' split VM-hours plus its share of idle, spare, unreserved
    spot_cost_usd: float  # what that cost at the prices paid
    on_demand_cost_usd: float  # the same VM-hours at the on-demand price
    as_of: float  # the instant (epoch seconds) the figures are of
    final: bool  # the bag and every VM its jobs ran on have ended: it never changes
    took_s: float  # wall time of the computation that gave it

    @property
    def savings_usd(self) -> float:
        return self.on_demand_cost_usd - self.spot_cost_usd


def bag_costs_of(
    rows: dict[str, list[tuple]], bag_ids: Sequence[str], now: float, rule: CostRule
) -> dict[str, BagCost]:
    """The cost of each of `bag_ids` from its report rows (`Store.report_rows(bag_ids=...)`)
    as of `now`; bags not in the rows are left out."""
    if not bag_ids:
        return {}
    by_bag = {
        row["bag_id"]: row
        for row in compute_report(rows, {"bags": list(bag_ids)}, now, rule)["by_bag"]
    }
    ended_vms = {vm[0] for vm in rows["vms"] if vm[13] is not None}
    known_vms = {vm[0] for vm in rows["vms"]}
    ended_bags = {bag[0] for bag in rows["bags"] if bag[11] and bag[3] != BagState.ACTIVE}
    # A bag is final once it has ended and so has every VM its attempts ran on (attempts
    # on no known VM take no part in the split).
    final = set(ended_bags)
    for bag_id, _, _, vm_id, *_ in rows["attempts"]:
        if bag_id in final and vm_id in known_vms and vm_id not in ended_vms:
            final.discard(bag_id)
    return {
        bag_id: BagCost(
            vm_hours=row["vm_h"],
            spot_cost_usd=row["spot_cost_usd"],
            on_demand_cost_usd=row["on_demand_cost_usd"],
            as_of=now,
            final=bag_id in final,
            took_s=0.0,
        )
        for bag_id, row in by_bag.items()
    }


async def compute_bag_costs(
    store: Store, bag_ids: Sequence[str], now: float, rule: CostRule
) -> dict[str, BagCost]:
    """The bags' costs as of `now`, computed now (off the event loop)."""
    started = time.perf_counter()
    rows = await store.report_rows(bag_ids=bag_ids)
    costs = await asyncio.to_thread(bag_costs_of, rows, bag_ids, now, rule)
    took_s = time.perf_counter() - started
    return {
        bag_id: BagCost(
            cost.vm_hours,
            cost.spot_cost_usd,
            cost.on_demand_cost_usd,
            cost.as_of,
            cost.final,
            took_s,
        )
        for bag_id, cost in costs.items()
    }


class BagCosts:
    """The daemon's bag costs: computed as the module says, kept, refreshed."""

    def __init__(
        self,
        store: Store,
        rule: CostRule,
        now: Callable[[], float],
        *,
        sync_budget_s: float = 0.05,
        stale_factor: float = 20.0,
        min_refresh_s: float = 1.0,
        max_stale_s: float = 60.0,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.store, self.rule, self.now = store, rule, now
        self.sync_budget_s = sync_budget_s
        self.stale_factor = stale_factor
        self.min_refresh_s = min_refresh_s
        self.max_stale_s = max_stale_s
        self.max_entries = max_entries
        # What final costs are kept in the store under: the split's settings.
        self.rule_key = json.dumps(dataclasses.asdict(rule), sort_keys=True)
        self._kept: OrderedDict[str, BagCost] = OrderedDict()
        # One computation per bag at a time: views that need it meanwhile await it.
        self._computing: dict[str, asyncio.Future[dict[str, BagCost]]] = {}
        self._refreshes: set[asyncio.Task[Any]] = set()

    async def of(self, bag_ids: Sequence[str]) -> dict[str, BagCost]:
        """The cost of each bag (that exists), by the rules of the module."""
        now = self.now()
        out: dict[str, BagCost] = {}
        needed: list[str] = []
        for bag_id in dict.fromkeys(bag_ids):
            kept = self._kept.get(bag_id)
            if kept is not None:
                age_s = now - kept.as_of
                fresh = kept.final or age_s <= max(
                    self.min_refresh_s, self.stale_factor * kept.took_s
                )
                expensive = kept.took_s > self.sync_budget_s
                if fresh or (expensive and age_s <= self.max_stale_s):
                    self._kept.move_to_end(bag_id)
                    out[bag_id] = kept
                    if not fresh:
                        self._refresh_in_background(bag_id)
                    continue
            needed.append(bag_id)
        unseen = [b for b in needed if b not in self._kept]
        if unseen:
            kept_rows = await self.store.final_bag_costs(unseen, self.rule_key)
            for bag_id, vm_h, spot_usd, on_demand_usd, as_of in kept_rows:
                out[bag_id] = BagCost(vm_h, spot_usd, on_demand_usd, as_of, True, 0.0)
                self._keep(bag_id, out[bag_id])
            needed = [b for b in needed if b not in out]
        if needed:
            out.update(await self._compute(needed))
        return out

    async def close(self) -> None:
        """Stop the background refreshes (before the store closes)."""
        for task in list(self._refreshes):
            task.cancel()
        await asyncio.gather(*self._refreshes, return_exceptions=True)

    def _refresh_in_background(self, bag_id: str) -> None:
        if bag_id in self._computing:
            return
        task = asyncio.create_task(self._compute([bag_id]), name=f"bag cost {bag_id}")
        self._refreshes.add(task)
        task.add_done_callback(self._refresh_done)

    def _refresh_done(self, task: asyncio.Task[Any]) -> None:
        self._refreshes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("refreshing a bag's cost failed: %s", task.exception())

    async def _compute(self, bag_ids: list[str]) -> dict[str, BagCost]:
        waiting = [self._computing[b] for b in bag_ids if b in self._computing]
        mine = [b for b in bag_ids if b not in self._computing]
        out: dict[str, BagCost] = {}
        if mine:
            future: asyncio.Future[dict[str, BagCost]] = asyncio.get_running_loop().create_future()
            for bag_id in mine:
                self._computing[bag_id] = future
            try:
                costs = await settle(
                    future, compute_bag_costs(self.store, mine, self.now(), self.rule)
                )
            finally:
                for bag_id in mine:
                    del self._computing[bag_id]
            for bag_id, cost in costs.items():
                self._keep(bag_id, cost)
            out.update(costs)
            await self._store_final(costs)
        for result in await asyncio.gather(*waiting):
            out.update({b: c for b, c in result.items() if b in bag_ids})
        return out

    async def _store_final(self, costs: dict[str, BagCost]) -> None:
        final = [
            (b, c.vm_hours, c.spot_cost_usd, c.on_demand_cost_usd, c.as_of)
            for b, c in costs.items()
            if c.final
        ]
        if not final:
            return
        try:
            await self.store.keep_final_bag_costs(self.rule_key, final)
        except SpotbagError as exc:  # the view goes on; a later one computes it again
            log.warning("keeping the final costs of %d bags failed: %s", len(final), exc)

    def _keep(self, bag_id: str, cost: BagCost) -> None:
        kept = self._kept.get(bag_id)
        if kept is not None and kept.as_of > cost.as_of:
            return  # a later computation finished first
        self._kept[bag_id] = cost
        self._kept.move_to_end(bag_id)
        while len(self._kept) > self.max_entries:
            self._kept.popitem(last=False)
