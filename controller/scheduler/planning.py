"""Planning: what the pure planner sees, and its decision recorded as intents.

`snapshot` describes the open world to `controller.planner.plan` (which places jobs
by the VM reuse policy, docs/design.md#reuse, and picks types by price or by the hopping market): the
demand per bag (queued jobs, their shape, allowed types and regions, runtime estimate
in model hours), the VMs that can take work (pending, roomy or idle, draining; with an
executor that queues attempts, full VMs too, up to `queue_ahead` of their capacity),
the catalog, the limits, the VM types backed off and the hopping market. While the
executor cannot take attempts nothing is placed or launched for.

`record_plan` records the decision's intents in the pass's batch *before* anything is
acted on: unplaceable jobs fail, placed jobs get STARTING attempts, launches get
PENDING VMs, terminations mark their VMs; so a crash never leaves a VM or a process
the store does not know.

`Planning` is given the scheduler's `World` (controller/scheduler/world.py), whose
bags, jobs, attempts, VMs and indexes both halves read or change, and what else it
reads: the executor (how far it queues, where logs go), the back-off
(controller/scheduler/backoff.py), the preemption models, the settings and the id
source for new VMs. It owns no state of its own.
"""

from __future__ import annotations

import logging
import math
from itertools import islice

from controller.bags.job_command import render_command
from controller.bags.waiting_jobs import JobQueue
from controller.config import SchedulerConfig
from controller.executors.base import AttemptSpec, Executor
from controller.planner import DemandGroup, Plan, Snapshot, VmView
from controller.preemption.model_book import ModelBook
from controller.scheduler.backoff import Backoff
from controller.scheduler.deadlines import Deadlines, SpotPriceFeed, outbid_s
from controller.scheduler.inputs import IdSource
from controller.scheduler.runs import AttemptRun, BagRun, VmRun, capacity_of
from controller.scheduler.world import World
from controller.states import AttemptState, JobState
from controller.store import WriteBatch
from drivers.base import VmState
from policies.packing import Shape
from policies.queue_depth import queue_ahead_for

# With a spot price feed, a type outbid now is looked at again this often (real s), as a
# scheduler polling the market would (the feed knows no future).
OUTBID_RECHECK_S = 300.0

log = logging.getLogger("spotbag.scheduler")


# A bag's last this many successes bound its jobs' runtime for the queue's depth.
LATEST_RUNTIMES = 20


def _runtime_bound_s(bag: BagRun) -> float:
    """A bag's jobs' runtime as the queue's depth takes it: its estimate (the 90th
    percentile of its recent successes, re-read every 50; before 5, its hint or its
    max_runtime_s), or the longest of its last LATEST_RUNTIMES successes if longer, so
    that jobs turning long end a deep queue at once, while one slow job among trivial
    ones (7.7 ms at the 99th percentile of 2,000 `echo`s, 0.9 ms at the median) leaves
    it deep for long."""
    latest = islice(reversed(bag.runtimes_s.order), LATEST_RUNTIMES)
    return max(bag.runtime_estimate_s, max(latest, default=0.0))


def _queue_room(vm: VmRun, queue_ahead: float) -> Shape:
    """Room left on a VM for attempts that wait in the executor's queue: `queue_ahead`
    of its capacity, less what is placed beyond its capacity already."""
    cap, free = vm.capacity, vm.free
    return Shape(
        int(cap.cpus * queue_ahead) - max(0, -free.cpus),
        int(cap.gpus * queue_ahead) - max(0, -free.gpus),
        cap.memory_gb * queue_ahead - max(0.0, -free.memory_gb),
    )


class Planning:
    """The planner's view and its decision as intents (see the module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        executor: Executor,
        backoff: Backoff,
        book: ModelBook | None,
        settings: SchedulerConfig,
        ids: IdSource,
        time_scale: float,
        deadlines: Deadlines | None = None,
        spot_feed: SpotPriceFeed | None = None,
    ) -> None:
        self.world = world
        self.executor = executor
        self.backoff = backoff
        self.book = book
        self.settings = settings
        self.ids = ids
        self.time_scale = time_scale
        self.deadlines = deadlines  # on-demand slots per bag (docs/design.md#deadlines)
        self.spot_feed = spot_feed  # the spot price simulate replays (None: no feed)

    def snapshot(self, now: float) -> Snapshot:
        world = self.world
        to_hours = self.time_scale / 3600.0  # real seconds -> model hours
        # While the executor cannot take attempts, nothing is placed (or launched for).
        blocked = now < self.backoff.starts_blocked_until
        noticed = self._noticed_jobs() if world.draining else {}
        if self.deadlines is not None:
            self.deadlines.begin_pass()
        demand = (
            []
            if blocked
            else [
                self._on_demand(
                    DemandGroup(
                        bag.id,
                        bag.shape,
                        # At most what its budgets leave room for (controller/budgets.py).
                        world.budgets.launchable(bag, len(bag.queue), world.catalog_view, now),
                        bag.allowed_types,
                        bag.regions,
                        bag.runtime_estimate_s * to_hours,
                        noticed.get(bag.id, 0),
                    ),
                    bag,
                    now,
                )
                for bag in world.bags.values()
                if (bag.queue or bag.id in noticed) and not bag.cancel_requested
            ]
        )
        queue_ahead = 0.0
        if demand and self.executor.queue_ahead > 0:  # (0: only what fits, whatever waits)
            # One depth for every VM's queue, which takes the oldest bag's jobs first:
            # deep only while every waiting bag's jobs are short.
            waiting = [world.bags[group.bag_id] for group in demand if group.queued]
            queue_ahead = queue_ahead_for(
                self.executor.queue_ahead,
                self.executor.backlog_pass_interval_s,
                max((_runtime_bound_s(bag) for bag in waiting), default=0.0),
            )
        if queue_ahead:  # full VMs may take attempts to queue too
            usable = [
                v.id
                for v in world.vms.values()
                if v.state is VmState.RUNNING and v.ready and not v.terminating and not v.pool_node
            ]
            candidates = list(world.pending) + usable
        else:
            candidates = list(world.pending) + list(world.roomy if demand else world.idle)
        if world.draining:
            candidates += [
                v for v in world.draining if v not in world.roomy and v not in world.idle
            ]
        # A VM whose ended attempt's job the executor has not seen end is not empty yet
        # (ended now, Slurm would record the job as NODE_FAIL): it counts as running one.
        settling = self.executor.vms_settling()
        views = []
        vms = world.vms
        for vm_id in candidates:
            vm = vms[vm_id]
            running = len(vm.attempts) or (1 if vm_id in settling else 0)
            views.append(
                VmView(
                    vm.id,
                    vm.vm_type.name,
                    vm.zone,
                    vm.state if vm.ready else VmState.PENDING,
                    vm.capacity,
                    vm.free,
                    running,
                    vm.idle_since,
                    vm.requested_at,
                    max(0.0, now - vm.requested_at) * to_hours,
                    vm.table,
                    vm.draining,
                    _queue_room(vm, queue_ahead) if queue_ahead else None,
                    vm.rejoin_since,
                    vm.spot,
                )
            )
        return Snapshot(
            now=now,
            demand=demand,
            vms=views,
            catalog=world.catalog_view,
            # A VM with a preemption notice is on its way out: its replacement may be
            # launched within max_vms now.
            alive_vms=len(world.vms)
            - len(world.pool_vms)
            - (self._noticed_vms() if world.draining else 0),
            max_vms=self.settings.max_vms,
            idle_timeout_s=self.settings.idle_timeout_s,
            boot_timeout_s=self.settings.boot_timeout_s,
            hot_spare_s=self.book.settings.hot_spare_h * 3600.0 / self.time_scale
            if self.book
            else 0.0,
            blocked_until=self._spot_blocked_until(now),
            on_demand_blocked_until=self.backoff.blocked_types(spot=False)
            if self.backoff.on_demand_types
            else {},
            market=world.market,
        )

    def _spot_blocked_until(self, now: float) -> dict[str, float]:
        """Until when each VM type's spot launches wait: its back-off after failed
        launches and, with a price feed, while its spot price is above its bid (the
        on-demand price: the launch would be refused) until the price is looked at again
        (`OUTBID_RECHECK_S`, or sooner if the outage is expected to end sooner)."""
        blocked = self.backoff.blocked_types() if self.backoff.types else {}
        feed = self.spot_feed
        if feed is None:
            return blocked
        for t in self.world.catalog_view:
            left_s = outbid_s(feed, t.name, t.zone, t.on_demand_price_per_hour or math.inf, now)
            if left_s > 0:
                until = now + min(left_s, OUTBID_RECHECK_S)
                blocked[t.name] = max(blocked.get(t.name, 0.0), until)
        return blocked

    def _on_demand(self, group: DemandGroup, bag: BagRun, now: float) -> DemandGroup:
        """The group with its on-demand slots (`on_demand: always`, or the deadline
        policy's decision: controller/scheduler/deadlines.py)."""
        if self.deadlines is None or bag.spec.on_demand_mode == "never":
            return group
        wanted = self.deadlines.plan_for(bag, now)
        if wanted is None:
            return group
        queued, slots, spot_slots = group.queued, wanted.slots, wanted.spot_slots
        if bag.spec.on_demand_mode == "when_needed" and slots > wanted.running:
            # Budgets priced every attempt at spot (`launchable`); those placed on
            # on-demand VMs cost more: as many as the budgets pay for, the rest on spot.
            queued, on_demand = self.world.budgets.launchable_with_on_demand(
                bag, queued, slots - wanted.running, self.world.catalog_view, now
            )
            if spot_slots is not None:  # the slots left to spot get those it cannot pay for
                spot_slots += max(0, slots - wanted.running - on_demand)
            slots = min(slots, wanted.running + on_demand)
        return group._replace(
            queued=queued,
            on_demand_slots=slots,
            on_demand_running=wanted.running,
            use_spot=wanted.use_spot,
            spot_slots_left=None
            if spot_slots is None
            else max(0, spot_slots - wanted.spot_running),
        )

    def _noticed_vms(self) -> int:
        world = self.world
        return sum(1 for vm_id in world.draining if world.vms[vm_id].notice_until is not None)

    def _noticed_jobs(self) -> dict[str, int]:
        """Per bag, its attempts running on VMs that got a preemption notice."""
        world = self.world
        counts: dict[str, int] = {}
        for vm_id in world.draining:
            vm = world.vms[vm_id]
            if vm.notice_until is None:
                continue
            for attempt_id in vm.attempts:
                attempt = world.attempts.get(attempt_id)
                if attempt is not None and not attempt.cancelling:
                    counts[attempt.bag_id] = counts.get(attempt.bag_id, 0) + 1
        return counts

    def record_plan(
        self, decision: Plan, batch: WriteBatch, now: float
    ) -> tuple[list[AttemptSpec], list[VmRun]]:
        world = self.world
        for problem in decision.unplaceable:
            bag = world.bags[problem.bag_id]
            queued, bag.queue = bag.queue, JobQueue()
            for idx in queued:
                world.job_to(
                    world.queued_job(bag, idx), JobState.FAILED, now, batch, problem.reason
                )
        starts: list[AttemptSpec] = []
        for place in decision.places:
            bag = world.bags[place.bag_id]
            vm = world.vms[place.vm_id]
            for _ in range(place.count):
                idx = bag.queue.popleft()
                if not self._budget_reserved(bag, vm, idx, now, batch):
                    bag.queue.appendleft(idx)  # held: budget (it waits, queued)
                    break
                starts.append(self._new_attempt(bag, vm, idx, now, batch))
            world.refresh_vm_sets(vm)
        self._budget_holds(batch, now)
        launches: list[VmRun] = []
        for launch in decision.launches:
            vm_type = world.catalog[launch.vm_type]
            for _ in range(launch.count):
                vm = VmRun(
                    id=self.ids.new_vm_token(),
                    vm_type=vm_type,
                    state=VmState.PENDING,
                    requested_at=now,
                    zone=vm_type.zone,
                    free=capacity_of(vm_type),
                    spot=launch.spot,
                )
                world.assume_model(vm)
                world.track_vm(vm)
                batch.vm(vm.row(world.driver_name, world.time_scale))
                batch.transition(
                    now,
                    "vm",
                    vm.id,
                    "",
                    VmState.PENDING,
                    f"for bag {launch.bag_id}" + ("" if launch.spot else " (on-demand)"),
                )
                launches.append(vm)
        for termination in decision.terminations:
            ending = world.vms.get(termination.vm_id)
            if ending is None:
                continue  # ended earlier in this pass
            ending.terminating = True
            ending.reason = termination.reason
            world.refresh_vm_sets(ending)
        return starts, launches

    # --- budgets (controller/budgets.py): checked and reserved before every attempt ------

    def _budget_reserved(
        self, bag: BagRun, vm: VmRun, idx: int, now: float, batch: WriteBatch
    ) -> bool:
        """Reserve the attempt's worst case under its bag's and account's budgets, in
        this pass's batch (the transaction that records the attempt); False holds the bag."""
        if not self.world.budgets.limited(bag):
            return True  # no caps: nothing to reserve (every attempt of most bags)
        job = self.world.jobs.get((bag.id, idx))
        number = (job.attempts if job is not None else 0) + 1
        entries = self.world.budgets.reserve_attempt(bag, vm, idx, number, now)
        if entries is None:
            return False
        batch.budget_entries(now, entries)
        return True

    def _budget_holds(self, batch: WriteBatch, now: float) -> None:
        """Bags a budget has just held: budget_reached, once per hold."""
        world = self.world
        for bag_id, _account, why in world.budgets.take_new_holds():
            bag = world.bags.get(bag_id)
            if bag is not None:
                log.info("bag %s held: budget: %s", bag_id, why)
                world.notices.budget_reached(bag, why, now, batch)

    def _new_attempt(
        self, bag: BagRun, vm: VmRun, idx: int, now: float, batch: WriteBatch
    ) -> AttemptSpec:
        world = self.world
        job = world.queued_job(bag, idx)
        job.attempts += 1
        job.vm_id = vm.id
        job.started_at = now
        attempt = AttemptRun(
            bag.id,
            idx,
            job.attempts,
            vm.id,
            AttemptState.STARTING,
            now,
            self.executor.log_path(bag.id, job.id, job.attempts),
            bag.shape,
            saved_s=job.work_saved_s,
        )
        world.attempts[attempt.id] = attempt
        bag.live_attempts += 1
        vm.attempts[attempt.id] = None
        vm.free = vm.free.minus(bag.shape)
        vm.idle_since = None
        batch.attempt(
            bag.id, idx, attempt.number, vm.id, attempt.state, now, None, None, "", attempt.log_path
        )
        world.job_to(job, JobState.RUNNING, now, batch, f"attempt {attempt.number} on {vm.id}")
        spec = bag.spec
        return AttemptSpec(
            cpus=spec.resources.cpus,
            memory_gb=spec.resources.memory_gb,
            gpus=spec.resources.gpus,
            account=spec.account,
            attempt_id=attempt.id,
            bag_id=bag.id,
            job_id=job.id,
            number=attempt.number,
            vm_id=vm.id,
            command=render_command(spec.command, job.params),
            params=job.params,
            env=spec.env,
            workdir=spec.workdir,
            max_runtime_s=spec.max_runtime_s,
            estimated_runtime_s=spec.estimated_runtime_s,
            simulation=spec.simulation,
            resume_work_s=job.work_saved_s if spec.checkpointable else 0.0,
            checkpoint_cost_s=spec.checkpoint_cost_s,
        )
