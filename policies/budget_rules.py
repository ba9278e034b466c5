"""Budgets in US dollars: the rules, with no clock and no I/O (docs/bags.md#budgets).

A bag may have a cap (`budget_usd`), and an account a monthly one. Money is reserved
like CPU-hours are (policies/ledger_rules.py): an attempt reserves its worst case
before it starts and is charged what it used when it ends, the rest released.

- An attempt's worst case is its share of its VM's price for its longest run:
  reserve = price_per_h × share × max_runtime_s × time_scale / 3600, where share =
  max(cpus / VM cpus, gpus / VM gpus, memory / VM memory), the largest part of the VM
  the job takes (what keeps the rest of the VM from other jobs), at most 1.
- Its charge is the same share for the time it ran: price_per_h × share × elapsed_s ×
  time_scale / 3600, never more than it reserved (an attempt is stopped at
  max_runtime_s).
- Before it starts: spent + committed + this attempt's reserve ≤ cap, for its bag
  (spent: the bag's charges; committed: its open reservations) and for its account
  (spent: the charges of the calendar month, UTC, the caller names; committed: every
  open reservation of the account). Otherwise the attempt does not start: the check
  is strict, so the committed money never passes a cap, and an attempt is refused
  only when it would pass one (`would_cross`).

Caps are compared with a relative tolerance of 1e-9 so that a cap the sums reach
exactly, to the last rounding error, still admits the attempt that reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

TOLERANCE = 1e-9


def vm_share(
    cpus: float, gpus: float, memory_gb: float, vm_cpus: float, vm_gpus: float, vm_memory_gb: float
) -> float:
    """The part of a VM a job takes: its largest fraction of any resource, at most 1."""
    parts = [cpus / vm_cpus if vm_cpus > 0 else 1.0]
    if gpus > 0:
        parts.append(gpus / vm_gpus if vm_gpus > 0 else 1.0)
    if vm_memory_gb > 0:
        parts.append(memory_gb / vm_memory_gb)
    return min(1.0, max(parts))


def cost_usd(price_per_h: float, share: float, seconds: float, time_scale: float = 1.0) -> float:
    """price_per_h × share × model hours (seconds × time_scale / 3600)."""
    return max(0.0, price_per_h * share * max(0.0, seconds) * time_scale / 3600.0)


def would_cross(spent: float, committed: float, amount: float, cap: float | None) -> bool:
    """Whether reserving `amount` more would take spent + committed past `cap`."""
    if cap is None:
        return False
    total = spent + committed + amount
    return total > cap + TOLERANCE * max(1.0, abs(cap))


class Entry(NamedTuple):
    """One budget ledger entry: reserve, charge or release of `usd` under `key` (a tuple:
    one is made per attempt start and two per end, in the scheduler's pass)."""

    account: str
    bag_id: str
    kind: str  # reserve | charge | release
    usd: float
    key: str
    month: str  # the calendar month (UTC, YYYY-MM) a charge counts in
    # A charge in another month than its reservation's (an attempt running over a month's
    # end): the stored row's month changes (otherwise it stays, and no index moves).
    new_month: bool = False


@dataclass
class Refusal:
    """Why an attempt may not start: whose cap, and the figures."""

    scope: str  # "bag" or "account"
    cap_usd: float
    spent_usd: float
    committed_usd: float
    needed_usd: float

    def text(self, owner: str) -> str:
        whose = f"bag {owner}" if self.scope == "bag" else f"account {owner!r} this month"
        return (
            f"{whose}: spent ${self.spent_usd:,.2f} + committed ${self.committed_usd:,.2f} + "
            f"next attempt ${self.needed_usd:,.2f} would pass its budget ${self.cap_usd:,.2f}"
        )


@dataclass
class BudgetBook:
    """Caps, charges and open reservations in dollars, per bag and per account."""

    bag_caps: dict[str, float | None] = field(default_factory=dict)
    account_caps: dict[str, float | None] = field(default_factory=dict)
    bag_spent: dict[str, float] = field(default_factory=dict)
    bag_committed: dict[str, float] = field(default_factory=dict)
    account_spent: dict[tuple[str, str], float] = field(default_factory=dict)  # (account, month)
    account_committed: dict[str, float] = field(default_factory=dict)
    # key -> bag, account, usd, the month it was reserved in
    open: dict[str, tuple[str, str, float, str]] = field(default_factory=dict)

    def refusal(self, bag_id: str, account: str, usd: float, month: str) -> Refusal | None:
        """Why reserving `usd` for an attempt of the bag would pass a cap, or None."""
        cap = self.bag_caps.get(bag_id)
        spent, committed = self.bag_spent.get(bag_id, 0.0), self.bag_committed.get(bag_id, 0.0)
        if cap is not None and would_cross(spent, committed, usd, cap):
            return Refusal("bag", cap, spent, committed, usd)
        cap = self.account_caps.get(account)
        spent = self.account_spent.get((account, month), 0.0)
        committed = self.account_committed.get(account, 0.0)
        if cap is not None and would_cross(spent, committed, usd, cap):
            return Refusal("account", cap, spent, committed, usd)
        return None

    def reserve(self, bag_id: str, account: str, key: str, usd: float, month: str) -> Entry:
        """Reserve (the caller checked `refusal`); a key reserved already raises."""
        if key in self.open:
            raise ValueError(f"budget reservation {key} is open already")
        self.open[key] = (bag_id, account, usd, month)
        self.bag_committed[bag_id] = self.bag_committed.get(bag_id, 0.0) + usd
        self.account_committed[account] = self.account_committed.get(account, 0.0) + usd
        return Entry(account, bag_id, "reserve", usd, key, month)

    def settle(self, key: str, used_usd: float, month: str) -> list[Entry]:
        """Charge what an attempt used (at most what it reserved) and release the rest;
        nothing when the key is not open (no budget was reserved for it)."""
        found = self.open.pop(key, None)
        if found is None:
            return []
        bag_id, account, reserved, reserved_in = found
        charged = min(max(0.0, used_usd), reserved)
        self.bag_committed[bag_id] = self.bag_committed.get(bag_id, 0.0) - reserved
        self.account_committed[account] = self.account_committed.get(account, 0.0) - reserved
        self.bag_spent[bag_id] = self.bag_spent.get(bag_id, 0.0) + charged
        self.account_spent[(account, month)] = (
            self.account_spent.get((account, month), 0.0) + charged
        )
        return [
            Entry(account, bag_id, "charge", charged, key, month, month != reserved_in),
            Entry(account, bag_id, "release", reserved - charged, key, month),
        ]

    def forget_bag(self, bag_id: str) -> None:
        """The bag ended (its reservations are settled): drop its running sums."""
        for table in (self.bag_caps, self.bag_spent, self.bag_committed):
            table.pop(bag_id, None)
