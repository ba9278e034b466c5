"""Events and their webhook deliveries (docs/notifications.md): an event is recorded
with one delivery per webhook (batch.py, in the transaction of the change that raised
it); the delivery worker (controller/notify/delivery.py) reads the due ones, and
records every attempt and the delivery's new state. Undelivered events are rows here,
so they survive a restart."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.store.batch import EventRecord, insert_events
from controller.store.engine import Engine, dict_rows


@dataclass(frozen=True)
class DeliveryTry:
    """One attempt at a delivery, and the delivery's state after it."""

    delivery_id: int
    at: float
    status: int | None  # the HTTP status; None: no answer came
    error: str
    duration_s: float
    state: str  # pending (retried at next_try_at), delivered or failed
    next_try_at: float


class EventQueries(Engine):
    """Queries of the events, event_deliveries and delivery_attempts tables."""

    async def record_events(self, events: Sequence[EventRecord]) -> None:
        """Record events raised outside a scheduler pass."""
        await self.write(insert_events, list(events))

    async def list_events(
        self,
        *,
        bag_id: str | None = None,
        kind: str | None = None,
        since: float | None = None,
        after: int = 0,
        account: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Events in the order recorded (seq > `after`), with their deliveries."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            where: list[str] = ["seq > ?"]
            args: list[Any] = [after]
            for column, value in (("bag_id", bag_id), ("kind", kind), ("account", account)):
                if value is not None:
                    where.append(f"{column} = ?")
                    args.append(value)
            if since is not None:
                where.append("created_at >= ?")
                args.append(since)
            events = dict_rows(
                conn,
                f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
                (*args, limit),
            )
            for event in events:
                event["deliveries"] = dict_rows(
                    conn,
                    "SELECT url, state, attempts, next_try_at, last_status, last_error, "
                    "delivered_at FROM event_deliveries WHERE event_id = ? ORDER BY id",
                    (event["id"],),
                )
            return events

        return await self.read(select)

    async def due_deliveries(self, now: float, limit: int) -> list[dict[str, Any]]:
        """Pending deliveries due by `now`, earliest first, with their events."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return dict_rows(
                conn,
                "SELECT d.id AS delivery_id, d.url, d.attempts, e.id, e.kind, e.bag_id, "
                "e.account, e.created_at, e.payload FROM event_deliveries d "
                "JOIN events e ON e.id = d.event_id "
                "WHERE d.state = 'pending' AND d.next_try_at <= ? "
                "ORDER BY d.next_try_at, d.id LIMIT ?",
                (now, limit),
            )

        return await self.read(select)

    async def next_delivery_at(self) -> float | None:
        """When the next pending delivery is due (None: none is pending)."""
        return await self.read(
            lambda conn: conn.execute(
                "SELECT min(next_try_at) FROM event_deliveries WHERE state = 'pending'"
            ).fetchone()[0]
        )

    async def deliveries_tried(self, tries: Sequence[DeliveryTry]) -> None:
        """Record attempts at deliveries and each delivery's new state, in one transaction."""

        def record(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO delivery_attempts (delivery_id, at, status, error, duration_s) "
                "VALUES (?, ?, ?, ?, ?)",
                [(t.delivery_id, t.at, t.status, t.error, t.duration_s) for t in tries],
            )
            conn.executemany(
                "UPDATE event_deliveries SET attempts = attempts + 1, state = ?, "
                "next_try_at = ?, last_status = ?, last_error = ?, delivered_at = ? "
                "WHERE id = ?",
                [
                    (
                        t.state,
                        t.next_try_at,
                        t.status,
                        t.error,
                        t.at if t.state == "delivered" else None,
                        t.delivery_id,
                    )
                    for t in tries
                ],
            )

        await self.write(record)

    async def delivery_attempts(self, event_id: str) -> list[dict[str, Any]]:
        """Every attempt at delivering an event, oldest first (with its URL)."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return dict_rows(
                conn,
                "SELECT d.url, a.at, a.status, a.error, a.duration_s FROM delivery_attempts a "
                "JOIN event_deliveries d ON d.id = a.delivery_id WHERE d.event_id = ? "
                "ORDER BY a.id",
                (event_id,),
            )

        return await self.read(select)
