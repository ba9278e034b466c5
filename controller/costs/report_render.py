"""Cost reports (controller/costs/report.py) as CSV or one HTML file, as the API serves them
(the CLI's terminal tables are controller.cli.render.report_tables).

The HTML report is self-contained: styles inline and the charts as inline SVG drawn
with matplotlib (no scripts, no fonts or images fetched), so it can be mailed or
attached to a ticket as it is.
"""

from __future__ import annotations

import csv
import html
import io
import time
from collections.abc import Callable
from typing import Any

from controller.costs.report import METRICS
from controller.formatting import duration, number, percent, usd


def count(value: Any) -> str:
    return f"{value:,}"


def _hours(value: float) -> str:
    return duration(value * 3600.0)


def _pct(value: float) -> str:
    return percent(value / 100.0)


# The columns a table shows, in the terminal and in the HTML (the JSON and CSV have them
# all), each with how its figure is printed (controller/formatting.py: money keeps its
# significant digits, so a non-zero cost never shows as 0.00).
Printer = Callable[[Any], str]
TABLE_COLUMNS: tuple[tuple[str, str, Printer], ...] = (
    ("vms", "VMs", count),
    ("vm_h", "VM-h", number),
    ("idle_vm_h", "idle VM-h", number),
    ("spare_vm_h", "spare VM-h", number),
    ("spot_cost_usd", "cost", usd),
    ("on_demand_cost_usd", "on-demand", usd),
    ("savings_usd", "saved", usd),
    ("savings_pct", "saved %", _pct),
    ("preemptions", "preempted", count),
    ("lost_h", "lost", _hours),
    ("checkpoint_h", "checkpointing", _hours),
    ("cpu_h", "CPU-h", number),
    # Per VM type: the mean spot price paid, and the index price for the type's size over
    # the same hours (docs/design.md#index-tracking; needs the hopper's price samples).
    ("price_paid_per_h", "paid $/h", usd),
    ("index_price_per_h", "index $/h", usd),
)


def fmt(value: Any, printer: Printer) -> str:
    """A table cell: '–' for a figure the report does not have."""
    return "–" if value is None else printer(value)


def _any_figure(name: str) -> Printer:
    """How "All figures" prints a metric, by the unit its name gives."""
    if name.endswith(("_usd", "_per_h")):
        return usd
    if name.endswith("_pct"):
        return _pct
    return lambda value: count(value) if isinstance(value, int) else number(value)


def title(report: dict[str, Any]) -> str:
    scope = report["scope"]
    return f"bag {scope['bag']}" if "bag" in scope else f"account {scope['account']}"


def to_csv(report: dict[str, Any]) -> str:
    """One row per group: section (total, vm_type, bag), its key, then every figure."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["section", "key", *(name for name, _ in METRICS)])
    writer.writerow(["total", title(report), *_values(report["totals"])])
    for row in report["by_vm_type"]:
        writer.writerow(["vm_type", row["vm_type"], *_values(row)])
    for row in report["by_bag"]:
        writer.writerow(["bag", row["bag_id"], *_values(row)])
    return out.getvalue()


def _values(row: dict[str, Any]) -> list[Any]:
    return ["" if row[name] is None else row[name] for name, _ in METRICS]


# --- HTML ---------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1300px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 2em; }
.muted { color: #666; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 1.2em 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 9em; }
.card b { display: block; font-size: 1.35em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 0.25em 0.6em; text-align: right; }
td { white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
tr.total td { font-weight: bold; border-top: 2px solid #999; }
svg { max-width: 100%; height: auto; }
.scroll { max-width: 100%; overflow-x: auto; }
"""


def to_html(report: dict[str, Any]) -> str:
    totals = report["totals"]
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(report["generated_at"]))
    cards = [
        ("cost", usd(totals["spot_cost_usd"])),
        ("on demand would cost", usd(totals["on_demand_cost_usd"])),
        (
            "saved",
            usd(totals["savings_usd"])
            + (f" ({_pct(totals['savings_pct'])})" if totals["savings_pct"] is not None else ""),
        ),
        ("VM-hours", number(totals["vm_h"])),
        ("preempted attempts", count(totals["preemptions"])),
        ("work lost to preemption", _hours(totals["lost_h"])),
        ("time checkpointing", _hours(totals["checkpoint_h"])),
        ("CPU-hours used", number(totals["cpu_h"])),
    ]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>spotbag cost report: {html.escape(title(report))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Cost report: {html.escape(title(report))}</h1>",
        f'<p class="muted">generated {html.escape(when)} by spotbag; costs split among the '
        "jobs that shared each VM by the split-cost-allocation method (weights "
        + ", ".join(f"{k} {v:g}" for k, v in report["split_weights"].items())
        + ")</p>",
        '<div class="cards">',
        *(f'<div class="card">{html.escape(k)}<b>{html.escape(v)}</b></div>' for k, v in cards),
        "</div>",
        "<h2>Cost by VM type</h2>",
        _cost_chart(report),
        _html_table(report["by_vm_type"], "vm_type", "VM type", totals),
        "<h2>Preemption timeline</h2>",
        _timeline_chart(report),
    ]
    if "account" in report["scope"]:
        parts += ["<h2>Bags</h2>", _html_table(report["by_bag"], "bag_id", "bag", totals)]
    parts += [
        "<h2>All figures</h2>",
        _figures_table(report["by_vm_type"], totals),
        "</body></html>",
    ]
    return "\n".join(parts)


def _figures_table(rows: list[dict[str, Any]], totals: dict[str, Any]) -> str:
    """Every metric (a row each) per VM type and in total (a column each): 21 metrics
    across would be wider than any page; a few VM types across are not (and the table
    scrolls within the page when there are many)."""
    head = "".join(f"<th>{html.escape(str(row['vm_type']))}</th>" for row in rows)
    body = []
    for name, label in METRICS:
        printer = _any_figure(name)
        cells = "".join(f"<td>{html.escape(fmt(row.get(name), printer))}</td>" for row in rows)
        total = html.escape(fmt(totals.get(name), printer))
        body.append(f"<tr><td>{html.escape(label)}</td>{cells}<td><b>{total}</b></td></tr>")
    return (
        f'<div class="scroll"><table><tr><th>figure</th>{head}<th>total</th></tr>'
        f"{''.join(body)}</table></div>"
    )


def _html_table(rows: list[dict[str, Any]], key: str, header: str, totals: dict[str, Any]) -> str:
    columns = TABLE_COLUMNS
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in columns)
    body = []
    for row in rows:
        cells = "".join(f"<td>{html.escape(fmt(row.get(n), p))}</td>" for n, _, p in columns)
        body.append(f"<tr><td>{html.escape(str(row[key]))}</td>{cells}</tr>")
    cells = "".join(f"<td>{html.escape(fmt(totals.get(n), p))}</td>" for n, _, p in columns)
    body.append(f'<tr class="total"><td>total</td>{cells}</tr>')
    return (
        f'<div class="scroll"><table><tr><th>{html.escape(header)}</th>{head}</tr>'
        f"{''.join(body)}</table></div>"
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _svg(figure: Any) -> str:
    out = io.StringIO()
    figure.savefig(out, format="svg", bbox_inches="tight")
    _pyplot().close(figure)
    text = out.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype


_PARTS = (
    ("job_cost_usd", "jobs", "#3b7dd8"),
    ("idle_cost_usd", "idle", "#f2b134"),
    ("spare_cost_usd", "spare (hot spares)", "#9b59b6"),
    ("unallocated_cost_usd", "unreserved capacity", "#bbbbbb"),
)


def _cost_chart(report: dict[str, Any]) -> str:
    """Stacked bars per VM type: what the cost went to; a hollow bar: the on-demand cost."""
    rows = report["by_vm_type"]
    if not rows:
        return '<p class="muted">No VM ran for this scope.</p>'
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(9, 0.7 + 0.55 * len(rows)))
    labels = [row["vm_type"] for row in rows]
    positions = range(len(rows))
    left = [0.0] * len(rows)
    for name, label, color in _PARTS:
        widths = [row[name] for row in rows]
        axis.barh(positions, widths, left=left, height=0.5, color=color, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axis.barh(
        positions,
        [row["on_demand_cost_usd"] for row in rows],
        height=0.8,
        fill=False,
        edgecolor="#444",
        linestyle="--",
        label="on-demand cost of the same hours",
    )
    axis.set_yticks(list(positions), labels)
    axis.invert_yaxis()
    axis.set_xlabel("cost")
    _money_axis(axis.xaxis)
    _legend_beside(axis)
    axis.grid(axis="x", alpha=0.3)
    return _svg(figure)


def _money_axis(axis: Any) -> None:
    """Tick labels in dollars as the report prints them ($0.000005, not 5e-6 with an
    offset above the axis)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: usd(value)))


def _legend_beside(axis: Any) -> None:
    """The legend right of the plot, where it covers nothing (the SVG is cut to fit it)."""
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)


MAX_VM_LABELS = 40  # VM ids written on the timeline's axis; more VMs: every k-th


def _timeline_chart(report: dict[str, Any]) -> str:
    """Each VM's life as a line (a few hundred at most), or the number running over time,
    with every preemption marked."""
    vms = report["vms"]
    if not vms:
        return '<p class="muted">No VM ran for this scope.</p>'
    plt = _pyplot()
    t0 = min(vm["start"] for vm in vms)
    hours = [((vm["start"] - t0) / 3600.0, (vm["end"] - t0) / 3600.0) for vm in vms]
    preempted = [h[1] for vm, h in zip(vms, hours, strict=True) if vm["state"] == "preempted"]
    types = sorted({vm["vm_type"] for vm in vms})
    colors = plt.get_cmap("tab10")
    lines = len(vms) <= 300
    # A row per VM, tall enough for its id when every id is written.
    height = min(9.0, max(2.6, 1.2 + 0.2 * len(vms))) if lines else 3.6
    figure, axis = plt.subplots(figsize=(9, height))
    if lines:
        for row, (vm, (start, end)) in enumerate(zip(vms, hours, strict=True)):
            axis.plot([start, end], [row, row], color=colors(types.index(vm["vm_type"]) % 10), lw=2)
        rows = [i for i, vm in enumerate(vms) if vm["state"] == "preempted"]
        axis.scatter(preempted, rows, marker="x", color="#c0392b", zorder=3, label="preempted")
        every = max(1, -(-len(vms) // MAX_VM_LABELS))  # ceil: at most MAX_VM_LABELS ids
        ticks = list(range(0, len(vms), every))
        axis.set_yticks(ticks, [vms[i]["id"] for i in ticks], fontsize=7, family="monospace")
        axis.set_ylim(len(vms) - 0.5, -0.5)  # the first VM on top
        axis.set_ylabel("VM" if every == 1 else f"VM (one id in {every})")
        for k, name in enumerate(types):
            axis.plot([], [], color=colors(k % 10), lw=2, label=name)
    else:
        events = sorted([(s, 1) for s, _ in hours] + [(e, -1) for _, e in hours])
        xs, ys, running = [0.0], [0], 0
        for at, step in events:
            running += step
            xs.append(at)
            ys.append(running)
        axis.step(xs, ys, where="post", color="#3b7dd8", label="VMs running")
        axis.scatter(
            preempted, [0] * len(preempted), marker="|", s=200, color="#c0392b", label="preempted"
        )
        axis.set_ylabel("VMs running")
    axis.set_xlabel("hours since the first VM started")
    _legend_beside(axis)
    axis.grid(axis="x", alpha=0.3)
    note = (
        f'<p class="muted">{len(preempted)} preemption(s) of {len(vms)} VM(s)'
        + (" (the first VMs only)" if report["vms_truncated"] else "")
        + "</p>"
    )
    return _svg(figure) + note
