"""Fitting lifetime models to observed VM lifetimes, and how good a fit is (docs/design.md#preemption-models).

Data: lifetimes in hours and whether each VM was preempted (True) or stopped by
its user / still running (False: right-censored).

Methods:
- "mle" (default): maximum likelihood with right censoring. A preemption before
  the deadline window contributes log f(t), one at the deadline (within
  `deadline_window_h` of L, or after it) contributes log of the deadline mass, a
  censored VM contributes log S(t). Parameters are fitted in an unconstrained
  (log / bounded) space from several starting points.
- "lsq": the paper's method, for comparison: least squares of the model CDF to
  the empirical CDF of the *preempted* VMs only (scipy curve_fit, dogbox). It
  ignores censored VMs, which biases the fit toward short lifetimes.

Goodness of fit, the same for every method: R² and the KS distance of the model
CDF against the Kaplan–Meier estimate (which accounts for censoring) at the event
times, the censored log-likelihood, and AIC = 2k - 2·logL.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from policies.preemption import (
    Bathtub,
    Exponential,
    GompertzMakeham,
    LifetimeModel,
    SplitLifetimes,
    Weibull,
)

MODEL_NAMES = ("bathtub", "exponential", "weibull", "gompertz_makeham")
_PENALTY = 1e12


@dataclass(frozen=True)
class KaplanMeier:
    """Kaplan–Meier estimate: S jumps to `survival[i]` at `times[i]` (distinct event times)."""

    times: np.ndarray
    survival: np.ndarray

    def cdf(self, t_h: np.ndarray | float) -> np.ndarray:
        """Right-continuous estimate of F(t) = 1 - S(t)."""
        index = np.searchsorted(self.times, np.asarray(t_h, dtype=float), side="right") - 1
        s = np.where(index >= 0, self.survival[np.maximum(index, 0)], 1.0)
        return 1.0 - s


def kaplan_meier(lifetimes_h: np.ndarray, preempted: np.ndarray) -> KaplanMeier:
    """S(t) = Π_{t_i <= t} (1 - d_i / n_i) over distinct event times t_i, with d_i events
    and n_i VMs still observed just before t_i (censored ones leave after their time)."""
    t = np.asarray(lifetimes_h, dtype=float)
    event = np.asarray(preempted, dtype=bool)
    order = np.argsort(t, kind="stable")
    t, event = t[order], event[order]
    times, first = np.unique(t, return_index=True)
    at_risk = len(t) - first
    deaths = np.add.reduceat(event.astype(float), first) if len(t) else np.array([])
    keep = deaths > 0
    survival = np.cumprod(1.0 - deaths[keep] / at_risk[keep])
    return KaplanMeier(times[keep], survival)


@dataclass(frozen=True)
class FitResult:
    model: LifetimeModel
    method: str
    n: int
    preempted: int
    censored: int
    log_likelihood: float
    aic: float
    r2: float
    ks: float

    def summary(self) -> dict:
        return {
            "model": self.model.name,
            "parameters": self.model.parameters,
            "L": self.model.L,
            "method": self.method,
            "n": self.n,
            "preempted": self.preempted,
            "censored": self.censored,
            "log_likelihood": self.log_likelihood,
            "aic": self.aic,
            "r2": self.r2,
            "ks": self.ks,
            "expected_lifetime_h": self.model.expected_lifetime_h(),
        }


def goodness(
    model: LifetimeModel,
    km: KaplanMeier,
    deadline_window_h: float = 0.25,
    until_h: float | None = None,
) -> tuple[float, float]:
    """(R², KS) of the model CDF against the Kaplan–Meier CDF.

    KS compares both sides of every jump of the estimate. Preemptions within
    `deadline_window_h` of the deadline are reported at L (see `at_deadline`), so the
    comparison stops where that window starts (there both are compared once, from the
    left), and, with `until_h`, also covers the flat stretch after the last jump."""
    cutoff = model.L - deadline_window_h if model.L is not None else math.inf
    keep = km.times < cutoff
    times, empirical = km.times[keep], 1.0 - km.survival[keep]
    if len(times) == 0:
        return math.nan, math.nan
    fitted = model.cdf(times)
    before = np.concatenate([[0.0], empirical[:-1]])
    fitted_before = model.cdf(np.nextafter(times, -np.inf))
    gaps = [np.abs(fitted - empirical), np.abs(fitted_before - before)]
    end = (
        min(cutoff, until_h) if until_h is not None else (cutoff if math.isfinite(cutoff) else None)
    )
    if end is not None:  # from the last jump up to the window or the end of follow-up
        gaps.append(np.abs(model.cdf(np.array([end])) - empirical[-1]))
    ks = float(max(np.max(g) for g in gaps))
    residual = np.sum((empirical - fitted) ** 2)
    total = np.sum((empirical - empirical.mean()) ** 2)
    r2 = float(1.0 - residual / total) if total > 0 else math.nan
    return r2, ks


# --- parametrisations: unconstrained vector <-> model --------------------------------


@dataclass(frozen=True)
class _Family:
    build: Callable[[np.ndarray, float | None], LifetimeModel]
    starts: Callable[[np.ndarray, np.ndarray, float | None], list[np.ndarray]]
    bounds: Callable[[float | None], list[tuple[float, float]]]


def _bathtub(x: np.ndarray, L: float | None) -> Bathtub:
    a, log_tau1, log_tau2, b = x
    return Bathtub(A=float(a), tau1=math.exp(log_tau1), tau2=math.exp(log_tau2), b=float(b), L=L)


def _bathtub_starts(t, event, L):
    horizon = L or float(np.max(t))
    # A grid over the shapes the model can take: early phases of different weights and
    # speeds, and a second process that is a sharp rise just before the deadline (the
    # paper's b ≈ L, tau2 < 1), earlier, or a slow rise through the quiet middle.
    return [
        np.array([a, math.log(t1), math.log(t2), horizon + shift])
        for a in (0.2, 0.35, 0.5, 0.7)
        for t1 in (0.5, 1.5, 4.0)
        for t2, shift in (
            (0.5, 0.0),
            (0.7, -4.0),
            (1.0, -2.0),
            (1.0, 0.0),
            (3.0, 2.0),
            (20.0, 10.0),
            (100.0, 100.0),
        )
    ]


def _bathtub_bounds(L):
    horizon = L or 48.0
    return [
        (1e-3, 1.0),
        (math.log(0.02), math.log(200.0)),
        (math.log(0.02), math.log(2000.0)),
        (1e-3, horizon + 2000.0),
    ]


def _exponential(x, L):
    return Exponential(mttf_h=math.exp(x[0]), L=L)


def _weibull(x, L):
    return Weibull(k=math.exp(x[0]), lam=math.exp(x[1]), L=L)


def _gompertz(x, L):
    return GompertzMakeham(lam=math.exp(x[0]), alpha=math.exp(x[1]), beta=math.exp(x[2]), L=L)


def _scale(t: np.ndarray) -> float:
    return float(np.mean(t)) if len(t) else 1.0


FAMILIES: dict[str, _Family] = {
    "bathtub": _Family(_bathtub, _bathtub_starts, _bathtub_bounds),
    "exponential": _Family(
        _exponential,
        lambda t, e, L: [np.array([math.log(_scale(t))])],
        lambda L: [(math.log(1e-3), math.log(1e5))],
    ),
    "weibull": _Family(
        _weibull,
        lambda t, e, L: [np.array([math.log(k), math.log(_scale(t))]) for k in (0.5, 1.0, 2.0)],
        lambda L: [(math.log(0.05), math.log(20.0)), (math.log(1e-3), math.log(1e5))],
    ),
    "gompertz_makeham": _Family(
        _gompertz,
        lambda t, e, L: [
            np.array([math.log(1 / _scale(t)), math.log(a), math.log(b)])
            for a, b in ((1e-3, 0.2), (1e-2, 0.1), (1e-4, 0.4), (1e-9, 1.0))
        ],
        lambda L: [
            (math.log(1e-6), math.log(100.0)),
            (math.log(1e-15), math.log(100.0)),
            (math.log(1e-3), math.log(20.0)),
        ],
    ),
}


def _negative_log_likelihood(family: _Family, t, event, L, window):
    data = SplitLifetimes.of(t, event, L, window)  # once per fit, not per evaluation

    def objective(x: np.ndarray) -> float:
        try:
            value = family.build(x, L).split_log_likelihood(data)
        except (ValueError, OverflowError, ZeroDivisionError):
            return _PENALTY
        return -value if math.isfinite(value) else _PENALTY

    return objective


def _fit_mle(family: _Family, t, event, L, window, refine: int = 4) -> LifetimeModel:
    """Score every starting point, refine the best `refine` with L-BFGS-B, polish the
    winner with Nelder-Mead (robust where the likelihood has cliffs, e.g. a bathtub
    whose CDF saturates before the deadline)."""
    objective = _negative_log_likelihood(family, t, event, L, window)
    bounds = family.bounds(L)
    low, high = np.array([lo for lo, _ in bounds]), np.array([hi for _, hi in bounds])
    starts = [np.clip(start, low, high) for start in family.starts(t, event, L)]
    starts.sort(key=objective)
    best: tuple[float, np.ndarray] | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for start in starts[:refine]:
            result = optimize.minimize(objective, start, method="L-BFGS-B", bounds=bounds)
            if best is None or result.fun < best[0]:
                best = (float(result.fun), result.x)
        assert best is not None
        polished = optimize.minimize(
            objective,
            best[1],
            method="Nelder-Mead",
            bounds=bounds,
            options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 4000},
        )
    if polished.fun < best[0]:
        best = (float(polished.fun), polished.x)
    if best[0] >= _PENALTY:
        raise ValueError("no parameters give the data a finite likelihood")
    return family.build(best[1], L)


def _fit_lsq(family: _Family, t, event, L, refine: int = 4) -> LifetimeModel:
    """The paper's least squares on the ECDF of preempted lifetimes (censored VMs dropped).

    scipy's least_squares with the dogbox method, as curve_fit(method="dogbox") runs
    it, from the `refine` best starting points; the best point found is kept even when
    the evaluation budget runs out (curve_fit would raise instead)."""
    dead = np.sort(t[event])
    if len(dead) < 3:
        raise ValueError("least squares needs at least 3 preempted VMs")
    ecdf = np.arange(1, len(dead) + 1) / len(dead)
    bounds = family.bounds(L)
    low, high = np.array([lo for lo, _ in bounds]), np.array([hi for _, hi in bounds])

    def residuals(params: np.ndarray) -> np.ndarray:
        try:
            return family.build(params, L).cdf(dead) - ecdf
        except (ValueError, OverflowError):
            return np.full_like(ecdf, 1e3)

    def squared_error(params: np.ndarray) -> float:
        return float(np.sum(residuals(params) ** 2))

    starts = sorted(
        (np.clip(start, low, high) for start in family.starts(t, event, L)), key=squared_error
    )
    best: tuple[float, np.ndarray] | None = None
    for start in starts[:refine]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = optimize.least_squares(
                residuals, start, bounds=(low, high), method="dogbox", max_nfev=400 * len(start)
            )
        error = squared_error(result.x)
        if best is None or error < best[0]:
            best = (error, result.x)
    assert best is not None
    return family.build(best[1], L)


def at_deadline(
    lifetimes_h: np.ndarray, preempted: np.ndarray, L: float | None, window_h: float
) -> np.ndarray:
    """Lifetimes as the models see them: a preemption within `window_h` of the deadline
    (or after it: clocks and API calls lag) happened at L; a VM stopped at or after L
    was last seen alive just before L."""
    t = np.asarray(lifetimes_h, dtype=float)
    if L is None:
        return t
    event = np.asarray(preempted, dtype=bool)
    t = np.where(event & (t >= L - window_h), L, t)
    return np.where(~event & (t >= L), np.nextafter(L, 0.0), t)


def fit(
    lifetimes_h: Sequence[float] | np.ndarray,
    preempted: Sequence[bool] | np.ndarray,
    model: str = "bathtub",
    method: str = "mle",
    L: float | None = 24.0,
    deadline_window_h: float = 0.25,
) -> FitResult:
    """Fit one model family; returns the model with its goodness of fit."""
    if model not in FAMILIES:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(FAMILIES)}")
    if method not in ("mle", "lsq"):
        raise ValueError(f"unknown method {method!r}; known: mle, lsq")
    event = np.asarray(preempted, dtype=bool)
    t = at_deadline(np.asarray(lifetimes_h, dtype=float), event, L, deadline_window_h)
    if len(t) != len(event) or len(t) == 0:
        raise ValueError("lifetimes and preempted flags must be non-empty and of equal length")
    if not event.any():
        raise ValueError("no preemption among the lifetimes: nothing to fit")
    family = FAMILIES[model]
    fitted = (
        _fit_mle(family, t, event, L, deadline_window_h)
        if method == "mle"
        else _fit_lsq(family, t, event, L)
    )
    log_likelihood = fitted.log_likelihood(t, event, deadline_window_h)
    r2, ks = goodness(fitted, kaplan_meier(t, event), deadline_window_h, until_h=float(t.max()))
    return FitResult(
        model=fitted,
        method=method,
        n=len(t),
        preempted=int(event.sum()),
        censored=int((~event).sum()),
        log_likelihood=log_likelihood,
        aic=2 * fitted.n_params - 2 * log_likelihood,
        r2=r2,
        ks=ks,
    )


def fit_all(
    lifetimes_h,
    preempted,
    method: str = "mle",
    L: float | None = 24.0,
    models: Sequence[str] = MODEL_NAMES,
) -> dict[str, FitResult]:
    """Fit every model family to the same data (for comparison)."""
    return {name: fit(lifetimes_h, preempted, name, method, L) for name in models}


def sample_kaplan_meier(km: KaplanMeier, rng: np.random.Generator, n: int) -> np.ndarray:
    """n draws from a Kaplan–Meier estimate (inverse transform over its jumps); the
    mass it leaves undetermined after its last jump is drawn as infinity."""
    cdf = 1.0 - km.survival
    index = np.searchsorted(cdf, rng.random(n), side="right")
    times = np.append(km.times, np.inf)
    return times[np.minimum(index, len(km.times))]


@dataclass(frozen=True)
class DriftResult:
    distance: float  # KS distance between the recent lifetimes (Kaplan–Meier) and the model
    threshold: float  # the distance a sample from the model exceeds with probability alpha
    n: int

    @property
    def drifted(self) -> bool:
        return self.distance > self.threshold


def drift_test(
    model: LifetimeModel,
    lifetimes_h,
    preempted,
    *,
    rng: np.random.Generator,
    alpha: float = 0.05,
    draws: int = 200,
    deadline_window_h: float = 0.25,
) -> DriftResult:
    """Do recent lifetimes still follow `model`?

    The KS distance of their Kaplan–Meier estimate from the model CDF, against a
    parametric bootstrap: `draws` samples of the same size from the model, censored
    by times drawn from the sample's own censoring distribution (the reverse
    Kaplan–Meier: stops as events, preemptions as censored), give the distance that
    only a fraction `alpha` exceed. KS tables assume no censoring and would raise
    too many false alarms here."""
    event = np.asarray(preempted, dtype=bool)
    t = at_deadline(np.asarray(lifetimes_h, dtype=float), event, model.L, deadline_window_h)
    n = len(t)
    if n == 0 or not event.any():
        return DriftResult(0.0, math.inf, n)

    def distance(times: np.ndarray, died: np.ndarray) -> float:
        return goodness(
            model, kaplan_meier(times, died), deadline_window_h, until_h=float(times.max())
        )[1]

    observed = distance(t, event)
    censoring = kaplan_meier(t, ~event)
    simulated = []
    for _ in range(draws):
        lives = model.sample_h(rng, n)
        stop = sample_kaplan_meier(censoring, rng, n)
        died = lives <= stop
        if died.any():
            times = at_deadline(np.minimum(lives, stop), died, model.L, deadline_window_h)
            simulated.append(distance(times, died))
    threshold = float(np.quantile(simulated, 1.0 - alpha)) if simulated else math.inf
    return DriftResult(observed, threshold, n)
