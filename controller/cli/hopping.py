"""`spotbag index` and `spotbag simulate-hopping`: the cloud index of a spot price trace
and spot hopping replayed on it (controller/tools/hopping_report.py), as tables or JSON."""

from __future__ import annotations

import json
import sys

import click

from controller.tools.checkpoint_plan import PlanError
from controller.tools.hopping_report import (
    COMPOSITIONS,
    SizeSourceError,
    compositions,
    parse_job,
    replay_row,
    replay_trace,
    seconds,
    size_table,
    summarize_index,
)
from controller.traces.price_trace import read_trace
from controller.traces.trace_io import TraceError
from controller.traces.vm_size import VmSize
from policies.index import Policy


def sizes_for(types_path: str | None, config_path: str | None) -> dict[str, VmSize]:
    """`size_table`, its problems told as a bad --types or --config."""
    try:
        return size_table(types_path, config_path)
    except SizeSourceError as exc:
        raise click.BadParameter(exc.message, param_hint=exc.option) from None


def size_options(command):
    """--types FILE and --config FILE: where sizes of types the bundled table lacks come from."""
    command = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="A spotbag config whose [[vm_types]] give sizes (by name or instance_type) "
        "of the trace's types.",
    )(command)
    return click.option(
        "--types",
        "types_path",
        metavar="FILE",
        help="VM sizes for types the bundled EC2/GCE table lacks or to override it: CSV "
        "(header name,vcpus,memory_gb) or JSON ([{name, vcpus, memory_gb}, ...]).",
    )(command)


@click.command("index")
@click.argument("trace_path", metavar="TRACE", type=click.Path(dir_okay=False))
@click.option(
    "--by",
    type=click.Choice(COMPOSITIONS),
    default="zone",
    show_default=True,
    help="What an index is taken over: the VMs of a zone, a region, or an instance family.",
)
@click.option("--step", default="5m", show_default=True, help="Grid the trace is put on.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG chart.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@size_options
def index_command(
    trace_path: str,
    by: str,
    step: str,
    plot_path: str | None,
    as_json: bool,
    types_path: str | None,
    config_path: str | None,
):
    """The cloud index of a spot price TRACE (CSV: region,az,instance_type,product,
    timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr) and how much less volatile it
    is than the prices it averages. Types are sized by --types, --config or the bundled
    table of every EC2 type and the common GCE types."""
    sizes = sizes_for(types_path, config_path)
    try:
        trace = read_trace(trace_path)
        times, series, normalized, summaries = summarize_index(
            trace, by, seconds(step, "--step"), sizes
        )
    except (TraceError, PlanError) as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path:
        from controller.tools.plots import plot_index

        plot_index(plot_path, times, series, normalized, trace.vms, compositions(trace, by), by)
    if as_json:
        json.dump(
            [s.__dict__ | {"calmer_by": s.calmer_by} for s in summaries], sys.stdout, indent=1
        )
        print()
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Index by {by} of {trace_path} (volatility: std / mean)")
    for column in (
        "index",
        "VMs",
        "mean $/h/√(vCPU·GB)",
        "index vol.",
        "members' vol.",
        "max member vol.",
        "calmer ×",
        "capped",
    ):
        table.add_column(column, justify="right" if column != "index" else "left")
    for s in summaries:
        table.add_row(
            s.composition,
            str(len(s.members)),
            f"{s.index_mean:.5f}",
            f"{s.index_cv:.3f}",
            f"{s.members_cv_mean:.3f}",
            f"{s.members_cv_max:.3f}",
            f"{s.calmer_by:.1f}",
            f"{s.capped_share:.2%}",
        )
    Console(width=200).print(table)


@click.command("simulate-hopping")
@click.argument("trace_path", metavar="TRACE", type=click.Path(dir_okay=False))
@click.option(
    "--policy",
    "policy_names",
    multiple=True,
    default=("all",),
    show_default=True,
    type=click.Choice([p.value for p in Policy] + ["all"]),
    help="Policy to replay (repeatable; all: the four).",
)
@click.option(
    "--job",
    required=True,
    help="CPUS:GB (runs to the end of the trace) or phases CPUS:GB:DURATION,... e.g. 4:16:30m,2:8:30m",
)
@click.option("--step", default="5m", show_default=True, help="Grid the trace is put on.")
@click.option("--window", default="1d", show_default=True, help="Window of the price statistics.")
@click.option("--decide-every", default="5m", show_default=True, help="Decision interval.")
@click.option("--migration", default="30s", show_default=True, help="Downtime of one migration.")
@click.option("--revocation", default="90s", show_default=True, help="Downtime of one revocation.")
@click.option("--bid-factor", default=1.0, show_default=True, help="Bid = this × on-demand price.")
@click.option(
    "--only-types", "only_types", default="", help="Only these instance types (comma-separated)."
)
@click.option("--zones", default="", help="Only these zones (comma-separated).")
@click.option("--literal-trigger", is_flag=True, help="Use the paper's printed eq. 5 to migrate.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@size_options
def simulate_hopping_command(
    trace_path,
    policy_names,
    job,
    step,
    window,
    decide_every,
    migration,
    revocation,
    bid_factor,
    only_types,
    zones,
    literal_trigger,
    as_json,
    types_path,
    config_path,
):
    """Replay a spot price TRACE with a job under hopping policies: cost (and cost
    normalised to the cheapest fitting on-demand VM), availability, migrations and
    revocations. Types are sized by --types, --config or the bundled table of every
    EC2 type and the common GCE types."""
    policies = list(Policy) if "all" in policy_names else [Policy(p) for p in policy_names]
    sizes = sizes_for(types_path, config_path)
    try:
        phases = parse_job(job)
        trace = read_trace(trace_path)
        trace = trace.select(
            [t for t in only_types.split(",") if t] or None,
            [z for z in zones.split(",") if z] or None,
        )
        results = replay_trace(
            trace,
            policies,
            phases,
            step_s=seconds(step, "--step"),
            window_s=seconds(window, "--window"),
            decide_every_s=seconds(decide_every, "--decide-every"),
            migration_s=seconds(migration, "--migration"),
            revocation_s=seconds(revocation, "--revocation"),
            bid_factor=bid_factor,
            literal_trigger=literal_trigger,
            sizes=sizes,
        )
    except (TraceError, PlanError) as exc:
        raise click.ClickException(str(exc)) from None
    rows = [replay_row(r) for r in results]
    if as_json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Hopping on {trace_path}, job {job}")
    for column in (
        "policy",
        "cost $",
        "vs on-demand",
        "availability",
        "migrations",
        "revocations",
        "waiting h",
        "work h",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(
            row["policy"],
            f"{row['cost_usd']:.2f}",
            f"{row['normalized_cost']:.3f}",
            f"{row['availability']:.5f}",
            str(row["migrations"]),
            str(row["revocations"]),
            f"{row['waiting_h']:.2f}",
            f"{row['work_h']:.1f}",
        )
    Console(width=200).print(table)
