"""Planning: what the pure planner sees, and its decision recorded as intents.

`_snapshot` describes the open world to `controller.planner.plan` (which places jobs
by the VM reuse policy, docs/design.md#reuse, and picks types by price or by the hopping market): the
demand per bag (queued jobs, their shape, allowed types and regions, runtime estimate
in model hours), the VMs that can take work (pending, roomy or idle, draining; with an
executor that queues attempts, full VMs too, up to `queue_ahead` of their capacity),
the catalog, the limits, the VM types backed off and the hopping market. While the
executor cannot take attempts nothing is placed or launched for.

`_record_plan` records the decision's intents in the pass's batch *before* anything is
acted on: unplaceable jobs fail, placed jobs get STARTING attempts, launches get
PENDING VMs, terminations mark their VMs; so a crash never leaves a VM or a process
the store does not know.

`PlanningMixin` is a mixin of `Scheduler`: both halves read or change most of its
state (bags, jobs, attempts, VMs and their indexes).
"""

from __future__ import annotations

from controller.bags.job_command import render_command
from controller.bags.waiting_jobs import JobQueue
from controller.executors.base import AttemptSpec
from controller.planner import DemandGroup, Plan, Snapshot, VmView
from controller.runtime import AttemptRun, BagRun, VmRun, capacity_of
from controller.scheduler.transitions import TransitionsMixin
from controller.states import AttemptState, JobState
from controller.store import WriteBatch
from drivers.base import VmState
from policies.packing import Shape


def _queue_room(vm: VmRun, queue_ahead: float) -> Shape:
    """Room left on a VM for attempts that wait in the executor's queue: `queue_ahead`
    of its capacity, less what is placed beyond its capacity already."""
    cap, free = vm.capacity, vm.free
    return Shape(
        int(cap.cpus * queue_ahead) - max(0, -free.cpus),
        int(cap.gpus * queue_ahead) - max(0, -free.gpus),
        cap.memory_gb * queue_ahead - max(0.0, -free.memory_gb),
    )


class PlanningMixin(TransitionsMixin):
    """The planner's view and its decision as intents (part of `Scheduler`; see the module
    docstring)."""

    def _snapshot(self, now: float) -> Snapshot:
        to_hours = self.time_scale / 3600.0  # real seconds -> model hours
        # While the executor cannot take attempts, nothing is placed (or launched for).
        blocked = now < self.backoff.starts_blocked_until
        noticed = self._noticed_jobs()
        demand = (
            []
            if blocked
            else [
                DemandGroup(
                    bag.id,
                    bag.shape,
                    len(bag.queue),
                    bag.allowed_types,
                    bag.regions,
                    bag.runtime_estimate_s * to_hours,
                    noticed.get(bag.id, 0),
                )
                for bag in self.bags.values()
                if (bag.queue or bag.id in noticed) and not bag.cancel_requested
            ]
        )
        queue_ahead = self.executor.queue_ahead if demand else 0.0
        if queue_ahead:  # full VMs may take attempts to queue too
            usable = [
                v.id
                for v in self.vms.values()
                if v.state is VmState.RUNNING and v.ready and not v.terminating and not v.pool_node
            ]
            candidates = list(self._pending) + usable
        else:
            candidates = list(self._pending) + list(self._roomy if demand else self._idle)
        candidates += [v for v in self._draining if v not in self._roomy and v not in self._idle]
        views = []
        for vm_id in candidates:
            vm = self.vms[vm_id]
            views.append(
                VmView(
                    vm.id,
                    vm.vm_type.name,
                    vm.zone,
                    vm.state if vm.ready else VmState.PENDING,
                    vm.capacity,
                    vm.free,
                    len(vm.attempts),
                    vm.idle_since,
                    vm.requested_at,
                    max(0.0, now - vm.requested_at) * to_hours,
                    vm.table,
                    vm.draining,
                    _queue_room(vm, queue_ahead) if queue_ahead else None,
                    vm.rejoin_since,
                )
            )
        return Snapshot(
            now=now,
            demand=demand,
            vms=views,
            catalog=self.catalog_view,
            # A VM with a preemption notice is on its way out: its replacement may be
            # launched within max_vms now.
            alive_vms=len(self.vms) - len(self._pool_vms) - self._noticed_vms(),
            max_vms=self.settings.max_vms,
            idle_timeout_s=self.settings.idle_timeout_s,
            boot_timeout_s=self.settings.boot_timeout_s,
            hot_spare_s=self.book.settings.hot_spare_h * 3600.0 / self.time_scale
            if self.book
            else 0.0,
            blocked_until=self.backoff.blocked_types(),
            market=self.market,
        )

    def _noticed_vms(self) -> int:
        return sum(1 for vm_id in self._draining if self.vms[vm_id].notice_until is not None)

    def _noticed_jobs(self) -> dict[str, int]:
        """Per bag, its attempts running on VMs that got a preemption notice."""
        counts: dict[str, int] = {}
        for vm_id in self._draining:
            vm = self.vms[vm_id]
            if vm.notice_until is None:
                continue
            for attempt_id in vm.attempts:
                attempt = self.attempts.get(attempt_id)
                if attempt is not None and not attempt.cancelling:
                    counts[attempt.bag_id] = counts.get(attempt.bag_id, 0) + 1
        return counts

    def _record_plan(
        self, decision: Plan, batch: WriteBatch, now: float
    ) -> tuple[list[AttemptSpec], list[VmRun]]:
        for problem in decision.unplaceable:
            bag = self.bags[problem.bag_id]
            queued, bag.queue = bag.queue, JobQueue()
            for idx in queued:
                self._job_to(
                    self._queued_job(bag, idx), JobState.FAILED, now, batch, problem.reason
                )
        starts: list[AttemptSpec] = []
        for place in decision.places:
            bag = self.bags[place.bag_id]
            vm = self.vms[place.vm_id]
            for _ in range(place.count):
                starts.append(self._new_attempt(bag, vm, bag.queue.popleft(), now, batch))
            self._refresh_vm_sets(vm)
        launches: list[VmRun] = []
        for launch in decision.launches:
            vm_type = self.catalog[launch.vm_type]
            for _ in range(launch.count):
                vm = VmRun(
                    id=self.ids.new_vm_token(),
                    vm_type=vm_type,
                    state=VmState.PENDING,
                    requested_at=now,
                    zone=vm_type.zone,
                    free=capacity_of(vm_type),
                )
                self._assume_model(vm)
                self._track_vm(vm)
                batch.vm(vm.row(self.driver.name, self.time_scale))
                batch.transition(now, "vm", vm.id, "", VmState.PENDING, f"for bag {launch.bag_id}")
                launches.append(vm)
        for termination in decision.terminations:
            ending = self.vms.get(termination.vm_id)
            if ending is None:
                continue  # ended earlier in this pass
            ending.terminating = True
            ending.reason = termination.reason
            self._refresh_vm_sets(ending)
        return starts, launches

    def _new_attempt(
        self, bag: BagRun, vm: VmRun, idx: int, now: float, batch: WriteBatch
    ) -> AttemptSpec:
        job = self._queued_job(bag, idx)
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
        self.attempts[attempt.id] = attempt
        bag.live_attempts += 1
        vm.attempts[attempt.id] = None
        vm.free = vm.free.minus(bag.shape)
        vm.idle_since = None
        batch.attempt(
            bag.id, idx, attempt.number, vm.id, attempt.state, now, None, None, "", attempt.log_path
        )
        self._job_to(job, JobState.RUNNING, now, batch, f"attempt {attempt.number} on {vm.id}")
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
