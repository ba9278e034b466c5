"""Plots (matplotlib, imported only when a plot is asked for: pip install spotbag[plot])."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from policies.fitting import FitResult, KaplanMeier


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'spotbag[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fits(
    groups: Sequence[tuple[str, KaplanMeier, Mapping[str, FitResult]]],
    out: str | Path,
    L: float = 24.0,
) -> None:
    """Per group: the Kaplan–Meier CDF with every fitted CDF, and the fitted hazards."""
    plt = _pyplot()
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
        cdf_axis.set(
            title=f"{title}: CDF of VM lifetime",
            xlabel="hours since launch",
            ylabel="P(preempted by t)",
        )
        cdf_axis.legend(fontsize=7)
        hazard_axis.set(
            title=f"{title}: hazard rate (the deadline mass at L is not drawn)",
            xlabel="hours since launch",
            ylabel="preemptions per hour",
            yscale="log",
            ylim=(1e-3, 20.0),
        )
        hazard_axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_reuse_evaluation(
    ages_h: np.ndarray,
    always: np.ndarray,
    model_policy: np.ndarray,
    fresh: float,
    lengths_h: np.ndarray,
    mean_always: np.ndarray,
    mean_model: np.ndarray,
    job_h: float,
    title: str,
    out: str | Path,
) -> None:
    """Job failure probability by VM age (one job length), and averaged over ages by job length."""
    plt = _pyplot()
    figure, (by_age, by_length) = plt.subplots(1, 2, figsize=(12, 4))
    by_age.plot(ages_h, always, "o-", label="always reuse (memoryless)")
    by_age.plot(ages_h, model_policy, "s-", label="model policy")
    by_age.axhline(fresh, color="gray", linestyle=":", label=f"fresh VM ({fresh:.2f})")
    by_age.set(
        title=f"{title}: {job_h:g}-hour jobs",
        xlabel="VM age when the job starts (hours)",
        ylabel="job failure probability",
        ylim=(0, 1.05),
    )
    by_age.legend()
    by_length.plot(lengths_h, mean_always, "o-", label="always reuse (memoryless)")
    by_length.plot(lengths_h, mean_model, "s-", label="model policy")
    by_length.set(
        title=f"{title}: mean over start ages",
        xlabel="job length (hours)",
        ylabel="mean job failure probability",
        ylim=(0, 1.05),
    )
    by_length.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_checkpoint_evaluation(
    ages_h: np.ndarray,
    by_age: Mapping[str, np.ndarray],
    lengths_h: np.ndarray,
    by_length: Mapping[str, np.ndarray],
    job_h: float,
    title: str,
    out: str | Path,
    target: float = 0.05,
) -> None:
    """Expected checkpointing overhead (expected makespan / work - 1) of each policy: for a
    `job_h` job by the VM age it starts at, and for jobs of each length on a fresh VM
    (the paper's figure 8). `by_age` / `by_length` map a policy label to overheads
    (fractions); the first policy is drawn solid, the others dashed."""
    plt = _pyplot()
    figure, (age_axis, length_axis) = plt.subplots(1, 2, figsize=(12, 4.2))
    markers = "os^vDx"
    for axis, x, curves in ((age_axis, ages_h, by_age), (length_axis, lengths_h, by_length)):
        for k, (label, overhead) in enumerate(curves.items()):
            axis.plot(
                x,
                100.0 * np.asarray(overhead, dtype=float),
                marker=markers[k % len(markers)],
                linestyle="-" if k == 0 else "--",
                markersize=4,
                label=label,
            )
        axis.axhline(100.0 * target, color="gray", linestyle=":", label=f"{100 * target:g}%")
        axis.set_ylim(bottom=0.0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    age_axis.set(
        title=f"{title}: {job_h:g}-hour job by VM age at start",
        xlabel="VM age when the job starts (hours)",
        ylabel="expected increase in running time (%)",
    )
    length_axis.set(
        title=f"{title}: jobs started on a fresh VM",
        xlabel="job length (hours of work)",
        ylabel="expected increase in running time (%)",
    )
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_checkpoint_plan(model, schedules, start_age_h: float, out: str | Path) -> None:
    """The checkpoint times of one or more schedules (policies.checkpoint.Schedule), one
    row per policy labelled with its expected overhead, on the time since the job
    started (if nothing fails), over the model's hazard rate at the VM's age then
    (start age + elapsed; the deadline mass is not drawn)."""
    plt = _pyplot()
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
            f"overhead {100 * schedule.overhead:.1f}%"
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
    """Prepaid vs on-demand cores (SPEC.md §7), one row per core type given as
    (label, prepaid core counts x, savings(x), T(≥x)/period, optimal x): the savings
    curve with its optimum marked, and how busy the x-th core would be against the
    break-even utilisation (the optimum is the last x at or above it)."""
    plt = _pyplot()
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
            f"{optimum:,} cores: \\${best:,.0f}",
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
            label=f"break-even {100 * break_even:.1f}%",
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


def plot_index(out: str | Path, times_s, series: Mapping[str, np.ndarray], normalized, trace, by):
    """The index of each composition over its members' normalised prices (log scale)."""
    import datetime as dt

    plt = _pyplot()
    dates = [dt.datetime.fromtimestamp(t, dt.UTC) for t in times_s]
    fig, axes = plt.subplots(len(series), 1, figsize=(11, 2.6 * len(series)), squeeze=False)
    for ax, (name, index) in zip(axes[:, 0], series.items(), strict=True):
        for i, (vm_type, zone) in enumerate(trace.vms):
            member = (
                (zone == name)
                if by == "zone"
                else (vm_type.split(".")[0] == name if by == "family" else True)
            )
            if member:
                ax.plot(dates, normalized[:, i], lw=0.4, alpha=0.55, label=f"{vm_type}/{zone}")
        ax.plot(dates, index, color="black", lw=1.2, label="index")
        ax.set_yscale("log")
        ax.set_ylabel("$/h per √(vCPU·GB)")
        ax.set_title(f"{by} {name}", fontsize=9)
        ax.legend(fontsize=6, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_hopping(out: str | Path, rows: Sequence[Mapping], title: str) -> None:
    """Cost (normalised to on-demand) against availability, one point per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        ax.scatter(row["normalized_cost"], row["availability"], s=40)
        ax.annotate(
            f"{row['policy']} ({row['migrations']} moves)",
            (row["normalized_cost"], row["availability"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set_xlabel("cost / cheapest fitting on-demand")
    ax.set_ylabel("availability")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
