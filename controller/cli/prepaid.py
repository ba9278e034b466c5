"""`spotbag prepaid`: how many cores to prepay for a term (controller/tools/prepaid_report.py),
as tables, JSON and a plot."""

from __future__ import annotations

import json
import math
import sys

import click
from rich.table import Table

from controller.formatting import percent, usd
from controller.tools.prepaid_report import (
    DEFAULT_CURVE_POINTS,
    TERMS_Y,
    PrepaidError,
    PrepaidReport,
    analyse,
    as_dict,
    explanation,
    price_text,
    read_source,
    read_store,
    sample_indices,
    when_text,
    write_plot,
)


def render(report: PrepaidReport, console, points: int = DEFAULT_CURVE_POINTS) -> None:
    """Header, one summary row per core type, then each type's savings curve."""

    def table(*columns: str) -> Table:
        grid = Table(box=None)
        for i, name in enumerate(columns):
            grid.add_column(name, no_wrap=i == 0, justify="left" if i == 0 else "right")
        return grid

    intervals = report.intervals

    def say(text: str) -> None:
        console.print(text, highlight=False)

    say(f"{intervals.source}: {intervals.starts.size:,} intervals")
    for note in intervals.notes:
        say(f"  {note}")
    if intervals.starts.size:
        say(
            f"period {when_text(report, report.period_start)} .. {when_text(report, report.period_end)}: "
            f"{report.period_h:,.1f} h, the span of the history"
        )
    else:
        say("period: none (no intervals)")
    say(
        f"on-demand {usd(report.on_demand_price)} per core-hour; {price_text(report)}; "
        f"break-even utilisation {percent(report.break_even, 3)}"
    )
    say(
        "each prepaid core is paid for every hour of the span; the optimum is the largest x "
        "with at least x cores busy >= break-even of the time"
    )
    summary = table(
        "core type",
        "peak cores",
        "core-hours",
        "on-demand cost",
        "prepaid cores",
        "last core busy",
        "prepaid cost",
        "on-demand core-hours left",
        "savings",
        "savings %",
    )
    for name, r in report.results.items():
        summary.add_row(
            name,
            f"{r.max_cores:,}",
            f"{r.all_core_hours:,.1f}",
            usd(r.all_on_demand_cost),
            f"{r.optimal_cores:,}",
            percent(r.optimal_utilisation, 3),
            usd(r.prepaid_cost),
            f"{r.residual_core_hours:,.1f}",
            usd(r.savings),
            percent(r.savings_fraction, 3),
        )
    console.print(summary)
    for name, r in report.results.items():
        why = explanation(report, r)
        if why:
            say(f"{name}: {why}")
    for name, r in report.results.items():
        say("")
        say(f"savings curve, {name} (* the optimum):")
        curve = table("prepaid cores", "busy ≥ this core", "savings", "of all on demand")
        cost = r.all_on_demand_cost
        for i in sample_indices(r, points):
            cores = int(r.curve_cores[i])
            value = float(r.curve_savings[i])
            curve.add_row(
                f"{cores:,}" + (" *" if cores == r.optimal_cores else ""),
                percent(float(r.curve_utilisation[i]), 3) if cores else "-",
                usd(value),
                percent(value / cost, 3) if cost > 0 else "-",
            )
        console.print(curve)


def _price(minimum_open: bool):
    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is None:
            return None
        if not math.isfinite(value) or value < 0 or (minimum_open and value == 0):
            need = "a positive" if minimum_open else "a non-negative"
            raise click.BadParameter(f"{value:g}: must be {need} number")
        return value

    return check


@click.command("prepaid")
@click.option(
    "--swf",
    type=click.Path(exists=True, dir_okay=False),
    help="A Standard Workload Format trace: jobs run from submit + wait for their run time "
    "on their allocated processors.",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(exists=True, dir_okay=False),
    help="A CSV with a header row and columns start, end (epoch seconds or ISO 8601; no zone: "
    "UTC) and cores (whole numbers).",
)
@click.option(
    "--from-store",
    is_flag=True,
    help="The VMs this host's daemon ran (its --state-dir / SPOTBAG_STATE_DIR): each VM's "
    "vCPUs from running to ended, per VM type.",
)
@click.option(
    "--on-demand-price",
    type=float,
    required=True,
    callback=_price(True),
    help="On-demand price per core-hour, e.g. 0.0475.",
)
@click.option(
    "--prepaid-price",
    type=float,
    callback=_price(False),
    help="Prepaid price per core-hour of commitment (the effective hourly price).",
)
@click.option(
    "--prepaid-upfront",
    type=float,
    callback=_price(False),
    help="Or: the upfront amount per core for the whole term (divided by 8760 h per year).",
)
@click.option(
    "--term",
    type=click.Choice(list(TERMS_Y)),
    required=True,
    help="The prepaid term (converts --prepaid-upfront to a price per core-hour).",
)
@click.option(
    "--core-type",
    help="Analyse each core type separately: a CSV column, or for SWF 'partition' or 'queue'.",
)
@click.option(
    "--curve-points",
    type=click.IntRange(min=2),
    default=DEFAULT_CURVE_POINTS,
    show_default=True,
    help="Points of the savings curve shown (the optimum is always among them).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    help="Save the savings curve and utilisation by prepaid core count to this PNG.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def prepaid_command(
    swf: str | None,
    csv_path: str | None,
    from_store: bool,
    on_demand_price: float,
    prepaid_price: float | None,
    prepaid_upfront: float | None,
    term: str,
    core_type: str | None,
    curve_points: int,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """How many cores to prepay (reserve) for a term rather than buy on demand, per
    core type, from a usage history (docs/design.md#cost-reports).

    The period is the span of the history (first start to last end). Every prepaid
    core is paid for each hour of it at the prepaid price per core-hour; --term only
    converts --prepaid-upfront to that price (upfront / (8760 h × years)), and a span
    shorter than the term is taken to stand for the whole term. The optimum is the
    largest x such that at least x cores are busy for at least the break-even
    utilisation (prepaid / on-demand price) of the period; it is exact. Prepaid at or
    above the on-demand price gives 0 prepaid cores, with the reason.
    """
    from rich.console import Console

    sources = [name for name, given in (("--swf", swf), ("--csv", csv_path)) if given]
    if from_store:
        sources.append("--from-store")
    if len(sources) != 1:
        raise click.UsageError(
            "give exactly one of --swf, --csv or --from-store"
            + (f" (got {', '.join(sources)})" if sources else "")
        )
    if (prepaid_price is None) == (prepaid_upfront is None):
        raise click.UsageError("give exactly one of --prepaid-price or --prepaid-upfront")
    try:
        if from_store:
            state_dir = click.get_current_context().find_root().obj or {}
            intervals = read_store(state_dir.get("state_dir"), core_type)
        else:
            intervals = read_source(swf, csv_path, core_type)
    except PrepaidError as exc:
        raise click.BadParameter(exc.message, param_hint=exc.option) from None
    report = analyse(
        intervals, on_demand_price, prepaid_price=prepaid_price, upfront=prepaid_upfront, term=term
    )
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if as_json:
        for note in intervals.notes:  # the table shows them; JSON readers see them here too
            click.echo(f"{intervals.source}: {note}", err=True)
        click.echo(json.dumps(as_dict(report, curve_points), indent=2))
    else:
        render(report, console, curve_points)
    sys.stdout.flush()
    if plot_path:
        try:
            write_plot(report, plot_path)
        except OSError as exc:
            raise click.BadParameter(
                f"cannot write {plot_path}: {exc}", param_hint="--plot"
            ) from None
        except RuntimeError as exc:  # no matplotlib
            raise click.ClickException(f"--plot: {exc}") from None
        Console(stderr=True).print(f"plot written to {plot_path}", highlight=False)
