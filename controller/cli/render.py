"""What the CLI prints: borderless tables (rich's; the list of bags in plain columns),
the text summary of a bag, the cost report as terminal tables. (The report's CSV and HTML are rendered by the daemon,
controller/costs/report_render.py, which serves them.)"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a table is made: `spotbag status` prints plain text
    from rich.table import Table

from controller.formatting import duration, number, percent, usd


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


def bag_flag(bag: dict[str, Any]) -> str:
    """What needs a look, in a word or two: 'AT RISK' (its deadline's projection says it
    may be missed), 'held: budget' (a budget stops its launches); '' else. Both come with
    the bag when known (`deadline.at_risk`, `budget.held`) and are absent otherwise."""
    flags = []
    if (bag.get("deadline") or {}).get("at_risk"):
        flags.append("AT RISK")
    if (bag.get("budget") or {}).get("held"):
        flags.append("held: budget")
    return ", ".join(flags)


def bag_table(bags: list[dict[str, Any]]) -> PlainTable:
    """One row per bag: state, progress, job counts, spot cost so far, and a flag for a
    bag at risk of missing its deadline or held by a budget."""
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
        "flag",
    )
    for bag in bags:
        c = bag["counts"]
        table.add_row(
            bag["id"],
            bag["name"],
            bag["state"],
            percent(bag["progress"]),
            f"{c['succeeded']:,}",
            f"{c['failed']:,}",
            f"{c['running']:,}",
            f"{c['queued'] + c['held']:,}",
            f"{bag['usage']['interrupted_attempts']:,}",
            usd(bag["usage"]["spot_cost_usd"]),
            bag_flag(bag),
        )
    return table


def when(at: float | None) -> str:
    """Epoch seconds as local time; '' for None."""
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def report_tables(report: dict[str, Any]) -> list[Table]:
    """A cost report (GET /v1/reports) per VM type with the total; for an account also
    per bag."""
    # Here, not at the top: the report module brings the store (sqlite-utils) and numpy.
    from rich.table import Table

    from controller.costs.report_render import TABLE_COLUMNS, fmt, title

    by_type = Table(title=f"Cost report: {title(report)}", title_justify="left")
    by_type.add_column("VM type", no_wrap=True)
    for _, header, _ in TABLE_COLUMNS:
        by_type.add_column(header, justify="right")
    for row in report["by_vm_type"]:
        by_type.add_row(row["vm_type"], *(fmt(row.get(k), p) for k, _, p in TABLE_COLUMNS))
    by_type.add_row(
        "total", *(fmt(report["totals"].get(k), p) for k, _, p in TABLE_COLUMNS), style="bold"
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
                row["bag_id"], row["name"], *(fmt(row.get(k), p) for k, _, p in TABLE_COLUMNS)
            )
        out.append(by_bag)
    return out


def render_summary(view: dict[str, Any], fleet: dict[str, Any] | None = None) -> str:
    """The end-of-run summary, as plain text."""
    c, u = view["counts"], view["usage"]
    saved = u["on_demand_cost_usd"] - u["spot_cost_usd"]
    fraction = saved / u["on_demand_cost_usd"] if u["on_demand_cost_usd"] > 0 else 0.0
    title = f"bag {view['id']}" + (f" ({view['name']})" if view["name"] else "")
    lines = [
        f"{title}: {view['state']} after {duration(view['elapsed_s'])}",
        f"  jobs        {c['succeeded']:,} succeeded, {c['failed']:,} failed, {c['cancelled']:,} cancelled"
        f", {c['running']:,} running, {c['queued'] + c['held']:,} waiting (of {view['job_count']:,})",
        f"  attempts    {u['attempts']:,} ({u['interrupted_attempts']:,} interrupted by VM preemptions: "
        f"{duration(u['preempted_attempt_hours'] * 3600)} of their running time, "
        f"{duration(u['lost_hours'] * 3600)} of work lost since the last checkpoint)",
        f"  checkpoints {u['checkpoints']:,} written, {duration(u['checkpoint_hours'] * 3600)} spent writing them",
        f"  VM-hours    {number(u['vm_hours'])}: this bag's share of its VMs (its jobs ran "
        f"{duration(u['attempt_hours'] * 3600)} in all, each on part of a VM)",
        f"  cost        spot {usd(u['spot_cost_usd'])} vs on-demand {usd(u['on_demand_cost_usd'])}"
        f" for the same hours: saved {usd(saved)} ({percent(fraction)})",
    ]
    lines += _option_lines(view)
    if fleet is not None:
        t = fleet["total"]
        fleet_saved = t["on_demand_cost_usd"] - t["spot_cost_usd"]
        lines.append(
            f"  all VMs     {t['vms']:,} VMs of every bag so far, {t['vms_preempted']:,} of them preempted: "
            f"{number(t['vm_hours'])} VM-hours incl. idle, spot {usd(t['spot_cost_usd'])} vs on-demand "
            f"{usd(t['on_demand_cost_usd'])} (saved {usd(fleet_saved)})"
        )
    return "\n".join(lines)


def _option_lines(view: dict[str, Any]) -> list[str]:
    """The bag's deadline, on-demand choice and budget, when it has any
    (docs/bags.md#options)."""
    options = view.get("options") or {}
    budget = view.get("budget") or {}
    lines = []
    if options.get("deadline_at") is not None:
        lines.append(
            f"  deadline    {when(options['deadline_at'])} ({options['deadline']}), "
            f"on-demand {options['on_demand']}, confidence {options['deadline_confidence']:g}"
        )
        lines += deadline_lines(view.get("deadline"), view)
    elif options.get("on_demand") not in (None, "never"):
        lines.append(f"  on-demand   {options['on_demand']}")
    cap = budget.get("budget_usd")
    account_cap = budget.get("account_budget_usd")
    if cap is not None or account_cap is not None or budget.get("held"):
        text = (
            f"  budget      {usd(budget.get('charged_usd', 0.0))} charged + "
            f"{usd(budget.get('reserved_usd', 0.0))} reserved of "
            f"{'no cap' if cap is None else usd(cap)}"
        )
        if cap:
            used = budget.get("charged_usd", 0.0) + budget.get("reserved_usd", 0.0)
            text += f" ({percent(used / cap)} used)"
        if account_cap is not None:
            text += (
                f" (account: {usd(budget.get('account_month_charged_usd', 0.0))} of "
                f"{usd(account_cap)} this month)"
            )
        lines.append(text)
        if budget.get("held"):
            lines.append(f"  waiting     {budget['held']}")
    if options.get("notify"):
        lines.append(f"  webhooks    {', '.join(w['url'] for w in options['notify'])}")
    return lines


def deadline_lines(deadline: dict[str, Any] | None, view: dict[str, Any]) -> list[str]:
    """The deadline's projection (the API's `deadline`, docs/bags.md#status): time left,
    the projected finish (p50, with p90–p95 as its spread), the chance of meeting the
    deadline, AT RISK, and the on-demand slots and share so far. Nothing when the bag has
    no projection (no `deadline` field: a daemon without the deadline policy)."""
    if not deadline:
        return []
    at = deadline.get("at")
    lines = []
    if view.get("state") == "active" and at is not None:
        # The time left is from the view's own clock: created_at + elapsed_s is its now.
        now = view["created_at"] + view["elapsed_s"]
        left = at - now
        lines.append(
            f"  time left   {duration(left)}"
            if left >= 0
            else f"  time left   passed {duration(-left)} ago"
        )
    finish = deadline.get("finish")
    p_meet = deadline.get("p_meet")
    if finish and finish.get("p50") is not None:
        text = f"  projected   finish {when(finish['p50'])} (p50)"
        if finish.get("p90") is not None and finish.get("p95") is not None:
            text += f", {when(finish['p90'])} – {when(finish['p95'])} (p90 – p95)"
        if p_meet is not None:
            text += f"; meets the deadline with p = {percent(p_meet, 3)}"
        lines.append(text)
    elif p_meet is not None:
        lines.append(f"  projected   meets the deadline with p = {percent(p_meet, 3)}")
    elif view.get("state") == "active":
        lines.append("  projected   not yet (too few jobs have ended)")
    if deadline.get("at_risk"):
        lines.append("  AT RISK     the projection may miss the deadline")
    slots = deadline.get("on_demand_slots")
    share = deadline.get("on_demand_share")
    if slots is not None or share is not None:
        text = f"  on-demand   {slots or 0:,} slots now"
        if share is not None:
            text += f", on-demand share so far {percent(share)}"
        lines.append(text)
    return lines
