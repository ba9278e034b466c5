"""Cloud index tracking: normalised spot prices, an index over comparable VMs, and the
policies that pick (and move between) VMs by it (docs/design.md#index-tracking, after the SoCC'18
cloud-index-tracking paper). Pure and vectorised: arrays in, arrays out.

Notation (per VM i of a composition of N comparable VMs, at time t):

    P̂ᵢ(t) = Pᵢ(t) / sqrt(Cᵢ·Mᵢ)          normalised price (C vCPUs, M GB)
    𝕀(t)  = mean over i of P̂ᵢ(t)          the index: equal weights, leaving out VMs
                                          whose price is at the provider's cap
                                          (10 × on-demand in the 2015 EC2 market)
    gainᵢ(t1, t2) = Σₜ (𝕀(t) - P̂ᵢ(t)) · sqrt(Cᵢ·Mᵢ)   what holding i saved against
                                          the index (price × step units)
    P̆ᵢ(t) = Pᵢ(t) / sqrt(C_used·M_used)  the price per unit of what the job uses
                                          (a too-big VM pays for idle capacity)

Migration i -> j takes T_m (stop-and-copy: checkpoint, launch j, restore); both VMs
are paid meanwhile and the job does no work. docs/design.md#index-tracking corrects the paper's
trigger (eq. 5, 𝕀 > P̂ᵢ + 2·P̂ⱼ, which almost never holds): move only when the
saving over the remaining horizon H pays for the move,

    (Pᵢ - Pⱼ)·H > (Pᵢ + Pⱼ)·T_m + Pⱼ·T_m

(`move_pays`); `paper_trigger` keeps the literal test for comparison.

Policies (`decide`), each seeing a window of recent prices:
    static        the VM with the lowest mean price per used unit at start; stay until
                  revoked or done (SpotFleet's lowest-price strategy);
    cost          the VM with the lowest current P̆; move whenever the move pays
                  (HotSpot);
    availability  among VMs whose normalised price is at or below the index, the one
                  with the lowest price standard deviation over the window; look for
                  another only when the current VM's normalised price rises above the
                  index, and move when the move pays (the paper applies eq. 5 to both
                  index-tracking policies; without it a VM hovering at the index makes
                  the job flap between two VMs);
    balanced      the highest modified Sharpe ratio Sᵢ = (𝕀̄ - P̆ᵢ) / σ̆ᵢ (the window's
                  mean index minus the VM's mean price per used unit, over the
                  standard deviation of that price); move when the current VM no
                  longer has the best ratio and the move pays.
A VM is usable when the job fits (C ≥ C_used, M ≥ M_used) and its price is below the
revocation price (the bid: the on-demand price unless given).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

DEFAULT_CAP_FACTOR = 10.0  # EC2 capped spot prices at 10 × on-demand (pre-2017 market)
FLAT_PRICE_FRACTION = 1e-3  # deviations below this share of the mean price count as this


class Policy(StrEnum):
    STATIC = "static"
    COST = "cost"
    AVAILABILITY = "availability"
    BALANCED = "balanced"


def normalized_prices(prices: np.ndarray, cpus: np.ndarray, memory_gb: np.ndarray) -> np.ndarray:
    """P̂ = P / sqrt(C·M), broadcast over the last axis (VMs)."""
    return np.asarray(prices, dtype=float) / np.sqrt(
        np.asarray(cpus, dtype=float) * np.asarray(memory_gb, dtype=float)
    )


def capped(
    prices: np.ndarray, on_demand: np.ndarray, cap_factor: float = DEFAULT_CAP_FACTOR
) -> np.ndarray:
    """True where a price is at the provider's cap (cap_factor × on-demand)."""
    return np.asarray(prices) >= cap_factor * np.asarray(on_demand) * (1 - 1e-9)


def index_series(
    prices: np.ndarray,
    cpus: np.ndarray,
    memory_gb: np.ndarray,
    on_demand: np.ndarray,
    members: np.ndarray | None = None,
    cap_factor: float = DEFAULT_CAP_FACTOR,
) -> np.ndarray:
    """𝕀(t): the equal-weight mean of the normalised prices of `members` (a boolean mask
    over VMs; None: all), leaving out capped prices and missing ones (NaN). prices has
    shape (T, N) or (N,); the answer (T,) or a scalar, NaN where no member counts."""
    prices = np.asarray(prices, dtype=float)
    normalized = normalized_prices(prices, cpus, memory_gb)
    counted = ~np.isnan(prices) & ~capped(np.nan_to_num(prices), on_demand, cap_factor)
    if members is not None:
        counted &= np.asarray(members, dtype=bool)
    total = np.where(counted, normalized, 0.0).sum(axis=-1)
    count = counted.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def gain(
    prices: np.ndarray, index: np.ndarray, cpus: np.ndarray, memory_gb: np.ndarray
) -> np.ndarray:
    """Σₜ (𝕀(t) - P̂ᵢ(t))·sqrt(Cᵢ·Mᵢ) per VM over the rows of `prices` (T, N): how much
    less than the index holding each VM cost (USD/h summed over steps; × step hours
    for USD)."""
    size = np.sqrt(np.asarray(cpus, dtype=float) * np.asarray(memory_gb, dtype=float))
    normalized = normalized_prices(prices, cpus, memory_gb)
    return ((np.asarray(index, dtype=float)[:, None] - normalized) * size).sum(axis=0)


def migration_loss(price_from: float, price_to: float, migration_h: float) -> float:
    """(Pᵢ + Pⱼ)·T_m + Pⱼ·T_m: both VMs paid during the move, plus the work not done
    meanwhile, valued at the target's price (USD)."""
    return (price_from + price_to) * migration_h + price_to * migration_h


def move_pays(
    price_from: np.ndarray | float,
    price_to: np.ndarray | float,
    horizon_h: float,
    migration_h: float,
) -> np.ndarray | bool:
    """docs/design.md#index-tracking's migration rule: (Pᵢ - Pⱼ)·H > (Pᵢ + Pⱼ)·T_m + Pⱼ·T_m."""
    price_from, price_to = np.asarray(price_from, float), np.asarray(price_to, float)
    return (price_from - price_to) * horizon_h > (price_from + 2 * price_to) * migration_h


def paper_trigger(index: float, normalized_from: float, normalized_to: float) -> bool:
    """The paper's eq. 5 as printed: 𝕀 > P̂ᵢ + 2·P̂ⱼ (kept for comparison; see module doc)."""
    return index > normalized_from + 2 * normalized_to


@dataclass(frozen=True)
class Need:
    """What the job uses and how long it still runs."""

    cpus: float
    memory_gb: float
    remaining_h: float  # the horizon H of the migration rule
    migration_h: float  # T_m


@dataclass(frozen=True)
class Decision:
    target: int | None  # the VM to be on (None: nothing usable)
    move: bool  # True: leave the current VM for `target`
    reason: str


@dataclass(frozen=True)
class Market:
    """What a decision sees: a window of prices (W, N), the last row now, per-VM size and
    on-demand price, and the revocation price (the bid) per VM."""

    prices: np.ndarray  # (W, N) USD/h; NaN: no price (not offered)
    cpus: np.ndarray  # (N,)
    memory_gb: np.ndarray  # (N,)
    on_demand: np.ndarray  # (N,)
    bid: np.ndarray  # (N,) revocation price; price > bid revokes
    cap_factor: float = DEFAULT_CAP_FACTOR

    @property
    def now(self) -> np.ndarray:
        return self.prices[-1]


@dataclass(frozen=True)
class WindowStats:
    """Per-VM statistics of a window, computed once per decision."""

    fits: np.ndarray  # (N,) bool: the job fits
    usable: np.ndarray  # (N,) bool: fits, priced, not revoked now
    now_price: np.ndarray  # (N,)
    mean_price: np.ndarray  # (N,) over the window (NaNs ignored)
    std_price: np.ndarray  # (N,)
    index_now: float  # 𝕀 over the VMs that fit, now
    index_mean: float  # mean 𝕀 over the window


def window_stats(market: Market, need: Need) -> WindowStats:
    """The window's statistics for a job of `need`, vectorised over VMs."""
    prices = market.prices
    fits = (market.cpus >= need.cpus) & (market.memory_gb >= need.memory_gb)
    now = prices[-1]
    usable = fits & ~np.isnan(now) & (np.nan_to_num(now, nan=np.inf) <= market.bid)
    valid = ~np.isnan(prices)
    count = valid.sum(axis=0)
    filled = np.where(valid, prices, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(axis=0) / count
        variance = np.maximum(np.einsum("ij,ij->j", filled, filled) / count - mean * mean, 0.0)
    # The index of every row (index_series, inlined to reuse `filled` and `valid`).
    counted = valid & (filled < market.cap_factor * market.on_demand * (1 - 1e-9)) & fits
    inverse_size = 1.0 / np.sqrt(market.cpus * market.memory_gb)
    members = counted.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        index = np.where(
            members > 0, (np.where(counted, filled, 0.0) @ inverse_size) / members, np.nan
        )
    index_now = float(index[-1])
    index_mean = float(np.nanmean(index)) if np.any(~np.isnan(index)) else np.nan
    return WindowStats(fits, usable, now, mean, np.sqrt(variance), index_now, index_mean)


def scores(policy: Policy, market: Market, need: Need, stats: WindowStats) -> np.ndarray:
    """Each VM's score under `policy` for one job of `need` (lower is better; +inf: not
    eligible)."""
    used = np.sqrt(need.cpus * need.memory_gb)
    return policy_scores(policy, market.cpus, market.memory_gb, used, stats)


def policy_scores(
    policy: Policy,
    cpus: np.ndarray,
    memory_gb: np.ndarray,
    used: np.ndarray | float,
    stats: WindowStats,
) -> np.ndarray:
    """The scores of `scores`, with `used` = sqrt(vCPUs·GB the job(s) use) per VM (a VM
    packed with several jobs uses more of itself, which lowers its price per used unit)."""
    used = np.asarray(used, dtype=float)
    if policy is Policy.STATIC:
        score = stats.mean_price / used
    elif policy is Policy.COST:
        score = stats.now_price / used
    elif policy is Policy.AVAILABILITY:
        normalized = normalized_prices(stats.now_price, cpus, memory_gb)
        below = normalized <= stats.index_now * (1 + 1e-12)
        # The steadiest of those priced at or below the index; if none is, the cheapest
        # (a large offset keeps every below-index VM ahead of the fallback).
        fallback = 1e6 + stats.now_price / used
        score = np.where(below, stats.std_price / used, fallback)
    else:  # balanced: maximise the Sharpe ratio, i.e. minimise its negative
        per_unit_mean = stats.mean_price / used
        # A price steadier than 0.1% of itself counts as that steady: with flat prices the
        # ratio then ranks by price, not by the rounding noise of a zero deviation.
        per_unit_std = np.maximum(stats.std_price / used, FLAT_PRICE_FRACTION * per_unit_mean)
        with np.errstate(divide="ignore", invalid="ignore"):
            sharpe = (stats.index_mean - per_unit_mean) / np.maximum(per_unit_std, 1e-12)
        score = -sharpe
    return np.where(stats.usable & ~np.isnan(score), score, np.inf)


@dataclass(frozen=True)
class TypeMarket:
    """What the hopper knows of each VM type's price, for choosing types to launch: the
    price now and its window mean and deviation (USD/h), per type in `names` order."""

    policy: Policy
    names: tuple[str, ...]
    cpus: np.ndarray
    memory_gb: np.ndarray
    on_demand: np.ndarray
    bid: np.ndarray
    now_price: np.ndarray
    mean_price: np.ndarray
    std_price: np.ndarray
    cap_factor: float = DEFAULT_CAP_FACTOR

    def launch_scores(self, job_cpus: float, job_memory_gb: float, slots: np.ndarray) -> np.ndarray:
        """Each type's score (lower is better, inf: not usable) for VMs that will each run
        `slots` copies of a job (0: it does not fit). The index is over the types that fit;
        its window mean is the mean of their normalised window means (the same unless
        some prices were capped or missing in the window)."""
        slots = np.asarray(slots, dtype=float)
        fits = slots > 0
        now = self.now_price
        priced = ~np.isnan(now)
        usable = fits & priced & (np.nan_to_num(now, nan=np.inf) <= self.bid)
        size = np.sqrt(self.cpus * self.memory_gb)
        counted = fits & priced & ~capped(np.nan_to_num(now), self.on_demand, self.cap_factor)
        index_now = float(np.mean(now[counted] / size[counted])) if counted.any() else np.nan
        with_mean = fits & ~np.isnan(self.mean_price)
        index_mean = (
            float(np.mean(self.mean_price[with_mean] / size[with_mean]))
            if with_mean.any()
            else np.nan
        )
        stats = WindowStats(
            fits, usable, now, self.mean_price, self.std_price, index_now, index_mean
        )
        used = np.maximum(slots, 1.0) * np.sqrt(job_cpus * job_memory_gb)
        return policy_scores(self.policy, self.cpus, self.memory_gb, used, stats)

    def index_now(self, cpus: float, memory_gb: float) -> float:
        """𝕀 now over the types that hold `cpus` and `memory_gb` (NaN: none priced)."""
        now = np.nan_to_num(self.now_price, nan=np.inf)
        counted = (
            (self.cpus >= cpus)
            & (self.memory_gb >= memory_gb)
            & np.isfinite(now)
            & ~capped(now, self.on_demand, self.cap_factor)
        )
        if not counted.any():
            return float("nan")
        return float(np.mean(now[counted] / np.sqrt(self.cpus[counted] * self.memory_gb[counted])))

    def move_decision(
        self,
        current: int,
        target: int,
        need: Need,
        *,
        target_vms: int = 1,
        literal_trigger: bool = False,
    ) -> tuple[bool, str]:
        """Whether jobs of `need` on one VM of type `current` should move to `target_vms`
        VMs of type `target`, the type the policy now prefers for them, by the policy's
        rule (module docstring); Pⱼ is the price of all the target VMs together."""
        if current == target:
            return False, "on the preferred type"
        price_from = float(self.now_price[current])
        price_to = float(self.now_price[target]) * target_vms
        if not self.now_price[target] <= self.bid[target]:  # NaN or above its bid
            return False, f"{self.names[target]} is not priced below its bid"
        if not price_from <= self.bid[current]:
            return True, f"{self.names[current]} is priced above its bid ({price_from:.4f} USD/h)"
        if self.policy is Policy.STATIC:
            return False, "static: stays until revoked"
        index = self.index_now(need.cpus, need.memory_gb)
        size = np.sqrt(self.cpus * self.memory_gb)
        normalized_from = price_from / size[current]
        if self.policy is Policy.AVAILABILITY and normalized_from <= index:
            return False, "availability: at or below the index"
        if literal_trigger:
            pays = paper_trigger(index, normalized_from, self.now_price[target] / size[target])
        else:
            pays = bool(move_pays(price_from, price_to, need.remaining_h, need.migration_h))
        if not pays:
            return False, f"moving to {self.names[target]} does not pay"
        count = f"{target_vms} × " if target_vms > 1 else ""
        return True, (
            f"{self.policy.value}: {self.names[current]} {price_from:.4f} -> "
            f"{count}{self.names[target]} {price_to:.4f} USD/h pays over "
            f"{need.remaining_h:.2f} h (index {index:.5f})"
        )


def decide(
    policy: Policy,
    market: Market,
    need: Need,
    current: int | None,
    *,
    literal_trigger: bool = False,
    stats: WindowStats | None = None,
) -> Decision:
    """Where the job should be now: its current VM (`current`, None if it has none, e.g.
    at start or after a revocation) or another one. A job without a VM gets the best
    usable VM; a running one moves only under its policy's rule (module docstring).
    `literal_trigger` uses the paper's printed eq. 5 instead of the corrected rule
    (docs/design.md#migration-rule); `stats`, if given, are the window's statistics
    computed elsewhere (a replay's rolling ones)."""
    if stats is None:
        stats = window_stats(market, need)
    score = scores(policy, market, need, stats)
    best = int(np.argmin(score))
    return decide_given_best(
        policy,
        best,
        bool(np.isfinite(score[best])),
        stats,
        market.cpus,
        market.memory_gb,
        need,
        current,
        literal_trigger=literal_trigger,
    )


def decide_given_best(
    policy: Policy,
    best: int,
    best_usable: bool,
    stats: WindowStats,
    cpus: np.ndarray,
    memory_gb: np.ndarray,
    need: Need,
    current: int | None,
    *,
    literal_trigger: bool = False,
) -> Decision:
    """`decide`, given the VM with the best score (`best`, the first of the lowest) and
    whether its score is finite (`best_usable`): what a replay computes for every step of
    a trace at once (policies.hopping.replay)."""
    if not best_usable:
        return Decision(
            current if current is not None and stats.usable[current] else None,
            False,
            "no usable VM",
        )
    if current is None or not stats.usable[current]:
        why = "start" if current is None else "current VM unusable (revoked or gone)"
        return Decision(best, current is not None, f"{why}: {policy.value} picks {best}")
    if best == current or policy is Policy.STATIC:
        return Decision(current, False, "stay")
    price_from, price_to = float(stats.now_price[current]), float(stats.now_price[best])
    if policy is Policy.AVAILABILITY:  # looks again only once above the index
        normalized = normalized_prices(stats.now_price, cpus, memory_gb)
        if normalized[current] <= stats.index_now:
            return Decision(current, False, "stay: at or below the index")
    if literal_trigger:
        normalized = normalized_prices(stats.now_price, cpus, memory_gb)
        pays = paper_trigger(stats.index_now, normalized[current], normalized[best])
    else:
        pays = bool(move_pays(price_from, price_to, need.remaining_h, need.migration_h))
    if not pays:
        return Decision(current, False, f"stay: moving to {best} does not pay")
    return Decision(
        best,
        True,
        f"{policy.value}: {price_from:.4f} -> {price_to:.4f} USD/h pays over "
        f"{need.remaining_h:.2f} h",
    )
