"""The store's reads for the web UI: a bag's timeline (bounded, incremental, with the
checkpoints and VMs of the attempts it returns), jobs by parameter value, and the newest
price samples."""

from __future__ import annotations

import json
import sqlite3

from controller.store import Store
from controller.store.attempts import VM_IDS_PER_QUERY

BAG = "b0000000001"
T0 = 1_700_000_000.0
VMS = VM_IDS_PER_QUERY + 100  # more than one query's worth of VM ids


async def filled(tmp_path) -> Store:
    """A bag of 2 * VMS jobs, job i started at T0 + i on VM i % VMS and ran 10 s, the
    last 5 still running; even jobs checkpointed 5 s in; another bag beside it."""
    path = tmp_path / "db.sqlite"
    store = Store(path)
    await store.open()
    await store.close()
    n = 2 * VMS
    with sqlite3.connect(path) as conn:
        for bag in (BAG, "b0000000002"):
            conn.execute(
                "INSERT INTO bags (id, account, name, spec, state, job_count, created_at) "
                "VALUES (?, 'a', '', '{}', 'active', ?, ?)",
                (bag, n, T0),
            )
        conn.executemany(
            "INSERT INTO vms (id, driver, vm_type, spot, state, cpus, gpus, memory_gb, "
            "spot_price_per_hour, on_demand_price_per_hour, requested_at) "
            "VALUES (?, 'local', 't', 1, 'running', 2, 0, 4, 0.1, 0.4, ?)",
            [(f"vm-{v}", T0) for v in range(VMS)],
        )
        conn.executemany(
            "INSERT INTO attempts (bag_id, idx, number, vm_id, state, started_at, ended_at) "
            "VALUES (?, ?, 1, ?, ?, ?, ?)",
            [
                (BAG, i, f"vm-{i % VMS}", "running" if i >= n - 5 else "succeeded", T0 + i)
                + ((None,) if i >= n - 5 else (T0 + i + 10,))
                for i in range(n)
            ]
            + [("b0000000002", 0, "vm-0", "succeeded", T0, T0 + 10**6)],
        )
        conn.executemany(
            "INSERT INTO checkpoints (bag_id, idx, number, requested_at, at, ok, work_s, "
            "vm_age_h) VALUES (?, ?, 1, ?, ?, 1, 5, 0)",
            [(BAG, i, T0 + i + 5, T0 + i + 5.5) for i in range(0, n, 2)],
        )
    store = Store(path)
    await store.open()
    return store


async def test_the_timeline_is_the_newest_attempts_with_their_checkpoints_and_vms(tmp_path):
    store = await filled(tmp_path)
    n = 2 * VMS
    whole = await store.bag_timeline(BAG, 0.0, n)
    assert not whole["truncated"] and len(whole["attempts"]) == n
    assert [a["idx"] for a in whole["attempts"]] == list(range(n))  # oldest start first
    assert all(a["vm_type"] == "t" for a in whole["attempts"])
    assert len(whole["vms"]) == VMS  # in two queries
    assert len(whole["checkpoints"]) == n // 2
    # Bounded: the newest by start, and it says so; their checkpoints and VMs only.
    newest = await store.bag_timeline(BAG, 0.0, 10)
    assert newest["truncated"] and [a["idx"] for a in newest["attempts"]] == list(range(n - 10, n))
    assert {c["idx"] for c in newest["checkpoints"]} == set(range(n - 10, n, 2))
    assert {v["id"] for v in newest["vms"]} == {f"vm-{i % VMS}" for i in range(n - 10, n)}
    # Incremental: what is still running or ended at `since` or later.
    since = T0 + n - 12  # jobs n - 22 .. (ended at since or later), and the running ones
    later = await store.bag_timeline(BAG, since, 1000)
    assert [a["idx"] for a in later["attempts"]] == list(range(n - 22, n))
    assert all(a["ended_at"] is None or a["ended_at"] >= since for a in later["attempts"])
    assert all(c["at"] >= since for c in later["checkpoints"])
    assert (await store.bag_timeline("b0000000009", 0.0, 10))["attempts"] == []
    await store.close()


async def test_jobs_are_found_by_parameter_value_in_index_order(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    await store.close()
    points = [{"s": s, "t": t, "f": f} for s in (1, 2.5) for t in ("1", "x") for f in (True, 0)]
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        conn.executemany(
            "INSERT INTO jobs (bag_id, idx, params, state) VALUES (?, ?, ?, 'queued')",
            [(BAG, i, json.dumps(p)) for i, p in enumerate(points)],
        )
    store = Store(tmp_path / "db.sqlite")
    await store.open()

    async def found(*params) -> list[int]:
        rows = await store.list_jobs(BAG, state=None, after_idx=-1, limit=100, params=params)
        return [r["idx"] for r in rows]

    def expected(**want) -> list[int]:
        return [i for i, p in enumerate(points) if all(p[k] == v for k, v in want.items())]

    assert await found(("s", [1.0])) == expected(s=1)  # an integer by a float
    assert await found(("s", ["2.5", 2.5])) == expected(s=2.5)
    assert await found(("t", ["1"])) == expected(t="1")  # text is not the number
    assert await found(("t", [1.0])) == []
    assert await found(("f", [1]), ("t", ["x"])) == expected(f=True, t="x")
    assert await found(("nothere", ["1", 1.0])) == []
    rows = await store.list_jobs(BAG, state=None, after_idx=2, limit=2, params=[("s", [1.0])])
    assert [r["idx"] for r in rows] == [i for i in expected(s=1) if i > 2][:2]
    await store.close()


async def test_the_newest_price_samples_and_whether_older_ones_were_left_out(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    await store.add_price_samples(
        [(vm_type, "z", T0 + k, 0.1 + k) for k in range(5) for vm_type in ("a", "b")]
    )
    rows, truncated = await store.recent_price_samples(T0 + 1, 4)
    assert truncated and [r[2] for r in rows] == [T0 + 3, T0 + 3, T0 + 4, T0 + 4]
    rows, truncated = await store.recent_price_samples(T0 + 3, 4)
    assert not truncated and len(rows) == 4
    await store.close()
