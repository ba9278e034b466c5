"""Learned preemption models: each fit recorded, the latest per key the active one."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from controller.store.engine import Engine, dict_rows
from controller.store.rows import ModelRow


class ModelQueries(Engine):
    """Queries of the preemption_models table."""

    async def save_models(self, models: list[dict[str, Any]], reason: str) -> None:
        """Record newly fitted models as the active ones for their keys (the older
        ones stay, inactive, as history)."""

        def save(conn: sqlite3.Connection) -> None:
            for m in models:
                conn.execute(
                    "UPDATE preemption_models SET active = 0 WHERE key = ? AND active = 1",
                    (m["key"],),
                )
                conn.execute(
                    "INSERT INTO preemption_models (key, model, parameters, L, n, censored, stats, fitted_at, "
                    "reason, active) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
                    (
                        m["key"],
                        m["model"],
                        json.dumps(m["parameters"]),
                        m["L"],
                        m["n"],
                        m["censored"],
                        json.dumps(m["stats"]),
                        m["fitted_at"],
                        m.get("reason", reason),
                    ),
                )

        await self.write(save)

    async def models(self, *, active_only: bool = True) -> list[ModelRow]:
        """Learned preemption models (as ModelEntry.to_dict gives them), newest first."""

        def select(conn: sqlite3.Connection) -> list[ModelRow]:
            where = "WHERE active = 1 " if active_only else ""
            rows = dict_rows(
                conn, f"SELECT * FROM preemption_models {where}ORDER BY fitted_at DESC, id DESC"
            )
            for row in rows:
                row["parameters"] = json.loads(row["parameters"])
                row["stats"] = json.loads(row["stats"])
                row["source"] = "learned"
            return rows

        return await self.read(select)
