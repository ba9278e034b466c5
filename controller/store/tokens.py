"""Per-account API tokens (only a hash of each secret is stored)."""

from __future__ import annotations

import sqlite3
from typing import Any

from controller.store.engine import Engine, dict_rows
from controller.store.rows import TokenRow


class TokenQueries(Engine):
    """Queries of the account_tokens table."""

    async def create_token(self, row: dict[str, Any]) -> None:
        await self.write(
            lambda conn: conn.execute(
                "INSERT INTO account_tokens (id, account, secret_sha256, created_at, note) "
                "VALUES (:id, :account, :secret_sha256, :created_at, :note)",
                row,
            )
        )

    async def revoke_token(self, token_id: str, at: float) -> bool:
        """Revoke a token; False when there is no such live token."""

        def revoke(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE account_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (at, token_id),
            )
            return cursor.rowcount > 0

        return await self.write(revoke)

    async def tokens(self) -> list[TokenRow]:
        """Every account token, revoked ones included (with their hashes)."""
        return await self.read(
            lambda conn: dict_rows(conn, "SELECT * FROM account_tokens ORDER BY created_at, id")
        )
