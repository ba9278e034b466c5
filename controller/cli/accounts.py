"""`spotbag accounts`: CPU-hour accounts (create, credit, set, show, list, ledger), their
monthly budgets in dollars, and the
tokens that can only see and spend one account (docs/design.md#ledger)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.table import Table

from controller.cli.common import call, client_of, console, err_console
from controller.cli.render import table_of, when
from controller.formatting import number
from controller.notify.kinds import EVENT_KINDS


@click.group()
def accounts() -> None:
    """CPU-hour accounts: create, credit, balances and ledger (docs/design.md#ledger)."""


def _balance_row(table: Table, view: dict[str, Any]) -> None:
    def hours(value: float | None) -> str:
        return "unlimited" if value is None else number(value)

    budget = view.get("budget") or {}
    cap = budget.get("budget_usd")
    table.add_row(
        view["account"],
        hours(view["allocation_cpu_h"]),
        number(view["charged_cpu_h"]),
        number(view["reserved_cpu_h"]),
        hours(view["available_cpu_h"]),
        str(view["held_jobs"]),
        "none" if cap is None else f"${number(cap)}",
        f"${number(budget.get('month_charged_usd', 0.0))}",
    )


def _balance_table() -> Table:
    return table_of(
        "account",
        "allocation",
        "charged",
        "reserved",
        "available",
        "held jobs",
        "budget/month",
        "spent this month",
    )


@accounts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def accounts_list(ctx: click.Context, as_json: bool) -> None:
    """Every account's balance in CPU-hours."""
    data = call(client_of(ctx).accounts)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = _balance_table()
    for view in data["accounts"]:
        _balance_row(table, view)
    console.print(table)


NOTIFY_HELP = (
    "A webhook told of every event of the account's bags (repeatable); =KIND,... for some "
    "kinds only (docs/notifications.md)."
)


@accounts.command("create")
@click.argument("name")
@click.option("--cpu-hours", type=float, default=0.0, show_default=True, help="First credit.")
@click.option("--unlimited", is_flag=True, help="No limit (usage is still recorded).")
@click.option("--note", default="", help="Why (kept in the ledger).")
@click.option(
    "--budget-usd", type=float, default=None, help="Most its bags may cost per month (UTC), USD."
)
@click.option("--notify", "webhooks", multiple=True, metavar="URL[=KIND,...]", help=NOTIFY_HELP)
@click.pass_context
def accounts_create(
    ctx: click.Context,
    name: str,
    cpu_hours: float,
    unlimited: bool,
    note: str,
    budget_usd: float | None,
    webhooks: tuple[str, ...],
) -> None:
    """Create an account with an allocation of CPU-hours (and a monthly budget, webhooks)."""
    notify = [webhook_value(text) for text in webhooks]
    view = call(client_of(ctx).create_account, name, cpu_hours, unlimited, note, budget_usd, notify)
    _print_account(view)


def _print_account(view: dict[str, Any]) -> None:
    table = _balance_table()
    _balance_row(table, view)
    console.print(table)
    for hook in view.get("notify") or ():
        console.print(f"webhook {hook['url']}: {', '.join(hook['events'])}", highlight=False)


@accounts.command("credit")
@click.argument("name")
@click.argument("cpu_hours", type=float)
@click.option("--note", default="", help="Why (kept in the ledger).")
@click.pass_context
def accounts_credit(ctx: click.Context, name: str, cpu_hours: float, note: str) -> None:
    """Add CPU-hours to an account (held jobs may then run)."""
    view = call(client_of(ctx).credit, name, cpu_hours, note)
    table = _balance_table()
    _balance_row(table, view)
    console.print(table)


@accounts.command("set")
@click.argument("name")
@click.option(
    "--budget-usd",
    "budget",
    default=None,
    help="Most its bags may cost per calendar month (UTC), US dollars; 'none' removes it.",
)
@click.option("--notify", "webhooks", multiple=True, metavar="URL[=KIND,...]", help=NOTIFY_HELP)
@click.option("--no-notify", is_flag=True, help="Remove the account's webhooks.")
@click.pass_context
def accounts_set(
    ctx: click.Context, name: str, budget: str | None, webhooks: tuple[str, ...], no_notify: bool
) -> None:
    """Change an account's monthly budget (bags it held may then go on), its webhooks."""
    if webhooks and no_notify:
        raise click.UsageError("--notify and --no-notify together")
    change: dict[str, Any] = {}
    if budget is not None:
        change["budget_usd"] = budget_value(budget)
    if webhooks or no_notify:
        change["notify"] = [webhook_value(text) for text in webhooks]
    if not change:
        raise click.UsageError("give --budget-usd, --notify or --no-notify")
    _print_account(call(client_of(ctx).set_account, name, change))


def webhook_value(text: str) -> dict[str, Any]:
    """A webhook given on the command line: URL, or URL=kind,kind (default: every kind)."""
    url, _, kinds = text.partition("=")
    events = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in events if k not in EVENT_KINDS]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)}: not an event kind ({', '.join(EVENT_KINDS)})"
        )
    return {"url": url.strip(), **({"events": events} if events else {})}


def budget_value(text: str) -> float | None:
    """A budget given on the command line: US dollars, or none."""
    if text.strip().lower() in ("none", "null", ""):
        return None
    try:
        return float(text.strip().lstrip("$"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number of US dollars (or none)") from None


@accounts.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def accounts_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One account's balance: allocation = charged + reserved + available."""
    view = call(client_of(ctx).account, name)
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    table = _balance_table()
    _balance_row(table, view)
    console.print(table)


@accounts.command("ledger")
@click.argument("name")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, every entry (pages through them).")
@click.option("--limit", type=int, default=100, show_default=True, help="Entries (table/JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def accounts_ledger(ctx: click.Context, name: str, as_csv: bool, limit: int, as_json: bool) -> None:
    """An account's ledger entries: credits, reservations, charges, releases."""
    client = client_of(ctx)
    if as_csv:
        after, first = 0, True
        while True:
            body, headers = call(client.ledger, name, after, 10_000, True)
            lines = body.decode().splitlines(keepends=True)
            sys.stdout.write("".join(lines if first else lines[1:]))
            first = False
            following = headers.get("X-Spotbag-Next-After")
            if not following:
                return
            after = int(following)
    data = call(client.ledger, name, 0, limit)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = table_of("id", "when", "kind", "CPU-hours", "reservation", "note", keep=3)
    for e in data["entries"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        table.add_row(str(e["id"]), when, e["kind"], number(e["cpu_h"]), e["key"], e["note"])
    console.print(table)


@accounts.group("token")
def accounts_token() -> None:
    """Tokens that can only see and spend one account (issued by the admin)."""


@accounts_token.command("create")
@click.argument("account")
@click.option("--note", default="", help="Who or what it is for.")
@click.pass_context
def token_create(ctx: click.Context, account: str, note: str) -> None:
    """Issue a token for ACCOUNT; it is printed once, keep it (SPOTBAG_TOKEN=...)."""
    view = call(client_of(ctx).create_token, account, note)
    err_console.print(
        f"token {view['id']} for account {account!r}; it is not shown again:", highlight=False
    )
    click.echo(view["token"])


@accounts_token.command("list")
@click.argument("account")
@click.pass_context
def token_list(ctx: click.Context, account: str) -> None:
    """ACCOUNT's tokens (never their secrets)."""
    table = table_of("id", "created", "revoked", "note", keep=1)
    for t in call(client_of(ctx).tokens, account)["tokens"]:
        table.add_row(t["id"], when(t["created_at"]), when(t["revoked_at"]), t["note"])
    console.print(table)


@accounts_token.command("revoke")
@click.argument("account")
@click.argument("token_id")
@click.pass_context
def token_revoke(ctx: click.Context, account: str, token_id: str) -> None:
    """Revoke one of ACCOUNT's tokens; it stops working at once."""
    call(client_of(ctx).revoke_token, account, token_id)
    console.print(f"token {token_id} of account {account!r} revoked", highlight=False)
