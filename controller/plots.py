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
