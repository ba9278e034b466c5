"""Prepaid (reserved) vs on-demand cores for one core type (docs/design.md#cost-reports).

A history (or forecast) of jobs is a set of intervals [start, end) each holding
`cores` cores. Over a period of P hours, u(t) is the number of cores in use and,
for x prepaid cores (paid for every hour of the period whether used or not),

    R(x)       = ∫ max(0, u(t) - x) dt                    on-demand core-hours left over;
    savings(x) = c_od·(A - R(x)) - c_pp·x·P               A = ∫ u(t) dt, all core-hours,

with prices per core-hour (c_pp: the prepaid price per core-hour of commitment,
i.e. an upfront amount per core divided by the term's hours). With T(≥x) the time
with at least x cores in use, the x-th prepaid core saves c_od·T(≥x) - c_pp·P:
non-increasing in x, so savings is concave in x and the optimum is the largest x
with T(≥x) ≥ (c_pp / c_od)·P, 0 if there is none. c_pp / c_od is the break-even
utilisation: a prepaid core pays off when it would be busy at least that fraction
of the period.

`usage_levels` reduces the intervals to the hours spent at each distinct level of
u(t) by one sweep over the sorted endpoints clipped to the period (O(n log n));
R, T(≥x), the savings curve and the exact optimum all follow from suffix sums
over the sorted levels, no search over x. Cores are whole numbers; times are in
any unit (`hours_per_unit` converts them to hours). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

HOURS_PER_YEAR = 8760.0  # the providers' year of a 1- or 3-year term (365 days)
TIE_TOLERANCE = 1e-12  # relative to the threshold: an exact tie must not fall to rounding
DEFAULT_CURVE_POINTS = 100_001  # beyond this many core counts the curve is sampled


@dataclass(frozen=True, eq=False)
class UsageLevels:
    """The level-duration distribution of u(t): `hours[i]` hours with exactly
    `levels[i]` cores in use (levels ascending, distinct; hours sum to `period_h`)."""

    levels: np.ndarray  # int64
    hours: np.ndarray  # float64
    period_h: float
    # Suffix sums over the sorted levels, with a 0 past the last level:
    # at_least_h[i] = Σ_{j>=i} hours[j] = T(≥ levels[i]); core_hours_from[i] = Σ_{j>=i} hours[j]·levels[j].
    at_least_h: np.ndarray = field(init=False, repr=False)
    core_hours_from: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        hours = np.asarray(self.hours, dtype=float)
        weighted = hours * np.asarray(self.levels, dtype=float)
        object.__setattr__(self, "at_least_h", np.append(np.cumsum(hours[::-1])[::-1], 0.0))
        object.__setattr__(self, "core_hours_from", np.append(np.cumsum(weighted[::-1])[::-1], 0.0))

    @property
    def max_cores(self) -> int:
        """The peak of u(t) (0 for an empty history)."""
        return int(self.levels[-1]) if self.levels.size else 0

    @property
    def core_hours(self) -> float:
        """A = ∫ u(t) dt over the period."""
        return float(self.core_hours_from[0])

    def time_at_least_h(self, x: float | np.ndarray) -> np.ndarray:
        """T(≥x): hours with at least x cores in use (the whole period for x <= 0)."""
        index = np.searchsorted(self.levels, np.asarray(x), side="left")
        return self.at_least_h[index]

    def residual_core_hours(self, x: float | np.ndarray) -> np.ndarray:
        """R(x) = ∫ max(0, u(t) - x) dt = Σ_{levels > x} hours·(level - x)."""
        x = np.asarray(x, dtype=float)
        if np.any(x < 0):
            raise ValueError("prepaid cores must not be negative")
        index = np.searchsorted(self.levels, x, side="right")
        residual = self.core_hours_from[index] - x * self.at_least_h[index]
        return np.maximum(residual, 0.0)  # rounding must not make it negative


def usage_levels(
    starts: np.ndarray,
    ends: np.ndarray,
    cores: np.ndarray,
    period_start: float | None = None,
    period_end: float | None = None,
    *,
    hours_per_unit: float = 1.0,
) -> UsageLevels:
    """The hours at each level of u(t) over [period_start, period_end) (default: the
    span of the intervals, first start to last end), by a sweep over the sorted
    endpoints clipped to the period. Intervals outside the period, of zero length
    or with 0 cores contribute nothing; times are in units of `hours_per_unit` hours
    (1/3600 for seconds)."""
    starts = np.asarray(starts, dtype=float).ravel()
    ends = np.asarray(ends, dtype=float).ravel()
    cores_in = np.asarray(cores).ravel()
    if not (starts.shape == ends.shape == cores_in.shape):
        raise ValueError(
            f"starts, ends and cores differ in length ({starts.size}, {ends.size}, {cores_in.size})"
        )
    if not (np.isfinite(starts).all() and np.isfinite(ends).all()):
        raise ValueError("interval times must be finite numbers")
    if np.any(ends < starts):
        first = int(np.argmax(ends < starts))
        raise ValueError(f"interval {first} ends before it starts")
    cores_f = cores_in.astype(float)
    if (
        not np.isfinite(cores_f).all()
        or np.any(cores_f < 0)
        or np.any(cores_f != np.round(cores_f))
    ):
        raise ValueError("cores must be whole numbers >= 0")
    if not hours_per_unit > 0:
        raise ValueError("hours_per_unit must be positive")
    counts = cores_f.astype(np.int64)

    lo = float(starts.min()) if starts.size else 0.0
    hi = float(ends.max()) if ends.size else lo
    lo = lo if period_start is None else float(period_start)
    hi = hi if period_end is None else float(period_end)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        raise ValueError(f"the period [{lo}, {hi}] is empty or reversed")
    period_h = (hi - lo) * hours_per_unit

    # Times relative to the period start keep their precision with epoch seconds.
    begin = np.clip(starts, lo, hi) - lo
    finish = np.clip(ends, lo, hi) - lo
    keep = (finish > begin) & (counts > 0)
    begin, finish, counts = begin[keep], finish[keep], counts[keep]
    if not counts.size:
        levels = np.zeros(1 if period_h > 0 else 0, dtype=np.int64)
        return UsageLevels(levels, np.full(levels.size, period_h), period_h)

    times = np.concatenate((begin, finish))
    steps = np.concatenate((counts, -counts))
    # Events at the same time may come in any order: the levels between them last 0 h
    # and are dropped. Every interval ends strictly after it starts, so levels are >= 0.
    order = np.argsort(times)
    times, steps = times[order], steps[order]
    after = np.cumsum(steps)  # the level from each event to the next one
    # Idle before the first event and after the last one (the level there is 0).
    edges = np.concatenate(([0.0], times, [hi - lo]))
    level = np.concatenate(([0], after))
    durations = np.diff(edges) * hours_per_unit
    peak = int(after.max())
    if peak <= 2 * level.size + 100_000:  # a dense table of levels is small: no second sort
        hours = np.bincount(level, weights=durations, minlength=peak + 1)
        distinct = np.arange(peak + 1, dtype=np.int64)
    else:
        distinct, inverse = np.unique(level, return_inverse=True)
        hours = np.bincount(inverse.ravel(), weights=durations, minlength=distinct.size)
    used = hours > 0
    return UsageLevels(distinct[used].astype(np.int64), hours[used], period_h)


def residual_on_demand_core_hours(usage: UsageLevels, x: float | np.ndarray) -> np.ndarray:
    """R(x) = ∫ max(0, u(t) - x) dt for one x or an array of x (vectorised)."""
    return usage.residual_core_hours(x)


def break_even_utilisation(on_demand_price: float, prepaid_price: float) -> float:
    """c_pp / c_od: the fraction of the period a prepaid core must be busy to pay off."""
    _check_prices(on_demand_price, prepaid_price)
    return prepaid_price / on_demand_price


def prepaid_hourly_price(upfront_per_core: float, term_years: float) -> float:
    """An upfront payment for one core over the whole term as a price per core-hour
    of commitment: upfront / (8760·years)."""
    if not upfront_per_core >= 0:
        raise ValueError("the upfront price must not be negative")
    if not term_years > 0:
        raise ValueError("the term must be positive")
    return upfront_per_core / (HOURS_PER_YEAR * term_years)


def savings(
    usage: UsageLevels, x: float | np.ndarray, on_demand_price: float, prepaid_price: float
) -> np.ndarray:
    """savings(x) = c_od·(A - R(x)) - c_pp·x·P against running everything on demand."""
    _check_prices(on_demand_price, prepaid_price)
    x = np.asarray(x, dtype=float)
    covered = usage.core_hours - usage.residual_core_hours(x)
    return on_demand_price * covered - prepaid_price * x * usage.period_h


@dataclass(frozen=True, eq=False)
class PrepaidOptimum:
    """The best number of prepaid cores for one core type and the savings curve."""

    optimal_cores: int
    savings: float  # at the optimum, against all on demand (>= 0)
    break_even_utilisation: float  # c_pp / c_od
    all_core_hours: float  # A
    residual_core_hours: float  # R at the optimum: still bought on demand
    period_h: float
    max_cores: int
    on_demand_price: float
    prepaid_price: float
    curve_cores: np.ndarray  # x, ascending from 0 to max_cores (sampled if huge)
    curve_savings: np.ndarray  # savings(x)
    curve_utilisation: np.ndarray  # T(≥x) / P: how busy the x-th core would be

    @property
    def all_on_demand_cost(self) -> float:
        return self.on_demand_price * self.all_core_hours

    @property
    def savings_fraction(self) -> float:
        """Savings as a fraction of the all-on-demand cost (0 when nothing ran)."""
        cost = self.all_on_demand_cost
        return self.savings / cost if cost > 0 else 0.0

    @property
    def prepaid_cost(self) -> float:
        return self.prepaid_price * self.optimal_cores * self.period_h

    @property
    def on_demand_cost(self) -> float:
        """What the residual core-hours cost on demand, at the optimum."""
        return self.on_demand_price * self.residual_core_hours

    @property
    def prepaid_never_pays(self) -> bool:
        """c_pp >= c_od: a prepaid core never costs less than its hours on demand."""
        return self.break_even_utilisation >= 1.0

    @property
    def optimal_utilisation(self) -> float:
        """T(≥x*) / P: the busy fraction of the last prepaid core (0 if none)."""
        if self.optimal_cores == 0:
            return 0.0
        index = np.searchsorted(self.curve_cores, self.optimal_cores)
        return float(self.curve_utilisation[index])


def optimal_prepaid_cores(
    usage: UsageLevels,
    on_demand_price: float,
    prepaid_price: float,
    *,
    max_curve_points: int = DEFAULT_CURVE_POINTS,
) -> PrepaidOptimum:
    """The exact optimum: the largest x with T(≥x) ≥ (c_pp/c_od)·P (0 if none, and
    0 when c_pp >= c_od). Between two consecutive levels T(≥x) is constant, so the
    answer is one of the levels: the highest level whose suffix of hours reaches the
    threshold. A core that exactly breaks even is taken (ties go to the larger x, as
    docs/design.md#cost-reports words the rule; a 1e-12 relative tolerance keeps rounding from
    splitting an exact tie). The curve covers every x from 0 to the peak, or `max_curve_points`
    evenly spaced ones plus the optimum when the peak is higher."""
    ratio = break_even_utilisation(on_demand_price, prepaid_price)
    at_least = usage.at_least_h[:-1]  # T(≥ levels[i])
    optimum = 0
    if ratio < 1.0 and usage.period_h > 0:
        threshold = ratio * usage.period_h * (1.0 - TIE_TOLERANCE)
        reaching = int(np.count_nonzero(at_least >= threshold))  # a prefix: non-increasing
        if reaching:
            optimum = int(usage.levels[reaching - 1])

    peak = usage.max_cores
    if peak + 1 <= max_curve_points:
        curve = np.arange(peak + 1, dtype=np.int64)
    else:
        sampled = np.round(np.linspace(0, peak, max(2, max_curve_points - 1))).astype(np.int64)
        curve = np.unique(np.append(sampled, optimum))
    curve_savings = savings(usage, curve, on_demand_price, prepaid_price)
    utilisation = (
        usage.time_at_least_h(curve) / usage.period_h
        if usage.period_h > 0
        else np.zeros(curve.size)
    )
    best = float(savings(usage, optimum, on_demand_price, prepaid_price))
    return PrepaidOptimum(
        optimal_cores=optimum,
        savings=best,
        break_even_utilisation=ratio,
        all_core_hours=usage.core_hours,
        residual_core_hours=float(usage.residual_core_hours(optimum)),
        period_h=usage.period_h,
        max_cores=peak,
        on_demand_price=float(on_demand_price),
        prepaid_price=float(prepaid_price),
        curve_cores=curve,
        curve_savings=curve_savings,
        curve_utilisation=utilisation,
    )


def optimal_by_core_type(
    starts: np.ndarray,
    ends: np.ndarray,
    cores: np.ndarray,
    core_types: np.ndarray | None,
    on_demand_price: float,
    prepaid_price: float,
    period_start: float | None = None,
    period_end: float | None = None,
    *,
    hours_per_unit: float = 1.0,
    max_curve_points: int = DEFAULT_CURVE_POINTS,
) -> dict[str, PrepaidOptimum]:
    """`optimal_prepaid_cores` separately for each core type (one shared period: the
    span of all intervals unless given), keyed by type in sorted order; all
    intervals under the key "all" when `core_types` is None."""
    starts = np.asarray(starts, dtype=float).ravel()
    ends = np.asarray(ends, dtype=float).ravel()
    cores = np.asarray(cores).ravel()
    lo = period_start if period_start is not None else (float(starts.min()) if starts.size else 0)
    hi = period_end if period_end is not None else (float(ends.max()) if ends.size else lo)
    if core_types is None:
        groups = {"all": np.ones(starts.size, dtype=bool)}
    else:
        labels = np.asarray(core_types).astype(str).ravel()
        if labels.size != starts.size:
            raise ValueError(f"{labels.size} core types for {starts.size} intervals")
        groups = {str(name): labels == name for name in np.unique(labels)}
    results = {}
    for name, mask in groups.items():
        usage = usage_levels(
            starts[mask], ends[mask], cores[mask], lo, hi, hours_per_unit=hours_per_unit
        )
        results[name] = optimal_prepaid_cores(
            usage, on_demand_price, prepaid_price, max_curve_points=max_curve_points
        )
    return results


def _check_prices(on_demand_price: float, prepaid_price: float) -> None:
    if not (math.isfinite(on_demand_price) and on_demand_price > 0):
        raise ValueError("the on-demand price must be a positive number")
    if not (math.isfinite(prepaid_price) and prepaid_price >= 0):
        raise ValueError("the prepaid price must not be negative")
