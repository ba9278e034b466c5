"""The hopper: spot hopping by cloud-index tracking in the running daemon (docs/design.md#index-tracking).

Every `[hopping] interval_s` of model time (5 minutes by default) it

1. samples the spot price of every catalog type (the driver's `spot_prices`, or a
   replayed trace for the local and sim drivers) and records the samples in the store,
   which keeps them for `retention_days`;
2. hands the scheduler a `TypeMarket` (price now, window mean and deviation per type,
   the policy), by which the planner chooses the type of every new VM;
3. with `migrate`, looks at each running VM whose jobs can all move (one bag,
   checkpointable; `migration_candidates`, read from the scheduler's open world): when
   the policy now prefers another type for that bag (`preferred_type`) and the
   policy's rule says the move pays (policies.index.TypeMarket.move_decision), it asks
   the scheduler to move them through its one hook, `Scheduler.request_migration`
   (checkpoint, stop, resume on a new VM of the preferred type), and records the
   migration with its reason, prices and index.

The window's statistics come from an in-memory buffer of the samples, filled from the
store at start so a restart keeps the history. Price per type: the sample for the
type's own zone, else the cheapest zone's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from controller.config import HoppingConfig
from controller.planner import DemandGroup, preferred_launch
from controller.states import AttemptState
from drivers.base import PriceSample, VmState, VmType
from policies.index import Need, Policy, TypeMarket

if TYPE_CHECKING:
    from controller.scheduler import Scheduler

log = logging.getLogger("spotbag.hopper")

MIN_INTERVAL_REAL_S = 1.0
PriceSource = Callable[[Sequence[str], Sequence[str]], Awaitable[Sequence[PriceSample]]]


def latest_per_series(samples: Sequence[PriceSample]) -> list[PriceSample]:
    """The price in effect now per (type, zone): a source may answer with a history (EC2
    gives the last hour of changes), of which only the latest counts."""
    latest: dict[tuple[str, str], PriceSample] = {}
    for sample in samples:
        key = (sample.vm_type, sample.zone)
        if key not in latest or sample.at >= latest[key].at:
            latest[key] = sample
    return list(latest.values())


def prices_by_type(
    samples: Sequence[PriceSample],
    catalog: Sequence[VmType],
    position: dict[str, int] | None = None,
) -> np.ndarray:
    """Price per catalog type (NaN: none): its own zone's sample, else the cheapest
    zone's. `position`: type name -> index in `catalog` (built when not given)."""
    if position is None:
        position = {t.name: i for i, t in enumerate(catalog)}
    prices = np.full(len(catalog), np.nan)
    own = np.zeros(len(catalog), dtype=bool)
    for sample in samples:
        i = position.get(sample.vm_type)
        if i is None:
            continue
        mine = sample.zone == catalog[i].zone
        if mine and not own[i]:
            prices[i], own[i] = sample.price_per_hour, True
        elif not own[i] and not sample.price_per_hour >= prices[i]:
            prices[i] = sample.price_per_hour
    return prices


@dataclass(frozen=True)
class MigrationCandidate:
    """A running VM whose jobs could all move (the hopper decides whether they do)."""

    vm_id: str
    vm_type: str
    bag_id: str  # every job on it is of this bag
    cpus: float  # used by its jobs together
    memory_gb: float
    remaining_h: float  # model hours of work left, the shortest of its jobs
    jobs: list[tuple[str, int]]


# --- what the hopper reads of the scheduler's open world ------------------------------


def migration_candidates(scheduler: Scheduler, now: float) -> list[MigrationCandidate]:
    """Running VMs whose every job can move (checkpointable, running, not already
    moving), with what the jobs use and how long they still run (model hours)."""
    world = scheduler.world
    to_h = scheduler.time_scale / 3600.0
    found = []
    for vm in world.vms.values():
        if vm.state is not VmState.RUNNING or vm.terminating or vm.draining or not vm.attempts:
            continue
        if not vm.spot:
            continue  # an on-demand VM is there for a deadline, not for a spot price
        attempts = [world.attempts[a] for a in vm.attempts if a in world.attempts]
        bag_ids = {a.bag_id for a in attempts}
        if len(bag_ids) != 1:
            continue  # jobs of several bags: where they would go is not one choice
        bag = world.bags.get(next(iter(bag_ids)))
        if (
            bag is None
            or not bag.spec.checkpointable
            or any(a.state is not AttemptState.RUNNING or a.cancelling for a in attempts)
        ):
            continue
        left_h = [
            max(bag.runtime_estimate_s - a.saved_s - max(0.0, now - a.mark_at), 0.0) * to_h
            for a in attempts
        ]
        found.append(
            MigrationCandidate(
                vm_id=vm.id,
                vm_type=vm.vm_type.name,
                bag_id=bag.id,
                cpus=sum(a.shape.cpus for a in attempts),
                memory_gb=sum(a.shape.memory_gb for a in attempts),
                remaining_h=min(left_h),
                jobs=[(a.bag_id, a.idx) for a in attempts],
            )
        )
    return found


def preferred_type(scheduler: Scheduler, bag_id: str) -> tuple[str, int] | None:
    """The type the planner would launch now for `bag_id`'s jobs under the hopping
    policy and how many jobs one VM of it holds (None: no market, or no usable type)."""
    bag = scheduler.world.bags.get(bag_id)
    if bag is None or scheduler.world.market is None:
        return None
    group = DemandGroup(bag.id, bag.shape, 1, bag.allowed_types, bag.regions)
    choice = preferred_launch(scheduler.world.market, group, scheduler.world.catalog_view)
    return (choice[0].name, choice[1]) if choice is not None else None


@dataclass
class HopRound:
    """What one round did (for logs, metrics and tests)."""

    at: float
    prices: dict[str, float] = field(default_factory=dict)  # type -> USD/h (NaN: none)
    migrations: list[dict] = field(default_factory=list)
    stays: dict[str, str] = field(default_factory=dict)  # vm_id -> why it stays


class Hopper:
    def __init__(
        self,
        *,
        settings: HoppingConfig,
        catalog: Sequence[VmType],
        scheduler: Scheduler,
        store,
        price_source: PriceSource,
        now: Callable[[], float],
        time_scale: float = 1.0,
        boot_delay_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self.catalog = list(catalog)
        self.scheduler = scheduler
        self.store = store
        self.price_source = price_source
        self.now = now
        self.time_scale = time_scale
        self.boot_delay_s = boot_delay_s  # real seconds (the driver's), part of a move
        self.policy = Policy(settings.policy)
        self.names = tuple(t.name for t in self.catalog)
        self.position = {name: i for i, name in enumerate(self.names)}
        self.cpus = np.array([t.cpus for t in self.catalog], dtype=float)
        self.memory_gb = np.array([t.memory_gb for t in self.catalog], dtype=float)
        self.on_demand = np.array(
            [t.on_demand_price_per_hour or math.inf for t in self.catalog], dtype=float
        )
        self.bid = self.on_demand * settings.bid_factor
        self.rows: deque[tuple[float, np.ndarray]] = deque()  # (at, price per type)
        self.rounds = 0

    # --- real seconds of the daemon's clock for model-time settings ----------------------

    @property
    def interval_real_s(self) -> float:
        # At most one round a second however fast model time runs (simulated fleets).
        return max(self.settings.interval_s / self.time_scale, MIN_INTERVAL_REAL_S)

    @property
    def window_real_s(self) -> float:
        return self.settings.window_s / self.time_scale

    async def load_history(self) -> None:
        """Fill the window from the store's samples (a restart keeps its statistics)."""
        now = self.now()
        rows = await self.store.price_samples(now - self.window_real_s, vm_types=self.names)
        by_time: dict[float, list[PriceSample]] = {}
        for vm_type, zone, at, price in rows:
            by_time.setdefault(at, []).append(PriceSample(vm_type, zone, price, at))
        for at in sorted(by_time):
            self.rows.append((at, self._prices_of(by_time[at])))

    def _prices_of(self, samples: Sequence[PriceSample]) -> np.ndarray:
        return prices_by_type(samples, self.catalog, self.position)

    def market(self) -> TypeMarket | None:
        if not self.rows:
            return None
        window = np.vstack([row for _, row in self.rows])
        with warnings.catch_warnings():  # a type with no price in the window: NaN, fine
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(window, axis=0)
            std = np.nanstd(window, axis=0)
        return TypeMarket(
            policy=self.policy,
            names=self.names,
            cpus=self.cpus,
            memory_gb=self.memory_gb,
            on_demand=self.on_demand,
            bid=self.bid,
            now_price=window[-1],
            mean_price=mean,
            std_price=std,
        )

    async def round(self) -> HopRound:
        """Sample, hand the market to the scheduler, and move what should move."""
        now = self.now()
        self.rounds += 1
        zones = sorted({t.zone for t in self.catalog if t.zone})
        samples = latest_per_series(await self.price_source(self.names, zones))
        prices = self._prices_of(samples)
        await self.store.add_price_samples(
            [
                (s.vm_type, s.zone, now, s.price_per_hour)
                for s in samples
                if s.vm_type in self.position
            ]
        )
        self.rows.append((now, prices))
        while self.rows and self.rows[0][0] < now - self.window_real_s:
            self.rows.popleft()
        if self.rounds % 12 == 1:
            await self.store.prune_price_samples(now - self.settings.retention_days * 86400)
        result = HopRound(now, {n: float(p) for n, p in zip(self.names, prices, strict=True)})
        market = self.market()
        self.scheduler.world.market = market
        if market is None or not self.settings.migrate:
            return result
        for candidate in migration_candidates(self.scheduler, now):
            current = self.position.get(candidate.vm_type)
            choice = preferred_type(self.scheduler, candidate.bag_id)
            if current is None or choice is None:
                continue
            preferred, slots = choice
            target = self.position[preferred]
            target_vms = math.ceil(len(candidate.jobs) / max(slots, 1))
            migration_h = (
                self.boot_delay_s * self.time_scale
                + candidate.memory_gb * self.settings.migration_s_per_gb
            ) / 3600.0
            need = Need(candidate.cpus, candidate.memory_gb, candidate.remaining_h, migration_h)
            move, why = market.move_decision(
                current,
                target,
                need,
                target_vms=target_vms,
                literal_trigger=self.settings.literal_trigger,
            )
            if not move:
                result.stays[candidate.vm_id] = why
                continue
            jobs = self.scheduler.request_migration(candidate.vm_id, why)
            if not jobs:
                continue
            index_price = market.index_now(candidate.cpus, candidate.memory_gb)
            row = {
                "at": now,
                "vm_id": candidate.vm_id,
                "from_type": candidate.vm_type,
                "to_type": preferred,
                "policy": self.policy.value,
                "price_from": float(market.now_price[current]),
                "price_to": float(market.now_price[target]) * target_vms,
                "index_price": index_price,
                "jobs": json.dumps(jobs),
                "reason": why,
            }
            if math.isnan(index_price):
                row["index_price"] = None
            await self.store.add_migration(row)
            result.migrations.append(row)
            log.info("moving %d job(s) off %s: %s", len(jobs), candidate.vm_id, why)
        return result

    async def run(self) -> None:
        """Rounds every interval until cancelled; a failed round is logged, not fatal."""
        await self.load_history()
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("hopping round failed; trying again next interval")
            await asyncio.sleep(self.interval_real_s)
