"""Attempts of jobs: one attempt, or a job's latest (the API's log and status reads)."""

from __future__ import annotations

import sqlite3

from controller.store.engine import Engine, dict_rows
from controller.store.rows import AttemptRow


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
