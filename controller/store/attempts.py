"""Attempts of jobs: one attempt, or a job's latest (the API's log and status reads), and
a bag's attempts over time with their checkpoints and VMs (the web UI's timeline)."""

from __future__ import annotations

import sqlite3

from controller.store.engine import Engine, dict_rows
from controller.store.rows import AttemptRow, BagTimeline, TimelineVm

VM_IDS_PER_QUERY = 500  # well under SQLite's limit on bound variables (999 in old builds)


class AttemptQueries(Engine):
    """Queries of the attempts table."""

    async def get_attempt(self, bag_id: str, idx: int, number: int | None) -> AttemptRow | None:
        """One attempt of a job (the latest when `number` is None)."""

        def get(conn: sqlite3.Connection) -> AttemptRow | None:
            if number is None:
                rows = dict_rows(
                    conn,
                    "SELECT * FROM attempts WHERE bag_id = ? AND idx = ? "
                    "ORDER BY number DESC LIMIT 1",
                    (bag_id, idx),
                )
            else:
                rows = dict_rows(
                    conn,
                    "SELECT * FROM attempts WHERE bag_id = ? AND idx = ? AND number = ?",
                    (bag_id, idx, number),
                )
            return rows[0] if rows else None

        return await self.read(get)

    async def on_demand_share(self, bag_id: str, now: float) -> float:
        """The share of the bag's attempt-hours so far (started → ended, or `now`) that
        ran on on-demand VMs (the vms table's `spot` = 0); 0 before any."""

        def share(conn: sqlite3.Connection) -> float:
            on_demand, total = conn.execute(
                "SELECT sum(CASE WHEN v.spot = 0 THEN h END), sum(h) FROM ("
                "SELECT a.vm_id, max(0, coalesce(a.ended_at, ?) - a.started_at) AS h "
                "FROM attempts a WHERE a.bag_id = ?) JOIN vms v ON v.id = vm_id",
                (now, bag_id),
            ).fetchone()
            return (on_demand or 0.0) / total if total else 0.0

        return await self.read(share)

    async def preempted_attempts(self, bag_id: str, idxs: list[int]) -> dict[int, int]:
        """How many attempts of each of a bag's jobs `idxs` a preemption cut short (the
        jobs with none are left out): one range of the attempts' primary key per job."""

        def count(conn: sqlite3.Connection) -> dict[int, int]:
            found: dict[int, int] = {}
            for start in range(0, len(idxs), VM_IDS_PER_QUERY):
                chunk = idxs[start : start + VM_IDS_PER_QUERY]
                marks = ", ".join("?" * len(chunk))
                for idx, n in conn.execute(
                    f"SELECT idx, COUNT(*) FROM attempts WHERE bag_id = ? AND idx IN ({marks}) "
                    "AND state = 'preempted' GROUP BY idx",
                    (bag_id, *chunk),
                ):
                    found[idx] = n
            return found

        return await self.read(count)

    async def bag_timeline(self, bag_id: str, since: float, limit: int) -> BagTimeline:
        """A bag's attempts that were live at or after `since` (still running, or ended
        then or later), the newest `limit` of them by start, oldest first; their
        checkpoints completed from `since` on (the newest `limit`); and the VMs they
        ran on.

        One pass over the bag's attempts (its primary-key range): a page that follows a
        running bag asks with `since` just before its previous answer, and gets the few
        attempts that changed since."""

        def read(conn: sqlite3.Connection) -> BagTimeline:
            # The newest `limit` first, then their VMs' types (a join before the limit
            # would look up the VM of every attempt of the bag).
            attempts = dict_rows(
                conn,
                "SELECT a.idx, a.number, a.vm_id, v.vm_type, a.state, a.started_at, "
                "a.ended_at, a.exit_code, a.reason FROM (SELECT idx, number, vm_id, state, "
                "started_at, ended_at, exit_code, reason FROM attempts "
                "WHERE bag_id = ? AND (ended_at IS NULL OR ended_at >= ?) "
                "ORDER BY started_at DESC, idx DESC, number DESC LIMIT ?) a "
                "LEFT JOIN vms v ON v.id = a.vm_id "
                "ORDER BY a.started_at DESC, a.idx DESC, a.number DESC",
                (bag_id, since, limit + 1),
            )
            truncated = len(attempts) > limit
            attempts = attempts[:limit][::-1]
            start = max(since, attempts[0]["started_at"]) if attempts else since
            checkpoints = dict_rows(
                conn,
                "SELECT id, idx, number AS attempt, requested_at, at, ok, work_s "
                "FROM checkpoints WHERE bag_id = ? AND at >= ? ORDER BY at DESC, id DESC "
                "LIMIT ?",
                (bag_id, start, limit),
            )[::-1]
            shown = {(a["idx"], a["number"]) for a in attempts}
            checkpoints = [k for k in checkpoints if (k["idx"], k["attempt"]) in shown]
            vm_ids = sorted({a["vm_id"] for a in attempts})
            vms: list[TimelineVm] = []
            for i in range(0, len(vm_ids), VM_IDS_PER_QUERY):
                chunk = vm_ids[i : i + VM_IDS_PER_QUERY]
                vms += dict_rows(
                    conn,
                    "SELECT id, vm_type, zone, spot, state, reason, requested_at, running_at, "
                    f"ended_at, notice_until FROM vms WHERE id IN ({', '.join('?' * len(chunk))}) ORDER BY id",
                    chunk,
                )
            return {
                "attempts": attempts,
                "checkpoints": checkpoints,
                "vms": vms,
                "truncated": truncated,
            }

        return await self.read(read)
