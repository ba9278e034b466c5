"""The store: migrations, WAL, one transaction per write, idempotent submission."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading

import pytest

from controller.store import MIGRATIONS, IdempotencyConflict, Store, WriteBatch, split_job_id


def _migration_before(words: str) -> int:
    """How many migrations come before the one whose description starts with `words`."""
    return next(i for i, (about, _) in enumerate(MIGRATIONS) if about.startswith(words))


LEDGER_BALANCES = _migration_before("ledger balances and open reservations")
SCOPED_KEYS = _migration_before("idempotency keys belong to an account")
LEDGER_KINDS_BY_OR = _migration_before("the ledger's kinds checked with OR")


def bag_row(bag_id="b0000000001", n=3, now=100.0):
    return {
        "id": bag_id,
        "account": "a",
        "name": "",
        "spec": "{}",
        "state": "active",
        "job_count": n,
        "created_at": now,
    }


async def test_migrations_are_applied_once_and_recorded(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    assert store.schema_version == len(MIGRATIONS)
    await store.close()
    again = Store(tmp_path / "db.sqlite")
    await again.open()  # a second open applies nothing new
    await again.close()
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
        recorded = conn.execute(
            "SELECT version, description FROM migrations ORDER BY version"
        ).fetchall()
        assert recorded == [
            (i, description) for i, (description, _) in enumerate(MIGRATIONS, start=1)
        ]


async def test_an_older_database_is_upgraded_in_place(tmp_path):
    path = tmp_path / "db.sqlite"
    with sqlite3.connect(path) as conn:  # a database made by the first release
        conn.executescript(MIGRATIONS[0][1])
        conn.execute("PRAGMA user_version = 1")
        conn.execute(
            "INSERT INTO bags (id, account, name, spec, state, job_count, created_at) "
            "VALUES ('b0000000001', 'a', '', '{}', 'active', 0, 1.0)"
        )
    store = Store(path)
    await store.open()
    assert store.schema_version == len(MIGRATIONS)
    bag = await store.get_bag("b0000000001")
    assert bag["request_hash"] == ""  # the new column, defaulted for old rows
    await store.close()


async def test_idempotency_keys_are_unique_per_account_after_an_upgrade(tmp_path):
    """A database from before keys were scoped (a column-wide UNIQUE) is rebuilt: its bags
    keep every column, and another account may use a key one account has used."""
    path = tmp_path / "db.sqlite"
    with sqlite3.connect(path) as conn:  # the schema before per-account keys
        for _, ddl in MIGRATIONS[:SCOPED_KEYS]:
            conn.executescript(ddl)
        conn.execute(f"PRAGMA user_version = {SCOPED_KEYS}")
        conn.execute(
            "INSERT INTO bags (id, account, name, spec, state, job_count, created_at, "
            "idempotency_key, request_hash, attempt_s, vm_s, checkpoints) "
            "VALUES ('b0000000001', 'a', 'old', '{}', 'active', 0, 1.0, 'k', 'h1', 2.5, 1.5, 3)"
        )
    store = Store(path)
    await store.open()
    old = await store.get_bag("b0000000001")
    assert (old["name"], old["idempotency_key"], old["attempt_s"], old["checkpoints"]) == (
        "old",
        "k",
        2.5,
        3,
    )
    # The interim cost totals are gone (a bag's cost is its report's split).
    assert not {"vm_s", "spot_cost_usd", "on_demand_cost_usd"} & set(old)
    theirs, created = await store.create_bag(
        {**bag_row("b0000000002", n=1), "account": "b", "request_hash": "h1"}, ['{"i":0}'], "k"
    )
    assert created and theirs["id"] == "b0000000002"
    again, created = await store.create_bag(
        {**bag_row("b0000000003", n=1), "request_hash": "h1"}, ['{"i":0}'], "k"
    )
    assert not created and again["id"] == "b0000000001"  # account a's own bag
    with pytest.raises(IdempotencyConflict) as caught:
        await store.create_bag(
            {**bag_row("b0000000004", n=1), "account": "b", "request_hash": "h2"}, [], "k"
        )
    assert caught.value.bag_id == "b0000000002"  # never account a's
    await store.close()
    with sqlite3.connect(path) as conn:
        # The index itself holds (account, key) unique: no second bag of b with key k.
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO bags (id, account, name, spec, state, job_count, created_at, "
                "idempotency_key) VALUES ('b0000000005', 'b', '', '{}', 'active', 0, 1.0, 'k')"
            )
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(bags)")}
        assert {"bags_by_state", "bags_by_account", "bags_by_idempotency_key"} <= indexes


async def test_the_ledger_rebuilt_for_its_kinds_check_keeps_its_rows_and_rules(tmp_path):
    """The ledger rebuilt so that its kinds are checked with OR (issue 24): every entry
    keeps its id and values, and the table refuses what it refused before."""
    path = tmp_path / "db.sqlite"
    entries = [
        (1, 1.0, "a", "credit", 100.0, "", "opened"),
        (2, 2.0, "a", "reserve", 4.0, "b0000000001:0:1", "admission"),
        (3, 3.0, "a", "charge", 1.0, "b0000000001:0:1", "attempt 1 succeeded"),
        (4, 3.0, "a", "release", 3.0, "b0000000001:0:1", "attempt 1 succeeded"),
        (5, 4.0, "a", "credit", 5.0, "", "again"),
    ]
    with sqlite3.connect(path) as conn:  # the schema before the rebuild
        for _, ddl in MIGRATIONS[:LEDGER_KINDS_BY_OR]:
            conn.executescript(ddl)
        conn.execute(f"PRAGMA user_version = {LEDGER_KINDS_BY_OR}")
        conn.executemany("INSERT INTO ledger VALUES (?,?,?,?,?,?,?)", entries)
    store = Store(path)
    await store.open()
    assert store.schema_version == len(MIGRATIONS)
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM ledger ORDER BY id").fetchall() == entries
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(ledger)")}
        assert {"ledger_by_account", "ledger_once"} <= indexes
        for bad in (
            (9.0, "a", "refund", 1.0, "b0000000001:1:1", ""),  # not a kind
            (9.0, "a", "charge", -1.0, "b0000000001:1:1", ""),  # negative
            (9.0, "a", "charge", 1.0, "b0000000001:0:1", ""),  # charged twice
        ):
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute(
                    "INSERT INTO ledger (at, account, kind, cpu_h, key, note) VALUES (?,?,?,?,?,?)",
                    bad,
                )


async def test_writes_run_on_one_thread_and_roll_back_on_error(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    threads = set()

    def insert(conn, key):
        threads.add(threading.get_ident())
        conn.execute("INSERT INTO meta (key, value) VALUES (?, 'x')", (key,))

    await asyncio.gather(*(store.write(insert, f"k{i}") for i in range(20)))
    assert len(threads) == 1 and threading.get_ident() not in threads

    def half_then_fail(conn):
        conn.execute("INSERT INTO meta (key, value) VALUES ('half', 'x')")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await store.write(half_then_fail)
    count = await store.read(lambda conn: conn.execute("SELECT count(*) FROM meta").fetchone()[0])
    assert count == 20  # 'half' was rolled back
    await store.close()


async def test_create_bag_is_atomic_and_idempotent_by_key(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    row, created = await store.create_bag(bag_row(), ['{"i":0}', '{"i":1}', '{"i":2}'], "key-1")
    assert created and row["job_count"] == 3
    again, created = await store.create_bag(bag_row("b0000000002"), ['{"i":0}'], "key-1")
    assert not created and again["id"] == "b0000000001"
    bag = await store.get_bag("b0000000001")
    assert bag["counts"] == {"queued": 3}
    assert [
        j["params"]
        for j in await store.list_jobs("b0000000001", state=None, after_idx=-1, limit=10)
    ] == ['{"i":0}', '{"i":1}', '{"i":2}']
    assert await store.get_bag("b0000000002") is None
    # A duplicate bag id fails as a whole: no jobs of it are left behind.
    with pytest.raises(sqlite3.IntegrityError):
        await store.create_bag(bag_row(), ['{"i":9}'], None)
    assert await store.job_state_counts("b0000000001") == {"queued": 3}
    await store.close()


async def test_batches_update_rows_counts_and_usage_together(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    await store.create_bag(bag_row(n=2), ["{}", "{}"], None)
    batch = WriteBatch()
    batch.job("b0000000001", 0, "succeeded", 1, 1, 0, "", "vm-1", 100.0, 160.0, 60.0)
    batch.job_state_change("b0000000001", "queued", "succeeded")
    batch.usage(
        "b0000000001",
        preempted=False,
        attempt_s=60.0,
    )
    batch.transition(160.0, "job", "b0000000001-0", "running", "succeeded")
    later = WriteBatch()
    later.usage(
        "b0000000001",
        preempted=True,
        attempt_s=10.0,
    )
    batch.merge(later)
    await store.apply(batch)
    bag = await store.get_bag("b0000000001")
    assert bag["counts"] == {"queued": 1, "succeeded": 1}
    assert (bag["attempts_ended"], bag["preemptions"], bag["attempt_s"], bag["preempted_s"]) == (
        2,
        1,
        70.0,
        10.0,
    )
    assert await store.job_state_counts("b0000000001") == {"queued": 1, "succeeded": 1}
    await store.close()


def test_job_ids_split_back_into_bag_and_index():
    assert split_job_id("b3f9a0c21d7-42") == ("b3f9a0c21d7", 42)
    assert split_job_id("nonsense") is None
    assert split_job_id("b1-x") is None


def _settled(n: int, account: str = "a") -> list[tuple]:
    rows = []
    for i in range(n):
        key = f"old:{i}:1"
        rows += [
            (1.0, account, "reserve", 1.0, key, ""),
            (2.0, account, "charge", 0.25, key, ""),
            (2.0, account, "release", 0.75, key, ""),
        ]
    return rows


OPEN = [(3.0, "a", "reserve", 2.0, f"new:{i}:1", "") for i in range(5)] + [
    (3.0, "b", "credit", 10.0, "", "")
]


async def test_a_restart_reads_the_open_work_not_the_whole_ledger(tmp_path):
    """What rebuilds the ledger at start-up costs the same for 300 and 30,000 rows of
    history (counted in SQLite VM steps, not timed): its cost is the open work. (It was
    a scan per reservation: 129 s for an idle daemon after 20,000 jobs.)"""
    steps = []
    for settled in (100, 10_000):
        store = Store(tmp_path / f"{settled}.db", threaded=False)
        await store.open()
        await store.append_ledger(_settled(settled) + OPEN)
        counted = [0]

        def step(counted=counted) -> int:
            counted[0] += 1
            return 0

        store._conn.set_progress_handler(step, 100)
        state = await store.ledger_state()
        store._conn.set_progress_handler(None, 100)
        await store.close()
        steps.append(counted[0])
        assert sorted(r["key"] for r in state["open"]) == [f"new:{i}:1" for i in range(5)]
        sums = {(r["account"], r["kind"]): r["cpu_h"] for r in state["sums"]}
        assert sums == pytest.approx(
            {
                ("a", "reserve"): settled + 10.0,
                ("a", "charge"): 0.25 * settled,
                ("a", "release"): 0.75 * settled,
                ("b", "credit"): 10.0,
            }
        )
    assert steps[1] <= steps[0] + 2, steps


BAG_OPTION_COLUMNS = (
    "deadline_at",
    "budget_usd",
    "on_demand",
    "deadline_confidence",
    "budget_changed_at",
)


async def test_the_ledger_balances_are_built_from_an_existing_ledger(tmp_path):
    """A database from before the balance tables: the migration builds them from its
    ledger, and from then on they are kept in step with every entry (by triggers, then
    by insert_ledger once a later migration drops them)."""
    path = tmp_path / "old.db"
    store = Store(path)
    await store.open()
    await store.close()
    with sqlite3.connect(path) as conn:  # back to the schema before the balance tables
        conn.executescript(
            "DROP TABLE ledger_balances; DROP TABLE ledger_open;"
            # and the bags' columns of then, which later migrations rebuild and drop
            "ALTER TABLE bags ADD COLUMN vm_s REAL NOT NULL DEFAULT 0;"
            "ALTER TABLE bags ADD COLUMN spot_cost_usd REAL NOT NULL DEFAULT 0;"
            "ALTER TABLE bags ADD COLUMN on_demand_cost_usd REAL NOT NULL DEFAULT 0;"
            "DROP TABLE final_bag_costs;"
            "ALTER TABLE attempts DROP COLUMN ran_at;"
            "ALTER TABLE vms DROP COLUMN notice_until;"
            # and what the budgets and events migration added
            + "".join(f"ALTER TABLE bags DROP COLUMN {c};" for c in BAG_OPTION_COLUMNS)
            + "ALTER TABLE accounts DROP COLUMN budget_usd;"
            "ALTER TABLE accounts DROP COLUMN budget_changed_at;"
            "DROP TABLE budget_reservations; DROP TABLE events; DROP TABLE event_deliveries;"
            "DROP TABLE delivery_attempts;"
            # and the accounts' webhooks
            "ALTER TABLE accounts DROP COLUMN notify;"
        )
        conn.execute("DELETE FROM migrations WHERE version > ?", (LEDGER_BALANCES,))
        conn.execute(f"PRAGMA user_version = {LEDGER_BALANCES}")
        conn.executemany(
            "INSERT INTO ledger (at, account, kind, cpu_h, key, note) VALUES (?,?,?,?,?,?)",
            _settled(50) + OPEN,
        )
    store = Store(path)
    await store.open()
    assert store.schema_version == len(MIGRATIONS)
    state = await store.ledger_state()
    assert len(state["open"]) == 5
    await store.append_ledger(
        [(4.0, "a", "charge", 1.5, "new:0:1", ""), (4.0, "a", "release", 0.5, "new:0:1", "")]
    )
    state = await store.ledger_state()
    await store.close()
    assert sorted(r["key"] for r in state["open"]) == [f"new:{i}:1" for i in range(1, 5)]
    sums = {(r["account"], r["kind"]): r["cpu_h"] for r in state["sums"]}
    assert sums[("a", "charge")] == pytest.approx(0.25 * 50 + 1.5)
    assert sums[("a", "release")] == pytest.approx(0.75 * 50 + 0.5)
    with sqlite3.connect(path) as conn:  # the same as summing the whole ledger
        full = dict(
            ((a, k), v)
            for a, k, v in conn.execute(
                "SELECT account, kind, sum(cpu_h) FROM ledger GROUP BY account, kind"
            )
        )
    assert sums == pytest.approx(full)


async def test_a_batch_writes_each_kind_of_row_to_its_columns(tmp_path):
    """Every WriteBatch method, through apply: each value lands in its own column (the
    batch's rows are named fields; the statements take them in column order)."""
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    await store.create_bag(bag_row(n=2), ["{}", "{}"], None)
    batch = WriteBatch()
    batch.job("b0000000001", 0, "running", 2, 1, None, "retried", "vm-1", 10.0, None, None)
    batch.job_state_change("b0000000001", "queued", "running")
    batch.attempt("b0000000001", 0, 2, "vm-1", "running", 10.0, None, None, "", "/l", ref="77")
    vm = {
        "id": "vm-1",
        "provider_id": "i-1",
        "driver": "sim",
        "vm_type": "m5.large",
        "zone": "z1",
        "spot": 1,
        "state": "running",
        "reason": "",
        "cpus": 2,
        "gpus": 0,
        "memory_gb": 8.0,
        "spot_price_per_hour": 0.03,
        "on_demand_price_per_hour": 0.1,
        "requested_at": 1.0,
        "running_at": 5.0,
        "ended_at": None,
    }
    batch.vm(vm)  # without the columns later migrations added: their defaults
    batch.vm(
        {**vm, "id": "vm-2", "time_scale": 60.0, "ready_at": 6.0, "pool_node": "n1",
         "notice_until": 35.0}
    )  # fmt: skip
    batch.checkpoint(
        "b0000000001", 0, 2, requested_at=20.0, at=22.5, ok=True, work_saved_s=8.0,
        checkpoints=1, vm_age_h=0.25,
    )  # fmt: skip
    batch.work_lost("b0000000001", 3.5)
    batch.transition(10.0, "job", "b0000000001-0", "queued", "running", "placed")
    batch.callback("cb-1", 9.0, "started", "b0000000001-0.2")
    batch.account({"name": "u", "unlimited": False, "created_at": 1.0})
    entry = type("Entry", (), {"account": "u", "kind": "credit", "cpu_h": 4.0, "key": ""})
    batch.ledger_entries(5.0, [entry], "opened")
    batch.slurm_run(
        {"key": "slurm:1:0:x", "job_id": "1", "job_name": "x", "restart": 0, "user": "u",
         "account": "u", "partition": "p", "node": "n1", "vm_id": "vm-2", "cpus": 2.0,
         "reserved_cpu_h": 1.0, "started_at": 3.0, "ended_at": None, "state": "running",
         "exit_code": None, "reason": ""}
    )  # fmt: skip
    await store.apply(batch)

    job = await store.get_job("b0000000001", 0)
    assert (job["state"], job["attempts"], job["counted_attempts"], job["reason"]) == (
        "running",
        2,
        1,
        "retried",
    )
    assert (job["work_saved_s"], job["checkpoints"]) == (8.0, 1)
    [attempt] = job["attempt_list"]
    assert (attempt["number"], attempt["log_path"], attempt["ref"], attempt["vm_type"]) == (
        2,
        "/l",
        "77",
        "m5.large",
    )
    assert [c["work_s"] for c in job["checkpoint_list"]] == [8.0]
    assert [t["reason"] for t in job["transitions"]] == ["placed"]
    bag = await store.get_bag("b0000000001")
    assert bag["counts"] == {"queued": 1, "running": 1}
    assert (bag["checkpoints"], bag["checkpoint_s"], bag["lost_s"]) == (1, 2.5, 3.5)
    vms = {v["id"]: v for v in await store.list_vms(states=None, limit=10)}
    vm1 = vms["vm-1"]
    assert (vm1["time_scale"], vm1["ready_at"], vm1["pool_node"], vm1["notice_until"]) == (
        1.0,
        None,
        "",
        None,
    )
    assert (vms["vm-2"]["time_scale"], vms["vm-2"]["pool_node"]) == (60.0, "n1")
    assert vms["vm-2"]["notice_until"] == 35.0
    assert await store.callback_seen("cb-1")
    account = await store.account("u")
    assert account["sums"] == {"credit": 4.0}
    [run] = (await store.load_active())["slurm_runs"]
    assert (run["user"], run["vm_id"], run["reserved_cpu_h"]) == ("u", "vm-2", 1.0)
    await store.close()


LEDGER_TRIGGERS_DROPPED = _migration_before("no triggers on the ledger")


def _database(path, migrations: int) -> sqlite3.Connection:
    """A database with the first `migrations` migrations applied."""
    from controller.store.schema import _statements

    conn = sqlite3.connect(path, isolation_level=None)
    for _, script in MIGRATIONS[:migrations]:
        for statement in _statements(script):
            conn.execute(statement)
    return conn


@pytest.mark.slow
def test_insert_ledger_keeps_the_balances_and_open_reservations_the_triggers_kept(tmp_path):
    """The same entries, appended call by call, leave ledger_balances and ledger_open
    exactly (to the last bit of every sum) as the triggers of the earlier schema did:
    reservations released in the same call, in a later one, or never; credits; releases
    of reservations made before; amounts whose sums round."""
    from controller.store.batch import insert_ledger

    rng = random.Random(5)
    calls, reserved, key_no = [], [], 0
    for _ in range(40):
        rows = []
        for _ in range(rng.randrange(0, 30)):
            account = rng.choice("abc")
            choice = rng.random()
            if choice < 0.1:
                rows.append((1.0, account, "credit", rng.random() * 100, "", "credit"))
            elif choice < 0.5 or not reserved:
                key_no += 1
                key = f"b:{key_no}:1"
                reserved.append((account, key))
                rows.append((1.0, account, "reserve", rng.random() * 3, key, ""))
            else:
                account, key = reserved.pop(rng.randrange(len(reserved)))
                used = rng.random()
                rows.append((2.0, account, "charge", used, key, ""))
                rows.append((2.0, account, "release", used * 1.7, key, ""))
        calls.append(rows)
    with_triggers = _database(tmp_path / "triggers.db", LEDGER_TRIGGERS_DROPPED)
    without = _database(tmp_path / "code.db", len(MIGRATIONS))
    for rows in calls:
        with_triggers.executemany(
            "INSERT INTO ledger (at, account, kind, cpu_h, key, note) VALUES (?,?,?,?,?,?)", rows
        )
        without.execute("BEGIN")
        insert_ledger(without, iter(rows))
        without.execute("COMMIT")

    def state(conn):
        return (
            conn.execute("SELECT * FROM ledger ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM ledger_balances ORDER BY account, kind").fetchall(),
            conn.execute("SELECT * FROM ledger_open ORDER BY key").fetchall(),
        )

    assert state(without) == state(with_triggers)
    assert len(state(without)[2]) == len(reserved) > 0
