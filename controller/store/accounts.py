"""Accounts and the append-only CPU-hour ledger (docs/design.md#ledger): opening an account,
appending entries, the balances and open reservations a restart rebuilds from, and
an account's entries page by page; the webhooks an account names (docs/notifications.md)."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from controller.store.batch import insert_account, insert_ledger
from controller.store.engine import Engine, dict_rows
from controller.store.rows import AccountWithSums, LedgerEntryRow, LedgerState


class AccountQueries(Engine):
    """Queries of the accounts, ledger, ledger_balances and ledger_open tables."""

    async def create_account(self, account: dict[str, Any], ledger_rows: Sequence[tuple]) -> bool:
        """Create an account (with its first credit); False if it exists already."""

        def create(conn: sqlite3.Connection) -> bool:
            if conn.execute("SELECT 1 FROM accounts WHERE name = ?", (account["name"],)).fetchone():
                return False
            insert_account(conn, account)
            insert_ledger(conn, ledger_rows)
            return True

        return await self.write(create)

    async def set_account_notify(self, account: str, notify: list[dict[str, Any]]) -> bool:
        """Set the webhooks an account names (JSON: [{url, events}]); False when the
        account does not exist."""
        text = json.dumps(notify, separators=(",", ":"))

        def update(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("UPDATE accounts SET notify = ? WHERE name = ?", (text, account))
            return cursor.rowcount > 0

        return await self.write(update)

    async def account_webhooks(self) -> dict[str, list[dict[str, Any]]]:
        """Each account's webhooks (accounts that name none are left out)."""

        def load(conn: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
            rows = conn.execute("SELECT name, notify FROM accounts WHERE notify != '[]'")
            return {name: json.loads(notify) for name, notify in rows}

        return await self.read(load)

    async def append_ledger(self, ledger_rows: Sequence[tuple]) -> None:
        await self.write(insert_ledger, ledger_rows)

    async def ledger_state(self) -> LedgerState:
        """What rebuilds the in-memory ledger: accounts, their sums per kind, and the
        reservations not yet settled (no release entry yet)."""

        def load(conn: sqlite3.Connection) -> LedgerState:
            return {
                "accounts": dict_rows(conn, "SELECT * FROM accounts"),
                # Kept beside the ledger (batch.insert_ledger): as long as what is open,
                # not the history.
                "sums": dict_rows(conn, "SELECT account, kind, cpu_h FROM ledger_balances"),
                "open": dict_rows(conn, "SELECT key, account, cpu_h FROM ledger_open"),
            }

        return await self.read(load)

    async def account(self, name: str) -> AccountWithSums | None:
        """An account with its sums per entry kind."""

        def get(conn: sqlite3.Connection) -> AccountWithSums | None:
            rows = dict_rows(conn, "SELECT * FROM accounts WHERE name = ?", (name,))
            if not rows:
                return None
            account = rows[0]
            account["sums"] = dict(
                conn.execute(
                    "SELECT kind, cpu_h FROM ledger_balances WHERE account = ?", (name,)
                ).fetchall()
            )
            return account

        return await self.read(get)

    async def list_accounts(self) -> list[AccountWithSums]:
        def list_(conn: sqlite3.Connection) -> list[AccountWithSums]:
            accounts = dict_rows(conn, "SELECT * FROM accounts ORDER BY name")
            sums: dict[str, dict[str, float]] = defaultdict(dict)
            for account, kind, cpu_h in conn.execute(
                "SELECT account, kind, cpu_h FROM ledger_balances"
            ):
                sums[account][kind] = cpu_h
            for account in accounts:
                account["sums"] = sums.get(account["name"], {})
            return accounts

        return await self.read(list_)

    async def ledger_entries(self, account: str, after_id: int, limit: int) -> list[LedgerEntryRow]:
        def select(conn: sqlite3.Connection) -> list[LedgerEntryRow]:
            return dict_rows(
                conn,
                "SELECT id, at, account, kind, cpu_h, key, note FROM ledger "
                "WHERE account = ? AND id > ? ORDER BY id LIMIT ?",
                (account, after_id, limit),
            )

        return await self.read(select)
