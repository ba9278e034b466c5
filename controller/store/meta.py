"""The `meta` table: values the daemon keeps about itself (its controller id)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from controller.store.engine import Engine


class MetaQueries(Engine):
    """Reads and writes of the `meta` table."""

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
