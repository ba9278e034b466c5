"""The PNG charts of the offline tools (matplotlib, a dependency of spotbag, imported
only when a plot is asked for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from controller.formatting import percent, usd
from policies.fitting import FitResult, KaplanMeier


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib
    except ImportError:
        # A dependency since the HTML report draws charts; only a broken install lacks it.
        raise RuntimeError("plotting needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fits(
    groups: Sequence[tuple[str, KaplanMeier, Mapping[str, FitResult]]],
    out: str | Path,
    L: float = 24.0,
) -> None:
    """Per group: the Kaplan–Meier CDF with every fitted CDF, and the fitted hazards."""
    plt = pyplot()
    figure, axes = plt.subplots(len(groups), 2, figsize=(12, 3.6 * len(groups)), squeeze=False)
    t = np.linspace(0.0, L, 600)
    for row, (title, km, fits) in enumerate(groups):
        cdf_axis, hazard_axis = axes[row]
        cdf_axis.step(
            km.times,
            1.0 - km.survival,
            where="post",
            color="black",
            linewidth=1.5,
            label="Kaplan–Meier",
        )
        for name, result in fits.items():
            label = f"{name} (AIC {result.aic:.0f}, KS {result.ks:.3f})"
            cdf_axis.plot(t, result.model.cdf(t), label=label)
            # Weibull's hazard is infinite at 0: start just after it.
            hazard_axis.plot(t[1:-1], result.model.hazard(t[1:-1]), label=name)
        cdf_axis.set(xlabel="hours since launch", ylabel="P(preempted by t)")
        cdf_axis.set_title(f"{title}: CDF of VM lifetime", fontsize=9, wrap=True)
        # The legend in a band above P = 1, where no CDF goes: it covers no curve.
        cdf_axis.set_ylim(-0.02, 1.4)
        cdf_axis.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
        cdf_axis.legend(fontsize=7, loc="upper left", ncol=2)
        hazard_axis.set(
            xlabel="hours since launch",
            ylabel="preemptions per hour",
            yscale="log",
            ylim=(1e-3, 200.0),  # above 20 per hour: the legend's band, over no curve
        )
        # Two lines: one would be wider than its panel, and cut.
        hazard_axis.set_title(
            f"{title}: hazard rate\n(the deadline mass at L is not drawn)", fontsize=9
        )
        hazard_axis.legend(fontsize=7, loc="upper right", ncol=2)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_checkpoint_plan(model, schedules, start_age_h: float, out: str | Path) -> None:
    """The checkpoint times of one or more schedules (policies.checkpoint.Schedule), one
    row per policy labelled with its expected overhead, on the time since the job
    started (if nothing fails), over the model's hazard rate at the VM's age then
    (start age + elapsed; the deadline mass is not drawn)."""
    plt = pyplot()
    schedules = list(schedules)
    figure, rows_axis = plt.subplots(figsize=(12, 2.4 + 0.7 * max(1, len(schedules))))
    spans = [sum(s.intervals_h) + s.delta_h * s.checkpoints for s in schedules]
    span = max(spans, default=1.0) or 1.0

    # The hazard, behind the rows, on its own axis.
    hazard_axis = rows_axis.twinx()
    rows_axis.set_zorder(hazard_axis.get_zorder() + 1)
    rows_axis.patch.set_visible(False)
    elapsed = np.linspace(0.0, span, 800)
    hazard = np.asarray(model.hazard(start_age_h + elapsed), dtype=float)
    shown = np.isfinite(hazard)
    hazard_axis.fill_between(elapsed[shown], hazard[shown], color="tab:red", alpha=0.12, lw=0)
    hazard_axis.plot(elapsed[shown], hazard[shown], color="tab:red", alpha=0.6, lw=1)
    drawn = hazard[shown]
    if drawn.size and (drawn > 0).all() and drawn.max() > 20 * drawn.min():
        hazard_axis.set_yscale("log")  # the bathtub's steep ends
    else:
        hazard_axis.set_ylim(bottom=0.0)
    hazard_axis.set_ylabel("hazard at the VM's age (1/h)", color="tab:red")
    hazard_axis.tick_params(axis="y", colors="tab:red")
    if model.L is not None and start_age_h + span > model.L:
        rows_axis.axvline(model.L - start_age_h, color="black", linestyle=":", lw=1)
        rows_axis.text(
            model.L - start_age_h, len(schedules) - 0.5, " deadline", fontsize=8, va="top"
        )

    labels = []
    for row, (schedule, end) in enumerate(zip(schedules, spans, strict=True)):
        y = len(schedules) - 1 - row  # the first schedule on top
        times = schedule.checkpoint_times_h()
        rows_axis.plot([0.0, end], [y, y], color="gray", lw=1)
        rows_axis.plot([0.0, end], [y, y], "|", color="gray", markersize=12)
        for t in times:  # each checkpoint takes δ
            rows_axis.plot([t, t + schedule.delta_h], [y, y], color="tab:blue", lw=6)
        rows_axis.plot(times, [y] * len(times), "v", color="tab:blue", markersize=6)
        if len(schedule.intervals_h) <= 16:
            starts = [0.0] + [t + schedule.delta_h for t in times]
            for begin, interval in zip(starts, schedule.intervals_h, strict=True):
                rows_axis.text(
                    begin + interval / 2,
                    y + 0.12,
                    f"{interval * 60:.0f}",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        labels.append(
            f"{schedule.policy}\n{schedule.checkpoints} checkpoints, "
            f"overhead {percent(schedule.overhead)}"
        )
    rows_axis.set_yticks(range(len(schedules)), list(reversed(labels)), fontsize=8)
    rows_axis.set_ylim(-0.6, len(schedules) - 0.4)
    rows_axis.set_xlim(0.0, span * 1.01)
    work = schedules[0].work_h if schedules else 0.0
    delta_min = schedules[0].delta_h * 60 if schedules else 0.0
    rows_axis.set(
        title=(
            f"checkpoints of a {work:g}-hour job started at VM age {start_age_h:g} h "
            f"(δ = {delta_min:g} min; numbers: minutes of work between checkpoints)"
        ),
        xlabel="hours since the job started (if nothing fails)",
    )
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_prepaid_savings(
    groups: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray, int]],
    break_even: float,
    title: str,
    out: str | Path,
) -> None:
    """Prepaid vs on-demand cores (docs/design.md#cost-reports), one row per core type given as
    (label, prepaid core counts x, savings(x), T(≥x)/period, optimal x): the savings
    curve with its optimum marked, and how busy the x-th core would be against the
    break-even utilisation (the optimum is the last x at or above it)."""
    plt = pyplot()
    figure, axes = plt.subplots(
        max(1, len(groups)), 2, figsize=(12, 3.8 * max(1, len(groups))), squeeze=False
    )
    for row, (label, cores, saved, utilisation, optimum) in enumerate(groups):
        savings_axis, busy_axis = axes[row]
        cores = np.asarray(cores)
        at = int(np.searchsorted(cores, optimum))
        best = float(np.asarray(saved)[at]) if at < cores.size else 0.0
        savings_axis.plot(cores, saved, color="tab:blue", lw=1.5)
        savings_axis.axhline(0.0, color="gray", lw=0.8)
        savings_axis.plot([optimum], [best], "o", color="tab:red")
        savings_axis.annotate(
            f"{optimum:,} cores: {usd(best)}".replace("$", "\\$"),  # not mathtext
            (optimum, best),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
            color="tab:red",
        )
        savings_axis.set(
            title=f"{label}: savings against all on demand",
            xlabel="prepaid cores",
            ylabel="savings (\\$)",
        )
        savings_axis.margins(y=0.12)
        savings_axis.grid(alpha=0.3)
        busy_axis.step(cores, 100.0 * np.asarray(utilisation), where="post", color="tab:green")
        busy_axis.axhline(
            100.0 * break_even,
            color="tab:red",
            linestyle="--",
            lw=1,
            label=f"break-even {percent(break_even, 3)}",
        )
        busy_axis.axvline(optimum, color="tab:red", linestyle=":", lw=1)
        busy_axis.set(
            title=f"{label}: time with at least x cores busy",
            xlabel="x (cores)",
            ylabel="% of the period",
            ylim=(0, 105),
        )
        busy_axis.grid(alpha=0.3)
        busy_axis.legend(fontsize=8)
    figure.suptitle(title.replace("$", "\\$"), fontsize=9)  # not mathtext
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_index(
    out: str | Path,
    times_s,
    series: Mapping[str, np.ndarray],
    normalized,
    vms: Sequence[tuple[str, str]],
    members: Mapping[str, np.ndarray],
    by: str,
):
    """The index of each composition over its members' normalised prices (log scale).
    `vms` are the trace's (type, zone) pairs, `members` each composition's mask over
    them (controller.tools.hopping_report.compositions: the rule the index itself used)."""
    plt = pyplot()
    # One datetime64 array (UTC, as matplotlib shows dates by default), not a datetime per
    # sample, which matplotlib converted again for every line: 36% of `index --plot`.
    dates = np.round(np.asarray(times_s, dtype=float) * 1000).astype("datetime64[ms]")
    fig, axes = plt.subplots(len(series), 1, figsize=(11, 2.6 * len(series)), squeeze=False)
    for ax, (name, index) in zip(axes[:, 0], series.items(), strict=True):
        for i in np.flatnonzero(members[name]):
            vm_type, zone = vms[int(i)]
            ax.plot(dates, normalized[:, i], lw=0.4, alpha=0.55, label=f"{vm_type}/{zone}")
        ax.plot(dates, index, color="black", lw=1.2, label="index")
        ax.set_yscale("log")
        ax.set_ylabel("$/h per √(vCPU·GB)")
        ax.set_title(f"{by} {name}", fontsize=9)
        # Beside the plot, where it hides no price (the file is cut to fit it).
        ax.legend(
            fontsize=6,
            ncol=1 + len(ax.get_lines()) // 16,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0.0,
        )
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
