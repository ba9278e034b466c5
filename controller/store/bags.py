"""Bags and their jobs: submission (with its idempotency key), cancellation,
what a restart recovers, and the reads of the API (a bag, its jobs, one job with
its attempts, transitions and checkpoints).

Job ids are `<bag id>-<index>`: `job_id_of` and `split_job_id` convert.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from controller.errors import SpotbagError
from controller.store.batch import insert_account, insert_ledger
from controller.store.engine import Engine, dict_rows
from controller.store.rows import ActiveState, BagDetail, BagRow, BagWithCounts, JobDetail, JobRow


class IdempotencyConflict(SpotbagError):
    """An idempotency key already used for a different bag."""

    status = 409
    code = "idempotency_key_reused"

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


# A bag's rows are written WRITE_SLICE_ROWS at a time, the writer thread pausing
# WRITE_PAUSE_S between slices. Making a million rows' tuples is seconds of Python
# that holds the GIL (released only inside each row's sqlite3_step); on a small,
# busy VM the event loop's thread then waits 100-250 ms at a time for the GIL and a
# CPU (measured with bench/big_bag.py, issue 14). The pauses cost ~0.2 s a million.
WRITE_SLICE_ROWS = 5_000
WRITE_PAUSE_S = 0.001


def _slices(rows: Iterable[tuple]) -> Iterator[list[tuple]]:
    """The rows, WRITE_SLICE_ROWS at a time, with a pause before each but the first."""
    it = iter(rows)
    first = True
    while chunk := list(itertools.islice(it, WRITE_SLICE_ROWS)):
        if not first:
            time.sleep(WRITE_PAUSE_S)  # the GIL and a CPU for the event loop's thread
        first = False
        yield chunk


class BagQueries(Engine):
    """Queries of the bags, jobs and bag_job_counts tables (and the recovery read)."""

    async def create_bag(
        self,
        bag: dict[str, Any],
        params_json: Iterable[str],
        idempotency_key: str | None,
        *,
        ledger_rows: Iterable[tuple] = (),
        held_from: int | None = None,
        new_account: dict[str, Any] | None = None,
    ) -> tuple[BagRow, bool]:
        """Insert a bag and all its jobs (queued; from index `held_from` on, held) with
        their ledger entries (and the account, when it is new) in one transaction.

        Returns (bag row, created). With an idempotency key the bag's account used
        before, nothing is written and the earlier bag is returned, or
        IdempotencyConflict raised when the earlier bag's request_hash differs. Keys are
        scoped to the account: another account's use of the same key is not seen.
        """

        def insert(conn: sqlite3.Connection) -> tuple[BagRow, bool]:
            if idempotency_key is not None:
                # Keys are the account's own: another account's bag is never found here.
                earlier = dict_rows(
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
            jobs = (
                (bag_id, idx, params, "queued" if idx < held else "held")
                for idx, params in enumerate(params_json)
            )
            for rows in _slices(jobs):
                conn.executemany(
                    "INSERT INTO jobs (bag_id, idx, params, state) VALUES (?, ?, ?, ?)", rows
                )
            for state, n in (("queued", held), ("held", row["job_count"] - held)):
                if n:
                    conn.execute(
                        "INSERT INTO bag_job_counts (bag_id, state, n) VALUES (?, ?, ?)",
                        (bag_id, state, n),
                    )
            if new_account is not None:
                insert_account(conn, new_account)
            for rows in _slices(ledger_rows):
                insert_ledger(conn, rows)
            conn.execute(
                "INSERT INTO transitions (at, entity, entity_id, from_state, to_state, reason) "
                "VALUES (?, 'bag', ?, '', 'active', 'submitted')",
                (row["created_at"], bag_id),
            )
            return dict_rows(conn, "SELECT * FROM bags WHERE id = ?", (bag_id,))[0], True

        return await self.write(insert)

    async def request_cancel(self, bag_id: str, at: float) -> bool:
        """Mark a bag for cancellation; False if it does not exist."""

        def mark(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE bags SET cancel_requested_at = coalesce(cancel_requested_at, ?) WHERE id = ?",
                (at, bag_id),
            )
            return cursor.rowcount > 0

        return await self.write(mark)

    async def load_active(self) -> ActiveState:
        """Everything not finished: active bags, their open jobs, live attempts and VMs."""

        def load(conn: sqlite3.Connection) -> ActiveState:
            bags = dict_rows(
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
                "jobs": dict_rows(
                    conn,
                    "SELECT j.bag_id, j.idx, j.params, j.state, j.attempts, j.counted_attempts, "
                    "j.vm_id, j.started_at, j.work_saved_s, j.checkpoints "
                    "FROM jobs j JOIN bags b ON b.id = j.bag_id "
                    "WHERE b.state = 'active' AND j.state IN ('queued', 'held', 'running') "
                    "ORDER BY b.created_at, j.bag_id, j.idx",
                ),
                # With each live attempt, when its last checkpoint completed (if any).
                "attempts": dict_rows(
                    conn,
                    "SELECT a.*, (SELECT max(c.at) FROM checkpoints c WHERE c.bag_id = a.bag_id "
                    "AND c.idx = a.idx AND c.number = a.number AND c.ok) AS checkpointed_at, "
                    "v.state AS vm_state, v.reason AS vm_reason, v.ended_at AS vm_ended_at "
                    "FROM attempts a LEFT JOIN vms v ON v.id = a.vm_id "
                    "WHERE a.state IN ('starting', 'running')",
                ),
                "vms": dict_rows(conn, "SELECT * FROM vms WHERE state IN ('pending', 'running')"),
                "slurm_runs": dict_rows(conn, "SELECT * FROM slurm_runs WHERE state = 'running'"),
            }

        return await self.read(load)

    async def get_bag(self, bag_id: str) -> BagDetail | None:
        """A bag with its job counts per state and its live (running) attempts."""

        def get(conn: sqlite3.Connection) -> BagDetail | None:
            rows = dict_rows(conn, "SELECT * FROM bags WHERE id = ?", (bag_id,))
            if not rows:
                return None
            bag = rows[0]
            bag["counts"] = dict(
                conn.execute(
                    "SELECT state, n FROM bag_job_counts WHERE bag_id = ?", (bag_id,)
                ).fetchall()
            )
            # The partial index of live attempts, named: left to itself SQLite walks all
            # of the bag's attempts by primary key (20-50 ms for a 100,000-job bag).
            bag["live_attempts"] = dict_rows(
                conn,
                "SELECT started_at FROM attempts INDEXED BY attempts_live "
                "WHERE bag_id = ? AND state IN ('starting', 'running')",
                (bag_id,),
            )
            return bag

        return await self.read(get)

    async def list_bags(
        self, *, state: str | None, account: str | None, limit: int, offset: int
    ) -> list[BagWithCounts]:
        def list_(conn: sqlite3.Connection) -> list[BagWithCounts]:
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
            bags = dict_rows(conn, sql, (*params, limit, offset))
            for bag in bags:
                bag["counts"] = dict(
                    conn.execute(
                        "SELECT state, n FROM bag_job_counts WHERE bag_id = ?", (bag["id"],)
                    ).fetchall()
                )
            return bags

        return await self.read(list_)

    async def list_jobs(
        self,
        bag_id: str,
        *,
        state: str | None,
        after_idx: int,
        limit: int,
        params: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> list[JobRow]:
        """A page of a bag's jobs in index order; `params`: (name, values) pairs, each a
        parameter the job must have with one of the values (compared as SQLite does:
        3 matches 3.0, not "3"). Names are identifiers (bagspec.PARAM_NAME), checked by
        the caller; they are bound, not spliced, into the JSON path."""

        def list_(conn: sqlite3.Connection) -> list[JobRow]:
            sql = "SELECT * FROM jobs WHERE bag_id = ?"
            args: list[Any] = [bag_id]
            if state is not None:
                sql += " AND state = ?"
                args.append(state)
            for name, values in params:
                sql += f" AND json_extract(params, ?) IN ({', '.join('?' * len(values))})"
                args += [f'$."{name}"', *values]
            return dict_rows(
                conn, sql + " AND idx > ? ORDER BY idx LIMIT ?", (*args, after_idx, limit)
            )

        return await self.read(list_)

    async def get_job(self, bag_id: str, idx: int) -> JobDetail | None:
        """A job with its attempts and its transition history."""

        def get(conn: sqlite3.Connection) -> JobDetail | None:
            rows = dict_rows(conn, "SELECT * FROM jobs WHERE bag_id = ? AND idx = ?", (bag_id, idx))
            if not rows:
                return None
            job = rows[0]
            job["attempt_list"] = dict_rows(
                conn,
                "SELECT a.*, v.vm_type, v.provider_id FROM attempts a LEFT JOIN vms v ON v.id = a.vm_id "
                "WHERE a.bag_id = ? AND a.idx = ? ORDER BY a.number",
                (bag_id, idx),
            )
            job["transitions"] = dict_rows(
                conn,
                "SELECT at, from_state, to_state, reason FROM transitions WHERE entity_id = ? ORDER BY id",
                (job_id_of(bag_id, idx),),
            )
            job["checkpoint_list"] = dict_rows(
                conn,
                "SELECT number AS attempt, requested_at, at, ok, work_s, vm_age_h, detail "
                "FROM checkpoints WHERE bag_id = ? AND idx = ? ORDER BY id",
                (bag_id, idx),
            )
            return job

        return await self.read(get)

    async def job_state_counts(self, bag_id: str) -> dict[str, int]:
        """Counts by state computed from the jobs themselves (to check the maintained counts)."""

        def count(conn: sqlite3.Connection) -> dict[str, int]:
            return dict(
                conn.execute(
                    "SELECT state, count(*) FROM jobs WHERE bag_id = ? GROUP BY state", (bag_id,)
                ).fetchall()
            )

        return await self.read(count)
