"""The `spotbag` command.

`serve` runs the daemon; `simulate` runs a bag on a virtual clock; `config`
prints or checks configuration; every other command talks to a daemon over
HTTP (--url / SPOTBAG_URL, --token / SPOTBAG_TOKEN, or the api.url and token
files of --state-dir / SPOTBAG_STATE_DIR on this host).

Exit codes: 0 success; 1 the daemon could not be reached or an internal error;
2 the request or its input file was refused (bad input, not found, ...); 3 `watch`/`submit
--watch` saw the bag end with failed or cancelled jobs; 78 `serve` was given a
configuration it cannot use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controller.cli.client import Client, ClientError
from controller.config import ConfigError, load_config, render_defaults
from controller.summary import render_summary

# Piped output (files, CI logs) gets wide lines rather than truncated tables.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)

EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2
EXIT_BAG_FAILED = 3
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG
TERMINAL_BAG_STATES = ("succeeded", "failed", "cancelled")


def _fail(error: ClientError) -> None:
    err_console.print(f"[red]error:[/red] {error.message}", highlight=False)
    for problem in (error.detail or {}).get("errors", [])[1:]:
        err_console.print(f"       {problem['field']}: {problem['message']}", highlight=False)
    sys.exit(EXIT_UNREACHABLE if error.status in (0, 500) else EXIT_REFUSED)


def _client(ctx: click.Context) -> Client:
    return ctx.obj["client"]


def _call(fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        _fail(exc)


def load_spec_file(path: str) -> Any:
    """A bag spec from a YAML or JSON file ('-' reads standard input); exit 2 when unusable."""
    from controller.specfile import SpecFileError
    from controller.specfile import load_spec_file as load

    try:
        return load(path, sys.stdin.read() if path == "-" else None)
    except SpecFileError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(EXIT_REFUSED)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="SPOTBAG_URL",
    help="Daemon URL (default: STATE_DIR/api.url, else http://127.0.0.1:8787).",
)
@click.option("--token", envvar="SPOTBAG_TOKEN", help="Bearer token (default: STATE_DIR/token).")
@click.option(
    "--state-dir",
    envvar="SPOTBAG_STATE_DIR",
    type=click.Path(file_okay=False),
    help="State directory of the daemon (where api.url and token are found).",
)
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None, state_dir: str | None) -> None:
    """spotbag: run bags of jobs on preemptible (spot) VMs."""
    ctx.ensure_object(dict)
    ctx.obj["state_dir"] = state_dir
    ctx.obj["client"] = Client.discover(url, token, state_dir)


# --- the daemon -----------------------------------------------------------------------


@cli.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SPOTBAG_CONFIG",
    help="TOML configuration file (default: built-in defaults).",
)
@click.option("--host", help="Override api.host.")
@click.option("--port", type=int, help="Override api.port (0: any free port).")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def serve(
    ctx: click.Context, config_path: str | None, host: str | None, port: int | None, log_level: str
) -> None:
    """Run the controller daemon (stops cleanly on SIGTERM / Ctrl-C)."""
    from controller.daemon import StateDirBusy, TaskDied
    from controller.daemon import serve as serve_forever

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        config = load_config(
            config_path, state_dir=ctx.obj["state_dir"], **{"api.host": host, "api.port": port}
        )
    except ConfigError as exc:
        # EX_CONFIG: a supervisor should not restart what only an edit can fix.
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(EXIT_CONFIG)
    try:
        asyncio.run(serve_forever(config))
    except StateDirBusy as exc:
        raise click.ClickException(str(exc)) from None
    except TaskDied as exc:
        # Non-zero: systemd (Restart=on-failure) starts a fresh daemon.
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(1)
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None


# --- bags ---------------------------------------------------------------------------------


@cli.command()
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
    bag = _call(_client(ctx).submit, spec, idempotency_key)
    if quiet:
        click.echo(bag["id"])
    else:
        console.print(
            f"submitted bag [bold]{bag['id']}[/bold] ({bag['job_count']:,} jobs)", highlight=False
        )
    if watch_after:
        ctx.invoke(watch, bag_id=bag["id"])


def _table(*columns: str, keep: int = 1) -> Table:
    """A borderless table whose first `keep` columns (ids) never wrap or shrink."""
    table = Table(box=None)
    for i, name in enumerate(columns):
        table.add_column(name, no_wrap=i < keep, min_width=len(name) if i >= keep else None)
    return table


def _bag_table(bags: list[dict[str, Any]]) -> Table:
    table = _table(
        "bag",
        "name",
        "state",
        "done",
        "succeeded",
        "failed",
        "running",
        "queued",
        "interrupted",
        "spot cost",
    )
    for bag in bags:
        c = bag["counts"]
        table.add_row(
            bag["id"],
            bag["name"],
            bag["state"],
            f"{100 * bag['progress']:.0f}%",
            f"{c['succeeded']:,}",
            f"{c['failed']:,}",
            f"{c['running']:,}",
            f"{c['queued'] + c['held']:,}",
            f"{bag['usage']['interrupted_attempts']:,}",
            f"${bag['usage']['spot_cost_usd']:.4f}",
        )
    return table


@cli.command()
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
    client = _client(ctx)
    if bag_id is None:
        bags = _call(client.bags, state, limit)
        if as_json:
            click.echo(json.dumps(bags, indent=2))
        elif not bags:
            console.print("no bags")
        else:
            console.print(_bag_table(bags))
            if len(bags) == limit:
                console.print(f"(the {limit} most recent; --limit shows more)", highlight=False)
        return
    bag = _call(client.bag, bag_id)
    if as_json:
        click.echo(json.dumps(bag, indent=2))
    else:
        click.echo(render_summary(bag))


@cli.command()
@click.argument("bag_id")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between updates.")
@click.pass_context
def watch(ctx: click.Context, bag_id: str, interval: float) -> None:
    """Show a live progress bar until BAG_ID finishes, then its summary."""
    client = _client(ctx)
    bag = _call(client.bag, bag_id)
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
                bag = _call(client.bag, bag_id)
    except KeyboardInterrupt:
        err_console.print(f"stopped watching; the bag goes on (spotbag watch {bag_id})")
        sys.exit(130)
    vms = _call(client.vms, True)
    click.echo(render_summary(bag, vms["usage"]))
    if bag["state"] != "succeeded":
        sys.exit(EXIT_BAG_FAILED)


@cli.command()
@click.argument("bag_id")
@click.pass_context
def cancel(ctx: click.Context, bag_id: str) -> None:
    """Cancel BAG_ID: queued jobs are cancelled and running ones stopped."""
    bag = _call(_client(ctx).cancel, bag_id)
    console.print(
        f"cancelling bag {bag['id']}: {bag['counts']['running']} running jobs are being stopped",
        highlight=False,
    )


# --- jobs -----------------------------------------------------------------------------------


@cli.command()
@click.argument("bag_id")
@click.option("--state", help="Only jobs in this state (queued, running, succeeded, failed, ...).")
@click.option("--limit", default=50, show_default=True, help="At most this many jobs (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def jobs(ctx: click.Context, bag_id: str, state: str | None, limit: int, as_json: bool) -> None:
    """List the jobs of BAG_ID."""
    client = _client(ctx)
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page_size = 1000 if limit == 0 else min(1000, limit - len(rows))
        page = _call(client.jobs, bag_id, state, after, page_size)
        rows += page["jobs"]
        after = page["next_after"]
        if after is None or (limit and len(rows) >= limit):
            break
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = _table("job", "state", "attempts", "exit", "runtime", "params", "reason")
    for job in rows:
        runtime = f"{job['runtime_s']:.1f} s" if job["runtime_s"] is not None else ""
        exit_code = "" if job["exit_code"] is None else str(job["exit_code"])
        table.add_row(
            job["id"],
            job["state"],
            str(job["attempts"]),
            exit_code,
            runtime,
            json.dumps(job["params"], ensure_ascii=False),
            job["reason"],
        )
    console.print(table)


@cli.command()
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
    client = _client(ctx)
    if not follow:
        data, _ = _call(client.log, job_id, attempt, 0)
        sys.stdout.buffer.write(data)
        return
    shown, offset, said_waiting = None, 0, False
    while True:
        job = _call(client.job, job_id)
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
        data, headers = _call(client.log, job_id, number, offset)
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


@cli.command()
@click.option("--all", "include_ended", is_flag=True, help="Include VMs that have ended.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def vms(ctx: click.Context, include_ended: bool, as_json: bool) -> None:
    """List VMs and the fleet's VM-hours and cost."""
    data = _call(_client(ctx).vms, include_ended)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = _table("vm", "type", "state", "jobs", "launched", "hours", "cost $", "reason", keep=2)
    for vm in data["vms"]:
        launched = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(vm["requested_at"]))
        table.add_row(
            vm["id"],
            vm["vm_type"],
            vm["state"] + (" (terminating)" if vm["terminating"] else ""),
            f"Slurm node {vm['pool_node']}" if vm.get("pool_node") else str(vm["jobs"]),
            launched,
            f"{vm['billed_hours']:.3f}",
            f"{vm['cost_usd']:.4f}",
            vm["reason"],
        )
    console.print(table)
    total = data["usage"]["total"]
    console.print(
        f"all VMs so far: {total['vms']}, {total['vms_preempted']} preempted, {total['vm_hours']:.3f} VM-hours: "
        f"spot ${total['spot_cost_usd']:.4f} vs on-demand ${total['on_demand_cost_usd']:.4f}",
        highlight=False,
    )


@cli.command()
@click.option("--limit", default=20, show_default=True, help="Migrations to list.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON answer.")
@click.pass_context
def hopping(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Spot hopping: the live market per VM type and the latest migrations."""
    data = _call(_client(ctx).hopping, limit)
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
    for column in ("VM type", "now $/h", "mean $/h", "std $/h", "on-demand $/h"):
        table.add_column(column, justify="left" if column == "VM type" else "right")
    fmt = "{:.4f}"
    for row in data["market"]:
        table.add_row(
            row["vm_type"],
            *(
                "–" if row[k] is None else fmt.format(row[k])
                for k in ("price_now", "price_mean", "price_std", "on_demand")
            ),
        )
    console.print(table)
    moves = Table(title="migrations (newest first)")
    for column in ("when", "VM", "from", "to", "$/h", "reason"):
        moves.add_column(column)
    for move in data["migrations"]:
        moves.add_row(
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(move["at"])),
            move["vm_id"],
            move["from_type"],
            move["to_type"],
            f"{move['price_from']:.4f} -> {move['price_to']:.4f}",
            move["reason"],
        )
    console.print(moves)


@cli.command()
@click.argument("vm_id")
@click.pass_context
def preempt(ctx: click.Context, vm_id: str) -> None:
    """Preempt VM_ID now (fault injection; local driver only)."""
    _call(_client(ctx).preempt, vm_id)
    console.print(f"preempted {vm_id}")


# --- offline commands ---------------------------------------------------------------------


@cli.command()
@click.argument("spec_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML configuration (VM types, max_vms, preemption model, [simulation]).",
)
@click.option(
    "--seed", type=int, help="Random seed (default: simulation.seed); same seed, same run."
)
@click.option(
    "--keep",
    "keep_dir",
    type=click.Path(file_okay=False),
    help="Keep the simulated database in this directory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the bag and fleet views as JSON.")
def simulate(
    spec_file: str, config_path: str | None, seed: int | None, keep_dir: str | None, as_json: bool
) -> None:
    """Run SPEC_FILE on a virtual clock with the real scheduler and print the summary."""
    from controller.errors import ApiError
    from controller.simulation import SimulationStalled
    from controller.simulation import simulate as run_simulation

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    spec = load_spec_file(spec_file)
    try:
        result = asyncio.run(
            run_simulation(spec, config, seed=seed, state_dir=Path(keep_dir) if keep_dir else None)
        )
    except ApiError as exc:
        _fail(ClientError(exc.status, exc.code, exc.message, exc.detail))
    except SimulationStalled as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "bag": result.bag,
                    "fleet": result.fleet,
                    "ticks": result.ticks,
                    "wall_s": result.wall_s,
                },
                indent=2,
            )
        )
        return
    click.echo(render_summary(result.bag, result.fleet))
    click.echo(
        f"  simulated   {result.ticks:,} scheduler passes in {result.wall_s:.2f} s of real time"
    )


@cli.command("fit")
@click.argument("lifetimes_csv", type=click.Path(dir_okay=False))
@click.option(
    "--by",
    default="",
    help="Group by these columns (comma-separated): machine_type, zone, "
    "region, time_of_day, day. Default: all lifetimes together.",
)
@click.option(
    "--method",
    type=click.Choice(["mle", "lsq"]),
    default="mle",
    show_default=True,
    help="mle: censoring-aware maximum likelihood; lsq: the paper's least squares on the "
    "ECDF of preempted VMs only.",
)
@click.option(
    "--deadline-h", default=24.0, show_default=True, help="The provider's maximum VM life L."
)
@click.option(
    "--classic-deadline",
    is_flag=True,
    help="Give exponential, Weibull and Gompertz-Makeham the deadline point mass too "
    "(by default they are fitted as published, without one).",
)
@click.option(
    "--min-samples", default=30, show_default=True, help="Skip groups with fewer lifetimes."
)
@click.option(
    "--provider", default="gce", show_default=True, help="Provider the lifetimes come from."
)
@click.option("--json", "as_json", is_flag=True, help="Print the fits as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    help="Save the empirical and fitted CDFs and the hazards to this PNG.",
)
@click.option(
    "--registry",
    "registry_path",
    type=click.Path(dir_okay=False),
    help="Also write a model registry (bathtub fits for every key with enough lifetimes).",
)
def fit_command(
    lifetimes_csv: str,
    by: str,
    method: str,
    deadline_h: float,
    classic_deadline: bool,
    min_samples: int,
    provider: str,
    as_json: bool,
    plot_path: str | None,
    registry_path: str | None,
) -> None:
    """Fit the bathtub, exponential, Weibull and Gompertz-Makeham models to VM lifetimes."""
    from controller.tools.lifetime_data import (
        GROUP_COLUMNS,
        LifetimeDataError,
        group_value,
        read_lifetimes,
    )
    from controller.tools.model_fits import fit_groups, write_registry

    columns = [c.strip() for c in by.split(",") if c.strip()]
    for column in columns:
        if column not in GROUP_COLUMNS:
            raise click.BadParameter(
                f"{column!r}; choose from {', '.join(GROUP_COLUMNS)}", param_hint="--by"
            )
    try:
        observations = read_lifetimes(lifetimes_csv, provider)
    except LifetimeDataError as exc:
        raise click.ClickException(str(exc)) from None
    groups, skipped = fit_groups(
        observations,
        columns,
        group_value,
        method=method,
        L=deadline_h,
        classic_deadline=classic_deadline,
        min_samples=min_samples,
    )
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "group": g.labels,
                        "n": g.n,
                        "fits": {k: r.summary() for k, r in g.fits.items()},
                    }
                    for g in groups
                ],
                indent=2,
            )
        )
    else:
        _print_fit_table(groups, skipped, method, classic_deadline)
    if plot_path:
        from controller.tools.plots import plot_fits

        shown = groups[:8]
        plot_fits([(g.title, g.kaplan_meier, g.fits) for g in shown], plot_path, deadline_h)
        err_console.print(f"plot of {len(shown)} group(s) written to {plot_path}")
    if registry_path:
        count = write_registry(
            observations,
            registry_path,
            source_name=Path(lifetimes_csv).name,
            method=method,
            L=deadline_h,
            min_samples=min_samples,
            command=" ".join(["spotbag", *sys.argv[1:]]),
        )
        err_console.print(f"registry of {count} model(s) written to {registry_path}")


def _print_fit_table(groups, skipped: list[str], method: str, classic_deadline: bool) -> None:
    deadline = "with" if classic_deadline else "without"
    console.print(
        f"fits by {method}; classic models {deadline} the deadline point mass; "
        "R² and KS against the Kaplan–Meier estimate",
        highlight=False,
    )
    table = _table(
        "group", "model", "n", "censored", "parameters", "R²", "KS", "log L", "AIC", "mean life h"
    )
    for group in groups:
        ranked = sorted(group.fits.items(), key=lambda item: item[1].aic)
        for rank, (name, result) in enumerate(ranked):
            params = ", ".join(f"{k}={v:.3g}" for k, v in result.model.parameters.items())
            table.add_row(
                group.title if rank == 0 else "",
                name + (" *" if rank == 0 else ""),
                str(result.n),
                str(result.censored),
                params,
                f"{result.r2:.3f}",
                f"{result.ks:.3f}",
                f"{result.log_likelihood:.1f}",
                f"{result.aic:.1f}",
                f"{result.model.expected_lifetime_h():.2f}",
            )
    console.print(table)
    console.print("* lowest AIC in its group", highlight=False)
    if skipped:
        console.print(f"skipped (too few lifetimes): {', '.join(skipped)}", highlight=False)


@cli.command("checkpoint-plan")
@click.option(
    "--model",
    "model_key",
    required=True,
    help="Preemption model key, e.g. gce/n1-highcpu-16 (the shipped registry, or --registry).",
)
@click.option("--work", required=True, help="The job's work: 5h, 90m, 1h30m, ...")
@click.option("--delta", default="1m", show_default=True, help="Time to write one checkpoint.")
@click.option("--age", default="0h", show_default=True, help="Age of the VM the job starts on.")
@click.option("--restart", default="0m", show_default=True, help="Time to get a fresh VM.")
@click.option("--step", default="1m", show_default=True, help="Grid of the optimal schedule.")
@click.option(
    "--compare",
    multiple=True,
    help="Also evaluate: young-daly, none (no checkpoints) or periodic:<duration>; repeatable.",
)
@click.option("--mttf", help="MTTF for young-daly (default: the model's mean lifetime).")
@click.option("--registry", "registry_path", default="", help="A model registry JSON file.")
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    help="Save the checkpoint times over the hazard rate to this PNG.",
)
@click.pass_context
def checkpoint_plan_command(
    ctx: click.Context,
    model_key: str,
    work: str,
    delta: str,
    age: str,
    restart: str,
    step: str,
    compare: tuple[str, ...],
    mttf: str | None,
    registry_path: str,
    as_json: bool,
    plot_path: str | None,
) -> None:
    """When a job should checkpoint (the optimal schedule of SPEC.md §4), and the
    expected overhead of each policy, under a VM type's preemption model."""
    from controller.tools import checkpoint_plan as cp
    from controller.checkpoint_tables import TableCache

    try:
        model, found_key = cp.resolve_model(model_key, registry_path)
        request = cp.PlanRequest(
            model=model,
            model_key=found_key,
            work_h=cp.parse_duration_h(work, "--work"),
            delta_h=cp.parse_duration_h(delta, "--delta"),
            start_age_h=cp.parse_duration_h(age, "--age"),
            restart_h=cp.parse_duration_h(restart, "--restart"),
            step_h=cp.parse_duration_h(step, "--step"),
            compare=compare,
            mttf_h=cp.parse_duration_h(mttf, "--mttf") if mttf else None,
        )
        cp.validate(request)
    except (cp.PlanError, OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    state_dir = ctx.obj.get("state_dir")
    tables = TableCache(
        Path(state_dir) / "checkpoint-tables" if state_dir else None,
        step_h=request.step_h,
        restart_h=request.restart_h,
        max_work_h=max(24.0, request.work_h),
        inline=True,
    )
    schedules = cp.plan(request, tables)
    if as_json:
        click.echo(json.dumps(cp.as_dict(request, schedules), indent=2))
    else:
        click.echo(cp.render(request, schedules))
    sys.stdout.flush()
    if plot_path:
        cp.write_plot(request, schedules, plot_path)
        err_console.print(f"plot written to {plot_path}")


@cli.group()
def accounts() -> None:
    """CPU-hour accounts: create, credit, balances and ledger (SPEC.md §6)."""


def _balance_row(table: Table, view: dict[str, Any]) -> None:
    def hours(value: float | None) -> str:
        return "unlimited" if value is None else f"{value:,.2f}"

    table.add_row(
        view["account"],
        hours(view["allocation_cpu_h"]),
        f"{view['charged_cpu_h']:,.2f}",
        f"{view['reserved_cpu_h']:,.2f}",
        hours(view["available_cpu_h"]),
        str(view["held_jobs"]),
    )


def _balance_table() -> Table:
    return _table("account", "allocation", "charged", "reserved", "available", "held jobs")


@accounts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def accounts_list(ctx: click.Context, as_json: bool) -> None:
    """Every account's balance in CPU-hours."""
    data = _call(_client(ctx).accounts)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = _balance_table()
    for view in data["accounts"]:
        _balance_row(table, view)
    console.print(table)


@accounts.command("create")
@click.argument("name")
@click.option("--cpu-hours", type=float, default=0.0, show_default=True, help="First credit.")
@click.option("--unlimited", is_flag=True, help="No limit (usage is still recorded).")
@click.option("--note", default="", help="Why (kept in the ledger).")
@click.pass_context
def accounts_create(
    ctx: click.Context, name: str, cpu_hours: float, unlimited: bool, note: str
) -> None:
    """Create an account with an allocation of CPU-hours."""
    view = _call(_client(ctx).create_account, name, cpu_hours, unlimited, note)
    table = _balance_table()
    _balance_row(table, view)
    console.print(table)


@accounts.command("credit")
@click.argument("name")
@click.argument("cpu_hours", type=float)
@click.option("--note", default="", help="Why (kept in the ledger).")
@click.pass_context
def accounts_credit(ctx: click.Context, name: str, cpu_hours: float, note: str) -> None:
    """Add CPU-hours to an account (held jobs may then run)."""
    view = _call(_client(ctx).credit, name, cpu_hours, note)
    table = _balance_table()
    _balance_row(table, view)
    console.print(table)


@accounts.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.pass_context
def accounts_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One account's balance: allocation = charged + reserved + available."""
    view = _call(_client(ctx).account, name)
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
    client = _client(ctx)
    if as_csv:
        after, first = 0, True
        while True:
            body, headers = _call(client.ledger, name, after, 10_000, True)
            lines = body.decode().splitlines(keepends=True)
            sys.stdout.write("".join(lines if first else lines[1:]))
            first = False
            following = headers.get("X-Spotbag-Next-After")
            if not following:
                return
            after = int(following)
    data = _call(client.ledger, name, 0, limit)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = _table("id", "when", "kind", "CPU-hours", "reservation", "note", keep=3)
    for e in data["entries"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        table.add_row(str(e["id"]), when, e["kind"], f"{e['cpu_h']:,.4f}", e["key"], e["note"])
    console.print(table)


@cli.command("report")
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
    client = _client(ctx)
    if fmt == "table":
        from controller.report_render import tables

        data = _call(client.report, bag_id, account, "json")
        for table in tables(data):
            console.print(table)
        return
    if fmt == "json":
        text = json.dumps(_call(client.report, bag_id, account, "json"), indent=2) + "\n"
    else:
        text = _call(client.report, bag_id, account, fmt)[0].decode()
    if output:
        Path(output).write_text(text)
        err_console.print(f"report written to {output}", highlight=False)
    else:
        sys.stdout.write(text)


@accounts.group("token")
def accounts_token() -> None:
    """Tokens that can only see and spend one account (issued by the admin)."""


@accounts_token.command("create")
@click.argument("account")
@click.option("--note", default="", help="Who or what it is for.")
@click.pass_context
def token_create(ctx: click.Context, account: str, note: str) -> None:
    """Issue a token for ACCOUNT; it is printed once, keep it (SPOTBAG_TOKEN=...)."""
    view = _call(_client(ctx).create_token, account, note)
    err_console.print(
        f"token {view['id']} for account {account!r}; it is not shown again:", highlight=False
    )
    click.echo(view["token"])


@accounts_token.command("list")
@click.argument("account")
@click.pass_context
def token_list(ctx: click.Context, account: str) -> None:
    """ACCOUNT's tokens (never their secrets)."""
    table = _table("id", "created", "revoked", "note", keep=1)
    for t in _call(_client(ctx).tokens, account)["tokens"]:
        table.add_row(t["id"], _when(t["created_at"]), _when(t["revoked_at"]), t["note"])
    console.print(table)


@accounts_token.command("revoke")
@click.argument("account")
@click.argument("token_id")
@click.pass_context
def token_revoke(ctx: click.Context, account: str, token_id: str) -> None:
    """Revoke one of ACCOUNT's tokens; it stops working at once."""
    _call(_client(ctx).revoke_token, account, token_id)
    console.print(f"token {token_id} of account {account!r} revoked", highlight=False)


def _when(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@cli.group()
def config() -> None:
    """Show or check configuration."""


@config.command("defaults")
def config_defaults() -> None:
    """Print every setting with its default and documentation (TOML)."""
    click.echo(render_defaults(), nl=False)


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Validate a configuration file; with executor slurm, also check that Slurm is
    reachable and set up for spotbag (partitions, hooks, configless)."""
    try:
        loaded = load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(
        f"{path}: ok ({len(loaded.vm_types)} VM types, driver {loaded.driver.name}, "
        f"executor {loaded.executor.name})",
        highlight=False,
    )
    if loaded.executor.name == "slurm":
        from controller.slurm.setup import check_slurm, report_checks

        click.echo("Slurm:")
        if not report_checks(asyncio.run(check_slurm(loaded))):
            raise click.ClickException("Slurm is not ready for spotbag (see above)")


# Commands that live in their own modules (they need no daemon).
def _register_offline_commands() -> None:
    from controller.tools.hopping_report import index_command, simulate_hopping_command
    from controller.tools.prepaid_report import prepaid_command
    from controller.slurm.setup import slurm_group
    from controller.tools.split_cost import split_cost_command

    cli.add_command(slurm_group)
    cli.add_command(split_cost_command)
    cli.add_command(prepaid_command)
    cli.add_command(index_command)
    cli.add_command(simulate_hopping_command)


_register_offline_commands()


def main() -> None:
    cli(obj={})


if __name__ == "__main__":
    main()
