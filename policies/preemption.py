"""VM lifetime (preemption) models: the bathtub model of docs/design.md#preemption-models and the classic
alternatives, on one interface.

Time is in hours. Every model may have a deadline L (Google: 24 h): a VM still
alive at L is preempted at L, so the distribution is a continuous part F_c on
[0, L) plus a point mass 1 - F_c(L-) at L:

    F(t) = F_c(t) for t < L,   F(t) = 1 for t >= L.

Models:
- `Bathtub(A, tau1, tau2, b, L)`: F_c(t) = A·(1 - e^{-t/tau1} + e^{(t-b)/tau2}) - A·e^{-b/tau2}
  (paper eq. 1, shifted so that F(0) = 0 exactly, clipped to [0, 1]; docs/design.md#preemption-models),
  f(t) = A·(e^{-t/tau1}/tau1 + e^{(t-b)/tau2}/tau2) while F_c < 1.
- `Exponential(mttf_h, L)`: F_c = 1 - e^{-t/mttf} (memoryless).
- `Weibull(k, lam, L)`: F_c = 1 - exp(-(t/lam)^k).
- `GompertzMakeham(lam, alpha, beta, L)`: F_c = 1 - exp(-lam·t - (alpha/beta)(e^{beta·t} - 1)).
- `NoPreemption()`: never preempted.

Each model gives cdf, sf, pdf, hazard, the deadline mass, the expected lifetime,
`mass(a, b)` = P(a < ℒ <= b) and `first_moment(a, b)` = E[ℒ; a < ℒ <= b] (both
counting the deadline mass), sampling with the caller's numpy Generator, and
the censored log-likelihood used for fitting (docs/design.md#preemption-models "Fitting").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

# scipy is imported where it is used (a saturating bathtub's end, the quadrature the tests
# check against): importing scipy.optimize costs ~0.5 s of CPU, which every command and
# the daemon's start paid for models that never need it.

ArrayLike = float | np.ndarray

# Grid resolution for models without a closed-form inverse or first moment.
_GRID_POINTS = 8193


def _arr(t: ArrayLike) -> np.ndarray:
    return np.asarray(t, dtype=float)


class LifetimeModel:
    """Shared machinery; subclasses give `_cdf_c` and `_pdf_c` (the continuous part)."""

    name = "model"
    draws = True  # each lifetime takes one uniform draw (`sample_h`, `lifetimes_h`)
    L: float | None

    # --- the continuous part (subclasses) ---------------------------------------

    def _cdf_c(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _pdf_c(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _moment_c(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """∫_a^b t f_c(t) dt for 0 <= a <= b <= end; by default from a cached grid."""
        grid, cumulative = self._moment_grid
        return np.interp(b, grid, cumulative) - np.interp(a, grid, cumulative)

    # --- the distribution --------------------------------------------------------

    @property
    def end_h(self) -> float:
        """Where the distribution ends: the deadline L (or a horizon when there is none)."""
        return self.L if self.L is not None else self._horizon_h()

    @functools.cached_property
    def _horizon(self) -> float:
        """Without a deadline: where nearly every VM has died (F_c >= 1 - 1e-10)."""
        t = 1.0
        while t < 1e8 and float(self._cdf_c(np.array(t))) < 1.0 - 1e-10:
            t *= 2.0
        return t

    def _horizon_h(self) -> float:
        return self._horizon

    def _grid(self) -> np.ndarray:
        """Evaluation points on [0, end]: even steps, plus geometric ones that resolve the
        mass near 0 of heavy-tailed models over a long horizon."""
        end = self.end_h
        even = np.linspace(0.0, end, _GRID_POINTS)
        geometric = np.geomspace(end * 1e-9, end, _GRID_POINTS)
        return np.unique(np.concatenate([even, geometric]))

    @property
    def parameters(self) -> dict[str, float]:
        # Every concrete model is a dataclass; this base class is not one.
        model: Any = self
        return {f.name: getattr(self, f.name) for f in fields(model) if f.name != "L"}

    @property
    def n_params(self) -> int:
        return len(self.parameters)

    def cdf(self, t_h: ArrayLike) -> np.ndarray:
        t = _arr(t_h)
        out = np.clip(self._cdf_c(np.maximum(t, 0.0)), 0.0, 1.0)
        # F(0) = 0 exactly: the bathtub's F_c(0) is A·e^{-b/tau2} minus itself, which
        # rounds to ~1e-17 rather than 0.
        out = np.where(t <= 0, 0.0, out)
        if self.L is not None:
            out = np.where(t >= self.L, 1.0, out)
        return out

    def sf(self, t_h: ArrayLike) -> np.ndarray:
        return 1.0 - self.cdf(t_h)

    def pdf(self, t_h: ArrayLike) -> np.ndarray:
        """Density of the continuous part (the deadline mass is not a density)."""
        t = _arr(t_h)
        inside = (t >= 0) & (self._cdf_c(np.maximum(t, 0.0)) < 1.0)
        if self.L is not None:
            inside &= t < self.L
        return np.where(inside, self._pdf_c(np.maximum(t, 0.0)), 0.0)

    def hazard(self, t_h: ArrayLike) -> np.ndarray:
        """h(t) = f(t) / S(t) (infinite where nothing survives)."""
        f, s = self.pdf(t_h), self.sf(t_h)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s > 0, f / np.where(s > 0, s, 1.0), np.inf)

    def deadline_mass(self) -> float:
        """P(ℒ = L): VMs that live until the deadline are reclaimed there."""
        return self._deadline_mass

    @functools.cached_property
    def _deadline_mass(self) -> float:
        # Once per model: every sampled lifetime asks (the sim driver, at each launch).
        if self.L is None:
            return 0.0
        return float(1.0 - np.clip(self._cdf_c(np.array(self.L)), 0.0, 1.0))

    def mass(self, a_h: ArrayLike, b_h: ArrayLike) -> np.ndarray:
        """P(a < ℒ <= b), the deadline mass included."""
        return self.cdf(b_h) - self.cdf(a_h)

    def first_moment(self, a_h: ArrayLike, b_h: ArrayLike) -> np.ndarray:
        """E[ℒ · 1{a < ℒ <= b}], the deadline mass included."""
        a, b = np.broadcast_arrays(_arr(a_h), _arr(b_h))
        end = self.end_h
        lo, hi = np.clip(a, 0.0, end), np.clip(b, 0.0, end)
        out = self._moment_c(lo, np.maximum(lo, hi))
        if self.L is not None:
            out = out + np.where((a < self.L) & (b >= self.L), self.L * self.deadline_mass(), 0.0)
        return out

    def expected_lifetime_h(self) -> float:
        """E[ℒ] = ∫_0^L t f(t) dt + L·(1 - F(L-))  (docs/design.md#preemption-models)."""
        return float(self.first_moment(0.0, self.end_h))

    def mean_residual_life_h(self, age_h: ArrayLike) -> np.ndarray:
        """E[ℒ - a | ℒ > a] = ∫_a^end S(t) dt / S(a) for each age a: how long a VM of
        that age is expected to live on (0 where nothing survives). One cumulative
        trapezoid over the model's grid serves every age; infinite for NoPreemption."""
        if math.isinf(self.expected_lifetime_h()):
            return np.full(np.shape(age_h), math.inf)
        grid = self._grid()
        s = self.sf(grid)
        area = np.concatenate(([0.0], np.cumsum(np.diff(grid) * (s[1:] + s[:-1]) / 2.0)))
        a = np.clip(_arr(age_h), 0.0, self.end_h)
        tail = area[-1] - np.interp(a, grid, area)
        alive = self.sf(a)
        return np.where(alive > 0, tail / np.where(alive > 0, alive, 1.0), 0.0)

    def drawing_horizon_h(self, oldest_age_h: float = 0.0) -> float:
        """Where a chart of S(t) and h(t) should end: the deadline, else where 99 % of
        VMs have died (24 h if they never do), and past the oldest VM to be shown."""
        end = self.L
        if end is None:
            end = 1.0
            while end < 1e4 and float(self.cdf(end)) < 0.99:
                end *= 2.0
            if float(self.cdf(end)) < 0.99:
                end = 24.0
        return max(end, 1.1 * oldest_age_h)

    def conditional_failure(self, age_h: ArrayLike, length_h: ArrayLike) -> np.ndarray:
        """P(preempted within `length` | alive at `age`) = (F(s+T) - F(s)) / S(s)."""
        s = _arr(age_h)
        survive = self.sf(s)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(
                survive > 0,
                self.mass(s, s + _arr(length_h)) / np.where(survive > 0, survive, 1.0),
                1.0,
            )

    def expected_loss_h(self, age_h: ArrayLike, length_h: ArrayLike) -> np.ndarray:
        """E[ℒ - s | s < ℒ <= s + T]: work lost by a job of length T started at age s, if it fails."""
        s, t = np.broadcast_arrays(_arr(age_h), _arr(length_h))
        m = self.mass(s, s + t)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(
                m > 0, (self.first_moment(s, s + t) - s * m) / np.where(m > 0, m, 1.0), 0.0
            )

    # --- sampling -------------------------------------------------------------------

    @functools.cached_property
    def _inverse_grid(self) -> tuple[np.ndarray, np.ndarray]:
        t = self._grid()
        cdf = np.clip(self._cdf_c(t), 0.0, 1.0)
        return t, np.maximum.accumulate(cdf)

    @functools.cached_property
    def _moment_grid(self) -> tuple[np.ndarray, np.ndarray]:
        t = self._grid()
        values = t * np.where(self._cdf_c(t) < 1.0, self._pdf_c(t), 0.0)
        cumulative = np.concatenate([[0.0], np.cumsum((values[1:] + values[:-1]) / 2 * np.diff(t))])
        return t, cumulative

    def _ppf_c(self, u: np.ndarray) -> np.ndarray:
        """Inverse of the continuous part, for u below F_c(end)."""
        t, cdf = self._inverse_grid
        return np.interp(u, cdf, t)

    def sample_h(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lifetimes: `lifetimes_h` of n uniform draws."""
        return self.lifetimes_h(rng.random(n))

    def lifetimes_h(self, u: np.ndarray) -> np.ndarray:
        """The lifetimes of uniform draws `u` in [0, 1) by inverse transform; draws
        beyond F_c(L-) land on the deadline. (Element by element: the lifetimes of a
        block of draws are those of each draw alone.)"""
        top = 1.0 - self.deadline_mass() if self.L is not None else 1.0
        lifetimes = self._ppf_c(np.minimum(u, top))
        if self.L is not None:
            lifetimes = np.where(u >= top, self.L, lifetimes)
        return lifetimes

    # --- fitting support --------------------------------------------------------------

    def log_likelihood(
        self, lifetimes_h: np.ndarray, preempted: np.ndarray, deadline_window_h: float = 0.25
    ) -> float:
        """Censored log-likelihood (docs/design.md#preemption-models): log f(t) per preemption before the deadline
        window; log P(L - w < ℒ <= L) per preemption within `deadline_window_h` = w of L
        or after it (reported at the deadline: it died in the window or at L, so the
        window's continuous mass counts too, not only the point mass); log S(t) per VM
        stopped by its user or still running."""
        return self.split_log_likelihood(
            SplitLifetimes.of(lifetimes_h, preempted, self.L, deadline_window_h)
        )

    def split_log_likelihood(self, data: SplitLifetimes) -> float:
        """`log_likelihood` of lifetimes split once for a deadline (a fit evaluates
        thousands of parameter sets on the same split).

        The same arithmetic as `cdf`, `sf` and `pdf` element by element, in one
        evaluation of F_c over every point (the early preemptions, the censored
        lifetimes and the window's start) and one of f_c over the early ones: their
        masks, which depend on the points only, are taken once in the split. A fit
        spends most of its time here, in numpy's per-call overhead on ~1,000 points."""
        n_early = len(data.early)
        continuous = self._cdf_c(data.points)
        cdf = np.minimum(np.maximum(continuous, 0.0), 1.0)  # np.clip's values, without its wrapper
        if data.at_or_below_zero is not None:  # F(0) = 0 exactly (see `cdf`)
            cdf = np.where(data.at_or_below_zero, 0.0, cdf)
        if data.at_or_after_deadline is not None:
            cdf = np.where(data.at_or_after_deadline, 1.0, cdf)
        window_mass = float(1.0 - cdf[-1]) if data.late else 1.0
        if window_mass <= 0:
            return -math.inf
        inside = continuous[:n_early] < 1.0
        if data.early_outside is not None:  # before 0 or at/after L: no density
            inside &= ~data.early_outside
        density = np.where(inside, self._pdf_c(data.points[:n_early]), 0.0)
        survival = 1.0 - cdf[n_early : n_early + len(data.censored)]
        with np.errstate(divide="ignore"):
            total = (
                float(np.log(density).sum())
                + float(data.late) * math.log(window_mass)
                + float(np.log(survival).sum())
            )
        return total if math.isfinite(total) else -math.inf


@dataclass(frozen=True)
class SplitLifetimes:
    """Lifetimes as the censored log-likelihood uses them, for a deadline L and window w:
    the preemptions before the window (`early`), how many fell in it or after (`late`),
    and the censored lifetimes (capped just below L: alive just before it).

    `points` are the early lifetimes, the censored ones and the window's start, at 0 or
    after (where `cdf` and `pdf` evaluate the continuous part); the masks say which
    points `cdf` and `pdf` set to 0 or 1 whatever the model (None where none does)."""

    early: np.ndarray
    late: int
    censored: np.ndarray
    window_start: float
    points: np.ndarray
    at_or_below_zero: np.ndarray | None
    at_or_after_deadline: np.ndarray | None
    early_outside: np.ndarray | None

    @classmethod
    def of(
        cls, lifetimes_h: ArrayLike, preempted, L: float | None, deadline_window_h: float = 0.25
    ) -> SplitLifetimes:
        t = _arr(lifetimes_h)
        event = np.asarray(preempted, dtype=bool)
        window_start = L - deadline_window_h if L is not None else math.inf
        at_deadline = t >= window_start
        censored = t[~event]
        if L is not None:  # a VM stopped at or after L was alive just before it
            censored = np.minimum(censored, L - 1e-9)
        early = t[event & ~at_deadline]
        late = int((event & at_deadline).sum())
        # The window's start is evaluated only when a preemption fell in the window.
        raw = np.concatenate([early, censored, [window_start] if late else []])
        beyond = raw >= L if L is not None else np.zeros(len(raw), dtype=bool)
        outside = (early < 0) | beyond[: len(early)]

        def mask(m: np.ndarray) -> np.ndarray | None:
            return m if m.any() else None

        return cls(
            early,
            late,
            censored,
            window_start,
            np.maximum(raw, 0.0),
            mask(raw <= 0),
            mask(beyond),
            mask(outside),
        )


@dataclass(frozen=True)
class NoPreemption(LifetimeModel):
    """A VM that is never preempted (on-demand capacity, or preemption switched off)."""

    L: float | None = None
    name = "none"
    draws = False  # its lifetimes take no random draw

    def _cdf_c(self, t):
        return np.zeros_like(_arr(t))

    def _pdf_c(self, t):
        return np.zeros_like(_arr(t))

    def expected_lifetime_h(self) -> float:
        return math.inf

    def sample_h(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, math.inf)

    def lifetimes_h(self, u: np.ndarray) -> np.ndarray:
        return np.full(len(u), math.inf)


@dataclass(frozen=True)
class Exponential(LifetimeModel):
    """Memoryless lifetimes: constant hazard 1/mttf_h."""

    mttf_h: float
    L: float | None = None
    name = "exponential"

    def __post_init__(self) -> None:
        if not self.mttf_h > 0:
            raise ValueError(f"mttf_h must be > 0, got {self.mttf_h}")
        if self.L is not None and not self.L > 0:
            raise ValueError(f"L must be > 0, got {self.L}")

    def _horizon_h(self) -> float:
        return 50.0 * self.mttf_h

    def _cdf_c(self, t):
        return -np.expm1(-_arr(t) / self.mttf_h)

    def _pdf_c(self, t):
        return np.exp(-_arr(t) / self.mttf_h) / self.mttf_h

    def _moment_c(self, a, b):
        m = self.mttf_h

        def g(t):  # antiderivative of t·f(t)
            return -(t + m) * np.exp(-t / m)

        return g(b) - g(a)

    def _ppf_c(self, u):
        return -self.mttf_h * np.log1p(-u)

    def expected_lifetime_h(self) -> float:
        if self.L is None:
            return self.mttf_h
        return self.mttf_h * -math.expm1(-self.L / self.mttf_h)


@dataclass(frozen=True)
class Weibull(LifetimeModel):
    """F_c = 1 - exp(-(t/lam)^k): k < 1 early failures, k > 1 wear-out."""

    k: float
    lam: float
    L: float | None = None
    name = "weibull"

    def _cdf_c(self, t):
        return -np.expm1(-((_arr(t) / self.lam) ** self.k))

    def _pdf_c(self, t):
        t = np.maximum(_arr(t), 1e-300)
        z = (t / self.lam) ** self.k
        return self.k / t * z * np.exp(-z)

    def _ppf_c(self, u):
        return self.lam * (-np.log1p(-u)) ** (1.0 / self.k)


@dataclass(frozen=True)
class GompertzMakeham(LifetimeModel):
    """F_c = 1 - exp(-lam·t - (alpha/beta)(e^{beta·t} - 1)): constant + ageing hazard."""

    lam: float
    alpha: float
    beta: float
    L: float | None = None
    name = "gompertz_makeham"

    def _cumhaz(self, t):
        t = _arr(t)
        with np.errstate(over="ignore"):  # far beyond the horizon: the hazard is infinite
            return self.lam * t + self.alpha / self.beta * np.expm1(self.beta * t)

    def _cdf_c(self, t):
        return -np.expm1(-self._cumhaz(t))

    def _pdf_c(self, t):
        t = _arr(t)
        with np.errstate(over="ignore"):
            return (self.lam + self.alpha * np.exp(self.beta * t)) * np.exp(-self._cumhaz(t))


@dataclass(frozen=True)
class Bathtub(LifetimeModel):
    """Two failure processes: early preemptions (rate 1/tau1) and reclamation near the
    deadline (rate 1/tau2, activated around b). Paper eq. 1, shifted so F(0) = 0."""

    A: float
    tau1: float
    tau2: float
    b: float
    L: float | None = 24.0
    name = "bathtub"

    def __post_init__(self) -> None:
        for name in ("A", "tau1", "tau2", "b"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def _horizon_h(self) -> float:
        return self.b + 50.0 * self.tau2

    def _raw(self, t):
        t = _arr(t)
        with np.errstate(over="ignore"):
            return self.A * (-np.expm1(-t / self.tau1) + np.exp((t - self.b) / self.tau2))

    @functools.cached_property
    def _offset(self) -> float:
        return float(self.A * math.exp(-self.b / self.tau2))

    @functools.cached_property
    def saturation_h(self) -> float:
        """Where F_c reaches 1 (every VM preempted before the deadline), else inf."""
        end = self.L if self.L is not None else self._horizon_h()
        if self._raw(end) - self._offset < 1.0:
            return math.inf
        from scipy import optimize

        return float(optimize.brentq(lambda t: float(self._raw(t)) - self._offset - 1.0, 0.0, end))

    @property
    def end_h(self) -> float:
        return min(super().end_h, self.saturation_h)

    def _cdf_c(self, t):
        return self._raw(t) - self._offset

    def _pdf_c(self, t):
        t = _arr(t)
        with np.errstate(over="ignore"):
            return self.A * (
                np.exp(-t / self.tau1) / self.tau1 + np.exp((t - self.b) / self.tau2) / self.tau2
            )

    def _moment_c(self, a, b):
        """∫ t f(t) dt = [-A(t + tau1)e^{-t/tau1} + A(t - tau2)e^{(t-b)/tau2}]  (paper eq. 3)."""

        def g(t):
            with np.errstate(over="ignore"):
                return self.A * (
                    -(t + self.tau1) * np.exp(-t / self.tau1)
                    + (t - self.tau2) * np.exp((t - self.b) / self.tau2)
                )

        return g(_arr(b)) - g(_arr(a))

    def deadline_mass(self) -> float:
        if self.L is None or self.saturation_h < self.L:
            return 0.0
        return super().deadline_mass()


def fit(
    lifetimes_h, preempted, model: str = "bathtub", method: str = "mle", L: float | None = 24.0
):
    """Fit a model to lifetimes (hours) and preempted flags; see policies.fitting.fit
    (censoring-aware MLE by default, the paper's least squares with method="lsq")."""
    from policies.fitting import fit as fit_model  # fitting builds on this module

    return fit_model(lifetimes_h, preempted, model=model, method=method, L=L)


def quad_first_moment(model: LifetimeModel, a: float, b: float) -> float:
    """∫_a^b t f(t) dt by adaptive quadrature (to check the closed forms and grids).

    The density drops to 0 at the model's end (a bathtub whose F_c reaches 1 before the
    deadline stops there): that jump is a breakpoint, or quadrature can step over the
    last sliver of mass."""
    from scipy import integrate

    end = model.end_h
    points = [end] if a < end < b else None
    value, _ = integrate.quad(lambda t: t * float(model.pdf(t)), a, b, limit=200, points=points)
    return value


MODELS: dict[str, type[LifetimeModel]] = {
    "none": NoPreemption,
    "exponential": Exponential,
    "weibull": Weibull,
    "gompertz_makeham": GompertzMakeham,
    "bathtub": Bathtub,
}


def make_model(name: str, parameters: dict[str, float], L: float | None) -> LifetimeModel:
    """A model from its name and parameters (as stored in JSON)."""
    try:
        cls = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown preemption model {name!r}; known: {', '.join(MODELS)}") from None
    if cls is NoPreemption:
        return NoPreemption()
    make: Callable[..., LifetimeModel] = cls  # the dataclass constructor of that model
    return make(**parameters, L=L)
