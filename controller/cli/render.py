"""What the CLI prints: borderless tables (rich's; the list of bags in plain columns),
the text summary of a bag, the cost report as terminal tables. (The report's CSV and HTML are rendered by the daemon,
controller/report_render.py, which serves them.)"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a table is made: `spotbag status` prints plain text
    from rich.table import Table


def table_of(*columns: str, keep: int = 1) -> Table:
    """A borderless table whose first `keep` columns (ids) never wrap or shrink."""
    from rich.table import Table

    table = Table(box=None)
    for i, name in enumerate(columns):
        table.add_column(name, no_wrap=i < keep, min_width=len(name) if i >= keep else None)
    return table


class PlainTable:
    """Columns of text, left-aligned and two spaces apart under a header line, as squeue
    prints them: `spotbag status` lists bags without rich, whose console and table take
    40 ms to import (a third of the command; issue 24)."""

    def __init__(self, *columns: str) -> None:
        self.columns = columns
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)

    def __str__(self) -> str:
        lines = (self.columns, *self.rows)
        widths = [max(len(line[i]) for line in lines) for i in range(len(self.columns))]
        return "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in lines
        )


def bag_table(bags: list[dict[str, Any]]) -> PlainTable:
    """One row per bag: state, progress, job counts, spot cost so far."""
    table = PlainTable(
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


def when(at: float | None) -> str:
    """Epoch seconds as local time; '' for None."""
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _cell(value: Any, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


def report_tables(report: dict[str, Any]) -> list[Table]:
    """A cost report (GET /v1/reports) per VM type with the total; for an account also
    per bag."""
    # Here, not at the top: the report module brings the store (sqlite-utils) and numpy.
    from rich.table import Table

    from controller.report_render import TABLE_COLUMNS, title

    by_type = Table(title=f"Cost report: {title(report)}", title_justify="left")
    by_type.add_column("VM type", no_wrap=True)
    for _, header, _ in TABLE_COLUMNS:
        by_type.add_column(header, justify="right")
    for row in report["by_vm_type"]:
        by_type.add_row(row["vm_type"], *(_cell(row.get(k), p) for k, _, p in TABLE_COLUMNS))
    by_type.add_row(
        "total", *(_cell(report["totals"].get(k), p) for k, _, p in TABLE_COLUMNS), style="bold"
    )
    out = [by_type]
    if "account" in report["scope"]:
        by_bag = Table(title="per bag", title_justify="left")
        by_bag.add_column("bag", no_wrap=True)
        by_bag.add_column("name")
        for _, header, _ in TABLE_COLUMNS:
            by_bag.add_column(header, justify="right")
        for row in report["by_bag"]:
            by_bag.add_row(
                row["bag_id"], row["name"], *(_cell(row.get(k), p) for k, _, p in TABLE_COLUMNS)
            )
        out.append(by_bag)
    return out


def _money(usd: float) -> str:
    if abs(usd) < 0.01:
        return f"${usd:.6f}"  # the demo's costs are fractions of a cent
    return f"${usd:,.4f}" if abs(usd) < 10 else f"${usd:,.2f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def render_summary(view: dict[str, Any], fleet: dict[str, Any] | None = None) -> str:
    """The end-of-run summary, as plain text."""
    c, u = view["counts"], view["usage"]
    saved = u["on_demand_cost_usd"] - u["spot_cost_usd"]
    pct = 100.0 * saved / u["on_demand_cost_usd"] if u["on_demand_cost_usd"] > 0 else 0.0
    title = f"bag {view['id']}" + (f" ({view['name']})" if view["name"] else "")
    lines = [
        f"{title}: {view['state']} after {_duration(view['elapsed_s'])}",
        f"  jobs        {c['succeeded']:,} succeeded, {c['failed']:,} failed, {c['cancelled']:,} cancelled"
        f", {c['running']:,} running, {c['queued'] + c['held']:,} waiting (of {view['job_count']:,})",
        f"  attempts    {u['attempts']:,} ({u['interrupted_attempts']:,} interrupted by VM preemptions: "
        f"{_duration(u['preempted_attempt_hours'] * 3600)} of their running time, "
        f"{_duration(u['lost_hours'] * 3600)} of work lost since the last checkpoint)",
        f"  checkpoints {u['checkpoints']:,} written, {_duration(u['checkpoint_hours'] * 3600)} spent writing them",
        f"  VM-hours    {u['vm_hours']:.3f}: this bag's share of its VMs (its jobs ran "
        f"{u['attempt_hours']:.3f} h in all, each on part of a VM)",
        f"  cost        spot {_money(u['spot_cost_usd'])} vs on-demand {_money(u['on_demand_cost_usd'])}"
        f" for the same hours: saved {_money(saved)} ({pct:.0f}%)",
    ]
    if fleet is not None:
        t = fleet["total"]
        fleet_saved = t["on_demand_cost_usd"] - t["spot_cost_usd"]
        lines.append(
            f"  all VMs     {t['vms']:,} VMs of every bag so far, {t['vms_preempted']:,} of them preempted: "
            f"{t['vm_hours']:.3f} VM-hours incl. idle, spot {_money(t['spot_cost_usd'])} vs on-demand "
            f"{_money(t['on_demand_cost_usd'])} (saved {_money(fleet_saved)})"
        )
    return "\n".join(lines)
