"""Fitting lifetime data for the CLI: groups of observations, all model families per
group, and writing a model registry file (the shipped defaults are made this way)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.plumbing.blas import one_blas_thread
from policies.fitting import FitResult, KaplanMeier, at_deadline, fit, kaplan_meier
from policies.registry import Observation, fit_registry

CLASSIC = ("exponential", "weibull", "gompertz_makeham")


@dataclass(frozen=True)
class GroupFit:
    labels: dict[str, str]
    n: int
    fits: dict[str, FitResult]
    kaplan_meier: KaplanMeier

    @property
    def title(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "all"


def fit_groups(
    observations: Sequence[Observation],
    columns: Sequence[str],
    value: Callable[[Observation, str], str],
    *,
    method: str,
    L: float,
    classic_deadline: bool,
    min_samples: int,
) -> tuple[list[GroupFit], list[str]]:
    """Fit every family to every group (largest groups first); groups smaller than
    `min_samples` or without a preemption are returned by name as skipped."""
    grouped: dict[tuple[str, ...], list[Observation]] = {}
    for observation in observations:
        grouped.setdefault(tuple(value(observation, c) for c in columns), []).append(observation)
    results, skipped = [], []
    # Once for every group: threadpoolctl finds the BLAS libraries by walking every
    # shared object loaded (~20 ms each time).
    with one_blas_thread():
        for values, group in sorted(grouped.items(), key=lambda item: (-len(item[1]), item[0])):
            labels = dict(zip(columns, values, strict=True))
            lifetimes = [o.lifetime_h for o in group]
            preempted = [o.preempted for o in group]
            if len(group) < min_samples or not any(preempted):
                skipped.append((", ".join(values) or "all") + f" ({len(group)})")
                continue
            fits = {"bathtub": fit(lifetimes, preempted, "bathtub", method, L)}
            for name in CLASSIC:
                fits[name] = fit(
                    lifetimes, preempted, name, method, L if classic_deadline else None
                )
            flags = np.asarray(preempted, dtype=bool)
            km = kaplan_meier(
                at_deadline(np.asarray(lifetimes, dtype=float), flags, L, 0.25), flags
            )
            results.append(GroupFit(labels, len(group), fits, km))
    return results, skipped


def write_registry(
    observations: Sequence[Observation],
    path: str | Path,
    *,
    source_name: str,
    method: str,
    L: float,
    min_samples: int,
    command: str,
) -> int:
    """Fit a bathtub registry (with the other families' statistics for comparison) and
    write it as JSON; returns how many models it holds."""
    with one_blas_thread():
        registry = fit_registry(
            observations,
            min_samples=min_samples,
            L=L,
            method=method,
            source="default",
            fitted_at=time.time(),
            compare=True,
        )
    document = {
        "generated_by": command,
        "data": source_name,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **registry.to_dict(),
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")
    return len(registry.entries)
