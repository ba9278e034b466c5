"""Accounts and their CPU-hour ledger as the controller keeps them in memory.

The rules are policies.ledger_rules; this module applies them to bags and jobs:
which account pays, how much a job reserves (rate × max_runtime per attempt), what
happens to an account that does not exist yet (`[ledger] new_accounts` for bags,
`[slurm] unknown_accounts` for Slurm users' jobs), and which jobs wait, held, for
credit. The scheduler (and, for admissions, the API, on the same event loop) changes
it; every entry it returns is written by the caller in the same transaction as the
state change that caused it. An admin's changes (a new account, a credit) are
written by the ledger itself, and taken into memory only once written
(`open_account`, `add_credit`): a write that fails changes nothing, so no caller has
anything to undo. After a restart it is rebuilt from the stored entries (`load`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from controller.bags.spec import BagSpec
from controller.bags.waiting_jobs import HeldQueue
from controller.config import LedgerConfig
from controller.errors import SpotbagError
from controller.store.rows import LedgerState
from policies.ledger_rules import (
    Entry,
    InsufficientCredit,
    Ledger,
    jobs_covered,
    rate_cpu_h_per_h,
    reservation_cpu_h,
    reservation_key,
)


def _check_credit(cpu_h: float) -> None:
    """What Ledger.credit would refuse, refused before anything is written."""
    if not cpu_h >= 0 or math.isnan(cpu_h):
        raise ValueError(f"a credit must be a non-negative number of CPU-hours, not {cpu_h}")


class FirstAttemptKeys(Sequence[str]):
    """The reservation keys of the first attempts of a bag's jobs (reservation_key),
    made as they are read: a list of a million keys would be ~70 MB, and every
    garbage collection that meets it walks a million strings (~50-80 ms, issue 14)."""

    __slots__ = ("_count", "_prefix")

    def __init__(self, bag_id: str, job_count: int) -> None:
        self._prefix = f"{bag_id}:"
        self._count = job_count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, idx: int) -> str: ...
    @overload
    def __getitem__(self, idx: slice) -> Sequence[str]: ...
    def __getitem__(self, idx: int | slice) -> str | Sequence[str]:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(self._count)
            if start == 0 and step == 1:  # the first jobs (those an account can cover)
                return FirstAttemptKeys(self._prefix[:-1], stop)
            prefix = self._prefix
            return [f"{prefix}{i}:1" for i in range(start, stop, step)]
        if idx < 0:
            idx += self._count
        if not 0 <= idx < self._count:
            raise IndexError(f"job index {idx} out of range")
        return f"{self._prefix}{idx}:1"

    def __iter__(self) -> Iterator[str]:
        prefix = self._prefix
        return (f"{prefix}{idx}:1" for idx in range(self._count))


def first_attempt_keys(bag_id: str, job_count: int) -> FirstAttemptKeys:
    """The reservation keys of the first attempts of a bag's jobs (reservation_key)."""
    return FirstAttemptKeys(bag_id, job_count)


class LedgerStore(Protocol):
    """The writes an admin's changes need (controller.store.Store has them)."""

    async def create_account(
        self, account: dict[str, Any], ledger_rows: Sequence[tuple]
    ) -> bool: ...

    async def append_ledger(self, ledger_rows: Sequence[tuple]) -> None: ...


class UnknownAccount(SpotbagError):
    status = 404
    code = "not_found"

    def __init__(self, account: str) -> None:
        super().__init__(
            f"account {account!r} does not exist; an admin creates it with "
            f"`spotbag accounts create {account} --cpu-hours N`"
        )
        self.account = account


@dataclass
class Admission:
    """What admitting a bag reserved (to write with the bag, or undo if it is not):
    `entries` (a new account's credit), and `per_job_cpu_h` for each of `reserved_keys`
    (the first attempts of the jobs that are not held)."""

    account: str
    entries: list[Entry]
    held_from: int  # jobs from this index on wait, held, for credit
    new_account: dict[str, Any] | None = None
    needed_cpu_h: float = 0.0  # for all the bag's jobs
    reserved_keys: Sequence[str] = ()
    per_job_cpu_h: float = 0.0
    opened: int = 0  # reserved_keys[:opened] are open in the ledger (open_reserved)

    def rows(self, at: float) -> Iterable[tuple]:
        """The ledger rows to write with the bag, made as they are written (off the
        event loop, by the store's writer: a million of them for a million jobs)."""
        given = [(at, e.account, e.kind, e.cpu_h, e.key, "admission") for e in self.entries]
        account, cpu_h = self.account, self.per_job_cpu_h
        reserved = ((at, account, "reserve", cpu_h, key, "admission") for key in self.reserved_keys)
        return itertools.chain(given, reserved)


@dataclass
class Accounts:
    settings: LedgerConfig
    ledger: Ledger = field(default_factory=Ledger)
    unlimited: dict[str, bool] = field(default_factory=dict)  # the accounts that exist
    held: dict[str, HeldQueue] = field(default_factory=dict)  # FIFO per account
    # Accounts an admin is creating, whose write is under way: they exist for every
    # other change (that write comes first to the store's one writer).
    creating: set[str] = field(default_factory=set)

    # --- amounts ----------------------------------------------------------------------------

    def rate(self, spec: BagSpec) -> float:
        r = spec.resources
        return rate_cpu_h_per_h(r.cpus, r.gpus, self.settings.gpu_weight)

    def per_attempt_cpu_h(self, spec: BagSpec) -> float:
        return reservation_cpu_h(self.rate(spec), spec.max_runtime_s)

    # --- admission --------------------------------------------------------------------------

    def admit_bag(
        self,
        bag_id: str,
        spec: BagSpec,
        job_count: int,
        now: float,
        keys: Sequence[str] | None = None,
        *,
        open_keys: bool = True,
    ) -> Admission:
        """Reserve for the first attempt of every job (reject: all or nothing, raising
        InsufficientCredit; hold: as many as fit, in order, the rest held). Creates the
        account first when `new_accounts` allows. `keys`: the jobs' first-attempt
        reservation keys (first_attempt_keys), when made beforehand off the event loop.
        `open_keys=False`: only the balance is reserved now; the caller opens the keys
        with `open_reserved` once the bag is written (in slices, between which the
        event loop serves others: a million keys take it hundreds of milliseconds)."""
        account = spec.account
        new_account, entries = self._open_account(account, now)
        per_job = self.per_attempt_cpu_h(spec)
        if keys is None:
            keys = first_attempt_keys(bag_id, job_count)
        try:
            if spec.on_insufficient_balance == "reject":
                fits = job_count
            else:
                fits = jobs_covered(self.ledger.balance(account).available, per_job, job_count)
            reserved = keys if fits == job_count else keys[:fits]
            self.ledger.reserve_block(account, len(reserved), per_job)
        except InsufficientCredit:
            self._forget_new(account, new_account)
            raise
        admission = Admission(
            account, entries, fits, new_account, per_job * job_count, reserved, per_job
        )
        if open_keys:
            self.open_reserved(admission, 0, len(reserved))
        return admission

    def open_reserved(self, admission: Admission, start: int, stop: int) -> None:
        """Open the reservations of the admission's keys [start, stop) (admit_bag
        reserved their amount)."""
        keys = admission.reserved_keys[start:stop]
        self.ledger.open_keys(admission.account, keys, admission.per_job_cpu_h)
        admission.opened = max(admission.opened, min(stop, len(admission.reserved_keys)))

    def undo(self, admission: Admission) -> None:
        """The bag was not written (an error, or a repeated Idempotency-Key)."""
        for key in admission.reserved_keys[: admission.opened]:
            self.ledger.open.pop(key, None)
        balance = self.ledger.balance(admission.account)
        balance.reserved -= admission.per_job_cpu_h * len(admission.reserved_keys)
        for entry in reversed(admission.entries):
            if entry.kind == "credit":
                self.uncredit(entry)
        self._forget_new(admission.account, admission.new_account)

    def _open_account(self, account: str, now: float) -> tuple[dict[str, Any] | None, list[Entry]]:
        if account in self.unlimited or account in self.creating:
            return None, []
        mode = self.settings.new_accounts
        if mode == "refuse":
            raise UnknownAccount(account)
        return self.create(account, mode == "unlimited", self.settings.new_account_cpu_h, now)

    def create(
        self, account: str, unlimited: bool, cpu_h: float, now: float, note: str = ""
    ) -> tuple[dict[str, Any], list[Entry]]:
        """A new account (the caller has checked it does not exist) and its first credit."""
        self.unlimited[account] = unlimited
        balance = self.ledger.balance(account)
        if unlimited:
            balance.allocation = math.inf
        entries = [self.ledger.credit(account, cpu_h)] if cpu_h > 0 else []
        row = {"name": account, "unlimited": unlimited, "created_at": now, "note": note}
        return row, entries

    def exists(self, account: str) -> bool:
        """Whether the account exists (or an admin's creation of it is being written)."""
        return account in self.unlimited or account in self.creating

    async def open_account(
        self,
        store: LedgerStore,
        account: str,
        unlimited: bool,
        cpu_h: float,
        now: float,
        note: str = "",
    ) -> bool:
        """An admin creates an account with its first credit: written first, then taken
        into memory. False (nothing changed) when it exists already; a failed write
        raises, changing nothing."""
        if self.exists(account):
            return False
        _check_credit(cpu_h)
        row = {"name": account, "unlimited": unlimited, "created_at": now, "note": note}
        rows = [(now, account, "credit", cpu_h, "", "account created")] if cpu_h > 0 else []
        self.creating.add(account)
        try:
            created = await store.create_account(row, rows)
        finally:
            self.creating.discard(account)
        if created:
            self.create(account, unlimited, cpu_h, now, note)
        return created

    async def add_credit(
        self, store: LedgerStore, account: str, cpu_h: float, now: float, note: str = ""
    ) -> None:
        """An admin credits an account: the entry is written first, then the balance
        grows (a failed write raises, changing nothing)."""
        _check_credit(cpu_h)
        await store.append_ledger([(now, account, "credit", cpu_h, "", note)])
        self.ledger.credit(account, cpu_h)

    def _forget_new(self, account: str, new_account: dict[str, Any] | None) -> None:
        if new_account is not None:
            self.forget(account)

    def forget(self, account: str) -> None:
        """Drop an account created in memory whose creation was not written."""
        self.unlimited.pop(account, None)
        self.ledger.balances.pop(account, None)

    def uncredit(self, entry: Entry) -> None:
        """Take back a credit that was not written."""
        self.ledger.balance(entry.account).allocation -= entry.cpu_h

    # --- attempts ---------------------------------------------------------------------------

    def settle(
        self, bag_id: str, idx: int, number: int, spec: BagSpec, elapsed_s: float, preempted: bool
    ) -> list[Entry]:
        """An attempt ended: charge its time (preempted ones as configured), release the rest."""
        charge_it = self.settings.charge_preempted or not preempted
        return self.ledger.settle(
            reservation_key(bag_id, idx, number), self.rate(spec), elapsed_s, charge_it
        )

    # --- Slurm users' jobs on power-saving pools ------------------------------------------

    def open_run_account(
        self, account: str, now: float, create_cpu_h: float | None
    ) -> tuple[dict[str, Any] | None, list[Entry]]:
        """The account a run of a Slurm user's job pays from, created if need be with
        `create_cpu_h` (`[slurm] unknown_accounts = "create"`): never unlimited, since
        Slurm's input names it, not an admin (`[ledger] new_accounts` is for bags only).
        Raises UnknownAccount when it does not exist and `create_cpu_h` is None. The
        caller writes what it returns (the account's row and first credit) whatever
        becomes of the run: an account created with too little credit for its first job
        still exists for an admin to credit."""
        if self.exists(account):
            return None, []
        if create_cpu_h is None:
            raise UnknownAccount(account)
        _check_credit(create_cpu_h)
        note = "created for a Slurm user's job ([slurm] unknown_accounts)"
        return self.create(account, False, create_cpu_h, now, note)

    def reserve_run(self, account: str, key: str, cpu_h: float) -> Entry:
        """Reserve for a run of a Slurm user's job (its CPUs × its time limit) from an
        account that exists (open_run_account). Raises InsufficientCredit, changing
        nothing."""
        return self.ledger.reserve(account, key, cpu_h)

    def settle_run(self, key: str, cpus: float, elapsed_s: float, preempted: bool) -> list[Entry]:
        """A run ended: charge its CPUs × the time it ran, release the rest."""
        charge_it = self.settings.charge_preempted or not preempted
        return self.ledger.settle(key, cpus, elapsed_s, charge_it)

    def charge_unreserved(
        self, account: str, key: str, cpus: float, elapsed_s: float
    ) -> list[Entry]:
        """A run whose start was never reported (its prolog callback was lost): what it
        used is reserved and charged at once, whatever the balance, since it happened.
        The account exists (open_run_account)."""
        used = cpus * max(0.0, elapsed_s) / 3600.0
        entries = [self.ledger.reserve(account, key, used, overdraw=True)]
        return entries + self.ledger.settle(key, cpus, elapsed_s)

    def reserve_next(self, bag_id: str, idx: int, number: int, spec: BagSpec) -> list[Entry] | None:
        """Reserve for attempt `number` of a job; None when the account cannot cover it."""
        try:
            return [
                self.ledger.reserve(
                    spec.account,
                    reservation_key(bag_id, idx, number),
                    self.per_attempt_cpu_h(spec),
                )
            ]
        except InsufficientCredit:
            return None

    def release(self, bag_id: str, idx: int, number: int) -> list[Entry]:
        """The job ended without running attempt `number`: give its reservation back."""
        return self.ledger.release(reservation_key(bag_id, idx, number))

    def hold(self, account: str, bag_id: str, idx: int, first: bool = False) -> None:
        queue = self.held.setdefault(account, HeldQueue())
        if first:
            queue.appendleft((bag_id, idx))
        else:
            queue.append((bag_id, idx))

    def hold_range(self, account: str, bag_id: str, start: int, stop: int) -> None:
        """Hold a bag's jobs start..stop-1, in order, after the account's held jobs."""
        self.held.setdefault(account, HeldQueue()).extend_range(bag_id, start, stop)

    def credit(self, account: str, cpu_h: float) -> Entry:
        return self.ledger.credit(account, cpu_h)

    # --- views and recovery -----------------------------------------------------------------

    def view(self, account: str) -> dict[str, Any]:
        balance = self.ledger.balance(account)
        unlimited = self.unlimited.get(account, False)
        return {
            "account": account,
            "unlimited": unlimited,
            "allocation_cpu_h": None if unlimited else balance.allocation,
            "charged_cpu_h": balance.charged,
            "reserved_cpu_h": balance.reserved,
            "available_cpu_h": None if unlimited else max(0.0, balance.available),
            "held_jobs": len(self.held.get(account, ())),
        }

    def load(self, state: LedgerState) -> None:
        """Rebuild from the store's ledger (Store.ledger_state)."""
        self.ledger = Ledger()
        self.unlimited = {a["name"]: bool(a["unlimited"]) for a in state["accounts"]}
        self.held = {}
        for name, unlimited in self.unlimited.items():
            if unlimited:
                self.ledger.balance(name).allocation = math.inf
        for row in state["sums"]:
            balance = self.ledger.balance(row["account"])
            if row["kind"] == "credit":
                balance.allocation += row["cpu_h"]
            elif row["kind"] == "reserve":
                balance.reserved += row["cpu_h"]
            elif row["kind"] == "charge":
                balance.reserved -= row["cpu_h"]
                balance.charged += row["cpu_h"]
            else:
                balance.reserved -= row["cpu_h"]
        for reservation in state["open"]:
            self.ledger.open[reservation["key"]] = (reservation["account"], reservation["cpu_h"])
        # A charge without its release (none is written without the other) cannot be
        # left open, so `open` is exactly the reservations still held.
