"""Spot price samples (kept for [hopping] retention_days) and the hopper's
migrations of VMs from one type to another (the `hops` table: `migrations` is the
schema's own record)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from controller.store.engine import Engine, dict_rows
from controller.store.rows import HopRow


class PriceQueries(Engine):
    """Queries of the price_samples and hops tables."""

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

    async def recent_price_samples(
        self, since: float, limit: int
    ) -> tuple[list[tuple[str, str, float, float]], bool]:
        """The newest `limit` (vm_type, zone, at, price_per_hour) samples from `since` on,
        oldest first, and whether older ones from `since` on were left out."""

        def select(conn: sqlite3.Connection) -> tuple[list[tuple[str, str, float, float]], bool]:
            rows = conn.execute(
                "SELECT vm_type, zone, at, price_per_hour FROM price_samples WHERE at >= ? "
                "ORDER BY at DESC LIMIT ?",
                (since, limit + 1),
            ).fetchall()
            return [tuple(r) for r in rows[:limit][::-1]], len(rows) > limit

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

    async def list_migrations(self, limit: int = 1000) -> list[HopRow]:
        def select(conn: sqlite3.Connection) -> list[HopRow]:
            return dict_rows(
                conn, "SELECT * FROM hops ORDER BY id DESC LIMIT :limit", {"limit": limit}
            )

        return await self.read(select)
