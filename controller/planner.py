"""The planner: a pure function from what the scheduler knows to what it should do.

`plan(snapshot)` packs queued jobs onto running VMs, decides how many VMs of
which type to launch for the rest, and which idle VMs to terminate. It reads
no clock and touches nothing; the scheduler executes the actions.

Per-pass values (groups, VM views, actions) are NamedTuples: immutable like frozen
dataclasses, and much cheaper to create in the scheduler's hot loop.

Packing is first-come first-served over bags (oldest bag first) and best-fit
over VMs (the fullest VM that still fits is filled first, so idle VMs drain
and can be released). Pending VMs count as capacity already on its way, so a
burst of submissions does not launch twice.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from drivers.base import VmState
from policies.index import TypeMarket
from policies.packing import PricedType, Shape, cheapest_type, copies_that_fit, zone_allowed
from policies.reuse import ReuseTable


class DemandGroup(NamedTuple):
    """The queued jobs of one bag (all jobs of a bag have one shape)."""

    bag_id: str
    shape: Shape
    queued: int
    vm_types: tuple[str, ...] | None = None  # allowed types; None = any
    regions: tuple[str, ...] | None = None
    runtime_h: float = 0.0  # expected job length in model hours (for the reuse policy)
    # Jobs running on VMs that got a preemption notice: they need a VM once theirs ends,
    # so one is kept or launched for them now (docs/design.md#checkpoint-notices).
    expected: int = 0
    # On-demand VMs (docs/design.md#deadlines): how many of the bag's slots should run on
    # them (`on_demand: always`, or the deadline policy's decision), how many of its
    # attempts run on them already, and whether its other slots may take spot VMs (else
    # they wait). A group with no on-demand slots never takes an on-demand VM.
    on_demand_slots: int = 0
    on_demand_running: int = 0
    use_spot: bool = True
    # With on-demand slots: how many more of its attempts may run on spot VMs (its slots
    # left to spot less those running there; None: no cap). A slot turned on-demand
    # waits for its on-demand VM rather than take a spot VM that frees.
    spot_slots_left: int | None = None


class VmView(NamedTuple):
    vm_id: str
    vm_type: str
    zone: str
    state: VmState  # PENDING or RUNNING
    capacity: Shape
    free: Shape
    running_attempts: int
    idle_since: float | None  # when it last became empty (None while busy or pending)
    requested_at: float = 0.0  # when it was launched
    age_h: float = 0.0  # model hours since launch
    table: ReuseTable | None = None  # reuse decisions for its preemption model; None: always reuse
    draining: str = ""  # why it takes no new jobs (its jobs are moving away); ended when empty
    # Room for attempts that wait in the executor's queue (Slurm) beyond what fits now, so
    # that a slot is refilled the moment it frees; None: no such queue.
    ahead: Shape | None = None
    # When it began to be waited for, if not at its launch (a VM that had joined before a
    # controller restart, seen joined again by the executor): its boot timeout counts
    # from here.
    waited_since: float | None = None
    spot: bool = True  # False: an on-demand VM (only bags that want on-demand slots use it)


@dataclass(frozen=True)
class CatalogType:
    name: str
    zone: str
    capacity: Shape
    spot_price_per_hour: float
    on_demand_price_per_hour: float = 0.0


@dataclass
class Snapshot:
    """What a pass's plan sees. Not frozen (the planner never changes it): a frozen
    dataclass's __init__ sets each field through object.__setattr__, 5.4 µs against
    0.9 µs, and one is made every pass (88,000 in the 100,000-job simulation)."""

    now: float
    demand: Sequence[DemandGroup]  # oldest bag first
    vms: Sequence[VmView]  # pending VMs, and running VMs with free capacity
    catalog: Sequence[CatalogType]
    alive_vms: int  # pending + running, including VMs not listed in `vms`
    max_vms: int
    idle_timeout_s: float
    boot_timeout_s: float = float("inf")
    hot_spare_s: float = 0.0  # idle VMs past their risky start are kept this long
    # type -> when spot launches may be tried again (back-off after failed launches, a
    # spot price above the bid), and the same for on-demand launches.
    blocked_until: Mapping[str, float] = field(default_factory=dict)
    on_demand_blocked_until: Mapping[str, float] = field(default_factory=dict)
    # Live prices and the hopping policy (controller/hopper.py); None: the catalog's prices.
    market: TypeMarket | None = None


@dataclass(frozen=True, slots=True)
class Place:
    """Start `count` queued jobs of `bag_id` on `vm_id`."""

    vm_id: str
    bag_id: str
    count: int


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch `count` VMs of `vm_type` (for the queued jobs of `bag_id`), on spot or,
    with `spot` False, on-demand."""

    vm_type: str
    count: int
    bag_id: str
    spot: bool = True


class Terminate(NamedTuple):
    vm_id: str
    reason: str


@dataclass(frozen=True)
class Unplaceable:
    """Queued jobs of a bag that no VM type in the catalog can hold."""

    bag_id: str
    reason: str


class Plan(NamedTuple):
    """One pass's decision (made every pass)."""

    places: list[Place]
    launches: list[Launch]
    terminations: list[Terminate]
    unplaceable: list[Unplaceable]
    next_wake_at: float | None  # when the plan may change with nothing else happening


@dataclass
class MarketShare:
    """One pass's split of a bag with on-demand slots between the markets: the
    on-demand slots still to fill (launched for when no VM has room) and how many more
    of its attempts spot VMs may take (its slots left to spot less those running and
    placed there)."""

    on_demand_wanted: int
    spot_left: int

    @classmethod
    def of(cls, group: DemandGroup) -> MarketShare:
        spot_left = group.spot_slots_left
        return cls(
            max(0, group.on_demand_slots - group.on_demand_running),
            sys.maxsize if spot_left is None else spot_left,
        )


def _eligible(group: DemandGroup, vm_type: str, zone: str) -> bool:
    if group.vm_types is not None and vm_type not in group.vm_types:
        return False
    return zone_allowed(zone, group.regions)


def _pack(
    group: DemandGroup,
    remaining: int,
    free: dict[str, Shape],
    vms: Sequence[VmView],
    gpu_demand: bool,
    places: list[Place] | None,
    refused: dict[str, str] | None = None,
) -> int:
    """Put up to `remaining` jobs of `group` on the VMs' free capacity (best fit first).

    Appends Place actions when `places` is given (running VMs, where the reuse policy
    must agree: docs/design.md#reuse); otherwise only reserves the capacity (pending VMs, which
    will be fresh). Idle VMs the policy turns down are noted in `refused`.
    Returns how many jobs are left.
    """
    candidates = []
    restricted = group.vm_types is not None or bool(group.regions)
    # Keep GPU VMs for GPU jobs while any are waiting.
    spare_gpus = gpu_demand and group.shape.gpus == 0
    # The group's jobs run on spot VMs when it uses spot, on on-demand VMs when it wants
    # on-demand slots.
    use_spot, use_on_demand = group.use_spot, group.on_demand_slots > 0
    for vm in vms:
        if restricted and not _eligible(group, vm.vm_type, vm.zone):
            continue
        if not (use_spot if vm.spot else use_on_demand):
            continue
        if spare_gpus and vm.capacity.gpus > 0:
            continue
        if (
            places is not None
            and vm.table is not None
            and not vm.table.reuse_ok(vm.age_h, group.runtime_h)
        ):
            if refused is not None and vm.running_attempts == 0:
                refused[vm.vm_id] = (
                    f"released: a fresh VM is better for {group.runtime_h:.1f} h jobs "
                    f"than this one at {vm.age_h:.1f} h"
                )
            continue
        candidates.append(vm)
    if len(candidates) > 1:
        candidates.sort(key=lambda vm: (free[vm.vm_id].cpus, free[vm.vm_id].memory_gb, vm.vm_id))
    for vm in candidates:
        if remaining == 0:
            break
        room = free[vm.vm_id]
        n = min(remaining, copies_that_fit(group.shape, room))
        if n == 0:
            continue
        free[vm.vm_id] = room.minus(group.shape, n)
        remaining -= n
        if places is not None:
            places.append(Place(vm.vm_id, group.bag_id, n))
    return remaining


def plan(snapshot: Snapshot) -> Plan:
    """One pass's decision, in phases: queued jobs are placed on running VMs (where the
    reuse policy agrees) and counted against pending ones; room is kept for the jobs of
    noticed VMs; VMs are launched for what is left; what still waits may queue ahead on
    running VMs; then idle, drained and unbooted VMs are ended, and the next wake-up is
    the earliest deadline that could change the plan."""
    drained: list[VmView] = []
    running: list[VmView] = []
    pending: list[VmView] = []
    free: dict[str, Shape] = {}
    for vm in snapshot.vms:  # one pass: this runs every pass of the scheduler
        free[vm.vm_id] = vm.free
        if vm.draining:
            drained.append(vm)
        elif vm.state is VmState.RUNNING:
            running.append(vm)
        elif vm.state is VmState.PENDING:
            pending.append(vm)
    gpu_demand = False  # (loops, not any() over a generator: this runs every pass)
    noticed = False
    for g in snapshot.demand:
        if g.shape.gpus > 0 and g.queued > 0:
            gpu_demand = True
        if g.expected > 0:
            noticed = True

    places: list[Place] = []
    refused: dict[str, str] = {}
    shares: dict[str, MarketShare] = {}  # per bag with on-demand slots: what each market takes
    leftover = _place_queued(
        snapshot.demand, free, running, pending, gpu_demand, places, refused, shares
    )
    kept = (
        _keep_for_noticed(snapshot.demand, free, running + pending, gpu_demand, leftover)
        if noticed
        else set()
    )
    launches, unplaceable, backoff_wake, short = _launches(snapshot, leftover, shares)
    _queue_ahead(snapshot.demand, running, gpu_demand, leftover, places, shares)

    used = {p.vm_id for p in places} | kept
    terminations: list[Terminate] = []
    wake: list[float] = [backoff_wake] if backoff_wake is not None else []
    _end_idle(snapshot, running, used, refused, short, terminations, wake)
    if drained:
        terminations += [
            Terminate(vm.vm_id, f"drained: {vm.draining}")
            for vm in drained
            if not vm.running_attempts
        ]
    if pending:
        _end_unbooted(snapshot, pending, terminations, wake)
    return Plan(places, launches, terminations, unplaceable, min(wake) if wake else None)


def _place_queued(
    demand: Sequence[DemandGroup],
    free: dict[str, Shape],
    running: Sequence[VmView],
    pending: Sequence[VmView],
    gpu_demand: bool,
    places: list[Place],
    refused: dict[str, str],
    shares: dict[str, MarketShare],
) -> dict[str, int]:
    """Queued jobs onto running VMs (Place actions), then counted against pending VMs'
    room; returns per bag how many are left. A bag that wants on-demand slots fills
    on-demand VMs first, and leaves on spot VMs the jobs its missing on-demand slots
    are for (`shares`: they are launched for), and puts on spot VMs at most the slots
    it leaves to spot."""
    leftover: dict[str, int] = {}
    for group in demand:
        if group.queued > 0:
            leftover[group.bag_id] = _pack_by_market(
                group, group.queued, free, running, gpu_demand, places, refused, shares
            )
    for group in demand if pending else ():
        if leftover.get(group.bag_id):
            leftover[group.bag_id] = _pack_by_market(
                group,
                leftover[group.bag_id],
                free,
                pending,
                gpu_demand,
                None,
                None,
                shares,
            )
    return leftover


def _pack_by_market(
    group: DemandGroup,
    remaining: int,
    free: dict[str, Shape],
    vms: Sequence[VmView],
    gpu_demand: bool,
    places: list[Place] | None,
    refused: dict[str, str] | None,
    shares: dict[str, MarketShare],
) -> int:
    """`_pack` for a group with on-demand slots: on-demand VMs first (each job there
    fills one of the slots still wanted), then spot VMs for what the slots still
    wanted leave, at most the spot slots left. Returns how many are left."""
    if group.on_demand_slots <= 0:
        return _pack(group, remaining, free, vms, gpu_demand, places, refused)
    share = shares.get(group.bag_id)
    if share is None:
        share = shares[group.bag_id] = MarketShare.of(group)
    on_demand = [vm for vm in vms if not vm.spot]
    left = _pack(group, remaining, free, on_demand, gpu_demand, places, refused)
    share.on_demand_wanted = max(0, share.on_demand_wanted - (remaining - left))
    spot_share = min(max(0, left - share.on_demand_wanted), share.spot_left)
    if spot_share == 0 or not group.use_spot:
        return left
    spot = [vm for vm in vms if vm.spot]
    unplaced = _pack(group, spot_share, free, spot, gpu_demand, places, refused)
    share.spot_left -= spot_share - unplaced
    return left - spot_share + unplaced


def _queue_ahead(
    demand: Sequence[DemandGroup],
    running: Sequence[VmView],
    gpu_demand: bool,
    leftover: dict[str, int],
    places: list[Place],
    shares: dict[str, MarketShare],
) -> None:
    """What still waits may queue on running VMs, in the executor's queue, up to their
    room for it (after launches are decided: queued work does not replace new VMs); a
    bag with on-demand slots splits what waits between the markets as `_pack_by_market`
    does (on-demand VMs first; on spot VMs only within the slots it leaves to spot, and
    not the jobs its on-demand VMs still to come are for)."""
    ahead = {vm.vm_id: vm.ahead for vm in running if vm.ahead is not None}
    if not ahead:
        return
    queue_on = [vm for vm in running if vm.vm_id in ahead]
    for group in demand:
        left = leftover.get(group.bag_id)
        if left:
            leftover[group.bag_id] = _pack_by_market(
                group, left, ahead, queue_on, gpu_demand, places, None, shares
            )


def _end_idle(
    snapshot: Snapshot,
    running: Sequence[VmView],
    used: set[str],
    refused: dict[str, str],
    short: bool,
    terminations: list[Terminate],
    wake: list[float],
) -> None:
    """Idle running VMs past their idle timeout (longer for a hot spare: a VM past its
    risky start is worth keeping a while for the next jobs) are ended. While max_vms
    leaves jobs waiting (`short`), so is every idle VM this pass gave nothing: none of
    the waiting jobs may use it (the reuse policy refused it, `refused`; it is on a
    market their bag does not use now, e.g. spot for slots turned on-demand; or of a
    type they may not take), and the VM they wait for needs its room."""
    now = snapshot.now
    for vm in running:
        if vm.running_attempts or vm.vm_id in used or vm.idle_since is None:
            continue
        if short:
            reason = refused.get(vm.vm_id) or (
                "released: jobs wait for a VM that max_vms leaves no room for, "
                "and none of them may use this one"
            )
            terminations.append(Terminate(vm.vm_id, reason))
            continue
        # A spot VM past its risky start is worth keeping for the next jobs; an
        # on-demand VM is never preempted, so none is better than a fresh one: idle,
        # it is only billed (a deadline's slots turned back to spot leave them idle).
        spare = vm.spot and vm.table is not None and vm.table.is_stable(vm.age_h)
        timeout = (
            max(snapshot.idle_timeout_s, snapshot.hot_spare_s) if spare else snapshot.idle_timeout_s
        )
        deadline = vm.idle_since + timeout
        if deadline <= now:
            kind = "hot spare idle" if spare else "idle"
            terminations.append(Terminate(vm.vm_id, f"{kind} for {now - vm.idle_since:.0f} s"))
        else:
            wake.append(deadline)


def _end_unbooted(
    snapshot: Snapshot,
    pending: Sequence[VmView],
    terminations: list[Terminate],
    wake: list[float],
) -> None:
    """Pending VMs that did not boot within boot_timeout_s (counted from when they began
    to be waited for) are ended."""
    for vm in pending:
        since = vm.requested_at if vm.waited_since is None else vm.waited_since
        deadline = since + snapshot.boot_timeout_s
        if deadline <= snapshot.now:
            terminations.append(
                Terminate(vm.vm_id, f"did not boot within {snapshot.boot_timeout_s:.0f} s")
            )
        elif deadline != math.inf:
            wake.append(deadline)


def _keep_for_noticed(
    demand: Sequence[DemandGroup],
    free: dict[str, Shape],
    vms: Sequence[VmView],
    gpu_demand: bool,
    leftover: dict[str, int],
) -> set[str]:
    """Room for the jobs of noticed VMs (after the queued jobs took theirs): reserved on
    live VMs, which are then kept, not ended as idle; what finds none is added to the
    bag's leftover, to launch for now. Returns the VMs kept."""
    kept: set[str] = set()
    for group in demand:
        if group.expected <= 0:
            continue
        before = dict(free)
        rest = _pack(group, group.expected, free, vms, gpu_demand, None)
        kept.update(vm_id for vm_id, room in free.items() if room != before[vm_id])
        if rest:
            leftover[group.bag_id] = leftover.get(group.bag_id, 0) + rest
    return kept


def _launch_split(group: DemandGroup, remaining: int, share: MarketShare | None) -> tuple[int, int]:
    """Of a bag's `remaining` jobs with no room: (to launch on-demand VMs for, to launch
    spot VMs for). The on-demand slots it still wants first; the rest on spot while it
    uses spot, within the slots it leaves to spot (less those placed this pass)."""
    on_demand = min(remaining, share.on_demand_wanted) if share else 0
    spot = remaining - on_demand if group.use_spot else 0
    if share is not None:
        spot = min(spot, share.spot_left)
    return on_demand, spot


def _launches(
    snapshot: Snapshot, leftover: dict[str, int], shares: dict[str, MarketShare]
) -> tuple[list[Launch], list[Unplaceable], float | None, bool]:
    """Launches for the demand left over, cheapest slot first, within max_vms: on-demand
    VMs for the on-demand slots a bag still wants, spot VMs for the rest (none when the
    bag does not use spot now). The last value says whether max_vms left some demand
    without a launch."""
    budget = snapshot.max_vms - snapshot.alive_vms
    short = False
    launches: list[Launch] = []
    unplaceable: list[Unplaceable] = []
    blocked_wake: float | None = None
    now = snapshot.now
    for group in snapshot.demand:
        remaining = leftover.get(group.bag_id, 0)
        if remaining == 0:
            continue
        fitting, holds_one = _fitting_types(group, snapshot.catalog)
        # `fitting` holds the allowed types: when one can hold a job, nothing is wrong
        # (why_unplaceable would say None after scanning the catalog again, every pass).
        if not holds_one:
            problem = why_unplaceable(group.shape, group.vm_types, group.regions, snapshot.catalog)
            assert problem is not None  # no allowed type holds a job: it says why
            unplaceable.append(Unplaceable(group.bag_id, problem))
            continue
        on_demand_jobs, spot_jobs = _launch_split(group, remaining, shares.get(group.bag_id))
        if not on_demand_jobs and not spot_jobs:  # they wait (e.g. for spot's price)
            continue
        if budget <= 0:  # max_vms reached: no type to rank (every pass of a full fleet)
            short = True
            continue
        if on_demand_jobs:
            priced = _fitting(group, snapshot.catalog, on_demand=True)
            picked = _cheapest_for(
                group.shape,
                [t for t in priced if snapshot.on_demand_blocked_until.get(t.name, 0.0) <= now],
                on_demand_jobs,
            )
            if picked is not None:
                od_type, od_slots = picked
                wanted_vms = math.ceil(on_demand_jobs / od_slots)
                count = min(budget, wanted_vms)
                short = short or count < wanted_vms
                if count:
                    budget -= count
                    launches.append(Launch(od_type.name, count, group.bag_id, spot=False))
        remaining = spot_jobs
        if remaining == 0:
            continue
        if budget <= 0:
            short = True
            continue
        open_types = [t for t in fitting if snapshot.blocked_until.get(t.name, 0.0) <= now]
        choice = None
        if snapshot.market is not None:
            choice = policy_type(snapshot.market, group.shape, open_types)
        if choice is None:
            choice = cheapest_type(group.shape, open_types)
        if choice is None:  # every type that can hold the job is backed off
            until = min(
                snapshot.blocked_until[t.name]
                for t in fitting
                if t.name in snapshot.blocked_until and copies_that_fit(group.shape, t.capacity)
            )
            blocked_wake = until if blocked_wake is None else min(blocked_wake, until)
            continue
        vm_type, slots = choice
        wanted = math.ceil(remaining / slots)
        count = min(max(budget, 0), wanted)
        short = short or count < wanted
        if count == 0:
            continue
        budget -= count
        launches.append(Launch(vm_type.name, count, group.bag_id))
        _spot_launched(shares.get(group.bag_id), min(remaining, count * slots))
    return launches, unplaceable, blocked_wake, short


def _spot_launched(share: MarketShare | None, jobs: int) -> None:
    """Spot VMs were launched for `jobs` of a bag with on-demand slots: its slots left to
    spot are theirs (what still waits does not also queue ahead on spot VMs for them)."""
    if share is not None:
        share.spot_left -= jobs


def _cheapest_for(
    shape: Shape, types: Sequence[PricedType], jobs: int
) -> tuple[PricedType, int] | None:
    """The type whose VMs hold `jobs` jobs for the least per hour (ceil(jobs / slots)
    × price: on-demand VMs are paid whole, and a few slots are wanted at a time), then
    the cheapest per slot; and its slot count. None when none fits."""
    best: tuple[float, float, str, PricedType, int] | None = None
    for vm_type in types:
        slots = copies_that_fit(shape, vm_type.capacity)
        if slots == 0:
            continue
        key = (
            math.ceil(jobs / slots) * vm_type.price_per_hour,
            vm_type.price_per_hour / slots,
            vm_type.name,
        )
        if best is None or key < best[:3]:
            best = (*key, vm_type, slots)
    return None if best is None else (best[3], best[4])


# `_fitting_types` answers, per catalog (the scheduler's is one tuple for its whole life):
# the catalog, then per (shape, allowed types, regions) the answer.
_FITTING_MEMO: dict[
    int,
    tuple[
        Sequence[CatalogType],
        dict[
            tuple[Shape, tuple[str, ...] | None, tuple[str, ...] | None],
            tuple[list[PricedType], bool],
        ],
    ],
] = {}


def _fitting_types(
    group: DemandGroup, catalog: Sequence[CatalogType]
) -> tuple[list[PricedType], bool]:
    """`_fitting(group, catalog)` (spot prices), and whether any of those types holds one
    of its jobs: remembered for a tuple catalog (immutable, and the same object every
    pass), since every pass with demand left over asks (what follows reads the list and
    does not change it)."""
    if type(catalog) is not tuple:
        fitting = _fitting(group, catalog)
        return fitting, any(copies_that_fit(group.shape, t.capacity) for t in fitting)
    known = _FITTING_MEMO.get(id(catalog))
    if known is None or known[0] is not catalog:
        if len(_FITTING_MEMO) >= 64:  # catalogs of schedulers gone (tests make many)
            _FITTING_MEMO.clear()
        known = _FITTING_MEMO[id(catalog)] = (catalog, {})
    key = (group.shape, group.vm_types, group.regions)
    try:
        answer = known[1].get(key)
    except TypeError:  # allowed types or regions given as a list: not remembered
        fitting = _fitting(group, catalog)
        return fitting, any(copies_that_fit(group.shape, t.capacity) for t in fitting)
    if answer is None:
        fitting = _fitting(group, catalog)
        answer = fitting, any(copies_that_fit(group.shape, t.capacity) for t in fitting)
        known[1][key] = answer
    return answer


def _fitting(
    group: DemandGroup, catalog: Sequence[CatalogType], on_demand: bool = False
) -> list[PricedType]:
    """The group's allowed types, priced at spot or (`on_demand`) on-demand rates (a
    type with no on-demand price counts at its spot price)."""
    return [
        PricedType(
            t.name,
            t.capacity,
            (t.on_demand_price_per_hour or t.spot_price_per_hour)
            if on_demand
            else t.spot_price_per_hour,
        )
        for t in catalog
        if _eligible(group, t.name, t.zone)
    ]


def preferred_launch(
    market: TypeMarket, group: DemandGroup, catalog: Sequence[CatalogType]
) -> tuple[PricedType, int] | None:
    """The type (and slots) the hopping policy picks for new VMs of `group`'s jobs,
    ignoring launch back-offs; what the hopper compares a running VM's type with."""
    return policy_type(market, group.shape, _fitting(group, catalog))


def pool_vm_type(
    market: TypeMarket | None,
    shape: Shape,
    catalog: Sequence[CatalogType],
    allowed: Sequence[str],
) -> str | None:
    """The type of a new VM for a Slurm power-saving pool node of `shape`: the hopping
    policy's pick among the pool's `allowed` types, else the cheapest of them."""
    group = DemandGroup("pool", shape, 1, tuple(allowed), None)
    fitting = _fitting(group, catalog)
    choice = policy_type(market, shape, fitting) if market is not None else None
    choice = choice or cheapest_type(shape, fitting)
    return choice[0].name if choice is not None else None


def policy_type(
    market: TypeMarket, shape: Shape, types: Sequence[PricedType]
) -> tuple[PricedType, int] | None:
    """The type the hopping policy prefers for VMs of `shape` jobs among `types`, and its
    slot count; None when the market knows none of them usable (the caller falls back on
    the catalog's prices)."""
    position = {name: i for i, name in enumerate(market.names)}
    slots = np.zeros(len(market.names))
    offered = {}
    for vm_type in types:
        i = position.get(vm_type.name)
        if i is not None:
            slots[i] = copies_that_fit(shape, vm_type.capacity)
            offered[i] = vm_type
    if not offered:
        return None
    scores = market.launch_scores(shape.cpus, shape.memory_gb, slots)
    candidates = [(scores[i], market.names[i], i) for i in offered if np.isfinite(scores[i])]
    if not candidates:
        return None
    _, _, best = min(candidates)
    return offered[best], int(slots[best])


def why_unplaceable(
    shape: Shape,
    vm_types: Sequence[str] | None,
    regions: Sequence[str] | None,
    catalog: Sequence[CatalogType],
) -> str | None:
    """Why no allowed VM type can hold a job of `shape`, or None when one can."""
    allowed = [
        t
        for t in catalog
        if (vm_types is None or t.name in vm_types) and zone_allowed(t.zone, regions)
    ]
    if not allowed:
        return "no VM type is allowed by resources.vm_types / resources.regions"
    if any(copies_that_fit(shape, t.capacity) for t in allowed):
        return None
    largest = max(allowed, key=lambda t: (t.capacity.cpus, t.capacity.memory_gb, t.capacity.gpus))
    return (
        f"no VM type fits cpus={shape.cpus}, gpus={shape.gpus}, memory_gb={shape.memory_gb:g}; "
        f"the largest allowed is {largest.name} with cpus={largest.capacity.cpus}, "
        f"gpus={largest.capacity.gpus}, memory_gb={largest.capacity.memory_gb:g}"
    )
