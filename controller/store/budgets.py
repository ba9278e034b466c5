"""Budgets in dollars (docs/bags.md#budgets): the caps of bags and accounts, and the
attempts' dollar reservations (budget_reservations: reserved, then charged), written
by the scheduler's batch (batch.py) in the same transaction as the CPU-hour ledger's
entries. A restart rebuilds the in-memory book (controller/budgets.py) from here."""

from __future__ import annotations

import sqlite3
from typing import Any

from controller.store.engine import Engine, dict_rows


class BudgetQueries(Engine):
    """Queries of budget_reservations and the budget columns of bags and accounts."""

    async def budget_state(self, month: str, month_start: float) -> dict[str, Any]:
        """What rebuilds the budget book: the caps of active bags and of accounts, the
        active bags' charges, the accounts' charges in `month`, the reservations not
        yet settled, and the active bags told budget_reached since their budgets (and
        their accounts') last changed, within the month (`month_start`, epoch s)."""

        def load(conn: sqlite3.Connection) -> dict[str, Any]:
            return {
                "told": dict(
                    conn.execute(
                        "SELECT DISTINCT b.id, b.account FROM events e "
                        "JOIN bags b ON b.id = e.bag_id LEFT JOIN accounts a ON a.name = b.account "
                        "WHERE e.kind = 'budget_reached' AND b.state = 'active' "
                        "AND e.created_at >= ? AND e.created_at >= coalesce(b.budget_changed_at, 0) "
                        "AND e.created_at >= coalesce(a.budget_changed_at, 0)",
                        (month_start,),
                    ).fetchall()
                ),
                "bag_caps": dict(
                    conn.execute(
                        "SELECT id, budget_usd FROM bags WHERE state = 'active'"
                    ).fetchall()
                ),
                "bag_accounts": dict(
                    conn.execute("SELECT id, account FROM bags WHERE state = 'active'").fetchall()
                ),
                "account_caps": dict(
                    conn.execute("SELECT name, budget_usd FROM accounts").fetchall()
                ),
                "bag_spent": dict(
                    conn.execute(
                        "SELECT b.id, coalesce(sum(r.charged_usd), 0) FROM bags b JOIN budget_reservations r "
                        "ON r.bag_id = b.id WHERE b.state = 'active' GROUP BY b.id"
                    ).fetchall()
                ),
                "account_spent": dict(
                    conn.execute(
                        "SELECT account, coalesce(sum(charged_usd), 0) FROM budget_reservations "
                        "WHERE month = ? AND settled_at IS NOT NULL GROUP BY account",
                        (month,),
                    ).fetchall()
                ),
                "open": dict_rows(
                    conn,
                    "SELECT key, bag_id, account, reserved_usd AS usd, month FROM budget_reservations "
                    "WHERE settled_at IS NULL",
                ),
            }

        return await self.read(load)

    async def bag_budget_sums(self, bag_id: str) -> tuple[float, float]:
        """(charged, reserved and not yet settled) dollars of one bag."""

        def sums(conn: sqlite3.Connection) -> tuple[float, float]:
            charged, reserved = conn.execute(
                "SELECT sum(charged_usd), sum(CASE WHEN settled_at IS NULL THEN reserved_usd END) "
                "FROM budget_reservations WHERE bag_id = ?",
                (bag_id,),
            ).fetchone()
            return charged or 0.0, reserved or 0.0

        return await self.read(sums)

    async def set_bag_budget(self, bag_id: str, budget_usd: float | None, at: float) -> None:
        await self.write(
            lambda conn: conn.execute(
                "UPDATE bags SET budget_usd = ?, budget_changed_at = ? WHERE id = ?",
                (budget_usd, at, bag_id),
            )
        )

    async def set_account_budget(self, account: str, budget_usd: float | None, at: float) -> bool:
        """Set an account's monthly budget; False when the account does not exist."""

        def update(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE accounts SET budget_usd = ?, budget_changed_at = ? WHERE name = ?",
                (budget_usd, at, account),
            )
            return cursor.rowcount > 0

        return await self.write(update)
