"""Who is calling: the admin token, or a per-account token.

The daemon's token (api.token / SPOTBAG_TOKEN / STATE_DIR/token) is the admin's: it
may do everything, including creating and crediting accounts and issuing account
tokens. An account token, `sbt_<id>_<secret>`, may only see and spend its own
account: submit bags charged to it, see and cancel its bags and their jobs, read its
balance, ledger and reports. Only a SHA-256 of the secret is stored (it is random
and long, so a slow password hash would add nothing); the whole token is shown once,
when it is issued. Tokens are kept in memory (the API is the only writer) and
checked in constant time; a new token or a revocation is written first and only then
taken into memory (`create`, `revoke`), so a failed write changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

TOKEN_FORMAT = re.compile(r"^sbt_([a-f0-9]{12})_([A-Za-z0-9_-]{20,100})$")


@dataclass(frozen=True)
class Principal:
    """The caller: the admin (account None) or the holder of one account's token."""

    account: str | None = None
    token_id: str = ""

    @property
    def is_admin(self) -> bool:
        return self.account is None

    def may_use(self, account: str) -> bool:
        return self.account is None or self.account == account


ADMIN = Principal()


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class _Known:
    account: str
    secret_sha256: str
    revoked: bool


def bearer_credentials(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None. The scheme is
    matched case-insensitively (RFC 7235 §2.1) and may be followed by several spaces;
    a header that is not text (raw bytes that are not UTF-8, which the HTTP server
    hands over as surrogate escapes) or has no token is None."""
    scheme, _, credentials = authorization.partition(" ")
    token = credentials.strip(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return token


class TokenStore(Protocol):
    """The writes tokens need (controller.store.Store has them)."""

    async def create_token(self, row: dict[str, Any]) -> None: ...

    async def revoke_token(self, token_id: str, at: float) -> bool: ...


class Tokens:
    def __init__(self, admin_token: str, rows: Sequence[Mapping[str, Any]] = ()) -> None:
        self._admin = admin_token.encode()
        self._known = {
            row["id"]: _Known(row["account"], row["secret_sha256"], row["revoked_at"] is not None)
            for row in rows
        }

    def authenticate(self, authorization: str) -> Principal | None:
        """The principal an `Authorization` header stands for; None if it is no valid token."""
        token = bearer_credentials(authorization)
        if token is None:
            return None
        if self._admin and hmac.compare_digest(token.encode(), self._admin):
            return ADMIN
        match = TOKEN_FORMAT.fullmatch(token)
        if match is None:
            return None
        token_id, secret = match.groups()
        known = self._known.get(token_id)
        if known is None or known.revoked:
            return None
        if not hmac.compare_digest(_digest(secret), known.secret_sha256):
            return None
        return Principal(known.account, token_id)

    def issue(self, account: str, now: float, note: str = "") -> tuple[dict[str, Any], str]:
        """A new token for `account`: (the row to store, the token to show once).
        Call `added(row)` once the row is written."""
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        row = {
            "id": token_id,
            "account": account,
            "secret_sha256": _digest(secret),
            "created_at": now,
            "note": note,
        }
        return row, f"sbt_{token_id}_{secret}"

    async def create(
        self, store: TokenStore, account: str, now: float, note: str = ""
    ) -> tuple[dict[str, Any], str]:
        """Issue a token for `account`, write it, then accept it: (its row, the token
        to show once)."""
        row, token = self.issue(account, now, note)
        await store.create_token(row)
        self.added(row)
        return row, token

    async def revoke(self, store: TokenStore, token_id: str, now: float) -> bool:
        """Revoke a token: written first, then refused from then on. False when it was
        revoked already (or does not exist)."""
        if not await store.revoke_token(token_id, now):
            return False
        self.revoked(token_id)
        return True

    def added(self, row: dict[str, Any]) -> None:
        self._known[row["id"]] = _Known(row["account"], row["secret_sha256"], False)

    def revoked(self, token_id: str) -> None:
        if token_id in self._known:
            self._known[token_id].revoked = True

    def account_of(self, token_id: str) -> str | None:
        known = self._known.get(token_id)
        return known.account if known else None


def token_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A stored token as the API shows it (never its hash)."""
    return {
        "id": row["id"],
        "account": row["account"],
        "created_at": row["created_at"],
        "revoked_at": row["revoked_at"],
        "note": row["note"],
    }
