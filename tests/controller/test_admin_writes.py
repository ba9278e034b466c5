"""An admin's changes (a new account, a credit, a token issued or revoked) are written
first and only then taken into memory: a write that fails leaves memory as it was,
so the API has nothing to undo."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.config import LedgerConfig
from controller.ledger import Accounts
from controller.tokens import Tokens


class WriteFailed(Exception):
    pass


class FakeStore:
    """The writes the ledger and the tokens make; `fail` makes every one raise."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.ledger: list[tuple] = []
        self.accounts: list[dict[str, Any]] = []
        self.tokens: dict[str, dict[str, Any]] = {}

    async def _write(self) -> None:
        await asyncio.sleep(0)  # other tasks may run while a write is under way
        if self.fail:
            raise WriteFailed

    async def create_account(self, account: dict[str, Any], ledger_rows: list[tuple]) -> bool:
        await self._write()
        if any(a["name"] == account["name"] for a in self.accounts):
            return False
        self.accounts.append(account)
        self.ledger += ledger_rows
        return True

    async def append_ledger(self, ledger_rows: list[tuple]) -> None:
        await self._write()
        self.ledger += ledger_rows

    async def create_token(self, row: dict[str, Any]) -> None:
        await self._write()
        self.tokens[row["id"]] = dict(row, revoked_at=None)

    async def revoke_token(self, token_id: str, at: float) -> bool:
        await self._write()
        row = self.tokens.get(token_id)
        if row is None or row["revoked_at"] is not None:
            return False
        row["revoked_at"] = at
        return True


async def test_an_account_exists_in_memory_only_once_written():
    accounts = Accounts(LedgerConfig())
    with pytest.raises(WriteFailed):
        await accounts.open_account(FakeStore(fail=True), "lab", False, 5.0, 1.0)
    assert not accounts.exists("lab") and "lab" not in accounts.ledger.balances
    store = FakeStore()
    assert await accounts.open_account(store, "lab", False, 5.0, 1.0, "first")
    assert accounts.view("lab")["allocation_cpu_h"] == 5.0
    assert store.ledger == [(1.0, "lab", "credit", 5.0, "", "account created")]
    assert not await accounts.open_account(store, "lab", True, 1.0, 2.0)  # exists already
    assert accounts.view("lab")["unlimited"] is False


async def test_an_account_being_written_exists_for_everything_else():
    accounts = Accounts(LedgerConfig(new_accounts="unlimited"))
    store = FakeStore()
    creating = asyncio.create_task(accounts.open_account(store, "lab", False, 5.0, 1.0))
    await asyncio.sleep(0)  # the write is under way
    assert accounts.exists("lab")
    assert not await accounts.open_account(store, "lab", False, 1.0, 1.0)
    assert await creating
    assert accounts.view("lab")["allocation_cpu_h"] == 5.0 and len(store.accounts) == 1


async def test_a_credit_counts_only_once_written():
    accounts = Accounts(LedgerConfig())
    store = FakeStore()
    await accounts.open_account(store, "lab", False, 5.0, 1.0)
    with pytest.raises(WriteFailed):
        await accounts.add_credit(FakeStore(fail=True), "lab", 2.0, 2.0)
    assert accounts.view("lab")["allocation_cpu_h"] == 5.0
    await accounts.add_credit(store, "lab", 2.0, 2.0, "more")
    assert accounts.view("lab")["allocation_cpu_h"] == 7.0
    assert store.ledger[-1] == (2.0, "lab", "credit", 2.0, "", "more")
    with pytest.raises(ValueError):
        await accounts.add_credit(store, "lab", -1.0, 3.0)
    assert len(store.ledger) == 2


async def test_a_token_works_once_written_and_stops_once_revoked():
    tokens = Tokens("admin")
    with pytest.raises(WriteFailed):
        await tokens.create(FakeStore(fail=True), "lab", 1.0)
    store = FakeStore()
    row, token = await tokens.create(store, "lab", 1.0, "ci")
    assert tokens.authenticate(f"Bearer {token}").account == "lab"
    with pytest.raises(WriteFailed):
        await tokens.revoke(FakeStore(fail=True), row["id"], 2.0)
    assert tokens.authenticate(f"Bearer {token}") is not None
    assert await tokens.revoke(store, row["id"], 2.0)
    assert tokens.authenticate(f"Bearer {token}") is None
    assert not await tokens.revoke(store, row["id"], 3.0)
