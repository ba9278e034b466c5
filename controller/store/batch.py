"""The write batch: the rows the scheduler changed in one pass, and the SQL that
writes them in one transaction (`apply_batch`, run by the engine's writer).

Each kind of change is a small dataclass with named fields (JobChange,
AttemptChange, VmChange, ...); `WriteBatch`'s methods (`batch.job(...)`,
`batch.attempt(...)`, ...) build them, so callers never see the rows' order. Rows
are keyed where an object may change twice in a pass, so it is written once; the
running totals of bags (usage, checkpoints) and the job counts per state are
deltas that add up. Each row class's `params` gives the values in the order of its
statement's placeholders.

The four kinds every job makes several of (jobs, attempts, transitions, ledger
entries: ~1.2 million rows in the 100,000-job simulation) are kept as plain tuples
in that order: their dataclasses declare the columns, and making a tuple costs a
fraction of a dataclass's `__init__` (issue 24).
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from operator import attrgetter, itemgetter
from typing import Any

from controller.store.rows import SlurmRunRow


@dataclass(slots=True)
class JobChange:
    """A job's state and outcome as the scheduler left it (UPDATE jobs)."""

    bag_id: str
    idx: int
    state: str
    attempts: int
    counted_attempts: int
    exit_code: int | None
    reason: str
    vm_id: str | None
    started_at: float | None
    ended_at: float | None
    runtime_s: float | None


# A job's row in a batch: the SET columns, then the key (the WHERE clause).
JobParams = tuple[
    str, int, int, int | None, str, str | None, float | None, float | None, float | None, str, int
]


@dataclass(slots=True)
class AttemptChange:
    """An attempt, new or changed (INSERT OR REPLACE INTO attempts)."""

    bag_id: str
    idx: int
    number: int
    vm_id: str
    state: str
    started_at: float
    ended_at: float | None
    exit_code: int | None
    reason: str
    log_path: str
    ref: str = ""
    ran_at: float | None = None  # when its program began (None: it has not)


@dataclass(slots=True)
class VmChange:
    """A VM, new or changed (INSERT OR REPLACE INTO vms)."""

    id: str
    provider_id: str
    driver: str
    vm_type: str
    zone: str
    spot: int | bool
    state: str
    reason: str
    cpus: int
    gpus: int
    memory_gb: float
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    requested_at: float
    running_at: float | None
    ended_at: float | None
    time_scale: float = 1.0
    ready_at: float | None = None
    pool_node: str = ""
    notice_until: float | None = None


@dataclass(slots=True)
class BagEnd:
    """A bag that finished (UPDATE bags)."""

    bag_id: str
    state: str
    finished_at: float


@dataclass(slots=True)
class Transition:
    """A state change of a bag, job, attempt or VM (INSERT INTO transitions)."""

    at: float
    entity: str
    entity_id: str
    from_state: str
    to_state: str
    reason: str = ""


@dataclass(slots=True)
class Usage:
    """What ended attempts add to their bag's running totals (UPDATE bags)."""

    attempts_ended: int = 0
    preemptions: int = 0
    attempt_s: float = 0.0
    preempted_s: float = 0.0

    def add(self, other: Usage) -> None:
        self.attempts_ended += other.attempts_ended
        self.preemptions += other.preemptions
        self.attempt_s += other.attempt_s
        self.preempted_s += other.preempted_s


@dataclass(slots=True)
class CheckpointTotals:
    """What checkpoints and preemptions add to their bag's totals (UPDATE bags)."""

    checkpoints: int = 0
    checkpoint_s: float = 0.0  # time the written checkpoints took
    lost_s: float = 0.0  # work preemptions threw away

    def add(self, other: CheckpointTotals) -> None:
        self.checkpoints += other.checkpoints
        self.checkpoint_s += other.checkpoint_s
        self.lost_s += other.lost_s


@dataclass(slots=True)
class Progress:
    """The work a job has saved, after its latest written checkpoint (UPDATE jobs)."""

    bag_id: str
    idx: int
    work_saved_s: float
    checkpoints: int


@dataclass(slots=True)
class CheckpointRecord:
    """One checkpoint of an attempt, written or given up on (INSERT INTO checkpoints)."""

    bag_id: str
    idx: int
    number: int  # the attempt
    requested_at: float
    at: float
    ok: int
    work_s: float
    vm_age_h: float
    detail: str = ""


@dataclass(slots=True)
class LedgerRow:
    """One ledger entry (INSERT INTO ledger); the same order as the tuples that
    create_bag, create_account and append_ledger take."""

    at: float
    account: str
    kind: str
    cpu_h: float
    key: str
    note: str = ""


@dataclass(slots=True)
class CallbackRecord:
    """A Slurm callback handled (INSERT OR IGNORE INTO callbacks)."""

    key: str
    at: float
    kind: str
    subject: str


@dataclass(slots=True)
class BudgetRow:
    """One dollar ledger entry (budget_reservations: a reserve inserts the attempt's row,
    a charge settles it, a release is the rest and writes nothing): an attempt's reservation,
    charge or release against its bag's and account's budgets."""

    at: float
    account: str
    bag_id: str
    kind: str
    usd: float
    key: str
    month: str
    new_month: bool = False  # a charge in another month than its reservation's


@dataclass(slots=True)
class EventRecord:
    """An event and the webhooks to deliver it to (INSERT INTO events, event_deliveries)."""

    id: str
    created_at: float
    kind: str
    bag_id: str | None
    account: str | None
    payload: str  # JSON
    urls: tuple[str, ...] = ()


def _columns(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


ATTEMPT_COLUMNS = _columns(AttemptChange)
VM_COLUMNS = _columns(VmChange)
# One declaration of a pool run's row: the store's TypedDict (its keys are the columns).
SLURM_RUN_COLUMNS = tuple(SlurmRunRow.__annotations__)
TRANSITION_COLUMNS = _columns(Transition)
CHECKPOINT_COLUMNS = _columns(CheckpointRecord)
LEDGER_COLUMNS = _columns(LedgerRow)
CALLBACK_COLUMNS = _columns(CallbackRecord)

# Columns a VM row may leave out (added by later migrations).
_VM_DEFAULTS: dict[str, Any] = {
    "time_scale": 1.0,
    "ready_at": None,
    "pool_node": "",
    "notice_until": None,
}


def _params_in_order(columns: tuple[str, ...]) -> Any:
    """The values of a row in the order of `columns`, as a tuple (columns: two or more)."""
    return attrgetter(*columns)


_VM_PARAMS = _params_in_order(VM_COLUMNS)
_VM_ROW_VALUES = itemgetter(*VM_COLUMNS)  # a VM's row dict -> its values (KeyError if one lacks)
_SLURM_RUN_PARAMS = itemgetter(*SLURM_RUN_COLUMNS)
_CHECKPOINT_PARAMS = _params_in_order(CHECKPOINT_COLUMNS)
_CALLBACK_PARAMS = _params_in_order(CALLBACK_COLUMNS)
_USAGE_PARAMS = _params_in_order(_columns(Usage))
_CHECKPOINT_TOTAL_PARAMS = _params_in_order(_columns(CheckpointTotals))


@dataclass(slots=True)
class WriteBatch:
    """Rows the scheduler changed in one pass, written in one transaction.

    Rows are keyed, so an object changed twice in a pass is written once.
    """

    jobs: dict[tuple[str, int], JobParams] = field(default_factory=dict)
    # Tuples of AttemptChange's, Transition's and LedgerRow's fields, in their order.
    attempts: dict[tuple[str, int, int], tuple[Any, ...]] = field(default_factory=dict)
    vms: dict[str, VmChange] = field(default_factory=dict)
    bags: dict[str, BagEnd] = field(default_factory=dict)
    transitions: list[tuple[float, str, str, str, str, str]] = field(default_factory=list)
    count_deltas: defaultdict[tuple[str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )  # (bag id, job state) -> change in the number of jobs in that state
    usage_deltas: dict[str, Usage] = field(default_factory=dict)
    progress: dict[tuple[str, int], Progress] = field(default_factory=dict)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    checkpoint_deltas: dict[str, CheckpointTotals] = field(default_factory=dict)
    ledger: list[tuple[float, str, str, float, str, str]] = field(default_factory=list)
    callbacks: dict[str, CallbackRecord] = field(default_factory=dict)
    accounts: list[dict[str, Any]] = field(default_factory=list)  # opened by this batch
    slurm_runs: dict[str, SlurmRunRow] = field(default_factory=dict)
    budget: list[BudgetRow] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.jobs
            or self.attempts
            or self.vms
            or self.bags
            or self.transitions
            or self.progress
            or self.checkpoints
            or self.checkpoint_deltas
            or self.ledger
            or self.callbacks
            or self.accounts
            or self.slurm_runs
            or self.budget
            or self.events
        )

    def size(self) -> int:
        return len(self.jobs) + len(self.attempts) + len(self.vms) + len(self.transitions)

    def merge(self, later: WriteBatch) -> None:
        """Fold a later batch into this one (later rows win; deltas add up)."""
        self.jobs.update(later.jobs)
        self.attempts.update(later.attempts)
        self.vms.update(later.vms)
        self.bags.update(later.bags)
        self.transitions.extend(later.transitions)
        for bag_state, n in later.count_deltas.items():
            self.count_deltas[bag_state] += n
        for bag_id, usage in later.usage_deltas.items():
            self.usage_deltas.setdefault(bag_id, Usage()).add(usage)
        self.progress.update(later.progress)
        self.ledger.extend(later.ledger)
        for key, row in later.callbacks.items():
            self.callbacks.setdefault(key, row)
        self.accounts.extend(later.accounts)
        self.slurm_runs.update(later.slurm_runs)
        self.checkpoints.extend(later.checkpoints)
        for bag_id, totals in later.checkpoint_deltas.items():
            self.checkpoint_deltas.setdefault(bag_id, CheckpointTotals()).add(totals)
        self.budget.extend(later.budget)
        self.events.extend(later.events)

    def job(
        self,
        bag_id: str,
        idx: int,
        state: str,
        attempts: int,
        counted: int,
        exit_code: int | None,
        reason: str,
        vm_id: str | None,
        started_at: float | None,
        ended_at: float | None,
        runtime_s: float | None,
    ) -> None:
        self.jobs[(bag_id, idx)] = (
            str(state),  # a plain str: see `transition`
            attempts,
            counted,
            exit_code,
            reason,
            vm_id,
            started_at,
            ended_at,
            runtime_s,
            bag_id,
            idx,
        )

    def job_state_change(self, bag_id: str, from_state: str, to_state: str) -> None:
        self.count_deltas[(bag_id, from_state)] -= 1
        self.count_deltas[(bag_id, to_state)] += 1

    def attempt(
        self,
        bag_id: str,
        idx: int,
        number: int,
        vm_id: str,
        state: str,
        started_at: float,
        ended_at: float | None,
        exit_code: int | None,
        reason: str,
        log_path: str,
        ref: str = "",
        ran_at: float | None = None,
    ) -> None:
        self.attempts[(bag_id, idx, number)] = (
            bag_id,
            idx,
            number,
            vm_id,
            str(state),  # a plain str: see `transition`
            started_at,
            ended_at,
            exit_code,
            reason,
            log_path,
            ref,
            ran_at,
        )

    def vm(self, row: dict[str, Any]) -> None:
        """A VM's row (every column of VM_COLUMNS, or its default for the later ones)."""
        self.vms[row["id"]] = VmChange(*_VM_ROW_VALUES({**_VM_DEFAULTS, **row}))

    def bag_finished(self, bag_id: str, state: str, finished_at: float) -> None:
        self.bags[bag_id] = BagEnd(bag_id, state, finished_at)

    def transition(
        self,
        at: float,
        entity: str,
        entity_id: str,
        from_state: str,
        to_state: str,
        reason: str = "",
    ) -> None:
        # States come as StrEnum members; sqlite3 binds a str subclass through its
        # adapter look-up (a failed __conform__ lookup on the member: ~0.65 µs a value,
        # 0.3 s of the 231,000 transitions of the 100,000-job simulation), a plain str
        # directly. str() of a member is its value as a plain str.
        self.transitions.append((at, entity, entity_id, str(from_state), str(to_state), reason))

    def usage(
        self,
        bag_id: str,
        *,
        preempted: bool,
        attempt_s: float,
    ) -> None:
        """Add one ended attempt to its bag's running totals."""
        totals = self.usage_deltas.get(bag_id)
        if totals is None:
            totals = self.usage_deltas[bag_id] = Usage()
        totals.attempts_ended += 1
        totals.preemptions += int(preempted)
        totals.attempt_s += attempt_s
        totals.preempted_s += attempt_s if preempted else 0.0

    def checkpoint(
        self,
        bag_id: str,
        idx: int,
        number: int,
        *,
        requested_at: float,
        at: float,
        ok: bool,
        work_saved_s: float,
        checkpoints: int,
        vm_age_h: float,
        detail: str = "",
    ) -> None:
        """One checkpoint of an attempt ended (`ok`: the job wrote it); a written one
        moves the job's saved work on and adds its duration to the bag's total."""
        self.checkpoints.append(
            CheckpointRecord(
                bag_id, idx, number, requested_at, at, int(ok), work_saved_s, vm_age_h, detail
            )
        )
        if ok:
            self.progress[(bag_id, idx)] = Progress(bag_id, idx, work_saved_s, checkpoints)
            totals = self.checkpoint_deltas.setdefault(bag_id, CheckpointTotals())
            totals.checkpoints += 1
            totals.checkpoint_s += max(0.0, at - requested_at)

    def ledger_entries(self, at: float, entries: Iterable[Any], note: str = "") -> None:
        """Ledger entries (policies.ledger_rules.Entry) caused by this batch's changes."""
        self.ledger.extend([(at, e.account, e.kind, e.cpu_h, e.key, note) for e in entries])

    def account(self, row: dict[str, Any]) -> None:
        """An account opened in memory by this batch's changes (a Slurm user's first job)."""
        self.accounts.append(row)

    def slurm_run(self, row: SlurmRunRow) -> None:
        """A pool run's row, as it is now (a copy: the caller keeps changing its own)."""
        self.slurm_runs[row["key"]] = SlurmRunRow(**row)

    def callback(self, key: str, at: float, kind: str, subject: str) -> None:
        """A callback was handled (with whatever else this batch changes because of it)."""
        self.callbacks.setdefault(key, CallbackRecord(key, at, kind, subject))

    def budget_entries(self, at: float, entries: Iterable[Any]) -> None:
        """Dollar ledger entries (policies.budget_rules.Entry) caused by this batch's changes."""
        if not entries:  # (most attempts: no bag or account of theirs has a budget)
            return
        # A release writes nothing (the row keeps what was reserved and what was charged).
        self.budget.extend(
            BudgetRow(at, e.account, e.bag_id, e.kind, e.usd, e.key, e.month, e.new_month)
            for e in entries
            if e.kind != "release"
        )

    def event(self, record: EventRecord) -> None:
        """An event raised by this batch's changes, with its deliveries."""
        self.events.append(record)

    def work_lost(self, bag_id: str, lost_s: float) -> None:
        """Work a preemption threw away (since the job's last checkpoint)."""
        self.checkpoint_deltas.setdefault(bag_id, CheckpointTotals()).lost_s += lost_s


def _insert_sql(table: str, columns: tuple[str, ...], verb: str = "INSERT") -> str:
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


_INSERT_ATTEMPT = _insert_sql("attempts", ATTEMPT_COLUMNS, "INSERT OR REPLACE")
_INSERT_VM = _insert_sql("vms", VM_COLUMNS, "INSERT OR REPLACE")
_INSERT_SLURM_RUN = _insert_sql("slurm_runs", SLURM_RUN_COLUMNS, "INSERT OR REPLACE")
_INSERT_CHECKPOINT = _insert_sql("checkpoints", CHECKPOINT_COLUMNS)
_INSERT_CALLBACK = _insert_sql("callbacks", CALLBACK_COLUMNS, "INSERT OR IGNORE")
_INSERT_TRANSITION = _insert_sql("transitions", TRANSITION_COLUMNS)
_INSERT_LEDGER = _insert_sql("ledger", LEDGER_COLUMNS)
_INSERT_BUDGET = (
    "INSERT INTO budget_reservations (key, bag_id, account, reserved_at, reserved_usd, month) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
# A charge sets no indexed column (SQLite then leaves the indexes alone), but in the rare
# case of a month passed since its reservation.
_SETTLE_BUDGET = (
    "UPDATE budget_reservations SET settled_at = ?, charged_usd = ? "
    "WHERE key = ? AND settled_at IS NULL"
)
_SETTLE_BUDGET_NEW_MONTH = (
    "UPDATE budget_reservations SET settled_at = ?, charged_usd = ?, month = ? "
    "WHERE key = ? AND settled_at IS NULL"
)


def apply_batch(conn: sqlite3.Connection, batch: WriteBatch) -> None:
    """Write a batch (inside the caller's transaction)."""
    if batch.jobs:
        conn.executemany(
            "UPDATE jobs SET state=?, attempts=?, counted_attempts=?, exit_code=?, reason=?, "
            "vm_id=?, started_at=?, ended_at=?, runtime_s=? WHERE bag_id=? AND idx=?",
            batch.jobs.values(),
        )
    if batch.attempts:
        conn.executemany(_INSERT_ATTEMPT, batch.attempts.values())
    if batch.vms:
        conn.executemany(_INSERT_VM, map(_VM_PARAMS, batch.vms.values()))
    deltas = [(b, s, n) for (b, s), n in batch.count_deltas.items() if n]
    if deltas:
        conn.executemany(
            "INSERT INTO bag_job_counts (bag_id, state, n) VALUES (?,?,?) "
            "ON CONFLICT (bag_id, state) DO UPDATE SET n = n + excluded.n",
            deltas,
        )
    if batch.usage_deltas:
        conn.executemany(
            "UPDATE bags SET attempts_ended = attempts_ended + ?, preemptions = preemptions + ?, "
            "attempt_s = attempt_s + ?, preempted_s = preempted_s + ? WHERE id = ?",
            [(*_USAGE_PARAMS(usage), bag_id) for bag_id, usage in batch.usage_deltas.items()],
        )
    for account in batch.accounts:  # before the ledger entries that credit it
        insert_account(conn, account)
    if batch.slurm_runs:
        conn.executemany(_INSERT_SLURM_RUN, map(_SLURM_RUN_PARAMS, batch.slurm_runs.values()))
    if batch.ledger:
        insert_ledger(conn, batch.ledger)
    if batch.progress:
        conn.executemany(
            "UPDATE jobs SET work_saved_s=?, checkpoints=? WHERE bag_id=? AND idx=?",
            [(p.work_saved_s, p.checkpoints, p.bag_id, p.idx) for p in batch.progress.values()],
        )
    if batch.checkpoints:
        conn.executemany(_INSERT_CHECKPOINT, map(_CHECKPOINT_PARAMS, batch.checkpoints))
    if batch.checkpoint_deltas:
        conn.executemany(
            "UPDATE bags SET checkpoints = checkpoints + ?, checkpoint_s = checkpoint_s + ?, "
            "lost_s = lost_s + ? WHERE id = ?",
            [
                (*_CHECKPOINT_TOTAL_PARAMS(totals), bag_id)
                for bag_id, totals in batch.checkpoint_deltas.items()
            ],
        )
    if batch.bags:
        conn.executemany(
            "UPDATE bags SET state=?, finished_at=? WHERE id=?",
            [(b.state, b.finished_at, b.bag_id) for b in batch.bags.values()],
        )
    if batch.callbacks:
        conn.executemany(_INSERT_CALLBACK, map(_CALLBACK_PARAMS, batch.callbacks.values()))
    if batch.transitions:
        conn.executemany(_INSERT_TRANSITION, batch.transitions)
    _apply_money_and_events(conn, batch)


def _apply_money_and_events(conn: sqlite3.Connection, batch: WriteBatch) -> None:
    """The dollar ledger's entries and the events (docs/notifications.md) of a batch."""
    rows = batch.budget
    if rows:
        reserved = [
            (r.key, r.bag_id, r.account, r.at, r.usd, r.month) for r in rows if r.kind == "reserve"
        ]
        if reserved:
            conn.executemany(_INSERT_BUDGET, reserved)
        charged = [(r.at, r.usd, r.key) for r in rows if r.kind == "charge" and not r.new_month]
        if charged:
            conn.executemany(_SETTLE_BUDGET, charged)
        moved = [(r.at, r.usd, r.month, r.key) for r in rows if r.kind == "charge" and r.new_month]
        if moved:
            conn.executemany(_SETTLE_BUDGET_NEW_MONTH, moved)
    if batch.events:
        insert_events(conn, batch.events)


def insert_events(conn: sqlite3.Connection, events: Iterable[EventRecord]) -> None:
    """Events and one pending delivery per webhook, due at once."""
    for event in events:
        conn.execute(
            "INSERT INTO events (id, created_at, kind, bag_id, account, payload) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (event.id, event.created_at, event.kind, event.bag_id, event.account, event.payload),
        )
        conn.executemany(
            "INSERT OR IGNORE INTO event_deliveries (event_id, url, state, next_try_at) "
            "VALUES (?, ?, 'pending', ?)",
            [(event.id, url, event.created_at) for url in event.urls],
        )


def insert_ledger(conn: sqlite3.Connection, rows: Iterable[tuple]) -> None:
    """Append ledger entries given as (at, account, kind, cpu_h, key, note) tuples, and
    keep ledger_balances and ledger_open in step with them (every ledger entry is
    appended here).

    Triggers did that once per entry (10 of the 16 µs an entry took: a third of the
    simulator's store time); here it is done once per call with the same result: each
    balance is the stored one plus the entries' amounts added one by one in their order
    (the same floating-point sums), a reservation is open until its release. A key is
    reserved once at most (the ledger_once index), so a reservation released in the same
    call never reaches ledger_open."""
    rows = rows if isinstance(rows, list) else list(rows)
    if not rows:
        return
    conn.executemany(_INSERT_LEDGER, rows)
    balances: dict[tuple[str, str], float | None] = {}
    opened: dict[str, tuple[str, str, float]] = {}
    released: list[tuple[str]] = []
    for _at, account, kind, cpu_h, key, _note in rows:
        pair = (account, kind)
        if pair not in balances:
            stored = conn.execute(
                "SELECT cpu_h FROM ledger_balances WHERE account = ? AND kind = ?", pair
            ).fetchone()
            balances[pair] = None if stored is None else stored[0]
        total = balances[pair]
        balances[pair] = float(cpu_h) if total is None else total + float(cpu_h)
        if kind == "reserve":
            opened[key] = (key, account, float(cpu_h))
        elif kind == "release" and opened.pop(key, None) is None:
            released.append((key,))  # reserved in an earlier call
    conn.executemany(
        "INSERT INTO ledger_balances (account, kind, cpu_h) VALUES (?, ?, ?) "
        "ON CONFLICT (account, kind) DO UPDATE SET cpu_h = excluded.cpu_h",
        [(account, kind, total) for (account, kind), total in balances.items()],
    )
    if released:
        conn.executemany("DELETE FROM ledger_open WHERE key = ?", released)
    if opened:
        conn.executemany(
            "INSERT INTO ledger_open (key, account, cpu_h) VALUES (?, ?, ?)", opened.values()
        )


def insert_account(conn: sqlite3.Connection, account: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO accounts (name, unlimited, created_at, note) VALUES (?, ?, ?, ?)",
        (
            account["name"],
            int(account["unlimited"]),
            account["created_at"],
            account.get("note", ""),
        ),
    )
