"""Offline commands that need no daemon: `simulate` (a bag on a virtual clock with the
real scheduler), `fit` (preemption models from VM lifetimes), `checkpoint-plan` and
`split-cost`. What they compute is controller.simulation and controller/tools/."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controller.cli.client import ClientError
from controller.cli.common import (
    EXIT_REFUSED,
    console,
    err_console,
    fail,
    load_spec_file,
)
from controller.cli.render import render_summary, table_of
from controller.tools.split_cost import (
    FIELDS,
    INPUT_FORMAT,
    InputError,
    SplitCostInput,
    as_dict,
    compute,
    load_input,
)
from policies.allocation import RESOURCES, CostSplit


@click.command()
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
@click.option(
    "--price-trace",
    type=click.Path(dir_okay=False),
    help="Spot prices follow this trace (simulation.price_trace): spot VMs launch at or below "
    "the on-demand price, are preempted above it, and pay the trace's price.",
)
@click.option(
    "--trace-series", help="The trace's series to follow, TYPE/ZONE (simulation.trace_series)."
)
@click.option(
    "--trace-start",
    help="Trace time the run starts at, ISO 8601 or epoch seconds (simulation.trace_start).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the bag and fleet views as JSON.")
def simulate(
    spec_file: str,
    config_path: str | None,
    seed: int | None,
    keep_dir: str | None,
    price_trace: str | None,
    trace_series: str | None,
    trace_start: str | None,
    as_json: bool,
) -> None:
    """Run SPEC_FILE on a virtual clock with the real scheduler and print the summary."""
    # The spec first: a file that cannot be a bag is refused before the scheduler's
    # half second of imports.
    spec = load_spec_file(spec_file)
    # Imported here: the other commands of this module need neither the configuration
    # (pydantic) nor asyncio, and `spotbag fit` is timed with its imports.
    import asyncio

    from controller.config import ConfigError, load_config
    from controller.errors import ApiError
    from controller.simulation import SimulationSetupError, SimulationStalled
    from controller.simulation import simulate as run_simulation

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    market = {
        name: value
        for name, value in (
            ("price_trace", price_trace),
            ("trace_series", trace_series),
            ("trace_start", trace_start),
        )
        if value is not None
    }
    if market:
        config = config.model_copy(
            update={"simulation": config.simulation.model_copy(update=market)}
        )
    try:
        result = asyncio.run(
            run_simulation(spec, config, seed=seed, state_dir=Path(keep_dir) if keep_dir else None)
        )
    except ApiError as exc:
        fail(ClientError(exc.status, exc.code, exc.message, exc.detail))
    except (SimulationStalled, SimulationSetupError) as exc:
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


@click.command("fit")
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
    table = table_of(
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


@click.command("checkpoint-plan")
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
@click.option(
    "--notice",
    help="Plan for preemption notices this long ahead (GCE ~30s, EC2 2m): a job signalled "
    "at the notice saves its work, so fewer checkpoints are needed.",
)
@click.option(
    "--notice-share",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="The share of preemptions that come with a notice.",
)
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
    notice: str | None,
    notice_share: float,
    registry_path: str,
    as_json: bool,
    plot_path: str | None,
) -> None:
    """When a job should checkpoint (the optimal schedule of docs/design.md#checkpoints), and the
    expected overhead of each policy, under a VM type's preemption model."""
    from controller.preemption.checkpoint_tables import TableCache
    from controller.tools import checkpoint_plan as cp

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
            notices=cp.Notices(cp.parse_duration_h(notice, "--notice"), notice_share)
            if notice
            else None,
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


# The table's headings and units of the resources, in FIELDS order.
UNITS = (("vCPU", "vCPUs"), ("GB", "GB memory"), ("GPU", "GPUs"))
LABELS = ("vCPUs", "memory GB", "GPUs")


def render_split(request: SplitCostInput, result: CostSplit, console: Console) -> None:
    """The report as a table: one row per job, unallocated (idle), and the total."""
    capacity = request.capacity
    present = [r for r in range(len(FIELDS)) if capacity[r] > 0]
    has = ", ".join(f"{_amount(capacity[r])} {_plural(r, capacity[r])}" for r in present)
    weights = ", ".join(f"{name} {_amount(getattr(request.weights, name))}" for name in RESOURCES)
    console.print(
        f"VM: {has}; ${request.cost_usd:.4f} over {_amount(request.hours)} h; weights {weights}",
        highlight=False,
    )
    prices = ", ".join(f"per {UNITS[r][0]} ${result.price[r]:.4f}" for r in present)
    console.print(
        f"unit cost ${float(result.unit_cost):.6f}; for the period {prices}", highlight=False
    )
    table = Table(box=None)
    table.add_column("job", no_wrap=True)
    for label in (*LABELS, "split $", "unused $", "total $", "share"):
        table.add_column(label, justify="right", min_width=len(label))
    cost = request.cost_usd
    job_costs = result.job_cost
    for j, job_id in enumerate(request.job_ids):
        table.add_row(
            escape(job_id),
            *(_amount(result.allocated[j, r]) for r in range(len(FIELDS))),
            f"{result.split[j]:.4f}",
            f"{result.unused_share[j]:.4f}",
            f"{job_costs[j]:.4f}",
            _percent(job_costs[j], cost),
        )
    unallocated = float(result.unallocated)
    if unallocated > 0 or not request.job_ids:
        table.add_row(
            "unallocated (idle)",
            *("" for _ in FIELDS),
            "",
            "",
            f"{unallocated:.4f}",
            _percent(unallocated, cost),
        )
    table.add_section()
    table.add_row(
        "total",
        *(
            f"{_amount(result.allocated[:, r].sum())}/{_amount(capacity[r])}"
            for r in range(len(FIELDS))
        ),
        f"{result.split.sum():.4f}",
        f"{result.unused_share.sum():.4f}",
        f"{math.fsum([*map(float, job_costs), unallocated]):.4f}",
        _percent(cost, cost),
    )
    console.print(table)
    notes = []
    for r, label in enumerate(LABELS):
        held = result.allocated[:, r].sum()
        if held > capacity[r] and capacity[r] > 0:
            notes.append(
                f"{label}: {_amount(held)} allocated of {_amount(capacity[r])}, no unused cost"
            )
        elif result.unused_cost[r] > 0:
            whom = "shared by utilisation" if held > 0 else "no job holds any: unallocated"
            notes.append(
                f"{label}: {100 * result.unused_ratio[r]:.1f}% unused, "
                f"${result.unused_cost[r]:.4f} ({whom})"
            )
    for note in notes:
        console.print(note, highlight=False)


@click.command("split-cost", epilog=INPUT_FORMAT)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
def split_cost_command(file: str, fmt: str, as_json: bool) -> None:
    """Split a VM's cost among the jobs that shared it (docs/design.md#cost-reports).

    Each resource has a weight; unit cost = VM cost / Σ weight × capacity; a
    job's allocation is max(reserved, used); it pays its share of each
    resource's cost (allocation / max(capacity, all allocations)), plus the
    cost of unused capacity in proportion to its allocation. The jobs' totals
    and the unallocated (idle) cost add up to the VM's cost."""
    try:
        request = load_input(file)
    except InputError as exc:
        err_console.print(
            f"[red]error:[/red] {escape(file)}: {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_REFUSED)
    result = compute(request)
    if as_json or fmt == "json":
        click.echo(json.dumps(as_dict(request, result), indent=2))
        return
    render_split(request, result, console)


def _amount(value: float) -> str:
    return f"{float(value):g}"


def _plural(r: int, amount: float) -> str:
    return UNITS[r][0] if amount == 1 and r != 1 else UNITS[r][1]


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"
