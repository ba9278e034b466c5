"""VMs: the fleet listing, usage and cost per VM type, the lifetimes the preemption
models learn from, and the core-hour history prepaid sizing reads."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from controller.store.engine import Engine, dict_rows
from controller.store.rows import LifetimeRow, VmRow


class VmQueries(Engine):
    """Queries of the vms table."""

    async def list_vms(self, *, states: Sequence[str] | None, limit: int) -> list[VmRow]:
        def list_(conn: sqlite3.Connection) -> list[VmRow]:
            if states:
                marks = ", ".join("?" * len(states))
                return dict_rows(
                    conn,
                    f"SELECT * FROM vms WHERE state IN ({marks}) "
                    "ORDER BY requested_at DESC LIMIT ?",
                    (*states, limit),
                )
            return dict_rows(conn, "SELECT * FROM vms ORDER BY requested_at DESC LIMIT ?", (limit,))

        return await self.read(list_)

    async def lifetime_observations(
        self, driver: str, now: float, limit: int = 20_000
    ) -> list[LifetimeRow]:
        """VMs that ran, most recently launched first: how long they lived (model seconds)
        and whether they were preempted. A VM still running, or stopped by spotbag, is
        censored at its age. Ordering by launch, with the live ones included, keeps a
        window of recent VMs unbiased (ordering by end would favour long lives)."""

        def select(conn: sqlite3.Connection) -> list[LifetimeRow]:
            return dict_rows(
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

    async def vm_core_intervals(self) -> list[tuple[float, float, int, str]]:
        """(running_at, ended_at, cpus, vm_type) of every VM that ran and ended: the
        history `spotbag prepaid --from-store` sizes prepaid capacity from."""
        return await self.read(
            lambda conn: conn.execute(
                "SELECT running_at, ended_at, cpus, vm_type FROM vms WHERE running_at IS NOT NULL "
                "AND ended_at IS NOT NULL AND ended_at > running_at ORDER BY running_at"
            ).fetchall()
        )
