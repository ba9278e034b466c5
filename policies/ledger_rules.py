"""The CPU-hour reservation ledger's rules (docs/design.md#ledger), as a pure state machine.

Amounts are CPU-hours. A job's rate is cpus + gpu_weight·gpus CPU-hours per hour
(a GPU-hour counts as `gpu_weight` CPU-hours, 20 by default). Per account:

    available = allocation - charged - reserved        (never negative)

- credit a:       allocation += a
- reserve r:      reserved += r       (a job's next attempt may run max_runtime: r = rate·max_runtime)
- charge c:       reserved -= c, charged += c   (c = rate·elapsed, at most what was reserved)
- release l:      reserved -= l       (the rest of the reservation)

Each reservation has a key (bag, job, attempt number) and is settled exactly once:
by a charge and a release when its attempt ends, or by a release when the job ends
without running it. Settling a key that is not open changes nothing, so a repeated
completion event is harmless. An account may be unlimited (allocation = ∞): its
reservations and charges are recorded all the same, it just never runs out.

`Ledger` holds balances and open reservations in memory and returns the entries to
append; the controller writes them in the same transaction as the state change
that caused them, and rebuilds a Ledger from the stored entries after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

GPU_WEIGHT = 20.0  # CPU-hours per GPU-hour, by default
_EPS_CPU_H = 1e-9  # sums of float amounts are compared with this much slack


def rate_cpu_h_per_h(cpus: float, gpus: float, gpu_weight: float = GPU_WEIGHT) -> float:
    """CPU-hours a job uses per hour it runs: cpus + gpu_weight·gpus (docs/design.md#ledger)."""
    return float(cpus) + gpu_weight * float(gpus)


def reservation_cpu_h(rate: float, max_runtime_s: float) -> float:
    """What one attempt may use: rate × max_runtime."""
    return rate * max_runtime_s / 3600.0


def settlement(
    reserved_cpu_h: float, rate: float, elapsed_s: float, charge_it: bool = True
) -> tuple[float, float]:
    """(charge, release) for an attempt that ran `elapsed_s` on a reservation: charge
    rate × elapsed (at most the reservation; nothing when `charge_it` is false) and
    release the rest."""
    charge = min(reserved_cpu_h, rate * max(0.0, elapsed_s) / 3600.0) if charge_it else 0.0
    return charge, reserved_cpu_h - charge


def jobs_covered(available_cpu_h: float, per_job_cpu_h: float, job_count: int) -> int:
    """How many of `job_count` jobs, each reserving `per_job_cpu_h`, the balance covers:
    the largest n ≤ job_count whose block `Ledger.reserve_block` accepts (with its
    slack), so that a held bag reserves exactly what this says.

    Any floats give an answer in [0, job_count], never an error: a tiny reservation
    makes the quotient overflow to infinity (int(inf) raised OverflowError, a 500 on
    admission), and a NaN is taken as "covers nothing" rather than guessed at."""
    if job_count <= 0 or math.isnan(available_cpu_h) or math.isnan(per_job_cpu_h):
        return 0
    if per_job_cpu_h <= 0 or available_cpu_h == math.inf:
        return job_count
    budget = available_cpu_h + _EPS_CPU_H  # what can_reserve compares with
    if not budget >= per_job_cpu_h:  # nothing, or an overdrawn account
        return 0
    quotient = budget / per_job_cpu_h  # ≥ 1 here; inf when per_job is tiny
    n = job_count if quotient >= job_count else int(quotient)
    # The quotient is rounded; the block is per_job × n, rounded too. A step or two
    # makes them agree (bounded: past 2**53 jobs a step may not change the float).
    for _ in range(4):
        if n > 0 and per_job_cpu_h * n > budget:
            n -= 1
        elif n < job_count and per_job_cpu_h * (n + 1) <= budget:
            n += 1
        else:
            break
    return n


class Entry(NamedTuple):
    kind: str  # credit | reserve | charge | release
    account: str
    cpu_h: float  # >= 0
    key: str = ""  # the reservation it belongs to ("" for credits)


@dataclass
class Balance:
    allocation: float = 0.0  # math.inf: unlimited
    charged: float = 0.0
    reserved: float = 0.0

    @property
    def available(self) -> float:
        return self.allocation - self.charged - self.reserved


class InsufficientCredit(Exception):
    """A reservation the account cannot cover; says what was needed and what is available."""

    def __init__(self, account: str, needed_cpu_h: float, available_cpu_h: float) -> None:
        super().__init__(
            f"account {account!r} needs {needed_cpu_h:,.2f} CPU-hours but has "
            f"{max(0.0, available_cpu_h):,.2f} available"
        )
        self.account = account
        self.needed_cpu_h = needed_cpu_h
        self.available_cpu_h = available_cpu_h


@dataclass
class Ledger:
    balances: dict[str, Balance] = field(default_factory=dict)
    open: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (account, cpu_h)

    def balance(self, account: str) -> Balance:
        found = self.balances.get(account)
        if found is None:  # (setdefault would make a Balance at every call)
            found = self.balances[account] = Balance()
        return found

    def can_reserve(self, account: str, cpu_h: float) -> bool:
        return self.balance(account).available + _EPS_CPU_H >= cpu_h

    def credit(self, account: str, cpu_h: float) -> Entry:
        if not cpu_h >= 0 or math.isnan(cpu_h):
            raise ValueError(f"a credit must be a non-negative number of CPU-hours, not {cpu_h}")
        self.balance(account).allocation += cpu_h
        return Entry("credit", account, cpu_h)

    def reserve(self, account: str, key: str, cpu_h: float, *, overdraw: bool = False) -> Entry:
        """Reserve for one attempt; raises InsufficientCredit (changing nothing) when
        the account cannot cover it, ValueError when the key is already open.
        `overdraw`: record use that already happened whatever the balance (the only
        way `available` goes below zero)."""
        if key in self.open:
            raise ValueError(f"reservation {key} is already open")
        balance = self.balance(account)
        if not overdraw and not self.can_reserve(account, cpu_h):
            raise InsufficientCredit(account, cpu_h, balance.available)
        balance.reserved += cpu_h
        self.open[key] = (account, cpu_h)
        return Entry("reserve", account, cpu_h, key)

    def reserve_many(self, account: str, keys: Sequence[str], cpu_h: float) -> None:
        """Reserve `cpu_h` for each key, all or nothing, in bulk (a million keys in a
        fraction of a second: a bag's first attempts, keys no reservation has used yet).
        The caller records one reserve entry per key."""
        self.reserve_block(account, len(keys), cpu_h)
        self.open_keys(account, keys, cpu_h)

    def reserve_block(self, account: str, count: int, cpu_h: float) -> None:
        """The balance side of `reserve_many`: reserve `count × cpu_h`, all or nothing
        (raising InsufficientCredit). The keys are opened afterwards with `open_keys`,
        in slices if need be: opening a million keys at once holds a thread for
        hundreds of milliseconds."""
        needed = cpu_h * count
        if not self.can_reserve(account, needed):
            raise InsufficientCredit(account, needed, self.balance(account).available)
        self.balance(account).reserved += needed

    def open_keys(self, account: str, keys: Iterable[str], cpu_h: float) -> None:
        """Open reservations of `cpu_h` each, whose amount `reserve_block` reserved."""
        self.open.update(dict.fromkeys(keys, (account, cpu_h)))

    def settle(
        self, key: str, rate: float, elapsed_s: float, charge_it: bool = True
    ) -> list[Entry]:
        """An attempt ended: charge what it used, release the rest. Nothing when the key
        is not open (settled already, or never reserved)."""
        found = self.open.pop(key, None)
        if found is None:
            return []
        account, reserved = found
        charge, release = settlement(reserved, rate, elapsed_s, charge_it)
        balance = self.balance(account)
        balance.reserved -= reserved
        balance.charged += charge
        return [Entry("charge", account, charge, key), Entry("release", account, release, key)]

    def release(self, key: str) -> list[Entry]:
        """A reservation that will not be used (the job ended before its attempt ran)."""
        return self.settle(key, 0.0, 0.0, charge_it=False)[1:]

    def apply(self, entry: Entry) -> None:
        """Replay a stored entry (rebuilding after a restart)."""
        balance = self.balance(entry.account)
        if entry.kind == "credit":
            balance.allocation += entry.cpu_h
        elif entry.kind == "reserve":
            balance.reserved += entry.cpu_h
            account, held = self.open.get(entry.key, (entry.account, 0.0))
            self.open[entry.key] = (account, held + entry.cpu_h)
        elif entry.kind in ("charge", "release"):
            balance.reserved -= entry.cpu_h
            if entry.kind == "charge":
                balance.charged += entry.cpu_h
            account, held = self.open.get(entry.key, (entry.account, 0.0))
            left = held - entry.cpu_h
            if left > _EPS_CPU_H:
                self.open[entry.key] = (account, left)
            else:
                self.open.pop(entry.key, None)
        else:
            raise ValueError(f"unknown ledger entry kind {entry.kind!r}")


def reservation_key(bag_id: str, idx: int, number: int) -> str:
    """The reservation for attempt `number` of job `idx` of a bag."""
    return f"{bag_id}:{idx}:{number}"
