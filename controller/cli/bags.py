"""The commands that talk to a daemon about its work: submit, watch, cancel, jobs, logs,
vms, hopping, preempt and report (`status` has a module of its own: status.py)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from controller.cli.client import ClientError
from controller.cli.common import (
    EXIT_BAG_FAILED,
    TERMINAL_BAG_STATES,
    call,
    client_of,
    console,
    err_console,
    fail,
    load_spec_file,
)
from controller.cli.render import render_summary, report_tables, table_of
from controller.formatting import duration, number, usd


@click.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--watch", "watch_after", is_flag=True, help="Show live progress until the bag finishes."
)
@click.option("--idempotency-key", help="Submitting again with the same key returns the first bag.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the bag id.")
@click.pass_context
def submit(
    ctx: click.Context, spec_file: str, watch_after: bool, idempotency_key: str | None, quiet: bool
) -> None:
    """Submit the bag in SPEC_FILE (YAML or JSON).

    Jobs run in the current directory unless the spec sets workdir.
    """
    spec = load_spec_file(spec_file)
    if isinstance(spec, dict) and "workdir" not in spec:
        spec["workdir"] = os.getcwd()
    bag = call(client_of(ctx).submit, spec, idempotency_key)
    if quiet:
        click.echo(bag["id"])
    else:
        console.print(
            f"submitted bag [bold]{bag['id']}[/bold] ({bag['job_count']:,} jobs)", highlight=False
        )
    if watch_after:
        ctx.invoke(watch, bag_id=bag["id"])


@click.command()
@click.argument("bag_id")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between updates.")
@click.pass_context
def watch(ctx: click.Context, bag_id: str, interval: float) -> None:
    """Show a live progress bar until BAG_ID finishes, then its summary."""
    client = client_of(ctx)
    bag = call(client.bag, bag_id)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"),
    )
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(bag_id, total=bag["job_count"], detail="")
            while True:
                c, u = bag["counts"], bag["usage"]
                done = c["succeeded"] + c["failed"] + c["cancelled"]
                detail = (
                    f"running {c['running']}  queued {c['queued'] + c['held']}  "
                    f"failed {c['failed']}  interrupted {u['interrupted_attempts']}"
                )
                progress.update(task, completed=done, detail=detail)
                if bag["state"] in TERMINAL_BAG_STATES:
                    break
                time.sleep(interval)
                bag = call(client.bag, bag_id)
    except KeyboardInterrupt:
        err_console.print(f"stopped watching; the bag goes on (spotbag watch {bag_id})")
        sys.exit(130)
    vms = call(client.vms, True)
    click.echo(render_summary(bag, vms["usage"]))
    if bag["state"] != "succeeded":
        sys.exit(EXIT_BAG_FAILED)


@click.command()
@click.argument("bag_id")
@click.pass_context
def cancel(ctx: click.Context, bag_id: str) -> None:
    """Cancel BAG_ID: queued jobs are cancelled and running ones stopped."""
    try:
        bag = client_of(ctx).cancel(bag_id)
    except ClientError as exc:
        if exc.status == 409 and exc.detail.get("state") == "cancelled":
            # It asks for what is already so: nothing to do, and no error (a script may
            # cancel a bag twice, or one that a user cancelled meanwhile).
            console.print(f"bag {bag_id} is already cancelled: nothing to do", highlight=False)
            return
        fail(exc)
    console.print(
        f"cancelling bag {bag['id']}: {bag['counts']['running']} running jobs are being stopped",
        highlight=False,
    )


# --- jobs -----------------------------------------------------------------------------------


@click.command()
@click.argument("bag_id")
@click.option("--state", help="Only jobs in this state (queued, running, succeeded, failed, ...).")
@click.option("--limit", default=50, show_default=True, help="At most this many jobs (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def jobs(ctx: click.Context, bag_id: str, state: str | None, limit: int, as_json: bool) -> None:
    """List the jobs of BAG_ID."""
    client = client_of(ctx)
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page_size = 1000 if limit == 0 else min(1000, limit - len(rows))
        page = call(client.jobs, bag_id, state, after, page_size)
        rows += page["jobs"]
        after = page["next_after"]
        if after is None or (limit and len(rows) >= limit):
            break
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = table_of("job", "state", "attempts", "exit", "runtime", "params", "reason")
    for job in rows:
        runtime = duration(job["runtime_s"])
        exit_code = "" if job["exit_code"] is None else str(job["exit_code"])
        # A waiting job: why it waits (the scheduler's view), before its last transition's.
        why = "; ".join(filter(None, (job.get("waiting", ""), job["reason"])))
        table.add_row(
            job["id"],
            job["state"],
            str(job["attempts"]),
            exit_code,
            runtime,
            json.dumps(job["params"], ensure_ascii=False),
            why,
        )
    console.print(table)


@click.command()
@click.argument("job_id")
@click.option("--attempt", type=int, help="Attempt number (default: the latest).")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing as the job runs, through its retries, until it finishes.",
)
@click.pass_context
def logs(ctx: click.Context, job_id: str, attempt: int | None, follow: bool) -> None:
    """Print the output of JOB_ID's latest (or given) attempt."""
    client = client_of(ctx)
    if not follow:
        data, _ = call(client.log, job_id, attempt, 0)
        sys.stdout.buffer.write(data)
        return
    shown, offset, said_waiting = None, 0, False
    while True:
        job = call(client.job, job_id)
        number = attempt or job["attempts"]
        if number == 0:  # queued, not started yet
            if not said_waiting:
                err_console.print(
                    f"{job_id} is {job['state']}; waiting for it to start", highlight=False
                )
                said_waiting = True
            time.sleep(1.0)
            continue
        if number != shown:
            if shown is not None:
                err_console.print(f"--- attempt {number} ---", highlight=False)
            shown, offset = number, 0
        data, headers = call(client.log, job_id, number, offset)
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        offset = int(headers.get("X-Spotbag-Next-Offset", offset + len(data)))
        if data:
            continue
        attempt_live = headers.get("X-Spotbag-Attempt-State") in ("starting", "running")
        finished = job["state"] in ("succeeded", "failed", "cancelled")
        if not attempt_live and (attempt is not None or finished):
            return
        time.sleep(0.5)


# --- VMs ----------------------------------------------------------------------------------------


def vm_state(vm: dict[str, Any]) -> str:
    """A VM's state, with its preemption notice while it lives ("running (notice: ends
    by 21:30:05)") and whether spotbag is terminating it."""
    notes = []
    if vm.get("notice_until") and not vm.get("ended_at"):
        ends_by = time.strftime("%H:%M:%S", time.localtime(vm["notice_until"]))
        notes.append(f"notice: ends by {ends_by}")
    if vm["terminating"]:
        notes.append("terminating")
    return vm["state"] + (f" ({', '.join(notes)})" if notes else "")


@click.command()
@click.option("--all", "include_ended", is_flag=True, help="Include VMs that have ended.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def vms(ctx: click.Context, include_ended: bool, as_json: bool) -> None:
    """List VMs and the fleet's VM-hours and cost."""
    data = call(client_of(ctx).vms, include_ended)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = table_of("vm", "type", "state", "jobs", "launched", "hours", "cost", "reason", keep=2)
    for vm in data["vms"]:
        launched = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(vm["requested_at"]))
        table.add_row(
            vm["id"],
            vm["vm_type"],
            vm_state(vm),
            f"Slurm node {vm['pool_node']}" if vm.get("pool_node") else str(vm["jobs"]),
            launched,
            number(vm["billed_hours"]),
            usd(vm["cost_usd"]),
            vm["reason"],
        )
    console.print(table)
    total = data["usage"]["total"]
    console.print(
        f"all VMs so far: {total['vms']}, {total['vms_preempted']} preempted, "
        f"{number(total['vm_hours'])} VM-hours: spot {usd(total['spot_cost_usd'])} vs on-demand "
        f"{usd(total['on_demand_cost_usd'])}",
        highlight=False,
    )


@click.command()
@click.option("--limit", default=20, show_default=True, help="Migrations to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON answer.")
@click.pass_context
def hopping(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Spot hopping: the live market per VM type and the latest migrations."""
    data = call(client_of(ctx).hopping, limit)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    configured = data["configured"]
    console.print(
        f"policy {configured['policy']}, every {configured['interval_s']:g} model s over "
        f"{configured['window_s']:g} s windows; migrate: {configured['migrate']}",
        highlight=False,
    )
    table = Table(title="market")
    for column in ("VM type", "now /h", "mean /h", "std /h", "on-demand /h"):
        table.add_column(column, justify="left" if column == "VM type" else "right")
    for row in data["market"]:
        table.add_row(
            row["vm_type"],
            *(
                "–" if row[k] is None else usd(row[k])
                for k in ("price_now", "price_mean", "price_std", "on_demand")
            ),
        )
    console.print(table)
    moves = Table(title="migrations (newest first)")
    for column in ("when", "VM", "from", "to", "price /h", "reason"):
        moves.add_column(column)
    for move in data["migrations"]:
        moves.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(move["at"])),
            move["vm_id"],
            move["from_type"],
            move["to_type"],
            f"{usd(move['price_from'])} -> {usd(move['price_to'])}",
            move["reason"],
        )
    console.print(moves)


NOTICE = re.compile(r"(\d+)\s*(s|m)?")


def _notice_s(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    """'30s', '2m' or a number of seconds -> seconds."""
    if value is None:
        return 0
    match = NOTICE.fullmatch(value.strip())
    if match is None:
        raise click.BadParameter(f"{value!r}: write seconds or minutes, e.g. 30s or 2m")
    return int(match[1]) * (60 if match[2] == "m" else 1)


@click.command()
@click.argument("vm_id")
@click.option(
    "--notice",
    callback=_notice_s,
    help="Announce the preemption this long ahead (30s as GCE, 2m as EC2): the VM takes "
    "no new job and its checkpointable jobs are signalled.",
)
@click.option(
    "--rebalance",
    is_flag=True,
    help="Give EC2's rebalance recommendation instead (local VM hosts: told by their "
    "metadata server only): the VM takes no new job and ends once empty; not preempted.",
)
@click.pass_context
def preempt(ctx: click.Context, vm_id: str, notice: int, rebalance: bool) -> None:
    """Preempt VM_ID now (fault injection; local driver only).

    With --notice, the VM gets a preemption notice now and is preempted when it ends."""
    if rebalance:
        call(client_of(ctx).rebalance, vm_id)
        console.print(f"recommended a rebalance of {vm_id}")
        return
    call(client_of(ctx).preempt, vm_id, notice)
    console.print(f"preempted {vm_id}" + (f" after a {notice} s notice" if notice else ""))


@click.command("report")
@click.option("--bag", "bag_id", help="Report on this bag.")
@click.option("--account", help="Report on this account (all its bags).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv", "html"]),
    default="table",
    show_default=True,
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write to this file.")
@click.pass_context
def report(
    ctx: click.Context, bag_id: str | None, account: str | None, fmt: str, output: str | None
) -> None:
    """Where the money went: VM-hours, cost, on-demand cost, savings, idle and spare time,
    preemptions, hours lost and spent checkpointing, per VM type (and per bag).

    The HTML report is one self-contained file with charts."""
    if (bag_id is None) == (account is None):
        raise click.UsageError("give one of --bag or --account")
    client = client_of(ctx)
    if fmt == "table":
        data = call(client.report, bag_id, account, "json")
        for table in report_tables(data):
            console.print(table)
        return
    if fmt == "json":
        text = json.dumps(call(client.report, bag_id, account, "json"), indent=2) + "\n"
    else:
        text = call(client.report, bag_id, account, fmt)[0].decode()
    if output:
        Path(output).write_text(text)
        err_console.print(f"report written to {output}", highlight=False)
    else:
        sys.stdout.write(text)
