"""The schema: numbered migrations, and `migrate`, which applies the missing ones.

Each migration is (description, SQL script). The number of the last one applied is
kept in `PRAGMA user_version`, and every applied one is recorded in the `migrations`
table (version, description, applied_at); `Engine.open()` runs `migrate` in one
write transaction, so a database is never left half-migrated. A new schema change
is a new entry at the end of MIGRATIONS, never an edit of an old one (databases in
the field have run those).

Why not sqlite-utils' `Migrations` (the sqlite-migrate plugin): it records applied
migrations by name in a `_sqlite_migrations` table of its own and knows nothing of
`user_version`, so every state directory made so far (its version in user_version
and `migrations`) would look unmigrated and have its first CREATE TABLE run again;
adopting it would need a bridge that seeds its table from user_version, leaving two
records of one fact. It is an alpha package outside our dependencies, its
migrations are Python functions on a sqlite-utils Database (ours are SQL scripts,
which the tests replay to build databases of older releases), and it applies each
migration on its own, not inside the writer's single transaction. The mechanism
here is twenty lines, so it stays.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence

import sqlite_utils

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
        "accounts and the append-only CPU-hour ledger (docs/design.md#ledger)",
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
    (
        # A bag's cost is the split of its VMs' cost (docs/design.md#cost-reports), computed from the VMs
        # and attempts (controller/costs/bag_cost.py); the interim per-attempt charges go. Once
        # it can change no more it is kept, so a restart need not split a large bag again.
        "bag costs from the split-cost report: drop the interim cost totals, keep final costs",
        """
        ALTER TABLE bags DROP COLUMN vm_s;
        ALTER TABLE bags DROP COLUMN spot_cost_usd;
        ALTER TABLE bags DROP COLUMN on_demand_cost_usd;
        CREATE TABLE final_bag_costs (
            bag_id TEXT PRIMARY KEY,
            rule TEXT NOT NULL,  -- the split's settings it was computed with (JSON)
            vm_h REAL NOT NULL,
            spot_cost_usd REAL NOT NULL,
            on_demand_cost_usd REAL NOT NULL,
            as_of REAL NOT NULL
        ) WITHOUT ROWID;
        """,
    ),
    (
        "when each attempt's program began to run (NULL: it never did); an attempt queued "
        "in its executor and ended before it ran was charged nothing and never ran",
        """
        ALTER TABLE attempts ADD COLUMN ran_at REAL;
        UPDATE attempts SET ran_at = started_at
            WHERE state IN ('running', 'succeeded', 'failed', 'preempted');
        """,
    ),
    (
        "no triggers on the ledger: its balances and open reservations are kept by the "
        "code that appends to it (batch.insert_ledger), once per write rather than once "
        "per entry (the same sums; a third of the simulator's store time)",
        """
        DROP TRIGGER ledger_balance_on_insert;
        DROP TRIGGER ledger_open_on_reserve;
        DROP TRIGGER ledger_open_on_release;
        """,
    ),
    (
        "each VM's preemption notice, when its cloud takes it (NULL: none), kept across "
        "restarts and shown on the timeline",
        """
        ALTER TABLE vms ADD COLUMN notice_until REAL;
        """,
    ),
    (
        "bag options (deadline, budget, on-demand, confidence), account budgets, the dollar "
        "ledger budgets are enforced with, and events with their webhook deliveries",
        """
        ALTER TABLE bags ADD COLUMN deadline_at REAL;  -- epoch s (a duration resolved)
        ALTER TABLE bags ADD COLUMN budget_usd REAL;  -- NULL: no cap; PATCH changes it
        ALTER TABLE bags ADD COLUMN on_demand TEXT NOT NULL DEFAULT 'never';
        ALTER TABLE bags ADD COLUMN deadline_confidence REAL NOT NULL DEFAULT 0.95;
        -- When a budget was last changed: a budget_reached raised since is not raised again
        ALTER TABLE bags ADD COLUMN budget_changed_at REAL;
        ALTER TABLE accounts ADD COLUMN budget_usd REAL;  -- per calendar month (UTC)
        ALTER TABLE accounts ADD COLUMN budget_changed_at REAL;
        -- One row an attempt of a bag with a budget (or of an account with one): its
        -- worst case reserved as it starts, what it was charged when it ended (the rest
        -- released). A row, not ledger entries: a third of the rows and index updates
        -- (the entries cost a simulation 25 % more CPU; bench/notify_budgets.py).
        CREATE TABLE budget_reservations (
            key TEXT PRIMARY KEY,  -- the attempt: bag:job:attempt (reserved once)
            bag_id TEXT NOT NULL,
            account TEXT NOT NULL,
            reserved_at REAL NOT NULL,
            reserved_usd REAL NOT NULL CHECK (reserved_usd >= 0),
            settled_at REAL,  -- NULL: open (the attempt runs)
            charged_usd REAL CHECK (charged_usd >= 0 AND charged_usd <= reserved_usd),
            month TEXT NOT NULL  -- YYYY-MM (UTC) its charge counts in (that of its
                                 -- reservation until it is charged)
        ) WITHOUT ROWID;
        CREATE INDEX budget_by_bag ON budget_reservations(bag_id);
        CREATE INDEX budget_by_account_month ON budget_reservations(account, month);
        -- (a charge updates no indexed column: the month is set as the attempt starts)
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,  -- the order events were recorded in (a cursor)
            id TEXT NOT NULL UNIQUE,  -- sent as X-Spotbag-Event-Id: receivers de-duplicate
            created_at REAL NOT NULL,
            kind TEXT NOT NULL,
            bag_id TEXT,  -- NULL: the fleet's (preemption_storm)
            account TEXT,
            payload TEXT NOT NULL  -- JSON
        );
        CREATE INDEX events_by_bag ON events(bag_id, seq);
        CREATE INDEX events_by_time ON events(created_at);
        CREATE TABLE event_deliveries (
            id INTEGER PRIMARY KEY,
            event_id TEXT NOT NULL,
            url TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_try_at REAL NOT NULL,
            last_status INTEGER,  -- HTTP status of the last attempt (NULL: none came)
            last_error TEXT NOT NULL DEFAULT '',
            delivered_at REAL,
            UNIQUE (event_id, url)
        );
        CREATE INDEX deliveries_due ON event_deliveries(next_try_at) WHERE state = 'pending';
        CREATE TABLE delivery_attempts (
            id INTEGER PRIMARY KEY,
            delivery_id INTEGER NOT NULL,
            at REAL NOT NULL,
            status INTEGER,  -- NULL: no answer (refused, timed out)
            error TEXT NOT NULL DEFAULT '',
            duration_s REAL NOT NULL
        );
        CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts(delivery_id);
        """,
    ),
    (
        "the ledger's kinds checked with OR, not IN: SQLite builds an IN list's lookup "
        "table again for every row an executemany inserts (2.3 us of the 3.7 us a row "
        "took; the same rows are allowed)",
        """
        CREATE TABLE ledger_new (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            account TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (
                kind = 'credit' OR kind = 'reserve' OR kind = 'charge' OR kind = 'release'
            ),
            cpu_h REAL NOT NULL CHECK (cpu_h >= 0),
            key TEXT NOT NULL DEFAULT '',  -- the reservation: bag:job:attempt
            note TEXT NOT NULL DEFAULT ''
        );
        INSERT INTO ledger_new (id, at, account, kind, cpu_h, key, note)
            SELECT id, at, account, kind, cpu_h, key, note FROM ledger;
        DROP TABLE ledger;
        ALTER TABLE ledger_new RENAME TO ledger;
        CREATE INDEX ledger_by_account ON ledger(account, id);
        -- A reservation is made, charged and released once each.
        CREATE UNIQUE INDEX ledger_once ON ledger(key, kind) WHERE kind != 'credit';
        """,
    ),
    (
        "accounts name webhooks for their bags' events",
        """
        -- JSON: [{"url": ..., "events": [...]}], told of every event of the account's bags
        ALTER TABLE accounts ADD COLUMN notify TEXT NOT NULL DEFAULT '[]';
        """,
    ),
]


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


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations the database has not had (inside the caller's transaction);
    the schema version it is at now."""
    db = sqlite_utils.Database(conn)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if "migrations" not in db.table_names():
        db.table("migrations").create(
            {"version": int, "description": str, "applied_at": float}, pk="version"
        )
    for number, (description, ddl) in enumerate(MIGRATIONS, start=1):
        if number <= version:
            continue
        for statement in _statements(ddl):
            conn.execute(statement)
        db.table("migrations").insert(
            {"version": number, "description": description, "applied_at": time.time()}
        )
        conn.execute(f"PRAGMA user_version = {number}")
        version = number
    return version


def restore_missing_indexes(conn: sqlite3.Connection, names: Sequence[str]) -> list[str]:
    """Create those of the indexes `names` the database lacks, as the migrations define
    them today (inside the caller's transaction); the ones it created. A simulation
    killed while it wrote without them (Engine.defer_indexes) leaves them missing, and
    nothing else would build them again: migrations run once."""
    present = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
    }
    missing = [name for name in names if name not in present]
    if not missing:
        return []
    fresh = sqlite3.connect(":memory:")
    try:
        migrate(fresh)
        definitions = dict(
            fresh.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'").fetchall()
        )
    finally:
        fresh.close()
    # One that a later migration dropped is not missing (tests/controller/
    # test_simulation_outcome.py checks that every deferrable index is defined).
    built = [name for name in missing if name in definitions]
    for name in built:
        conn.execute(definitions[name])
    return built
