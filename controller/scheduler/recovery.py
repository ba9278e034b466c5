"""Recovery: rebuild the scheduler's memory from the store after a restart (or after a
failed pass) and reconcile it with what the driver and the executor still have.

- Active bags, their open jobs (queued, held, running) and their runtime history are
  loaded; jobs that never started stay compact strings until they first run.
- The driver's VMs are matched to the stored ones by token: a VM the driver owns but
  the store does not know is terminated; a stored VM the driver no longer has is
  recorded TERMINATED ("not found after controller restart").
- Live attempts are handed to the executor to re-adopt (`Executor.recover`); those it
  cannot re-adopt are marked LOST (not counted against max_attempts) and their jobs
  queued again, unless their end already waits in the inbox. Re-adopted running
  attempts get their checkpoint schedule again; on a VM under a preemption notice
  heard before the restart, they are asked to checkpoint and move again.
- Bags with nothing open left are finished; cancellations under way are resumed.

`Recovery` rebuilds the scheduler's `World` (controller/scheduler/world.py) and what
its collaborators keep about it: it is given the world, the accounts (loaded from the
ledger), the Slurm pools (their open runs), the checkpoint timer (its plans), the events
(an attempt whose VM is gone ends as `Events.end_on_gone_vm` says), the inbox (ends
already waiting there, statuses seen, cancellations resumed), and the store, driver,
executor and clock it reconciles with.
"""

from __future__ import annotations

import json
import logging

from controller.bags.spec import BagSpec
from controller.bags.waiting_jobs import FreshParams, JobQueue
from controller.budgets import month_of, month_start
from controller.executors.base import AttemptEvent, Executor, LiveAttempt, Outcome
from controller.ledger import Accounts
from controller.scheduler.calls import Calls
from controller.scheduler.checkpoints import CheckpointTimer
from controller.scheduler.events import Events
from controller.scheduler.inputs import Clock, Inbox, _Cancel
from controller.scheduler.runs import AttemptRun, BagRun, JobRun, VmRun, capacity_of, shape_of
from controller.scheduler.slurm_pools import SlurmPools
from controller.scheduler.world import World
from controller.states import AttemptState, JobState
from controller.store import Store
from controller.store.batch import WriteBatch
from controller.store.rows import ActiveBag, LiveAttemptRow, OpenJob, VmRow
from drivers.base import Driver, VmState, VmType

log = logging.getLogger("spotbag.scheduler")


class Recovery:
    """Restart re-adoption (see the module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        store: Store,
        driver: Driver,
        executor: Executor,
        clock: Clock,
        accounts: Accounts,
        pools: SlurmPools,
        checkpoints: CheckpointTimer,
        events: Events,
        inbox: Inbox,
        calls: Calls,
    ) -> None:
        self.world = world
        self.store = store
        self.driver = driver
        self.executor = executor
        self.clock = clock
        self.accounts = accounts
        self.pools = pools
        self.checkpoints = checkpoints
        self.events = events
        self.inbox = inbox
        self.calls = calls

    async def recover(self) -> None:
        """Rebuild memory from the store (after a start, or after a failed pass) and
        reconcile it with what the driver and executor still have, in phases: bags and
        their jobs, VMs against the driver's, attempts against the executor's, then
        what ended meanwhile and what was under way."""
        await self.calls.starts_settled()  # the executor has every attempt it was given
        self._forget_everything()
        now = self.clock.now()
        # Accounts.load takes a dict of lists of dicts: a LedgerState is what it reads.
        self.accounts.load(await self.store.ledger_state())
        notices = self.world.notices
        notices.account_webhooks.clear()
        for account, webhooks in (await self.store.account_webhooks()).items():
            notices.set_account_webhooks(account, webhooks)
        budget_state = await self.store.budget_state(month_of(now), month_start(now))
        self.world.budgets.load(budget_state, now)
        state = await self.store.load_active()
        batch = self.store.new_batch()
        self._load_bags(state["bags"])
        self._load_jobs(state["jobs"])
        self.pools.load_runs(state["slurm_runs"])
        missing = await self._load_vms(state["vms"])
        # Every live attempt first (a bag with live attempts is not done), then the
        # ones the executor does not run any more are lost.
        attempts = self._load_attempts(state["attempts"], now)
        live = [vm.id for vm in self.world.vms.values() if vm.id not in {m.id for m in missing}]
        adopted = await self.executor.recover(
            [self._live_attempt(a) for a in attempts],
            live,
        )
        gone_vms = self._reconcile_attempts(attempts, adopted, missing, now, batch)
        for vm in missing:
            # As for a VM found gone while running (Events._on_status): a cluster
            # forgets its node, and a pool node is let go at once (a pool VM lost while
            # it booted left its node powering up, its job waiting out ResumeTimeout).
            pool_node_held = bool(vm.pool_node) and not vm.released_by_slurm
            if (self.executor.confirms_ends and vm.attempts) or pool_node_held:
                await self.calls.call(self.executor.vm_lost(vm.id, vm.pool_node))
            self.world.end_vm(
                vm, VmState.TERMINATED, now, "not found after controller restart", batch
            )
        for vm_id in gone_vms:  # the executor stops what it still has there
            await self.calls.call(self.executor.vm_lost(vm_id))
        await self._resume_vms(now)
        for vm in self.world.vms.values():  # a notice heard before the restart still holds
            if (
                vm.notice_until is not None
                and vm.notice_until > now
                and vm.state is VmState.RUNNING
            ):
                self.events.move_off_noticed(vm, vm.notice_until, now)
        for bag in list(self.world.bags.values()):
            if bag.done:
                self.world.finish_bag(bag, now, batch)
            elif bag.cancel_requested:
                self.inbox.commands.append(_Cancel(bag.id))
        await self.store.apply(batch)
        log.info(
            "recovered %d active bags, %d open jobs, %d live VMs, %d adopted attempts",
            len(self.world.bags),
            sum(b.open_jobs for b in self.world.bags.values()),
            len(self.world.vms),
            len(adopted),
        )

    def _load_bags(self, bag_rows: list[ActiveBag]) -> None:
        """Active bags, with their counts and runtime history."""
        for bag_row in bag_rows:
            spec = BagSpec.from_stored(bag_row["spec"])
            counts = bag_row["counts"]
            self.world.bags[bag_row["id"]] = BagRun(
                id=bag_row["id"],
                spec=spec,
                shape=shape_of(spec),
                queue=JobQueue(),
                fresh=FreshParams(),
                open_jobs=sum(counts.get(s, 0) for s in ("queued", "held", "running")),
                failed_jobs=counts.get("failed", 0),
                cancelled_jobs=counts.get("cancelled", 0),
                cancel_requested=bag_row["cancel_requested_at"] is not None,
            )
            bag = self.world.bags[bag_row["id"]]
            bag.deadline_at = spec.deadline_at(bag_row["created_at"])  # kept: it is stored
            bag.submitted_at, bag.jobs_total = bag_row["created_at"], sum(counts.values())
            bag.runtimes_s.extend(bag_row["runtimes_s"])
            bag.successes = len(bag_row["runtimes_s"])
            bag.refresh_estimate()

    def _load_jobs(self, job_rows: list[OpenJob]) -> None:
        """Open jobs: those that never ran stay compact (their parameters a string)."""
        for job_row in job_rows:
            bag = self.world.bags[job_row["bag_id"]]
            if job_row["state"] in (JobState.QUEUED, JobState.HELD) and job_row["attempts"] == 0:
                bag.fresh[job_row["idx"]] = job_row["params"]
                if job_row["state"] == JobState.QUEUED:
                    bag.queue.append(job_row["idx"])
                else:
                    bag.held[job_row["idx"]] = None
                    self.accounts.hold(bag.spec.account, bag.id, job_row["idx"])
                continue
            job = JobRun(
                bag_id=job_row["bag_id"],
                idx=job_row["idx"],
                params=json.loads(job_row["params"]),
                state=JobState(job_row["state"]),
                attempts=job_row["attempts"],
                counted=job_row["counted_attempts"],
                vm_id=job_row["vm_id"],
                started_at=job_row["started_at"],
                work_saved_s=job_row["work_saved_s"],
                checkpoints=job_row["checkpoints"],
            )
            self.world.jobs[(job.bag_id, job.idx)] = job
            if job.state is JobState.QUEUED:
                bag.queue.append(job.idx)
            elif job.state is JobState.HELD:
                bag.held[job.idx] = None
                self.accounts.hold(bag.spec.account, bag.id, job.idx)

    async def _load_vms(self, vm_rows: list[VmRow]) -> list[VmRun]:
        """The stored VMs matched to the driver's by token; a VM the driver owns but the
        store does not know is terminated. Returns the stored VMs the driver lacks."""
        owned = {s.token: s for s in await self.driver.list_owned()}
        missing: list[VmRun] = []
        for vm_row in vm_rows:
            vm = self._vm_of_row(vm_row)
            status = owned.pop(vm.id, None)
            if status is not None and status.vm_id:
                vm.provider_id = status.vm_id
            self.world.assume_model(vm)
            self.world.track_vm(vm)
            if status is None:
                missing.append(vm)
            elif status.state is not vm.state:
                self.inbox.push(status)
        for status in owned.values():
            log.warning(
                "terminating VM %s (token %s): owned by this controller but not in the store",
                status.vm_id,
                status.token,
            )
            await self.calls.call(self.driver.terminate([status.vm_id]))
        return missing

    def _vm_of_row(self, vm_row: VmRow) -> VmRun:
        vm_type = self._vm_type_of_row(vm_row)
        return VmRun(
            id=vm_row["id"],
            vm_type=vm_type,
            state=VmState(vm_row["state"]),
            requested_at=vm_row["requested_at"],
            spot=bool(vm_row["spot"]),
            zone=vm_row["zone"],
            provider_id=vm_row["provider_id"],
            running_at=vm_row["running_at"],
            reason=vm_row["reason"],
            free=capacity_of(vm_type),
            # A VM joins the executor's cluster anew in its eyes: it says so again. A
            # pool VM is Slurm's to watch.
            ready=not self.executor.joins_vms or bool(vm_row["pool_node"]),
            ready_at=vm_row["ready_at"],
            pool_node=vm_row["pool_node"],
            # A noticed VM stays drained: no new attempt; it ends once empty.
            notice_until=vm_row["notice_until"],
            draining="spot notice (heard before the restart)" if vm_row["notice_until"] else "",
        )

    def _load_attempts(self, attempt_rows: list[LiveAttemptRow], now: float) -> list[AttemptRun]:
        """The live attempts, each counted in its bag; one whose VM ended before the
        restart carries why (its executor had not confirmed its end)."""
        attempts = []
        for attempt_row in attempt_rows:
            bag = self.world.bags[attempt_row["bag_id"]]  # a live attempt keeps its bag active
            attempt = AttemptRun(
                bag_id=attempt_row["bag_id"],
                idx=attempt_row["idx"],
                number=attempt_row["number"],
                vm_id=attempt_row["vm_id"],
                state=AttemptState(attempt_row["state"]),
                started_at=attempt_row["started_at"],
                log_path=attempt_row["log_path"],
                shape=bag.shape,
                ref=attempt_row["ref"],
                ran_at=attempt_row["ran_at"],
                mark_at=attempt_row["checkpointed_at"] or attempt_row["started_at"],
            )
            open_job = self.world.jobs.get((attempt.bag_id, attempt.idx))
            attempt.saved_s = open_job.work_saved_s if open_job is not None else 0.0
            if attempt_row["vm_state"] not in (None, VmState.PENDING, VmState.RUNNING):
                vm_state, reason = attempt_row["vm_state"], attempt_row["vm_reason"] or ""
                detail = reason.removeprefix(f"{vm_state}: ")
                attempt.vm_gone = f"VM {attempt.vm_id} {vm_state}" + (
                    f": {detail}" if detail else ""
                )
                attempt.vm_gone_at = attempt_row["vm_ended_at"] or now
            self.world.attempts[attempt.id] = attempt
            bag.live_attempts += 1
            attempts.append(attempt)
        return attempts

    def _live_attempt(self, attempt: AttemptRun) -> LiveAttempt:
        spec = self.world.bags[attempt.bag_id].spec
        return LiveAttempt(
            attempt.id,
            attempt.vm_id,
            attempt.started_at,
            spec.max_runtime_s,
            attempt.ref,
            spec.account,
        )

    def _reconcile_attempts(
        self,
        attempts: list[AttemptRun],
        adopted: set[str],
        missing: list[VmRun],
        now: float,
        batch: WriteBatch,
    ) -> set[str]:
        """Each loaded attempt: re-adopted onto its VM, left for its gone VM's end, or
        lost. Returns the ended VMs whose attempts the executor still runs."""
        # An attempt whose end is waiting in the inbox is not lost, even when its VM is
        # gone: its event (e.g. it finished while the controller was down) says how it ended.
        ended = {e.attempt_id for e in self.inbox.events if isinstance(e, AttemptEvent)}
        missing_ids = {vm.id for vm in missing}
        gone_vms: set[str] = set()
        for attempt in attempts:
            host = self.world.vms.get(attempt.vm_id)
            on_missing_vm = host is not None and host.id in missing_ids
            if (
                attempt.id in adopted
                and host is not None
                and (self.executor.confirms_ends or not on_missing_vm)
            ):
                host.attempts[attempt.id] = None
                host.free = host.free.minus(attempt.shape)
                if attempt.state is AttemptState.RUNNING and not on_missing_vm:
                    self.checkpoints.plan(attempt, now)
                continue  # on a missing VM: `World.end_vm` ends it, or waits for its end
            if attempt.id in adopted and attempt.vm_gone and self.executor.confirms_ends:
                gone_vms.add(attempt.vm_id)  # its end comes once its job is gone
                continue
            if attempt.id in ended:
                continue
            if attempt.vm_gone:  # the executor has not got it: its VM's end ends it
                self.events.end_on_gone_vm(
                    attempt, AttemptEvent(attempt.id, now, Outcome.KILLED, None), batch
                )
                continue
            self.world.finish_attempt(
                attempt,
                AttemptState.LOST,
                now,
                None,
                "the controller restarted while it ran",
                batch,
            )
        return gone_vms

    async def _resume_vms(self, now: float) -> None:
        """Idle clocks restart; a running VM not yet ready is announced to the executor
        again (one that had joined is re-joining, not booting)."""
        for vm in self.world.vms.values():
            if vm.state is VmState.RUNNING and not vm.attempts:
                vm.idle_since = now
            self.world.refresh_vm_sets(vm)
            if vm.state is VmState.RUNNING and not vm.ready:
                if vm.ready_at is not None:  # it had joined: not a boot to time out
                    vm.rejoin_since = now
                await self.calls.call(self.executor.vm_started(vm.id, vm.vm_type))
            elif vm.state is VmState.RUNNING and not self.executor.joins_vms:
                # Its capacity, for an executor that queues attempts itself (local).
                await self.calls.call(self.executor.vm_started(vm.id, vm.vm_type))

    def _vm_type_of_row(self, row: VmRow) -> VmType:
        """A stored VM's type: the catalog's, or as the row recorded it (a type since
        removed from the configuration)."""
        return self.world.catalog.get(row["vm_type"]) or VmType(
            row["vm_type"],
            row["cpus"],
            row["memory_gb"],
            row["gpus"],
            row["spot_price_per_hour"],
            row["on_demand_price_per_hour"],
            row["zone"],
        )

    def _forget_everything(self) -> None:
        self.world.clear()
        self.pools.forget()
        self.checkpoints.clear()
