"""Accounts and their CPU-hour ledger: create and credit (admin), balances, and the
ledger's entries as JSON or CSV. Account names in paths are checked here for every
account route (account_in_path), tokens included."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from controller.api.base import (
    ACCOUNT_PATH,
    ERR,
    Param,
    Route,
    bounded,
    controller_of,
    enum_query,
    int_param,
    json_body,
    json_response,
    principal_of,
    require_account,
)
from controller.api.schemas import (
    ACCOUNT_NAME_PATTERN,
    Account,
    AccountChange,
    AccountCreate,
    AccountList,
    Credit,
    parse_body,
)
from controller.errors import ApiError, Conflict, NotFound

ACCOUNT_NAME = re.compile(ACCOUNT_NAME_PATTERN)
LEDGER_AFTER = bounded("after", "Entries after this id (paging).", 0, 10**15, 0)
LEDGER_LIMIT = bounded("limit", "At most this many entries.", 1, 100_000, 1000)


def account_in_path(request: web.Request) -> str:
    """The path's account, which must exist and be the caller's to use."""
    name = request.match_info["account"]
    require_account(request, name)
    if (
        not ACCOUNT_NAME.fullmatch(name)
        or name not in controller_of(request).running_scheduler.accounts.unlimited
    ):
        raise NotFound(f"account {name!r} does not exist", code="unknown_account")
    return name


def account_view(c: Any, name: str) -> dict[str, Any]:
    """An account's CPU-hour balance, its budget in dollars this month, its webhooks."""
    scheduler = c.running_scheduler
    view = scheduler.accounts.view(name)
    view["budget"] = scheduler.budgets.account_view(name, c.clock.now())
    view["notify"] = [
        {"url": url, "events": list(kinds)}
        for url, kinds in scheduler.world.notices.account_webhooks.get(name, ())
    ]
    return view


async def set_webhooks(c: Any, name: str, webhooks: list[Any]) -> None:
    """An account's webhooks: written first, then the scheduler's (events raised from
    now on go to them too)."""
    notify = [w.model_dump() for w in webhooks]
    await c.store.set_account_notify(name, notify)
    c.running_scheduler.world.notices.set_account_webhooks(name, notify)


async def list_accounts(request: web.Request) -> web.Response:
    c = controller_of(request)
    principal = principal_of(request)
    names = [a["name"] for a in await c.store.list_accounts() if principal.may_use(a["name"])]
    return json_response({"accounts": [account_view(c, name) for name in names]})


async def create_account(request: web.Request) -> web.Response:
    c = controller_of(request)
    body = parse_body(AccountCreate, await json_body(request))
    accounts = c.running_scheduler.accounts
    # Written first, then taken into memory by the ledger: a failed write changes nothing.
    if not await accounts.open_account(
        c.store, body.name, body.unlimited, body.cpu_hours, c.clock.now(), body.note
    ):
        raise Conflict(f"account {body.name!r} exists already", code="account_exists")
    if body.budget_usd is not None:
        await c.store.set_account_budget(body.name, body.budget_usd, c.clock.now())
        c.running_scheduler.budgets.set_account_cap(body.name, body.budget_usd)
    if body.notify:
        await set_webhooks(c, body.name, body.notify)
    c.running_scheduler.credited()
    return json_response(account_view(c, body.name), status=201)


async def set_account(request: web.Request) -> web.Response:
    """Change an account's monthly budget, its webhooks, or both: each written first,
    then taken by the scheduler."""
    c = controller_of(request)
    name = account_in_path(request)
    body = parse_body(AccountChange, await json_body(request))
    given = body.model_fields_set
    if not given:
        raise ApiError("give budget_usd, notify or both", code="invalid_body")
    if "notify" in given:
        await set_webhooks(c, name, body.notify)
    if "budget_usd" in given:
        await c.store.set_account_budget(name, body.budget_usd, c.clock.now())
        c.running_scheduler.budgets.set_account_cap(name, body.budget_usd)
        c.running_scheduler.credited()  # wake it: held bags may go on
    return json_response(account_view(c, name))


async def credit_account(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    body = parse_body(Credit, await json_body(request))
    accounts = c.running_scheduler.accounts
    await accounts.add_credit(c.store, name, body.cpu_hours, c.clock.now(), body.note)
    c.running_scheduler.credited()
    return json_response(account_view(c, name))


async def get_account(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    return json_response(account_view(c, name))


async def account_ledger(request: web.Request) -> web.Response:
    c = controller_of(request)
    name = account_in_path(request)
    after = int_param(request, LEDGER_AFTER)
    limit = int_param(request, LEDGER_LIMIT)
    fmt = enum_query(request, "format", ["json", "csv"]) or "json"
    entries = await c.store.ledger_entries(name, after, limit)
    next_after = entries[-1]["id"] if len(entries) == limit else None
    if fmt == "csv":
        lines = ["id,at,account,kind,cpu_hours,reservation,note"]
        for e in entries:
            note = '"' + e["note"].replace('"', '""') + '"'
            lines.append(
                f"{e['id']},{e['at']:.3f},{e['account']},{e['kind']},{e['cpu_h']!r},{e['key']},{note}"
            )
        headers = {"X-Spotbag-Next-After": str(next_after)} if next_after is not None else {}
        return web.Response(text="\n".join(lines) + "\n", content_type="text/csv", headers=headers)
    return json_response({"entries": entries, "next_after": next_after})


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/v1/accounts",
        list_accounts,
        "Accounts and their CPU-hour balances.",
        responses={200: ("Accounts.", AccountList)},
    ),
    Route(
        "POST",
        "/v1/accounts",
        create_account,
        "Create an account: {name, cpu_hours (its first credit), unlimited, note, budget_usd, "
        "notify}.",
        admin_only=True,
        body=AccountCreate,
        responses={
            201: ("The account, with its balance.", Account),
            400: ("A bad field; the message names it.", ERR),
            409: ("The account exists already.", ERR),
        },
    ),
    Route(
        "GET",
        "/v1/accounts/{account}",
        get_account,
        "An account's balance: allocation, charged, reserved and available CPU-hours.",
        params=(ACCOUNT_PATH,),
        responses={200: ("The balance.", Account), 404: ("No such account.", ERR)},
    ),
    Route(
        "PATCH",
        "/v1/accounts/{account}",
        set_account,
        "Change an account's monthly budget {budget_usd} (US dollars, or null for none), "
        "its webhooks {notify} ([] for none), or both.",
        admin_only=True,
        body=AccountChange,
        params=(ACCOUNT_PATH,),
        responses={
            200: ("The account, with its budget now.", Account),
            400: ("A bad field.", ERR),
            404: ("No such account.", ERR),
        },
    ),
    Route(
        "POST",
        "/v1/accounts/{account}/credit",
        credit_account,
        "Add CPU-hours to an account's allocation: {cpu_hours, note}. Held jobs may run.",
        admin_only=True,
        body=Credit,
        params=(ACCOUNT_PATH,),
        responses={
            200: ("The new balance.", Account),
            400: ("A bad field.", ERR),
            404: ("No such account.", ERR),
        },
    ),
    Route(
        "GET",
        "/v1/accounts/{account}/ledger",
        account_ledger,
        "The account's ledger entries, oldest first (JSON, or CSV with format=csv).",
        params=(
            ACCOUNT_PATH,
            LEDGER_AFTER,
            LEDGER_LIMIT,
            Param(
                "format",
                "query",
                "json (default) or csv.",
                {"type": "string", "enum": ["json", "csv"], "default": "json"},
            ),
        ),
        responses={
            200: ("Entries.", None),
            403: ("An account token may not read another account.", ERR),
            404: ("No such account.", ERR),
        },
    ),
)
