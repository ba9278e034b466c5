"""Budgets as the scheduler keeps them (docs/bags.md#budgets): the dollar book of
policies/budget_rules.py applied to bags, attempts and VMs, and which bags a budget
holds.

The scheduler asks, on the event loop and in the pass that records the attempt, before
every attempt starts (`reserve_attempt`): its bag's and account's spent + committed +
this attempt's worst case against their caps. A yes reserves, and the entry is written
in the pass's batch, the transaction that writes the attempt and its CPU-hour
reservation; a no holds the bag (`held: budget`) until something changes (a budget
raised, an attempt's reservation settled, a new month). One event loop makes every
check and reservation in turn, and the store writes them in that order, so two bags of
one account cannot pass its cap together: the second check sees the first reservation.

Before a pass plans, `launchable` caps each bag's demand at the attempts its budgets
leave room for at the cheapest VM type it may use, so that no VM is launched for a bag
that could not start an attempt on it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controller.planner import CatalogType
from policies.budget_rules import TOLERANCE, BudgetBook, Entry, cost_usd, vm_share
from policies.ledger_rules import reservation_key
from policies.packing import Shape, zone_allowed

if TYPE_CHECKING:  # the scheduler's records (it imports this module)
    from controller.scheduler.runs import BagRun, VmRun


def month_of(at: float) -> str:
    """The calendar month (UTC) of an instant, YYYY-MM: what an account's budget is per."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m")


def month_start(at: float) -> float:
    """The first instant of the calendar month (UTC) of `at`, epoch seconds."""
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    return when.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_end(at: float) -> float:
    """The first instant of the next calendar month (UTC), epoch seconds."""
    when = dt.datetime.fromtimestamp(month_start(at), dt.UTC)
    following = (
        when.replace(year=when.year + 1, month=1)
        if when.month == 12
        else when.replace(month=when.month + 1)
    )
    return following.timestamp()


def share_of(shape: Shape, capacity: Shape) -> float:
    return vm_share(
        shape.cpus, shape.gpus, shape.memory_gb, capacity.cpus, capacity.gpus, capacity.memory_gb
    )


@dataclass
class Hold:
    why: str
    generation: int  # Budgets.generation when it was held


@dataclass
class Budgets:
    """Caps, reservations and holds in dollars (see the module docstring)."""

    time_scale: float = 1.0  # model seconds per real second: prices are per model hour
    book: BudgetBook = field(default_factory=BudgetBook)
    held: dict[str, Hold] = field(default_factory=dict)
    # Bumped by every change that may let a held bag go on: a cap changed, a
    # reservation settled.
    generation: int = 0
    new_holds: list[tuple[str, str, str]] = field(default_factory=list)  # bag, account, why
    # Bags told of (budget_reached) since their budgets last changed: bag -> account.
    told: dict[str, str] = field(default_factory=dict)
    month: str = ""
    # The month's bounds (epoch s): the month is worked out again only outside them (a
    # datetime per attempt was a tenth of the budgets' cost in a simulation).
    month_from: float = 0.0
    month_until: float = 0.0
    _worst_case: dict[tuple[str, str, float], float] = field(default_factory=dict)  # attempt_usd
    # The spot price (USD/h) of (type, zone) at an instant when the market is followed
    # (`spotbag simulate --price-trace`: the trace's); None: the catalog's price.
    spot_price: Callable[[str, str, float], float] | None = None

    # --- caps -------------------------------------------------------------------------

    def open_bag(self, bag_id: str, cap_usd: float | None) -> None:
        """A bag the scheduler takes on (a cap set meanwhile by PATCH stays)."""
        self.book.bag_caps.setdefault(bag_id, cap_usd)

    def set_bag_cap(self, bag_id: str, cap_usd: float | None) -> None:
        self.book.bag_caps[bag_id] = cap_usd
        self.told.pop(bag_id, None)
        self.generation += 1

    def set_account_cap(self, account: str, cap_usd: float | None) -> None:
        self.book.account_caps[account] = cap_usd
        self.told = {b: a for b, a in self.told.items() if a != account}
        self.generation += 1

    def limited(self, bag: BagRun) -> bool:
        return (
            self.book.bag_caps.get(bag.id) is not None
            or self.book.account_caps.get(bag.spec.account) is not None
        )

    # --- before planning ----------------------------------------------------------------

    def launchable(
        self, bag: BagRun, wanted: int, catalog: Sequence[CatalogType], now: float
    ) -> int:
        """How many of `wanted` attempts the bag's budgets leave room for, each at its
        worst case on the cheapest VM type the bag may use. 0 holds the bag."""
        self._roll_month(now)
        if not wanted or not self.limited(bag):
            return wanted
        hold = self.held.get(bag.id)
        if hold is not None and hold.generation == self.generation:
            return 0  # refused, and nothing changed since
        cheapest = self._cheapest_attempt_usd(bag, catalog, now)
        room = self.room_usd(bag.id, bag.spec.account, now)
        if cheapest <= 0:
            return wanted
        fits = _fits(room, cheapest, wanted)
        if fits <= 0:
            refusal = self.book.refusal(bag.id, bag.spec.account, cheapest, self.month)
            why = (
                refusal.text(bag.id if refusal.scope == "bag" else bag.spec.account)
                if refusal
                else ""
            )
            self._hold(bag, why or "its budget has no room for another attempt")
            return 0
        return fits

    def launchable_with_on_demand(
        self, bag: BagRun, wanted: int, on_demand: int, catalog: Sequence[CatalogType], now: float
    ) -> tuple[int, int]:
        """(attempts, of which on on-demand VMs) the bag's budgets leave room for, when
        the first `on_demand` of the `wanted` would go on on-demand VMs (the planner
        fills a bag's on-demand slots first; the deadline policy's `when_needed`): each
        of those at its worst case at the cheapest on-demand price, the rest at spot's.
        The budget is the cap and the deadline a goal: on-demand attempts it cannot
        pay for are left to spot (cheaper), not held."""
        on_demand = min(on_demand, wanted)
        if not wanted or not on_demand or not self.limited(bag):
            return wanted, on_demand
        room = self.room_usd(bag.id, bag.spec.account, now)
        od_usd = self._cheapest_attempt_usd(bag, catalog, now, on_demand=True)
        spot_usd = self._cheapest_attempt_usd(bag, catalog, now, on_demand=False)
        od_fit = on_demand if od_usd <= 0 else _fits(room, od_usd, on_demand)
        room -= od_fit * od_usd
        spot_fit = wanted - od_fit if spot_usd <= 0 else _fits(room, spot_usd, wanted - od_fit)
        return od_fit + spot_fit, od_fit

    def room_usd(self, bag_id: str, account: str, now: float) -> float:
        """Dollars left under the tighter of the bag's and the account's caps (inf: none)."""
        self._roll_month(now)
        book = self.book
        room = math.inf
        cap = book.bag_caps.get(bag_id)
        if cap is not None:
            room = cap - book.bag_spent.get(bag_id, 0.0) - book.bag_committed.get(bag_id, 0.0)
        cap = book.account_caps.get(account)
        if cap is not None:
            spent = book.account_spent.get((account, self.month), 0.0)
            room = min(room, cap - spent - book.account_committed.get(account, 0.0))
        return room

    def _cheapest_attempt_usd(
        self,
        bag: BagRun,
        catalog: Sequence[CatalogType],
        now: float,
        on_demand: bool | None = None,
    ) -> float:
        # A bag that runs on on-demand VMs only pays their price.
        always = bag.spec.on_demand_mode == "always" if on_demand is None else on_demand
        prices = [
            (
                t.on_demand_price_per_hour or t.spot_price_per_hour
                if always
                else self._spot_price(t.name, t.zone, t.spot_price_per_hour, now)
            )
            * share_of(bag.shape, t.capacity)
            for t in catalog
            if (bag.allowed_types is None or t.name in bag.allowed_types)
            and zone_allowed(t.zone, bag.regions)
            and bag.shape.fits_in(t.capacity)
        ]
        per_h = min(prices) if prices else 0.0
        return cost_usd(per_h, 1.0, bag.spec.max_runtime_s, self.time_scale)

    def _spot_price(self, vm_type: str, zone: str, catalog_usd: float, now: float) -> float:
        return catalog_usd if self.spot_price is None else self.spot_price(vm_type, zone, now)

    # --- attempts ---------------------------------------------------------------------

    def attempt_usd(self, bag: BagRun, vm: VmRun, now: float) -> float:
        """An attempt's worst case in dollars on this VM (kept per bag, VM type and price:
        one a start, in the scheduler's pass); a spot VM at the spot price now (the
        market's, when followed), an on-demand VM at its on-demand price."""
        vm_type = vm.vm_type
        price = (
            self._spot_price(vm_type.name, vm.zone, vm_type.spot_price_per_hour, now)
            if vm.spot
            else vm_type.on_demand_price_per_hour or vm_type.spot_price_per_hour
        )
        key = (bag.id, vm_type.name, price)
        usd = self._worst_case.get(key)
        if usd is None:
            per_h = price * share_of(bag.shape, vm.capacity)
            usd = self._worst_case[key] = cost_usd(
                per_h, 1.0, bag.spec.max_runtime_s, self.time_scale
            )
        return usd

    def reserve_attempt(
        self, bag: BagRun, vm: VmRun, idx: int, number: int, now: float
    ) -> list[Entry] | None:
        """Reserve an attempt's worst case (its entry), or hold the bag and return None
        when a cap would be passed. A bag without caps reserves nothing ([])."""
        if not self.limited(bag):
            return []
        self._roll_month(now)
        usd = self.attempt_usd(bag, vm, now)
        account = bag.spec.account
        refusal = self.book.refusal(bag.id, account, usd, self.month)
        if refusal is not None:
            self._hold(bag, refusal.text(bag.id if refusal.scope == "bag" else account))
            return None
        self.held.pop(bag.id, None)
        key = reservation_key(bag.id, idx, number)
        return [self.book.reserve(bag.id, account, key, usd, self.month)]

    def settle_attempt(
        self, bag: BagRun, idx: int, number: int, elapsed_s: float, now: float
    ) -> list[Entry]:
        """An attempt ended after `elapsed_s`: charge its share of its VM for that time
        and release the rest. It reserved that share for max_runtime_s, so the charge is
        reserved × elapsed_s / max_runtime_s (at most what it reserved): the same
        figure after a restart, when the VM may be gone."""
        if not self.book.open:
            return []  # nothing reserved (no bag or account has a budget): nothing to settle
        key = reservation_key(bag.id, idx, number)
        found = self.book.open.get(key)
        if found is None:
            return []
        self._roll_month(now)
        used = found[2] * max(0.0, elapsed_s) / bag.spec.max_runtime_s
        self.generation += 1
        return self.book.settle(key, used, self.month)

    def bag_ended(self, bag_id: str) -> None:
        self.held.pop(bag_id, None)
        for key in [k for k in self._worst_case if k[0] == bag_id]:
            del self._worst_case[key]
        self.told.pop(bag_id, None)
        self.book.forget_bag(bag_id)

    def take_new_holds(self) -> list[tuple[str, str, str]]:
        held, self.new_holds = self.new_holds, []
        return held

    def _hold(self, bag: BagRun, why: str) -> None:
        """Hold the bag until something changes; the first hold since its budgets last
        changed is told (budget_reached), not every one: while attempts of the bag run,
        one may be refused and the next, after one ended, admitted."""
        if bag.id not in self.told:
            self.told[bag.id] = bag.spec.account
            self.new_holds.append((bag.id, bag.spec.account, why))
        self.held[bag.id] = Hold(why, self.generation)

    def _roll_month(self, now: float) -> None:
        if self.month_from <= now < self.month_until:
            return
        month = month_of(now)
        self.month_from, self.month_until = month_start(now), month_end(now)
        if month != self.month:
            if self.month:
                self.generation += 1  # a new month: accounts' budgets start again
                self.told.clear()
            self.month = month

    # --- views and recovery -----------------------------------------------------------

    def bag_view(self, bag_id: str, account: str) -> dict[str, Any]:
        book = self.book
        hold = self.held.get(bag_id)
        return {
            "budget_usd": book.bag_caps.get(bag_id),
            "charged_usd": book.bag_spent.get(bag_id, 0.0),
            "reserved_usd": book.bag_committed.get(bag_id, 0.0),
            "account_budget_usd": book.account_caps.get(account),
            "account_month_charged_usd": book.account_spent.get((account, self.month), 0.0),
            "held": f"held: budget: {hold.why}" if hold is not None else None,
        }

    def account_view(self, account: str, now: float) -> dict[str, Any]:
        self._roll_month(now)
        book = self.book
        return {
            "budget_usd": book.account_caps.get(account),
            "month": self.month,
            "month_charged_usd": book.account_spent.get((account, self.month), 0.0),
            "reserved_usd": book.account_committed.get(account, 0.0),
        }

    def load(self, state: dict[str, Any], now: float) -> None:
        """Rebuild from the store (Store.budget_state(month_of(now), month_start(now)))."""
        self.book = BudgetBook()
        self.held = {}
        self.month = month_of(now)
        self.month_from, self.month_until = month_start(now), month_end(now)
        self.told = dict(state["told"])  # not told again after a restart
        self.book.bag_caps.update(state["bag_caps"])
        self.book.account_caps.update(state["account_caps"])
        self.book.bag_spent.update(state["bag_spent"])
        for account, spent in state["account_spent"].items():
            self.book.account_spent[(account, self.month)] = spent
        for row in state["open"]:
            self.book.reserve(row["bag_id"], row["account"], row["key"], row["usd"], row["month"])


def _fits(room_usd: float, each_usd: float, at_most: int) -> int:
    """How many attempts of `each_usd` the room holds, at most `at_most`."""
    if room_usd <= 0:
        return 0
    return max(0, min(at_most, math.floor(room_usd / each_usd + TOLERANCE)))
