"""Charts only the benchmarks draw (a bench script's own directory is on sys.path); the
tools' own charts are controller/tools/plots.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from controller.tools.plots import pyplot


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
    plt = pyplot()
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
    plt = pyplot()
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


def plot_hopping(out: str | Path, rows: Sequence[Mapping], title: str) -> None:
    """Cost (normalised to on-demand) against availability, one point per policy."""
    plt = pyplot()
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
