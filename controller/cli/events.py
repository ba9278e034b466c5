"""`spotbag events`: the events of bags and the fleet (finished, failed,
deadline_at_risk, budget_reached, preemption_storm) with their webhook deliveries,
`--follow` to wait for more; and `spotbag bags set`: a bag's budget
(docs/notifications.md, docs/bags.md#budgets). Plain text, no rich: `events --follow`
may run for days in a terminal."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from controller.cli.common import call, client_of
from controller.cli.render import PlainTable, when
from controller.formatting import usd

KINDS = ("finished", "failed", "deadline_at_risk", "budget_reached", "preemption_storm")


@click.group()
def bags() -> None:
    """Change a bag: its budget (bags set BAG --budget USD)."""


@bags.command("set")
@click.argument("bag_id")
@click.option(
    "--budget",
    required=True,
    help="Most the bag may cost, US dollars; 'none' removes its cap. A bag its budget held "
    "goes on if the new one leaves room.",
)
@click.pass_context
def bags_set(ctx: click.Context, bag_id: str, budget: str) -> None:
    """Change BAG_ID's budget."""
    from controller.cli.accounts import budget_value

    view = call(client_of(ctx).set_bag_budget, bag_id, budget_value(budget))
    click.echo(budget_line(view))


def budget_line(view: dict[str, Any]) -> str:
    """A bag's budget in one line: its cap, what it was charged and has reserved, why a
    budget holds it."""
    b = view.get("budget") or {}
    cap = b.get("budget_usd")
    text = (
        f"bag {view['id']}: budget {'none' if cap is None else usd(cap)}, "
        f"charged {usd(b.get('charged_usd', 0.0))}, reserved {usd(b.get('reserved_usd', 0.0))}"
    )
    if b.get("held"):
        text += f"; {b['held']}"
    return text


def _summary(event: dict[str, Any]) -> str:
    p = event["payload"]
    if event["kind"] in ("finished", "failed"):
        return f"{p.get('state', '')}, {p.get('failed_jobs', 0)} failed jobs"
    if event["kind"] == "budget_reached":
        return str(p.get("held", ""))
    if event["kind"] == "preemption_storm":
        return f"{p.get('preemptions')} preemptions in {p.get('window_s', 0):g} s"
    return json.dumps(p, separators=(",", ":"))[:200]


def _deliveries(event: dict[str, Any]) -> str:
    parts = []
    for d in event["deliveries"]:
        parts.append(f"{d['state']} ({d['attempts']}) {d['url']}")
    return "; ".join(parts) or "-"


def events_table(events: list[dict[str, Any]]) -> str:
    table = PlainTable("seq", "when", "kind", "bag", "event id", "what", "deliveries")
    for e in events:
        table.add_row(
            str(e["seq"]),
            when(e["created_at"]),
            e["kind"],
            e["bag_id"] or "(fleet)",
            e["id"],
            _summary(e),
            _deliveries(e),
        )
    return str(table)


@click.command()
@click.option("--bag", "bag_id", help="Only this bag's events.")
@click.option("--kind", type=click.Choice(KINDS), help="Only events of this kind.")
@click.option("--since", type=int, help="Only events created at or after this epoch second.")
@click.option(
    "--limit", default=100, show_default=True, help="At most this many (without --follow)."
)
@click.option("--follow", is_flag=True, help="Print new events as they come, until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, help="--follow: seconds between polls.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.pass_context
def events(
    ctx: click.Context,
    bag_id: str | None,
    kind: str | None,
    since: int | None,
    limit: int,
    follow: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Events (finished, failed, budget_reached, ...) and their webhook deliveries; --follow waits for more."""
    client = client_of(ctx)
    after = 0
    header = True
    while True:
        page = call(client.events, bag_id, kind, since, after, limit)
        found = page["events"]
        if found:
            if as_json:
                for e in found:
                    click.echo(json.dumps(e))
            else:
                text = events_table(found)
                click.echo(text if header else text.split("\n", 1)[1])
                header = False
            after = page["next_after"]
        elif header and not follow and not as_json:
            click.echo("no events")
        if not follow:
            return
        if len(found) < limit:
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return
