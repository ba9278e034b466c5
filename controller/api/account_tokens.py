"""Account tokens (controller/tokens.py): issue one for an account (shown once), list
an account's tokens (never their secrets), revoke one."""

from __future__ import annotations

from aiohttp import web

from controller.api.accounts import account_in_path
from controller.api.base import (
    ACCOUNT_PATH,
    ERR,
    Param,
    Route,
    controller_of,
    json_body,
    json_response,
)
from controller.api.schemas import IssuedToken, RevokedToken, TokenCreate, TokenList, parse_body
from controller.errors import Conflict, NotFound
from controller.tokens import token_view


async def create_token(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    data = await json_body(request) if request.body_exists else {}
    body = parse_body(TokenCreate, data)
    row, token = await c.tokens.create(c.store, name, c.clock.now(), body.note)
    view = token_view({**row, "revoked_at": None})
    return json_response({**view, "token": token}, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    rows = [token_view(row) for row in await c.store.tokens() if row["account"] == name]
    return json_response({"tokens": rows})


async def revoke_token(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    token_id = request.match_info["token_id"]
    if c.tokens.account_of(token_id) != name:
        raise NotFound(f"account {name!r} has no token {token_id!r}")
    if not await c.tokens.revoke(c.store, token_id, c.clock.now()):
        raise Conflict(f"token {token_id} was revoked already")
    return json_response({"id": token_id, "account": name, "revoked": True})


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/accounts/{account}/tokens",
        create_token,
        "Issue a token that can only see and spend this account: {note}. The token is shown once.",
        admin_only=True,
        body=TokenCreate,
        body_required=False,
        params=(ACCOUNT_PATH,),
        responses={201: ("The token.", IssuedToken), 404: ("No such account.", ERR)},
    ),
    Route(
        "GET",
        "/v1/accounts/{account}/tokens",
        list_tokens,
        "The account's tokens (ids, notes, revocation; never the secrets).",
        params=(ACCOUNT_PATH,),
        responses={200: ("Tokens.", TokenList), 404: ("No such account.", ERR)},
    ),
    Route(
        "DELETE",
        "/v1/accounts/{account}/tokens/{token_id}",
        revoke_token,
        "Revoke one of the account's tokens.",
        admin_only=True,
        params=(ACCOUNT_PATH, Param("token_id", "path", "Token id.", required=True)),
        responses={
            200: ("Revoked.", RevokedToken),
            404: ("No such token.", ERR),
            409: ("Revoked already.", ERR),
        },
    ),
)
