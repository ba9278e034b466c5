"""`spotbag index` and `spotbag simulate-hopping`: the cloud index of a spot price trace
and what each hopping policy would have cost (SPEC.md §5). The math is policies.index
and policies.hopping; this module reads the trace (controller.price_trace), sizes its
VM types (controller.vm_size: a --types file, a --config catalog, the bundled EC2 and
GCE table), runs them, and reports."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from controller.tools.checkpoint_plan import PlanError, parse_duration_h
from controller.config import ConfigError, load_config
from controller.price_trace import PriceTrace, TraceError, read_trace
from controller.vm_size import VmSize, bundled_sizes, catalog_sizes, read_sizes_file
from policies.hopping import Phase, Replay, replay, volatility
from policies.index import Policy, index_series, normalized_prices

COMPOSITIONS = ("zone", "region", "family")
_JOB_PART = re.compile(r"^\s*([0-9.]+)\s*:\s*([0-9.]+)\s*(?::\s*(\S+))?\s*$")


def family_of(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def region_of_zone(zone: str) -> str:
    return zone[:-1] if zone and zone[-1].isalpha() and zone[-2:-1].isdigit() else zone


def compositions(trace: PriceTrace, by: str) -> dict[str, np.ndarray]:
    """Composition name -> member mask over the trace's VMs."""
    keys = []
    for vm_type, zone in trace.vms:
        if by == "zone":
            keys.append(zone)
        elif by == "region":
            keys.append(region_of_zone(zone))
        else:
            keys.append(family_of(vm_type))
    return {key: np.array([k == key for k in keys]) for key in sorted(set(keys))}


@dataclass
class IndexSummary:
    composition: str
    members: list[str]
    index_mean: float  # USD per hour per sqrt(vCPU·GB)
    index_cv: float  # coefficient of variation of the index
    members_cv_mean: float  # mean coefficient of variation of the members' normalised prices
    members_cv_max: float
    capped_share: float  # fraction of member prices at the cap, left out of the index

    @property
    def calmer_by(self) -> float:
        return self.members_cv_mean / self.index_cv if self.index_cv > 0 else math.inf


def summarize_index(
    trace: PriceTrace, by: str, step_s: float, sizes: dict[str, VmSize] | None = None
):
    """(times, {composition: index series}, normalised prices, [IndexSummary])."""
    fleet = trace.fleet(sizes)
    times, prices = trace.grid(step_s)
    normalized = normalized_prices(prices, fleet.cpus, fleet.memory_gb)
    series, summaries = {}, []
    for name, members in compositions(trace, by).items():
        index = index_series(prices, fleet.cpus, fleet.memory_gb, fleet.on_demand, members)
        series[name] = index
        cvs = [volatility(normalized[:, i]) for i in np.flatnonzero(members)]
        member_prices = prices[:, members]
        capped = member_prices >= 10 * fleet.on_demand[members] * (1 - 1e-9)
        summaries.append(
            IndexSummary(
                composition=name,
                members=[fleet.names[i] for i in np.flatnonzero(members)],
                index_mean=float(np.nanmean(index)),
                index_cv=volatility(index),
                members_cv_mean=float(np.mean(cvs)),
                members_cv_max=float(np.max(cvs)),
                capped_share=float(np.mean(capped[~np.isnan(member_prices)])),
            )
        )
    return times, series, normalized, summaries


def parse_job(text: str) -> list[Phase]:
    """'2:10' (2 vCPUs, 10 GB, until the trace ends) or phases '4:16:30m,2:8:30m'."""
    phases = []
    parts = text.split(",")
    for n, part in enumerate(parts):
        match = _JOB_PART.match(part)
        if not match:
            raise PlanError(
                f"--job: cannot read {part!r}; write CPUS:GB (runs to the end) or "
                "CPUS:GB:DURATION phases separated by commas, e.g. 4:16:30m,2:8:30m"
            )
        cpus, memory_gb = float(match.group(1)), float(match.group(2))
        if match.group(3):
            work_h = parse_duration_h(match.group(3), "--job duration")
        elif n == len(parts) - 1:
            work_h = math.inf
        else:
            raise PlanError(f"--job: phase {part!r} needs a duration (only the last may run on)")
        if cpus <= 0 or memory_gb <= 0 or work_h <= 0:
            raise PlanError(f"--job: phase {part!r}: cpus, GB and duration must be > 0")
        phases.append(Phase(work_h, cpus, memory_gb))
    return phases


def replay_trace(
    trace: PriceTrace,
    policies: Sequence[Policy],
    phases: Sequence[Phase],
    *,
    step_s: float,
    window_s: float,
    decide_every_s: float,
    migration_s: float,
    revocation_s: float,
    bid_factor: float = 1.0,
    literal_trigger: bool = False,
    sizes: dict[str, VmSize] | None = None,
) -> list[Replay]:
    fleet = trace.fleet(sizes, bid_factor=bid_factor)
    if np.isnan(fleet.on_demand).any():
        raise TraceError("the trace has no on-demand price for some VMs (ondemand_price_usd_hr)")
    # From the first moment every VM has a price: a policy choosing before then would
    # choose among the few VMs whose history happens to start first.
    _, prices = trace.grid(step_s, start_s=trace.common_start_s)
    return [
        replay(
            prices,
            step_s / 3600,
            fleet,
            phases,
            policy,
            window_steps=max(1, round(window_s / step_s)),
            decide_every=max(1, round(decide_every_s / step_s)),
            migration_h=migration_s / 3600,
            revocation_h=revocation_s / 3600,
            literal_trigger=literal_trigger,
        )
        for policy in policies
    ]


def _seconds(text: str, what: str) -> float:
    return parse_duration_h(text, what) * 3600


def size_table(types_path: str | None, config_path: str | None) -> dict[str, VmSize]:
    """The sizes a trace's types are looked up in: the --types file first, then the
    --config catalog, then the bundled EC2 and GCE table."""
    sizes = bundled_sizes()
    if config_path:
        try:
            sizes |= catalog_sizes(load_config(config_path).vm_types)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--config") from None
    if types_path:
        if not Path(types_path).is_file():
            raise click.BadParameter(
                f"{types_path}: no such file. --types takes a file of VM sizes (CSV or JSON: "
                "name, vcpus, memory_gb); to keep only some types of the trace, use --only-types",
                param_hint="--types",
            )
        try:
            sizes |= read_sizes_file(types_path)
        except TraceError as exc:
            raise click.BadParameter(str(exc), param_hint="--types") from None
    return sizes


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
    sizes = size_table(types_path, config_path)
    try:
        trace = read_trace(trace_path)
        times, series, normalized, summaries = summarize_index(
            trace, by, _seconds(step, "--step"), sizes
        )
    except (TraceError, PlanError) as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path:
        from controller.tools.plots import plot_index

        plot_index(plot_path, times, series, normalized, trace, by)
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
    sizes = size_table(types_path, config_path)
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
            step_s=_seconds(step, "--step"),
            window_s=_seconds(window, "--window"),
            decide_every_s=_seconds(decide_every, "--decide-every"),
            migration_s=_seconds(migration, "--migration"),
            revocation_s=_seconds(revocation, "--revocation"),
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


def replay_row(result: Replay) -> dict:
    return {
        "policy": result.policy,
        "cost_usd": result.cost_usd,
        "normalized_cost": result.normalized_cost,
        "availability": result.availability,
        "migrations": result.migrations,
        "revocations": result.revocations,
        "waiting_h": result.waiting_h,
        "work_h": result.work_h,
        "wall_h": result.wall_h,
        "finished": result.finished,
    }
