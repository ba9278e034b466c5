"""The store: every SQL statement spotbag runs lives in this module.

SQLite in WAL mode through sqlite-utils. All writes go through one writer
thread, one transaction per call (the datasette `execute_write_fn` pattern);
reads run on a small pool of reader threads with their own connections, so the
event loop never waits on disk. `threaded=False` runs everything inline on one
connection, which the simulator uses (it has no event loop to protect).

Schema changes are numbered migrations recorded in `PRAGMA user_version` and in
the `migrations` table; `open()` applies the missing ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

T = TypeVar("T")

MIGRATIONS: list[tuple[str, str]] = [
    (
        "initial schema",
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE bags (
            id TEXT PRIMARY KEY,
            account TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            job_count INTEGER NOT NULL,
            created_at REAL NOT NULL,
            finished_at REAL,
            cancel_requested_at REAL,
            idempotency_key TEXT UNIQUE,
            -- usage of ended attempts, kept up to date with every attempt end
            attempts_ended INTEGER NOT NULL DEFAULT 0,
            preemptions INTEGER NOT NULL DEFAULT 0,
            attempt_s REAL NOT NULL DEFAULT 0,
            preempted_s REAL NOT NULL DEFAULT 0,
            vm_s REAL NOT NULL DEFAULT 0,
            spot_cost_usd REAL NOT NULL DEFAULT 0,
            on_demand_cost_usd REAL NOT NULL DEFAULT 0
        );
        CREATE INDEX bags_by_state ON bags(state, created_at);
        CREATE INDEX bags_by_account ON bags(account, created_at);
        CREATE TABLE bag_job_counts (
            bag_id TEXT NOT NULL,
            state TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (bag_id, state)
        ) WITHOUT ROWID;
        CREATE TABLE jobs (
            bag_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            params TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            counted_attempts INTEGER NOT NULL DEFAULT 0,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            vm_id TEXT,
            started_at REAL,
            ended_at REAL,
            runtime_s REAL,
            PRIMARY KEY (bag_id, idx)
        ) WITHOUT ROWID;
        CREATE INDEX jobs_by_state ON jobs(bag_id, state, idx);
        CREATE TABLE attempts (
            bag_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            number INTEGER NOT NULL,
            vm_id TEXT NOT NULL,
            state TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            log_path TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (bag_id, idx, number)
        ) WITHOUT ROWID;
        CREATE INDEX attempts_live ON attempts(bag_id) WHERE state IN ('starting', 'running');
        CREATE TABLE vms (
            id TEXT PRIMARY KEY,
            provider_id TEXT NOT NULL DEFAULT '',
            driver TEXT NOT NULL,
            vm_type TEXT NOT NULL,
            zone TEXT NOT NULL DEFAULT '',
            spot INTEGER NOT NULL,
            state TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            cpus INTEGER NOT NULL,
            gpus INTEGER NOT NULL,
            memory_gb REAL NOT NULL,
            spot_price_per_hour REAL NOT NULL,
            on_demand_price_per_hour REAL NOT NULL,
            requested_at REAL NOT NULL,
            running_at REAL,
            ended_at REAL
        );
        CREATE INDEX vms_by_state ON vms(state);
        CREATE TABLE transitions (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            entity TEXT NOT NULL,
            entity_id TEXT NOT NULL,
            from_state TEXT NOT NULL,
            to_state TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX transitions_by_entity ON transitions(entity_id);
        """,
    ),
    (
        "hash of the submitted bag, to tell a retried submission from a different one",
        """
        ALTER TABLE bags ADD COLUMN request_hash TEXT NOT NULL DEFAULT '';
        """,
    ),
    (
        "VM lifetimes in model time, and the preemption models learned from them",
        """
        ALTER TABLE vms ADD COLUMN time_scale REAL NOT NULL DEFAULT 1.0;
        CREATE INDEX vms_ended ON vms(driver, ended_at) WHERE ended_at IS NOT NULL;
        CREATE TABLE preemption_models (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            model TEXT NOT NULL,
            parameters TEXT NOT NULL,
            L REAL,
            n INTEGER NOT NULL,
            censored INTEGER NOT NULL,
            stats TEXT NOT NULL,
            fitted_at REAL NOT NULL,
            reason TEXT NOT NULL,
            active INTEGER NOT NULL
        );
        CREATE INDEX preemption_models_active ON preemption_models(key) WHERE active = 1;
        """,
    ),
    (
        "checkpoints: work each job has saved, every checkpoint, and per bag the time spent "
        "checkpointing and the work lost to preemptions",
        """
        ALTER TABLE jobs ADD COLUMN work_saved_s REAL NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN checkpoints INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE bags ADD COLUMN checkpoints INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE bags ADD COLUMN checkpoint_s REAL NOT NULL DEFAULT 0;
        ALTER TABLE bags ADD COLUMN lost_s REAL NOT NULL DEFAULT 0;
        CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY,
            bag_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            number INTEGER NOT NULL,  -- the attempt
            requested_at REAL NOT NULL,  -- when the job was signalled
            at REAL NOT NULL,  -- when it completed (or was given up on)
            ok INTEGER NOT NULL,
            work_s REAL NOT NULL,  -- work saved by it, seconds of the job's runtime
            vm_age_h REAL NOT NULL,  -- model hours, when signalled
            detail TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX checkpoints_by_job ON checkpoints(bag_id, idx, number);
        """,
    ),
    (
        "accounts and the append-only CPU-hour ledger (SPEC.md §6)",
        """
        CREATE TABLE accounts (
            name TEXT PRIMARY KEY,
            unlimited INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            note TEXT NOT NULL DEFAULT ''
        );
        CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            account TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('credit', 'reserve', 'charge', 'release')),
            cpu_h REAL NOT NULL CHECK (cpu_h >= 0),
            key TEXT NOT NULL DEFAULT '',  -- the reservation: bag:job:attempt
            note TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX ledger_by_account ON ledger(account, id);
        -- A reservation is made, charged and released once each.
        CREATE UNIQUE INDEX ledger_once ON ledger(key, kind) WHERE kind != 'credit';
        """,
    ),
    (
        "per-account API tokens (only a hash of the secret is kept)",
        """
        CREATE TABLE account_tokens (
            id TEXT PRIMARY KEY,
            account TEXT NOT NULL,
            secret_sha256 TEXT NOT NULL,
            created_at REAL NOT NULL,
            revoked_at REAL,
            note TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX account_tokens_by_account ON account_tokens(account);
        """,
    ),
    (
        "attempts by VM, for cost reports (every job that shared a VM splits its cost)",
        """
        CREATE INDEX attempts_by_vm ON attempts(vm_id, bag_id);
        """,
    ),
    (
        "spot price samples (kept for [hopping] retention_days) and the hopper's migrations (hops)",
        """
        CREATE TABLE price_samples (
            vm_type TEXT NOT NULL,
            zone TEXT NOT NULL DEFAULT '',
            at REAL NOT NULL,  -- epoch seconds
            price_per_hour REAL NOT NULL,
            PRIMARY KEY (vm_type, zone, at)
        ) WITHOUT ROWID;
        CREATE INDEX price_samples_by_time ON price_samples(at);
        CREATE TABLE hops (  -- "migrations" records the schema's own
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            vm_id TEXT NOT NULL,  -- the VM left
            from_type TEXT NOT NULL,
            to_type TEXT NOT NULL,  -- the type the policy chose to move to
            policy TEXT NOT NULL,
            price_from REAL NOT NULL,  -- USD/h at the decision
            price_to REAL NOT NULL,
            index_price REAL,  -- the index (USD/h per sqrt(vCPU*GB)) at the decision
            jobs TEXT NOT NULL DEFAULT '[]',  -- [[bag_id, idx], ...] asked to checkpoint and move
            reason TEXT NOT NULL
        );
        """,
    ),
    (
        "executors that run attempts elsewhere (Slurm): each attempt's reference there (the "
        "Slurm job id), when a VM joined the cluster, the Slurm node a pool VM serves, and "
        "the callbacks received, each recorded once with the change it caused",
        """
        ALTER TABLE attempts ADD COLUMN ref TEXT NOT NULL DEFAULT '';
        ALTER TABLE vms ADD COLUMN ready_at REAL;
        ALTER TABLE vms ADD COLUMN pool_node TEXT NOT NULL DEFAULT '';
        CREATE TABLE callbacks (
            key TEXT PRIMARY KEY,  -- job name:job id:restart count:event (SLURM.md)
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL DEFAULT ''
        ) WITHOUT ROWID;
        """,
    ),
    (
        "runs of Slurm users' jobs on power-saving pools (charged to their accounts)",
        """
        CREATE TABLE slurm_runs (
            key TEXT PRIMARY KEY,  -- the ledger reservation: slurm:job id:restart:job name
            job_id TEXT NOT NULL,
            job_name TEXT NOT NULL,
            restart INTEGER NOT NULL,
            user TEXT NOT NULL,
            account TEXT NOT NULL,
            partition TEXT NOT NULL,
            node TEXT NOT NULL,
            vm_id TEXT NOT NULL DEFAULT '',
            cpus REAL NOT NULL,
            reserved_cpu_h REAL NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL,
            state TEXT NOT NULL,  -- running, or the attempt state it ended in
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT ''
        ) WITHOUT ROWID;
        CREATE INDEX slurm_runs_by_account ON slurm_runs(account, started_at);
        CREATE INDEX slurm_runs_by_vm ON slurm_runs(vm_id);
        CREATE INDEX slurm_runs_open ON slurm_runs(state) WHERE state = 'running';
        """,
    ),
    (
        "ledger balances and open reservations kept beside the ledger by triggers, so that "
        "a restart reads what is open, not the whole history",
        """
        CREATE TABLE ledger_balances (
            account TEXT NOT NULL,
            kind TEXT NOT NULL,
            cpu_h REAL NOT NULL,  -- sum of the account's entries of this kind
            PRIMARY KEY (account, kind)
        ) WITHOUT ROWID;
        CREATE TABLE ledger_open (
            key TEXT PRIMARY KEY,  -- a reservation with no release entry yet
            account TEXT NOT NULL,
            cpu_h REAL NOT NULL
        ) WITHOUT ROWID;
        INSERT INTO ledger_balances (account, kind, cpu_h)
            SELECT account, kind, sum(cpu_h) FROM ledger GROUP BY account, kind;
        -- NOT IN builds the set of released keys once (a correlated NOT EXISTS here
        -- scanned the ledger once per reservation: quadratic in the history).
        INSERT INTO ledger_open (key, account, cpu_h)
            SELECT key, account, cpu_h FROM ledger WHERE kind = 'reserve'
            AND key NOT IN (SELECT key FROM ledger WHERE kind = 'release');
        CREATE TRIGGER ledger_balance_on_insert AFTER INSERT ON ledger BEGIN
            INSERT INTO ledger_balances (account, kind, cpu_h)
                VALUES (NEW.account, NEW.kind, NEW.cpu_h)
                ON CONFLICT (account, kind) DO UPDATE SET cpu_h = cpu_h + excluded.cpu_h;
        END;
        CREATE TRIGGER ledger_open_on_reserve AFTER INSERT ON ledger
        WHEN NEW.kind = 'reserve' BEGIN
            INSERT INTO ledger_open (key, account, cpu_h)
                VALUES (NEW.key, NEW.account, NEW.cpu_h);
        END;
        CREATE TRIGGER ledger_open_on_release AFTER INSERT ON ledger
        WHEN NEW.kind = 'release' BEGIN
            DELETE FROM ledger_open WHERE key = NEW.key;
        END;
        """,
    ),
    (
        "idempotency keys belong to an account: unique per (account, key), not across "
        "accounts (the bags table is rebuilt without its column-wide UNIQUE constraint)",
        """
        CREATE TABLE bags_scoped (
            id TEXT PRIMARY KEY,
            account TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            job_count INTEGER NOT NULL,
            created_at REAL NOT NULL,
            finished_at REAL,
            cancel_requested_at REAL,
            idempotency_key TEXT,
            attempts_ended INTEGER NOT NULL DEFAULT 0,
            preemptions INTEGER NOT NULL DEFAULT 0,
            attempt_s REAL NOT NULL DEFAULT 0,
            preempted_s REAL NOT NULL DEFAULT 0,
            vm_s REAL NOT NULL DEFAULT 0,
            spot_cost_usd REAL NOT NULL DEFAULT 0,
            on_demand_cost_usd REAL NOT NULL DEFAULT 0,
            request_hash TEXT NOT NULL DEFAULT '',
            checkpoints INTEGER NOT NULL DEFAULT 0,
            checkpoint_s REAL NOT NULL DEFAULT 0,
            lost_s REAL NOT NULL DEFAULT 0
        );
        INSERT INTO bags_scoped (
            id, account, name, spec, state, job_count, created_at, finished_at,
            cancel_requested_at, idempotency_key, attempts_ended, preemptions, attempt_s,
            preempted_s, vm_s, spot_cost_usd, on_demand_cost_usd, request_hash, checkpoints,
            checkpoint_s, lost_s
        )
        SELECT
            id, account, name, spec, state, job_count, created_at, finished_at,
            cancel_requested_at, idempotency_key, attempts_ended, preemptions, attempt_s,
            preempted_s, vm_s, spot_cost_usd, on_demand_cost_usd, request_hash, checkpoints,
            checkpoint_s, lost_s
        FROM bags;
        DROP TABLE bags;
        ALTER TABLE bags_scoped RENAME TO bags;
        CREATE INDEX bags_by_state ON bags(state, created_at);
        CREATE INDEX bags_by_account ON bags(account, created_at);
        CREATE UNIQUE INDEX bags_by_idempotency_key ON bags(account, idempotency_key)
            WHERE idempotency_key IS NOT NULL;
        """,
    ),
]

SLURM_RUN_COLUMNS = (
    "key",
    "job_id",
    "job_name",
    "restart",
    "user",
    "account",
    "partition",
    "node",
    "vm_id",
    "cpus",
    "reserved_cpu_h",
    "started_at",
    "ended_at",
    "state",
    "exit_code",
    "reason",
)


class StoreClosed(RuntimeError):
    pass


class StoreUnavailable(RuntimeError):
    """The database cannot be written (or read) now: the disk is full, an I/O error, a
    read-only or locked file. Outside the daemon, and it may pass: retry later."""


# SQLite result codes of conditions outside the daemon (extended codes share the prefix).
_UNAVAILABLE_CODES = (
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_READONLY",
    "SQLITE_NOMEM",
    "SQLITE_PROTOCOL",
)


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    name = getattr(exc, "sqlite_errorname", None) or ""
    return isinstance(exc, sqlite3.Error) and name.startswith(_UNAVAILABLE_CODES)


class IdempotencyConflict(Exception):
    """An idempotency key already used for a different bag."""

    def __init__(self, key: str, bag_id: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} was used for a different bag ({bag_id})")
        self.key = key
        self.bag_id = bag_id


def job_id_of(bag_id: str, idx: int) -> str:
    return f"{bag_id}-{idx}"


def split_job_id(job_id: str) -> tuple[str, int] | None:
    """(bag_id, idx) of a job id, or None when it is not one."""
    bag_id, sep, idx = job_id.rpartition("-")
    if not sep or not idx.isdigit():
        return None
    return bag_id, int(idx)


@dataclass
class WriteBatch:
    """Rows the scheduler changed in one pass, written in one transaction.

    Rows are keyed, so an object changed twice in a pass is written once.
    """

    jobs: dict[tuple[str, int], tuple] = field(default_factory=dict)
    attempts: dict[tuple[str, int, int], tuple] = field(default_factory=dict)
    vms: dict[str, tuple] = field(default_factory=dict)
    bags: dict[str, tuple] = field(default_factory=dict)
    transitions: list[tuple] = field(default_factory=list)
    count_deltas: defaultdict[tuple[str, str], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    usage_deltas: dict[str, list[float]] = field(default_factory=dict)
    progress: dict[tuple[str, int], tuple] = field(default_factory=dict)  # (saved s, count)
    checkpoints: list[tuple] = field(default_factory=list)
    checkpoint_deltas: dict[str, list[float]] = field(default_factory=dict)  # n, seconds, lost
    ledger: list[tuple] = field(default_factory=list)  # (at, account, kind, cpu_h, key, note)
    callbacks: dict[str, tuple] = field(default_factory=dict)  # key -> (key, at, kind, subject)
    accounts: list[dict[str, Any]] = field(default_factory=list)  # opened by this batch
    slurm_runs: dict[str, tuple] = field(default_factory=dict)  # key -> row (SLURM_RUN_COLUMNS)

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
        for key, n in later.count_deltas.items():
            self.count_deltas[key] += n
        for bag_id, totals in later.usage_deltas.items():
            mine = self.usage_deltas.setdefault(bag_id, [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate(totals):
                mine[i] += value
        self.progress.update(later.progress)
        self.ledger.extend(later.ledger)
        for key, row in later.callbacks.items():
            self.callbacks.setdefault(key, row)
        self.accounts.extend(later.accounts)
        self.slurm_runs.update(later.slurm_runs)
        self.checkpoints.extend(later.checkpoints)
        for bag_id, totals in later.checkpoint_deltas.items():
            mine = self.checkpoint_deltas.setdefault(bag_id, [0, 0.0, 0.0])
            for i, value in enumerate(totals):
                mine[i] += value

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
            state,
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
    ) -> None:
        self.attempts[(bag_id, idx, number)] = (
            bag_id,
            idx,
            number,
            vm_id,
            state,
            started_at,
            ended_at,
            exit_code,
            reason,
            log_path,
            ref,
        )

    def vm(self, row: dict[str, Any]) -> None:
        self.vms[row["id"]] = tuple(row[c] if c in row else _VM_DEFAULTS[c] for c in VM_COLUMNS)

    def bag_finished(self, bag_id: str, state: str, finished_at: float) -> None:
        self.bags[bag_id] = (state, finished_at, bag_id)

    def transition(
        self,
        at: float,
        entity: str,
        entity_id: str,
        from_state: str,
        to_state: str,
        reason: str = "",
    ) -> None:
        self.transitions.append((at, entity, entity_id, from_state, to_state, reason))

    def usage(
        self,
        bag_id: str,
        *,
        preempted: bool,
        attempt_s: float,
        vm_s: float,
        spot_cost_usd: float,
        on_demand_cost_usd: float,
    ) -> None:
        """Add one ended attempt to its bag's running totals."""
        totals = self.usage_deltas.setdefault(bag_id, [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0])
        totals[0] += 1
        totals[1] += int(preempted)
        totals[2] += attempt_s
        totals[3] += attempt_s if preempted else 0.0
        totals[4] += vm_s
        totals[5] += spot_cost_usd
        totals[6] += on_demand_cost_usd

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
            (bag_id, idx, number, requested_at, at, int(ok), work_saved_s, vm_age_h, detail)
        )
        if ok:
            self.progress[(bag_id, idx)] = (work_saved_s, checkpoints, bag_id, idx)
            totals = self.checkpoint_deltas.setdefault(bag_id, [0, 0.0, 0.0])
            totals[0] += 1
            totals[1] += max(0.0, at - requested_at)

    def ledger_entries(self, at: float, entries: Iterable[Any], note: str = "") -> None:
        """Ledger entries (policies.ledger_rules.Entry) caused by this batch's changes."""
        self.ledger.extend((at, e.account, e.kind, e.cpu_h, e.key, note) for e in entries)

    def account(self, row: dict[str, Any]) -> None:
        """An account opened in memory by this batch's changes (a Slurm user's first job)."""
        self.accounts.append(row)

    def slurm_run(self, row: dict[str, Any]) -> None:
        self.slurm_runs[row["key"]] = tuple(row[c] for c in SLURM_RUN_COLUMNS)

    def callback(self, key: str, at: float, kind: str, subject: str) -> None:
        """A callback was handled (with whatever else this batch changes because of it)."""
        self.callbacks.setdefault(key, (key, at, kind, subject))

    def work_lost(self, bag_id: str, lost_s: float) -> None:
        """Work a preemption threw away (since the job's last checkpoint)."""
        totals = self.checkpoint_deltas.setdefault(bag_id, [0, 0.0, 0.0])
        totals[2] += lost_s


VM_COLUMNS = (
    "id",
    "provider_id",
    "driver",
    "vm_type",
    "zone",
    "spot",
    "state",
    "reason",
    "cpus",
    "gpus",
    "memory_gb",
    "spot_price_per_hour",
    "on_demand_price_per_hour",
    "requested_at",
    "running_at",
    "ended_at",
    "time_scale",
    "ready_at",
    "pool_node",
)


# Columns a VM row may leave out (added by later migrations).
_VM_DEFAULTS = {"time_scale": 1.0, "ready_at": None, "pool_node": ""}


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def _apply_batch(conn: sqlite3.Connection, batch: WriteBatch) -> None:
    if batch.jobs:
        conn.executemany(
            "UPDATE jobs SET state=?, attempts=?, counted_attempts=?, exit_code=?, reason=?, "
            "vm_id=?, started_at=?, ended_at=?, runtime_s=? WHERE bag_id=? AND idx=?",
            batch.jobs.values(),
        )
    if batch.attempts:
        conn.executemany(
            "INSERT OR REPLACE INTO attempts (bag_id, idx, number, vm_id, state, started_at, "
            "ended_at, exit_code, reason, log_path, ref) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            batch.attempts.values(),
        )
    if batch.vms:
        conn.executemany(
            f"INSERT OR REPLACE INTO vms ({', '.join(VM_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(VM_COLUMNS))})",
            batch.vms.values(),
        )
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
            "attempt_s = attempt_s + ?, preempted_s = preempted_s + ?, vm_s = vm_s + ?, "
            "spot_cost_usd = spot_cost_usd + ?, on_demand_cost_usd = on_demand_cost_usd + ? "
            "WHERE id = ?",
            [(*totals, bag_id) for bag_id, totals in batch.usage_deltas.items()],
        )
    for account in batch.accounts:  # before the ledger entries that credit it
        _insert_account(conn, account)
    if batch.slurm_runs:
        conn.executemany(
            f"INSERT OR REPLACE INTO slurm_runs ({', '.join(SLURM_RUN_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(SLURM_RUN_COLUMNS))})",
            batch.slurm_runs.values(),
        )
    if batch.ledger:
        _insert_ledger(conn, batch.ledger)
    if batch.progress:
        conn.executemany(
            "UPDATE jobs SET work_saved_s=?, checkpoints=? WHERE bag_id=? AND idx=?",
            batch.progress.values(),
        )
    if batch.checkpoints:
        conn.executemany(
            "INSERT INTO checkpoints (bag_id, idx, number, requested_at, at, ok, work_s, "
            "vm_age_h, detail) VALUES (?,?,?,?,?,?,?,?,?)",
            batch.checkpoints,
        )
    if batch.checkpoint_deltas:
        conn.executemany(
            "UPDATE bags SET checkpoints = checkpoints + ?, checkpoint_s = checkpoint_s + ?, "
            "lost_s = lost_s + ? WHERE id = ?",
            [(*totals, bag_id) for bag_id, totals in batch.checkpoint_deltas.items()],
        )
    if batch.bags:
        conn.executemany("UPDATE bags SET state=?, finished_at=? WHERE id=?", batch.bags.values())
    if batch.callbacks:
        conn.executemany(
            "INSERT OR IGNORE INTO callbacks (key, at, kind, subject) VALUES (?,?,?,?)",
            batch.callbacks.values(),
        )
    if batch.transitions:
        conn.executemany(
            "INSERT INTO transitions (at, entity, entity_id, from_state, to_state, reason) "
            "VALUES (?,?,?,?,?,?)",
            batch.transitions,
        )


def _insert_ledger(conn: sqlite3.Connection, rows: Iterable[tuple]) -> None:
    conn.executemany(
        "INSERT INTO ledger (at, account, kind, cpu_h, key, note) VALUES (?,?,?,?,?,?)", rows
    )


def _insert_account(conn: sqlite3.Connection, account: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO accounts (name, unlimited, created_at, note) VALUES (?, ?, ?, ?)",
        (
            account["name"],
            int(account["unlimited"]),
            account["created_at"],
            account.get("note", ""),
        ),
    )


def _statements(script: str) -> Iterator[str]:
    """The SQL statements of a script, one by one (a trigger's body holds semicolons
    of its own, so split where SQLite says a statement is complete)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n\t;"):
                yield pending
            pending = ""
    if pending.strip(" \n\t;"):
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]}")


def _migrate(conn: sqlite3.Connection) -> int:
    db = sqlite_utils.Database(conn)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if "migrations" not in db.table_names():
        db["migrations"].create(
            {"version": int, "description": str, "applied_at": float}, pk="version"
        )
    for number, (description, ddl) in enumerate(MIGRATIONS, start=1):
        if number <= version:
            continue
        for statement in _statements(ddl):
            conn.execute(statement)
        db["migrations"].insert(
            {"version": number, "description": description, "applied_at": time.time()}
        )
        conn.execute(f"PRAGMA user_version = {number}")
        version = number
    return version


class _Writer(threading.Thread):
    """Runs write functions one at a time, each in its own transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(name="spotbag-store-writer", daemon=True)
        self.conn = conn
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            fn, args, future, loop = item
            try:
                result = _in_transaction(self.conn, fn, args)
            except BaseException as exc:  # hand every failure back to the caller
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _in_transaction(conn: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    """fn(conn, *args) in one transaction, committed, or rolled back on any error (a
    failed COMMIT, e.g. on a full disk, too). Errors from outside the daemon are
    raised as StoreUnavailable."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn, *args)
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            # SQLite may have rolled back itself; the original error says why.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        if _is_unavailable(exc):
            raise StoreUnavailable(f"cannot write the database: {exc}") from exc
        raise
    return result


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence | dict = ()) -> list[dict]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class Store:
    """Async access to the spotbag database at `path`."""

    def __init__(
        self,
        path: str | Path,
        *,
        threaded: bool = True,
        durable: bool = True,
        group_commit: bool = False,
        readers: int = 4,
    ) -> None:
        """`group_commit` (simulator only: it never acts on the outside world)
        folds scheduler batches together and writes them before the next read,
        when they grow large, and on close."""
        self.path = Path(path)
        self._group_commit = group_commit
        self._pending = WriteBatch()
        self._threaded = threaded
        self._synchronous = "FULL" if durable else "OFF"
        self._readers = readers
        self._conn: sqlite3.Connection | None = None
        self._writer: _Writer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._read_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.schema_version = 0
        self.write_error: str | None = None  # why the last write failed, until one works
        self.write_errors = 0  # writes that failed for want of disk, I/O, ...

    # --- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = _connect(self.path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        self._conn = conn
        if self._threaded:
            self._writer = _Writer(conn)
            self._writer.start()
            self._pool = ThreadPoolExecutor(
                self._readers, thread_name_prefix="spotbag-store-reader"
            )
        self.schema_version = await self.write(_migrate)

    async def close(self) -> None:
        if self._conn is not None:
            await self.flush()
        if self._writer is not None:
            self._writer.jobs.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for conn in self._read_conns:
            conn.close()
        self._read_conns.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) in one write transaction on the writer thread. Raises
        StoreUnavailable when the database cannot be written now (`write_error` says
        why until a write succeeds again)."""
        if self._conn is None:
            raise StoreClosed("store is not open")
        try:
            if self._writer is None:
                result = _in_transaction(self._conn, fn, args)
            else:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._writer.jobs.put((fn, args, future, loop))
                result = await future
        except StoreUnavailable as exc:
            self.write_error = str(exc)
            self.write_errors += 1
            raise
        self.write_error = None
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) on a reader connection (a consistent WAL snapshot)."""
        if self._conn is None:
            raise StoreClosed("store is not open")
        if self._pending:
            await self.flush()
        if self._pool is None:
            return fn(self._conn, *args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._read_in_thread, fn, args)

    def _read_in_thread(self, fn: Callable[..., T], args: tuple) -> T:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            conn.execute("PRAGMA query_only = 1")
            self._local.conn = conn
            with self._lock:
                self._read_conns.append(conn)
        conn.execute("BEGIN")
        try:
            return fn(conn, *args)
        finally:
            conn.execute("COMMIT")

    # --- writes ------------------------------------------------------------------

    async def meta_value(self, key: str, default: Callable[[], str]) -> str:
        """The stored value of `key`, storing default() first if it has none."""

        def get_or_set(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return row[0]
            value = default()
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            return value

        return await self.write(get_or_set)

    async def create_bag(
        self,
        bag: dict[str, Any],
        params_json: Iterable[str],
        idempotency_key: str | None,
        *,
        ledger_rows: Sequence[tuple] = (),
        held_from: int | None = None,
        new_account: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Insert a bag and all its jobs (queued; from index `held_from` on, held) with
        their ledger entries (and the account, when it is new) in one transaction.

        Returns (bag row, created). With an idempotency key the bag's account used
        before, nothing is written and the earlier bag is returned, or
        IdempotencyConflict raised when the earlier bag's request_hash differs. Keys are
        scoped to the account: another account's use of the same key is not seen.
        """

        def insert(conn: sqlite3.Connection) -> tuple[dict[str, Any], bool]:
            if idempotency_key is not None:
                # Keys are the account's own: another account's bag is never found here.
                earlier = _rows(
                    conn,
                    "SELECT * FROM bags WHERE account = ? AND idempotency_key = ?",
                    (bag["account"], idempotency_key),
                )
                if earlier:
                    if earlier[0]["request_hash"] != bag.get("request_hash", ""):
                        raise IdempotencyConflict(idempotency_key, earlier[0]["id"])
                    return earlier[0], False
            row = dict(bag, idempotency_key=idempotency_key)
            columns = ", ".join(row)
            conn.execute(
                f"INSERT INTO bags ({columns}) VALUES ({', '.join('?' * len(row))})",
                tuple(row.values()),
            )
            bag_id = row["id"]
            held = row["job_count"] if held_from is None else held_from
            conn.executemany(
                "INSERT INTO jobs (bag_id, idx, params, state) VALUES (?, ?, ?, ?)",
                (
                    (bag_id, idx, params, "queued" if idx < held else "held")
                    for idx, params in enumerate(params_json)
                ),
            )
            for state, n in (("queued", held), ("held", row["job_count"] - held)):
                if n:
                    conn.execute(
                        "INSERT INTO bag_job_counts (bag_id, state, n) VALUES (?, ?, ?)",
                        (bag_id, state, n),
                    )
            if new_account is not None:
                _insert_account(conn, new_account)
            _insert_ledger(conn, ledger_rows)
            conn.execute(
                "INSERT INTO transitions (at, entity, entity_id, from_state, to_state, reason) "
                "VALUES (?, 'bag', ?, '', 'active', 'submitted')",
                (row["created_at"], bag_id),
            )
            return _rows(conn, "SELECT * FROM bags WHERE id = ?", (bag_id,))[0], True

        return await self.write(insert)

    # --- accounts and the ledger --------------------------------------------

    async def create_account(self, account: dict[str, Any], ledger_rows: Sequence[tuple]) -> bool:
        """Create an account (with its first credit); False if it exists already."""

        def create(conn: sqlite3.Connection) -> bool:
            if conn.execute("SELECT 1 FROM accounts WHERE name = ?", (account["name"],)).fetchone():
                return False
            _insert_account(conn, account)
            _insert_ledger(conn, ledger_rows)
            return True

        return await self.write(create)

    async def append_ledger(self, ledger_rows: Sequence[tuple]) -> None:
        await self.write(_insert_ledger, ledger_rows)

    async def ledger_state(self) -> dict[str, list[dict]]:
        """What rebuilds the in-memory ledger: accounts, their sums per kind, and the
        reservations not yet settled (no release entry yet)."""

        def load(conn: sqlite3.Connection) -> dict[str, list[dict]]:
            return {
                "accounts": _rows(conn, "SELECT * FROM accounts"),
                # Kept by triggers on the ledger: as long as what is open, not the history.
                "sums": _rows(conn, "SELECT account, kind, cpu_h FROM ledger_balances"),
                "open": _rows(conn, "SELECT key, account, cpu_h FROM ledger_open"),
            }

        return await self.read(load)

    async def account(self, name: str) -> dict[str, Any] | None:
        """An account with its sums per entry kind."""

        def get(conn: sqlite3.Connection) -> dict[str, Any] | None:
            rows = _rows(conn, "SELECT * FROM accounts WHERE name = ?", (name,))
            if not rows:
                return None
            account = rows[0]
            account["sums"] = dict(
                conn.execute(
                    "SELECT kind, cpu_h FROM ledger_balances WHERE account = ?", (name,)
                ).fetchall()
            )
            return account

        return await self.read(get)

    async def list_accounts(self) -> list[dict[str, Any]]:
        def list_(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            accounts = _rows(conn, "SELECT * FROM accounts ORDER BY name")
            sums: dict[str, dict[str, float]] = defaultdict(dict)
            for account, kind, cpu_h in conn.execute(
                "SELECT account, kind, cpu_h FROM ledger_balances"
            ):
                sums[account][kind] = cpu_h
            for account in accounts:
                account["sums"] = sums.get(account["name"], {})
            return accounts

        return await self.read(list_)

    async def ledger_entries(self, account: str, after_id: int, limit: int) -> list[dict]:
        def select(conn: sqlite3.Connection) -> list[dict]:
            return _rows(
                conn,
                "SELECT id, at, account, kind, cpu_h, key, note FROM ledger "
                "WHERE account = ? AND id > ? ORDER BY id LIMIT ?",
                (account, after_id, limit),
            )

        return await self.read(select)

    async def report_rows(self, *, bag_id: str | None = None, account: str | None = None) -> dict:
        """What a cost report of one bag or one account is built from, as tuples:

        - bags: the bags in scope (id, name, account, state, job_count, created_at,
          finished_at, checkpoints, cpus, gpus, memory_gb), plus every other bag that
          shared a VM with them (their jobs split those VMs' costs), `in_scope` 0/1;
        - vms: every VM an attempt in scope ran on (id, vm_type, zone, spot, state,
          reason, cpus, gpus, memory_gb, spot and on-demand price per hour,
          requested_at, running_at, ended_at);
        - attempts: every attempt on those VMs (bag_id, idx, number, vm_id, state,
          started_at, ended_at, lost_from: its last written checkpoint or its start,
          checkpoint_s: the time its written checkpoints took, checkpoints: how many).

        Runs of Slurm users' jobs on power-saving pools count as bags of one job with one
        attempt (id: the run's key), in scope when of the account: their CPUs, and the
        share of their VM's memory those CPUs stand for.
        """
        if (bag_id is None) == (account is None):
            raise ValueError("a report is of one bag or of one account")
        scope_sql = "SELECT id FROM bags WHERE " + ("id = :bag" if bag_id else "account = :account")
        params: dict[str, Any] = {"bag": bag_id, "account": account}
        # The scope's VMs, passed back as a JSON list (read connections are query-only:
        # no temporary table), so each query below looks them up by index.
        on_vms = "(SELECT value FROM json_each(:vms))"

        runs_scope = "r.account = :account" if account is not None else "0"

        def select(conn: sqlite3.Connection) -> dict:
            vm_ids = [
                row[0]
                for row in conn.execute(
                    f"SELECT DISTINCT vm_id FROM attempts WHERE bag_id IN ({scope_sql}) "
                    f"UNION SELECT vm_id FROM slurm_runs r WHERE {runs_scope} AND vm_id != ''",
                    params,
                )
            ]
            params["vms"] = json.dumps(vm_ids)
            bags = conn.execute(
                "SELECT id, name, account, state, job_count, created_at, finished_at, "
                "checkpoints, coalesce(json_extract(spec, '$.resources.cpus'), 1), "
                "coalesce(json_extract(spec, '$.resources.gpus'), 0), "
                "coalesce(json_extract(spec, '$.resources.memory_gb'), 1.0), "
                f"id IN ({scope_sql}) FROM bags WHERE id IN ({scope_sql}) OR id IN "
                f"(SELECT DISTINCT bag_id FROM attempts WHERE vm_id IN {on_vms}) "
                "ORDER BY created_at, id",
                params,
            ).fetchall()
            vms = conn.execute(
                "SELECT id, vm_type, zone, spot, state, reason, cpus, gpus, memory_gb, "
                "spot_price_per_hour, on_demand_price_per_hour, requested_at, running_at, ended_at "
                f"FROM vms WHERE id IN {on_vms} ORDER BY requested_at, id",
                params,
            ).fetchall()
            # The scope's attempts (by primary key), with their checkpoints ...
            attempts = conn.execute(
                "SELECT a.bag_id, a.idx, a.number, a.vm_id, a.state, a.started_at, "
                "a.ended_at, coalesce(c.last_at, a.started_at), coalesce(c.took_s, 0), "
                "coalesce(c.n, 0) FROM attempts a LEFT JOIN (SELECT bag_id, idx, number, "
                "max(at) AS last_at, sum(max(0, at - requested_at)) AS took_s, count(*) AS n "
                f"FROM checkpoints WHERE ok = 1 AND bag_id IN ({scope_sql}) "
                "GROUP BY bag_id, idx, number) c USING (bag_id, idx, number) "
                f"WHERE a.bag_id IN ({scope_sql})",
                params,
            ).fetchall()
            # ... and the other bags' attempts on the same VMs (they share the cost).
            attempts += conn.execute(
                "SELECT bag_id, idx, number, vm_id, state, started_at, ended_at, started_at, 0, 0 "
                f"FROM attempts WHERE vm_id IN {on_vms} AND bag_id NOT IN ({scope_sql})",
                params,
            ).fetchall()
            # The spot prices sampled while those VMs lived (from the last sample before the
            # first of them started), and every type's size, for the index.
            first, last = conn.execute(
                f"SELECT min(requested_at), max(coalesce(ended_at, 1e300)) FROM vms WHERE id IN {on_vms}",
                params,
            ).fetchone()
            prices: list[tuple] = []
            if first is not None:
                start = conn.execute(
                    "SELECT max(at) FROM price_samples WHERE at <= ?", (first,)
                ).fetchone()[0]
                prices = conn.execute(
                    "SELECT vm_type, zone, at, price_per_hour FROM price_samples "
                    "WHERE at >= ? AND at <= ? ORDER BY at",
                    (first if start is None else start, last),
                ).fetchall()
            sizes = conn.execute(
                "SELECT vm_type, max(cpus), max(memory_gb), max(on_demand_price_per_hour) "
                "FROM vms GROUP BY vm_type"
            ).fetchall()
            # Pool runs of the account, and every run on the scope's VMs (they share them).
            runs = conn.execute(
                "SELECT r.key, r.job_id, r.job_name, r.account, r.state, r.started_at, "
                "r.ended_at, r.cpus, coalesce(v.memory_gb * r.cpus / v.cpus, 0), "
                f"{runs_scope}, r.vm_id FROM slurm_runs r LEFT JOIN vms v ON v.id = r.vm_id "
                f"WHERE ({runs_scope}) OR r.vm_id IN {on_vms} ORDER BY r.started_at",
                params,
            ).fetchall()
            for key, job_id, name, acct, state, start, end, cpus, memory, mine, vm in runs:
                bag_state = "active" if state == "running" else state
                bags.append(
                    (key, f"Slurm job {job_id} ({name})", acct, bag_state, 1, start, end,
                     0, cpus, 0, memory, int(bool(mine)))
                )  # fmt: skip
                if vm:
                    attempts.append((key, 0, 1, vm, state, start, end, start, 0, 0))
            return {
                "bags": bags,
                "vms": vms,
                "attempts": attempts,
                "prices": prices,
                "sizes": sizes,
            }

        return await self.read(select)

    async def vm_core_intervals(self) -> list[tuple[float, float, int, str]]:
        """(running_at, ended_at, cpus, vm_type) of every VM that ran and ended: the
        history `spotbag prepaid --from-store` sizes prepaid capacity from."""
        return await self.read(
            lambda conn: conn.execute(
                "SELECT running_at, ended_at, cpus, vm_type FROM vms WHERE running_at IS NOT NULL "
                "AND ended_at IS NOT NULL AND ended_at > running_at ORDER BY running_at"
            ).fetchall()
        )

    async def create_token(self, row: dict[str, Any]) -> None:
        await self.write(
            lambda conn: conn.execute(
                "INSERT INTO account_tokens (id, account, secret_sha256, created_at, note) "
                "VALUES (:id, :account, :secret_sha256, :created_at, :note)",
                row,
            )
        )

    async def revoke_token(self, token_id: str, at: float) -> bool:
        """Revoke a token; False when there is no such live token."""

        def revoke(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE account_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (at, token_id),
            )
            return cursor.rowcount > 0

        return await self.write(revoke)

    async def tokens(self) -> list[dict[str, Any]]:
        """Every account token, revoked ones included (with their hashes)."""
        return await self.read(
            lambda conn: _rows(conn, "SELECT * FROM account_tokens ORDER BY created_at, id")
        )

    async def callback_seen(self, key: str) -> bool:
        """Whether a callback with this key was handled already."""
        return await self.read(
            lambda conn: (
                conn.execute("SELECT 1 FROM callbacks WHERE key = ?", (key,)).fetchone() is not None
            )
        )

    async def request_cancel(self, bag_id: str, at: float) -> bool:
        """Mark a bag for cancellation; False if it does not exist."""

        def mark(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE bags SET cancel_requested_at = coalesce(cancel_requested_at, ?) WHERE id = ?",
                (at, bag_id),
            )
            return cursor.rowcount > 0

        return await self.write(mark)

    def new_batch(self) -> WriteBatch:
        """A batch to record changes in: with group commit, the shared pending one."""
        return self._pending if self._group_commit else WriteBatch()

    async def apply(self, batch: WriteBatch) -> None:
        """Write the scheduler's changes in one transaction (with group commit: once
        enough have gathered, or before the next read)."""
        if not batch:
            return
        if not self._group_commit:
            await self.write(_apply_batch, batch)
            return
        if batch is not self._pending:
            self._pending.merge(batch)
        if self._pending.size() > 200_000:
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, WriteBatch()
        if pending:
            await self.write(_apply_batch, pending)

    # --- reads for the scheduler (recovery) ----------------------------------

    async def load_active(self) -> dict[str, list[dict]]:
        """Everything not finished: active bags, their open jobs, live attempts and VMs."""

        def load(conn: sqlite3.Connection) -> dict[str, list[dict]]:
            bags = _rows(
                conn,
                "SELECT id, account, spec, created_at, cancel_requested_at "
                "FROM bags WHERE state = 'active' ORDER BY created_at, id",
            )
            for bag in bags:
                bag["counts"] = dict(
                    conn.execute(
                        "SELECT state, n FROM bag_job_counts WHERE bag_id = ?", (bag["id"],)
                    ).fetchall()
                )
                # The latest runtimes of finished jobs, oldest first (runtime estimates).
                bag["runtimes_s"] = [
                    row[0]
                    for row in conn.execute(
                        "SELECT runtime_s FROM jobs WHERE bag_id = ? AND state = 'succeeded' "
                        "AND runtime_s IS NOT NULL ORDER BY ended_at DESC LIMIT 1000",
                        (bag["id"],),
                    ).fetchall()
                ][::-1]
            return {
                "bags": bags,
                "jobs": _rows(
                    conn,
                    "SELECT j.bag_id, j.idx, j.params, j.state, j.attempts, j.counted_attempts, "
                    "j.vm_id, j.started_at, j.work_saved_s, j.checkpoints "
                    "FROM jobs j JOIN bags b ON b.id = j.bag_id "
                    "WHERE b.state = 'active' AND j.state IN ('queued', 'held', 'running') "
                    "ORDER BY b.created_at, j.bag_id, j.idx",
                ),
                # With each live attempt, when its last checkpoint completed (if any).
                "attempts": _rows(
                    conn,
                    "SELECT a.*, (SELECT max(c.at) FROM checkpoints c WHERE c.bag_id = a.bag_id "
                    "AND c.idx = a.idx AND c.number = a.number AND c.ok) AS checkpointed_at "
                    "FROM attempts a WHERE a.state IN ('starting', 'running')",
                ),
                "vms": _rows(conn, "SELECT * FROM vms WHERE state IN ('pending', 'running')"),
                # Ended VMs that live attempts were on (what their time cost).
                "ended_vms": _rows(
                    conn,
                    "SELECT * FROM vms WHERE state NOT IN ('pending', 'running') AND id IN "
                    "(SELECT vm_id FROM attempts WHERE state IN ('starting', 'running'))",
                ),
                "slurm_runs": _rows(conn, "SELECT * FROM slurm_runs WHERE state = 'running'"),
            }

        return await self.read(load)

    # --- reads for the API and reports ---------------------------------------

    async def get_bag(self, bag_id: str) -> dict[str, Any] | None:
        """A bag with its job counts per state and its live (running) attempts."""

        def get(conn: sqlite3.Connection) -> dict[str, Any] | None:
            rows = _rows(conn, "SELECT * FROM bags WHERE id = ?", (bag_id,))
            if not rows:
                return None
            bag = rows[0]
            bag["counts"] = dict(
                conn.execute(
                    "SELECT state, n FROM bag_job_counts WHERE bag_id = ?", (bag_id,)
                ).fetchall()
            )
            bag["live_attempts"] = _rows(
                conn,
                "SELECT a.started_at, v.cpus, v.gpus, v.memory_gb, v.spot_price_per_hour, "
                "v.on_demand_price_per_hour FROM attempts a JOIN vms v ON v.id = a.vm_id "
                "WHERE a.bag_id = ? AND a.state IN ('starting', 'running')",
                (bag_id,),
            )
            return bag

        return await self.read(get)

    async def list_bags(
        self, *, state: str | None, account: str | None, limit: int, offset: int
    ) -> list[dict[str, Any]]:
        def list_(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            where, params = [], []
            if state is not None:
                where.append("state = ?")
                params.append(state)
            if account is not None:
                where.append("account = ?")
                params.append(account)
            sql = "SELECT * FROM bags"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY created_at DESC, id LIMIT ? OFFSET ?"
            bags = _rows(conn, sql, (*params, limit, offset))
            for bag in bags:
                bag["counts"] = dict(
                    conn.execute(
                        "SELECT state, n FROM bag_job_counts WHERE bag_id = ?", (bag["id"],)
                    ).fetchall()
                )
            return bags

        return await self.read(list_)

    async def list_jobs(
        self, bag_id: str, *, state: str | None, after_idx: int, limit: int
    ) -> list[dict[str, Any]]:
        def list_(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            if state is None:
                return _rows(
                    conn,
                    "SELECT * FROM jobs WHERE bag_id = ? AND idx > ? ORDER BY idx LIMIT ?",
                    (bag_id, after_idx, limit),
                )
            return _rows(
                conn,
                "SELECT * FROM jobs WHERE bag_id = ? AND state = ? AND idx > ? "
                "ORDER BY idx LIMIT ?",
                (bag_id, state, after_idx, limit),
            )

        return await self.read(list_)

    async def get_job(self, bag_id: str, idx: int) -> dict[str, Any] | None:
        """A job with its attempts and its transition history."""

        def get(conn: sqlite3.Connection) -> dict[str, Any] | None:
            rows = _rows(conn, "SELECT * FROM jobs WHERE bag_id = ? AND idx = ?", (bag_id, idx))
            if not rows:
                return None
            job = rows[0]
            job["attempt_list"] = _rows(
                conn,
                "SELECT a.*, v.vm_type, v.provider_id FROM attempts a LEFT JOIN vms v ON v.id = a.vm_id "
                "WHERE a.bag_id = ? AND a.idx = ? ORDER BY a.number",
                (bag_id, idx),
            )
            job["transitions"] = _rows(
                conn,
                "SELECT at, from_state, to_state, reason FROM transitions WHERE entity_id = ? ORDER BY id",
                (job_id_of(bag_id, idx),),
            )
            job["checkpoint_list"] = _rows(
                conn,
                "SELECT number AS attempt, requested_at, at, ok, work_s, vm_age_h, detail "
                "FROM checkpoints WHERE bag_id = ? AND idx = ? ORDER BY id",
                (bag_id, idx),
            )
            return job

        return await self.read(get)

    async def get_attempt(self, bag_id: str, idx: int, number: int | None) -> dict[str, Any] | None:
        """One attempt of a job (the latest when `number` is None)."""

        def get(conn: sqlite3.Connection) -> dict[str, Any] | None:
            if number is None:
                rows = _rows(
                    conn,
                    "SELECT * FROM attempts WHERE bag_id = ? AND idx = ? "
                    "ORDER BY number DESC LIMIT 1",
                    (bag_id, idx),
                )
            else:
                rows = _rows(
                    conn,
                    "SELECT * FROM attempts WHERE bag_id = ? AND idx = ? AND number = ?",
                    (bag_id, idx, number),
                )
            return rows[0] if rows else None

        return await self.read(get)

    async def list_vms(self, *, states: Sequence[str] | None, limit: int) -> list[dict[str, Any]]:
        def list_(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            if states:
                marks = ", ".join("?" * len(states))
                return _rows(
                    conn,
                    f"SELECT * FROM vms WHERE state IN ({marks}) "
                    "ORDER BY requested_at DESC LIMIT ?",
                    (*states, limit),
                )
            return _rows(conn, "SELECT * FROM vms ORDER BY requested_at DESC LIMIT ?", (limit,))

        return await self.read(list_)

    async def vm_usage(self, now: float) -> list[dict[str, Any]]:
        """Per VM type: VMs, preemptions, VM-seconds (running time) and their spot and on-demand cost."""

        def usage(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return _rows(
                conn,
                "SELECT vm_type, count(*) AS vms, sum(state = 'preempted') AS preemptions, "
                "sum(max(0, coalesce(ended_at, :now) - running_at)) AS vm_s, "
                "sum(max(0, coalesce(ended_at, :now) - running_at) * CASE WHEN spot "
                "THEN spot_price_per_hour ELSE on_demand_price_per_hour END) / 3600.0 "
                "AS spot_cost_usd, "
                "sum(max(0, coalesce(ended_at, :now) - running_at) * on_demand_price_per_hour) / 3600.0 "
                "AS on_demand_cost_usd "
                "FROM vms WHERE running_at IS NOT NULL GROUP BY vm_type ORDER BY vm_type",
                {"now": now},
            )

        return await self.read(usage)

    async def lifetime_observations(
        self, driver: str, now: float, limit: int = 20_000
    ) -> list[dict[str, Any]]:
        """VMs that ran, most recently launched first: how long they lived (model seconds)
        and whether they were preempted. A VM still running, or stopped by spotbag, is
        censored at its age. Ordering by launch, with the live ones included, keeps a
        window of recent VMs unbiased (ordering by end would favour long lives)."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return _rows(
                conn,
                "SELECT vm_type, zone, requested_at, "
                "(coalesce(ended_at, :now) - requested_at) * time_scale AS lifetime_s, "
                "state = 'preempted' AS preempted FROM vms "
                # VMs that ran, and VMs preempted before they finished booting (early hazard).
                "WHERE driver = :driver AND (running_at IS NOT NULL OR state = 'preempted') "
                "ORDER BY requested_at DESC LIMIT :limit",
                {"driver": driver, "now": now, "limit": limit},
            )

        return await self.read(select)

    async def add_price_samples(self, rows: Sequence[tuple[str, str, float, float]]) -> None:
        """Record (vm_type, zone, at, price_per_hour) samples; a repeat is ignored."""

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR IGNORE INTO price_samples (vm_type, zone, at, price_per_hour) "
                "VALUES (?, ?, ?, ?)",
                rows,
            )

        if rows:
            await self.write(insert)

    async def price_samples(
        self, since: float, until: float | None = None, vm_types: Sequence[str] | None = None
    ) -> list[tuple[str, str, float, float]]:
        """(vm_type, zone, at, price_per_hour) from `since` to `until`, oldest first."""

        def select(conn: sqlite3.Connection) -> list[tuple[str, str, float, float]]:
            sql = "SELECT vm_type, zone, at, price_per_hour FROM price_samples WHERE at >= ?"
            args: list[Any] = [since]
            if until is not None:
                sql += " AND at <= ?"
                args.append(until)
            if vm_types:
                sql += f" AND vm_type IN ({', '.join('?' * len(vm_types))})"
                args += list(vm_types)
            return [tuple(r) for r in conn.execute(sql + " ORDER BY at", args)]

        return await self.read(select)

    async def prune_price_samples(self, before: float) -> int:
        """Delete samples older than `before`, keeping each series' last one before it (the
        price in effect at `before`); the number deleted."""

        def prune(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM price_samples WHERE at < ? AND at < ("
                " SELECT max(p.at) FROM price_samples p WHERE p.vm_type = price_samples.vm_type"
                " AND p.zone = price_samples.zone AND p.at < ?)",
                (before, before),
            ).rowcount

        return await self.write(prune)

    async def add_migration(self, row: dict[str, Any]) -> None:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO hops (at, vm_id, from_type, to_type, policy, price_from, "
                "price_to, index_price, jobs, reason) VALUES (:at, :vm_id, :from_type, "
                ":to_type, :policy, :price_from, :price_to, :index_price, :jobs, :reason)",
                row,
            )

        await self.write(insert)

    async def list_migrations(self, limit: int = 1000) -> list[dict[str, Any]]:
        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return _rows(conn, "SELECT * FROM hops ORDER BY id DESC LIMIT :limit", {"limit": limit})

        return await self.read(select)

    async def save_models(self, models: list[dict[str, Any]], reason: str) -> None:
        """Record newly fitted models as the active ones for their keys (the older
        ones stay, inactive, as history)."""

        def save(conn: sqlite3.Connection) -> None:
            for m in models:
                conn.execute(
                    "UPDATE preemption_models SET active = 0 WHERE key = ? AND active = 1",
                    (m["key"],),
                )
                conn.execute(
                    "INSERT INTO preemption_models (key, model, parameters, L, n, censored, stats, fitted_at, "
                    "reason, active) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
                    (
                        m["key"],
                        m["model"],
                        json.dumps(m["parameters"]),
                        m["L"],
                        m["n"],
                        m["censored"],
                        json.dumps(m["stats"]),
                        m["fitted_at"],
                        m.get("reason", reason),
                    ),
                )

        await self.write(save)

    async def models(self, *, active_only: bool = True) -> list[dict[str, Any]]:
        """Learned preemption models (as ModelEntry.to_dict gives them), newest first."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            where = "WHERE active = 1 " if active_only else ""
            rows = _rows(
                conn, f"SELECT * FROM preemption_models {where}ORDER BY fitted_at DESC, id DESC"
            )
            for row in rows:
                row["parameters"] = json.loads(row["parameters"])
                row["stats"] = json.loads(row["stats"])
                row["source"] = "learned"
            return rows

        return await self.read(select)

    async def job_state_counts(self, bag_id: str) -> dict[str, int]:
        """Counts by state computed from the jobs themselves (to check the maintained counts)."""

        def count(conn: sqlite3.Connection) -> dict[str, int]:
            return dict(
                conn.execute(
                    "SELECT state, count(*) FROM jobs WHERE bag_id = ? GROUP BY state", (bag_id,)
                ).fetchall()
            )

        return await self.read(count)
