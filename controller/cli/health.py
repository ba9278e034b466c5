"""`spotbag health`: whether the daemon is ready, as GET /healthz says (the readiness
rule, docs/operations.md#healthz); `--wait` waits until it is, for scripts that start a
daemon (examples/demo.sh) instead of waiting a fixed count of seconds."""

from __future__ import annotations

import sys
import time

import click

from controller.cli.client import Client, ClientError
from controller.cli.common import EXIT_UNREACHABLE, client_of, fail

POLL_INTERVAL_S = 0.2  # between two questions while the daemon starts


@click.command()
@click.option(
    "--wait",
    is_flag=True,
    help="While the daemon says it is starting, ask again; end when it is ready or failing "
    "(or cannot be reached: it died).",
)
@click.pass_context
def health(ctx: click.Context, wait: bool) -> None:
    """Whether the daemon is ready (exit 0), starting or failing (exit 1): GET /healthz."""
    client = client_of(ctx)
    answer = _ask(client)
    while wait and answer["status"] == "starting":
        time.sleep(POLL_INTERVAL_S)
        answer = _ask(client)
    status = answer["status"]
    if status == "ok":
        click.echo(f"ok: ready (driver {answer['driver']}, {client.url})")
        return
    problems = "; ".join(answer.get("problems", []))
    click.echo(f"{status}{': ' + problems if problems else ''} ({client.url})")
    sys.exit(EXIT_UNREACHABLE)


def _ask(client: Client) -> dict:
    try:
        return client.health()
    except ClientError as exc:
        fail(exc)
