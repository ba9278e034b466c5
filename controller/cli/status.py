"""`spotbag status`: one bag's summary, or the recent bags.

A module of its own so that the command imports only the HTTP client and plain-text
rendering, not rich: it is the one run most often, often in a loop (issue 24: it cost
0.3 s of CPU importing what other commands need).
"""

from __future__ import annotations

import json

import click

from controller.cli.common import call, client_of
from controller.cli.render import bag_table, render_summary


@click.command()
@click.argument("bag_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--state", help="Without BAG_ID: only bags in this state.")
@click.option(
    "--limit", default=50, show_default=True, help="Without BAG_ID: at most this many bags."
)
@click.pass_context
def status(
    ctx: click.Context, bag_id: str | None, as_json: bool, state: str | None, limit: int
) -> None:
    """Show one bag (counts, progress, usage, cost) or list recent bags."""
    client = client_of(ctx)
    if bag_id is None:
        bags = call(client.bags, state, limit)
        if as_json:
            click.echo(json.dumps(bags, indent=2))
        elif not bags:
            click.echo("no bags")
        else:
            click.echo(str(bag_table(bags)))
            if len(bags) == limit:
                click.echo(f"(the {limit} most recent; --limit shows more)")
        return
    bag = call(client.bag, bag_id)
    if as_json:
        click.echo(json.dumps(bag, indent=2))
    else:
        # The whole fleet's line too, as `watch` ends with: the usage totals come with
        # any list of VMs, so one VM is asked for.
        fleet = call(client.vms, False, 1)["usage"]
        click.echo(render_summary(bag, fleet))
