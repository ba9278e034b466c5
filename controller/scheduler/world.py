"""The scheduler's world: what is open (bags, jobs, attempts, VMs), the VM indexes the
planner's snapshot reads, and the only places that change job, attempt and VM state.

`World` holds the open part of what the store records, as the run records of
controller/scheduler/runs.py:

- `bags` (active bags and their queues), `jobs` (open jobs that have run or been
  touched; a waiting job that never ran is a compact string in its bag), `attempts`
  (live attempts), `vms` (live VMs: pending, running, terminating);
- the VM indexes, kept in step by `refresh_vm_sets`: `pending` (booting, or running
  and not yet joined), `roomy` (running with free capacity), `idle` (running with no
  attempt), `draining` (running, its jobs moved away), `pool_vms` (Slurm's pool nodes,
  in none of the others), and `by_provider_id`;
- the VM types on offer: `catalog` by name, `catalog_view` as the planner sees it, and
  `market`, the hopping market's live prices and policy (set by controller/hopper.py).

Each change is checked against the state machines of controller/models.py
(`check_transition`), made in memory, and written to the pass's `WriteBatch` with its
transition row and reason, so that memory and the store move together: an attempt's end
settles its CPU-hours in the ledger (controller/ledger.py, docs/design.md#ledger) and
its dollars in the budgets (controller/budgets.py), and
adds its time to its bag's usage (what it cost is the cost report's split,
controller/report.py); a job's end may finish its bag; a VM's end preempts what ran on
it. A bag's end and a storm of preemptions raise events (controller/notify/emit.py).

Every collaborator of the scheduler (controller/scheduler/loop.py says which) is given
the same `World` and changes it only through these methods or the run records' fields;
the world itself calls no collaborator: it is given the accounts it settles with, the
executor whose capabilities decide how a VM's attempts end, and the metrics it counts.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from controller.bags.waiting_jobs import decode_params
from controller.budgets import Budgets
from controller.executors.base import Executor
from controller.ledger import Accounts
from controller.notify.emit import Notices
from controller.planner import CatalogType
from controller.plumbing.metrics import Metrics
from controller.preemption.model_book import ModelBook
from controller.scheduler.runs import AttemptRun, BagRun, JobRun, VmRun, capacity_of
from controller.states import AttemptState, BagState, JobState, check_transition
from controller.store import WriteBatch
from drivers.base import VmState, VmType
from policies.index import TypeMarket

log = logging.getLogger("spotbag.scheduler")

_JOB_TERMINAL = JobState.terminal()
_ATTEMPT_COUNTED = AttemptState.counted()


def _count(children: dict[Any, Any], family: Any, state: AttemptState | JobState) -> None:
    """Count one in `family`'s child for `state`, looked up once into `children`."""
    child = children.get(state)
    if child is None:
        child = children[state] = family.labels(state=str(state))
    child.inc()


class World:
    """The open bags, jobs, attempts and VMs, their indexes, and their state changes
    (see the module docstring)."""

    def __init__(
        self,
        *,
        catalog: Sequence[VmType],
        accounts: Accounts,
        executor: Executor,
        driver_name: str,
        time_scale: float,
        book: ModelBook | None,
        metrics: Metrics | None,
        budgets: Budgets | None = None,
        notices: Notices | None = None,
    ) -> None:
        self.accounts = accounts  # CPU-hour balances (docs/design.md#ledger)
        # Dollar budgets (controller/budgets.py: an attempt's end settles its dollars) and
        # events (controller/notify/emit.py: a bag's end, a preemption storm).
        self.budgets = budgets or Budgets(time_scale=time_scale)
        self.notices = notices or Notices()
        self.executor = executor
        self.driver_name = driver_name  # written in each VM's row
        self.time_scale = time_scale  # model seconds per real second (local driver)
        self.book = book  # preemption models; None: no reuse policy, no hot spares
        self.metrics = metrics
        # The metrics' children by state, looked up once (labels() validates and locks
        # each time: ~1.5 % of the daemon's time with trivial jobs).
        self._attempts_ended: dict[AttemptState, Any] = {}
        self._jobs_finished: dict[JobState, Any] = {}
        self.catalog = {t.name: t for t in catalog}
        # A tuple: the planner remembers what fits per catalog object (planner._fitting_types).
        self.catalog_view = tuple(
            CatalogType(
                t.name, t.zone, capacity_of(t), t.spot_price_per_hour, t.on_demand_price_per_hour
            )
            for t in catalog
        )
        self.market: TypeMarket | None = None  # live prices and policy (controller/hopper.py)
        self.bags: dict[str, BagRun] = {}
        self.jobs: dict[tuple[str, int], JobRun] = {}
        self.attempts: dict[str, AttemptRun] = {}
        self.vms: dict[str, VmRun] = {}  # live VMs only (pending, running, terminating)
        self.pending: dict[str, None] = {}  # VMs not yet running
        self.roomy: dict[str, None] = {}  # running VMs with some free capacity
        self.idle: dict[str, None] = {}  # running VMs with no attempt
        self.draining: dict[str, None] = {}  # running VMs whose jobs the hopper moves away
        self.pool_vms: dict[str, None] = {}  # ids of the VMs serving pool nodes
        self.by_provider_id: dict[str, str] = {}

    def clear(self) -> None:
        """Forget everything open (recovery rebuilds it from the store)."""
        self.bags.clear()
        self.jobs.clear()
        self.attempts.clear()
        self.vms.clear()
        for index in (
            self.pending,
            self.roomy,
            self.idle,
            self.draining,
            self.by_provider_id,
            self.pool_vms,
        ):
            index.clear()

    # --- jobs and attempts: made on first use, and moved on ------------------------------

    def held_job(self, bag: BagRun, idx: int) -> JobRun:
        """A held job that never started (made on first use, like `queued_job`)."""
        job = self.jobs.get((bag.id, idx))
        if job is None:
            job = JobRun(bag.id, idx, decode_params(bag.fresh.pop(idx)), JobState.HELD)
            self.jobs[(bag.id, idx)] = job
        return job

    def requeue(self, job: JobRun, bag: BagRun, at: float, batch: WriteBatch, reason: str) -> None:
        """Queue a job again, reserving for its next attempt; hold it (first in its
        account's line) when the account cannot cover that."""
        if not bag.cancel_requested:
            entries = self.accounts.reserve_next(bag.id, job.idx, job.attempts + 1, bag.spec)
            if entries is None:
                needed = self.accounts.per_attempt_cpu_h(bag.spec)
                available = max(0.0, self.accounts.ledger.balance(bag.spec.account).available)
                why = (
                    f"{reason}; held: its next attempt needs {needed:,.2f} CPU-hours and account "
                    f"{bag.spec.account!r} has {available:,.2f} available"
                )
                self.job_to(job, JobState.HELD, at, batch, why)
                bag.held[job.idx] = None
                self.accounts.hold(bag.spec.account, bag.id, job.idx, first=True)
                return
            batch.ledger_entries(at, entries, "retry")
        self.job_to(job, JobState.QUEUED, at, batch, reason)

    def job_to_cancel(self, bag: BagRun, idx: int, state: JobState) -> JobRun:
        """A waiting job (queued or held) about to be cancelled: one that never ran is
        made without decoding its parameters, which it will never use."""
        job = self.jobs.get((bag.id, idx))
        if job is None:
            bag.fresh.pop(idx)
            job = JobRun(bag.id, idx, {}, state)
            self.jobs[(bag.id, idx)] = job
        return job

    def queued_job(self, bag: BagRun, idx: int) -> JobRun:
        """The job at `idx` of a bag's queue (made on first use: a 100,000-job bag
        costs no 100,000 objects until its jobs start)."""
        job = self.jobs.get((bag.id, idx))
        if job is None:
            job = JobRun(bag.id, idx, decode_params(bag.fresh.pop(idx)), JobState.QUEUED)
            self.jobs[(bag.id, idx)] = job
        return job

    def finish_attempt(
        self,
        attempt: AttemptRun,
        state: AttemptState,
        at: float,
        exit_code: int | None,
        reason: str,
        batch: WriteBatch,
        *,
        retry: bool = True,
    ) -> None:
        """End an attempt and move its job on: success, retry, or failure.

        PREEMPTED and (with `retry`) FAILED attempts queue the job again while it
        has attempts left; LOST attempts always do and are not counted.
        """
        check_transition("attempt", attempt.state, state)
        del self.attempts[attempt.id]
        attempt.due_at = None
        bag = self.bags[attempt.bag_id]
        bag.live_attempts -= 1
        if state is AttemptState.PREEMPTED:
            batch.work_lost(bag.id, max(0.0, at - attempt.mark_at))
        vm = self.vms.get(attempt.vm_id)
        if vm is not None and attempt.id in vm.attempts:
            del vm.attempts[attempt.id]
            vm.free = vm.free.plus(attempt.shape)
            if not vm.attempts and vm.state is VmState.RUNNING:
                vm.idle_since = at
            self.refresh_vm_sets(vm)
        if attempt.ran_at is None:
            # Its program never ran (it waited in the executor's queue, or the controller
            # stopped between recording it and starting it): it used nothing (charged
            # nothing, and takes no time on its VM in reports).
            attempt.started_at = max(attempt.started_at, at)
        attempt.state = state
        self.write_attempt(attempt, batch, at, exit_code, reason)
        self.record_usage(attempt, state, at, batch)
        batch.ledger_entries(
            at,
            self.accounts.settle(
                attempt.bag_id,
                attempt.idx,
                attempt.number,
                bag.spec,
                at - attempt.started_at,
                preempted=state is AttemptState.PREEMPTED,
            ),
            f"attempt {attempt.number} {state}",
        )
        batch.budget_entries(  # its dollars too (controller/budgets.py)
            at,
            self.budgets.settle_attempt(
                bag, attempt.idx, attempt.number, at - attempt.started_at, at
            ),
        )
        if self.metrics is not None:
            _count(self._attempts_ended, self.metrics.attempts, state)

        job = self.jobs.get((attempt.bag_id, attempt.idx))
        if job is None or job.state is not JobState.RUNNING:
            if bag.done:  # the job was cancelled meanwhile; this was the bag's last process
                self.finish_bag(bag, at, batch)
            return
        if state in _ATTEMPT_COUNTED:
            job.counted += 1
        job.exit_code = exit_code
        if state is AttemptState.SUCCEEDED:
            # The job's runtime: the work its checkpoints carried over from earlier
            # attempts plus this attempt's since its last checkpoint (= the attempt's
            # running time when it never checkpointed). Runtime estimates learn from it.
            work_s = attempt.saved_s + max(0.0, at - attempt.mark_at)
            self.job_to(job, JobState.SUCCEEDED, at, batch, "", runtime_s=work_s)
        elif state is AttemptState.LOST or (
            retry
            and state in (AttemptState.PREEMPTED, AttemptState.FAILED)
            and job.counted < bag.spec.max_attempts
        ):
            self.requeue(job, bag, at, batch, f"attempt {attempt.number} {state}: {reason}")
        else:
            if retry and job.counted >= bag.spec.max_attempts:
                reason = f"{reason}; gave up after max_attempts={bag.spec.max_attempts}"
            self.job_to(job, JobState.FAILED, at, batch, reason)

    def write_attempt(
        self,
        attempt: AttemptRun,
        batch: WriteBatch,
        ended_at: float | None = None,
        exit_code: int | None = None,
        reason: str = "",
    ) -> None:
        batch.attempt(
            attempt.bag_id,
            attempt.idx,
            attempt.number,
            attempt.vm_id,
            attempt.state,
            attempt.started_at,
            ended_at,
            exit_code,
            reason,
            attempt.log_path,
            attempt.ref,
            attempt.ran_at,
        )

    def record_usage(
        self, attempt: AttemptRun, state: AttemptState, at: float, batch: WriteBatch
    ) -> None:
        """Add the ended attempt's time to its bag's usage. (What it cost is not kept
        here: the split of its VM's cost depends on its neighbours, and is computed from
        the attempts and VMs by the cost report, controller/report.py.)"""
        batch.usage(
            attempt.bag_id,
            preempted=state is AttemptState.PREEMPTED,
            attempt_s=max(0.0, at - attempt.started_at),
        )

    def job_to(
        self,
        job: JobRun,
        state: JobState,
        at: float,
        batch: WriteBatch,
        reason: str,
        *,
        runtime_s: float | None = None,
    ) -> None:
        bag = self.bags[job.bag_id]
        if state is JobState.QUEUED and bag.cancel_requested:
            state, reason = JobState.CANCELLED, "cancelled by user"
        check_transition("job", job.state, state)
        if job.state is JobState.QUEUED and state in (JobState.CANCELLED, JobState.FAILED):
            # It will not run the attempt it reserved for.
            batch.ledger_entries(
                at, self.accounts.release(job.bag_id, job.idx, job.attempts + 1), f"job {state}"
            )
        batch.job_state_change(job.bag_id, job.state, state)
        batch.transition(at, "job", job.id, job.state, state, reason)
        job.state = state
        job.reason = reason
        terminal = state in _JOB_TERMINAL
        batch.job(
            job.bag_id,
            job.idx,
            state,
            job.attempts,
            job.counted,
            job.exit_code,
            reason,
            job.vm_id,
            job.started_at,
            at if terminal else None,
            runtime_s,
        )
        if state is JobState.SUCCEEDED and runtime_s is not None:
            bag.job_succeeded(runtime_s, job.params)
        if state is JobState.QUEUED:
            bag.queue.appendleft(job.idx)  # retries go first: the bag's tail finishes sooner
        elif terminal:
            del self.jobs[(job.bag_id, job.idx)]
            bag.open_jobs -= 1
            if state is not JobState.CANCELLED:
                bag.recent_ends.append(at)
            if state is JobState.FAILED:
                bag.failed_jobs += 1
            elif state is JobState.CANCELLED:
                bag.cancelled_jobs += 1
            if self.metrics is not None:
                _count(self._jobs_finished, self.metrics.jobs_finished, state)
            if bag.done:
                self.finish_bag(bag, at, batch)

    def finish_bag(self, bag: BagRun, at: float, batch: WriteBatch) -> None:
        if bag.cancel_requested or bag.cancelled_jobs:
            state = BagState.CANCELLED
        elif bag.failed_jobs:
            state = BagState.FAILED
        else:
            state = BagState.SUCCEEDED
        batch.bag_finished(bag.id, state, at)
        batch.transition(at, "bag", bag.id, BagState.ACTIVE, state, "")
        self.notices.bag_ended(bag, state, at, batch)  # finished or failed
        self.budgets.bag_ended(bag.id)
        del self.bags[bag.id]
        log.info("bag %s finished: %s", bag.id, state)

    # --- VMs and their indexes ------------------------------------------------------------

    def vm_to(self, vm: VmRun, state: VmState, at: float, reason: str, batch: WriteBatch) -> None:
        check_transition("vm", vm.state, state)
        batch.transition(at, "vm", vm.id, vm.state, state, reason)
        vm.state = state

    def end_vm(self, vm: VmRun, state: VmState, at: float, reason: str, batch: WriteBatch) -> None:
        """A VM is gone: its attempts are preempted (retried) and it leaves memory. An
        attempt still waiting in the executor's queue never ran: it is lost (not counted).

        With an executor that confirms ends (Slurm), the attempts end only when it says
        their jobs can never run any more (`Events.on_attempt_end`): until then they stay open,
        marked with their VM's end, and their jobs are not retried."""
        # Drivers word a reason as "preempted: sampled lifetime ..."; the attempt's
        # reason names the VM and its state once ("VM vm-1 preempted: sampled ...").
        detail = reason.removeprefix(f"{state}: ")
        why = f"VM {vm.id} {state}" + (f": {detail}" if detail else "")
        for attempt_id in list(vm.attempts):
            attempt = self.attempts[attempt_id]
            if self.executor.confirms_ends:
                self.await_confirmed_end(attempt, vm, why, at)
                continue
            if attempt.cancelling:
                ended, why_ = AttemptState.CANCELLED, why
            elif attempt.state is AttemptState.STARTING and self.executor.queues_attempts:
                ended, why_ = AttemptState.LOST, f"never started: {why}"
            else:
                ended, why_ = AttemptState.PREEMPTED, why
            self.finish_attempt(attempt, ended, at, None, why_, batch)
        self.vm_to(vm, state, at, reason, batch)
        vm.reason = reason
        vm.ended_at = at
        if vm.running_at is not None:
            vm.running_at = min(vm.running_at, at)
        batch.vm(vm.row(self.driver_name, self.time_scale))
        self.untrack_vm(vm)
        if state is VmState.PREEMPTED:
            self.notices.preempted(vm.id, vm.vm_type.name, at, batch, self.bags.values())
            if self.metrics is not None:
                self.metrics.preemptions.inc()

    def await_confirmed_end(self, attempt: AttemptRun, vm: VmRun, why: str, at: float) -> None:
        """The attempt's VM is gone, and its executor will say when its job has ended for
        good: it leaves the VM (no capacity, no checkpoint plan) and waits for that."""
        del vm.attempts[attempt.id]
        attempt.vm_gone = attempt.vm_gone or why
        attempt.vm_gone_at = attempt.vm_gone_at or at
        attempt.due_at = None  # no more checkpoint signals: its program is dead or never ran

    def assume_model(self, vm: VmRun) -> None:
        """The preemption model the scheduler assumes for a VM (from the book, at its launch)."""
        if self.book is None:
            return
        launched = dt.datetime.fromtimestamp(vm.requested_at, dt.UTC)
        vm.belief = self.book.belief(vm.vm_type, vm.zone, launched)
        vm.table = self.book.table(vm.belief.model)

    def track_vm(self, vm: VmRun) -> None:
        self.vms[vm.id] = vm
        if vm.provider_id:
            self.by_provider_id[vm.provider_id] = vm.id
        self.refresh_vm_sets(vm)

    def untrack_vm(self, vm: VmRun) -> None:
        self.vms.pop(vm.id, None)
        self.by_provider_id.pop(vm.provider_id, None)
        for index in (self.pending, self.roomy, self.idle, self.draining, self.pool_vms):
            index.pop(vm.id, None)

    def set_provider_id(self, vm: VmRun, provider_id: str) -> None:
        vm.provider_id = provider_id
        self.by_provider_id[provider_id] = vm.id

    def refresh_vm_sets(self, vm: VmRun) -> None:
        """Keep the pending / roomy / idle indexes in step with the VM (a pool VM is in
        none of them: it is Slurm's)."""
        live = vm.id in self.vms
        if vm.pool_node:
            if live:
                self.pool_vms[vm.id] = None
            else:
                self.pool_vms.pop(vm.id, None)
            return
        # A running VM that has not joined the executor's cluster yet is capacity on its
        # way, like a booting one.
        vm_id, running = vm.id, vm.state is VmState.RUNNING
        booting = vm.state is VmState.PENDING or (running and not vm.ready)
        pending = live and booting and not vm.terminating
        usable = live and running and vm.ready and not vm.terminating
        draining = usable and bool(vm.draining)
        usable = usable and not draining
        # Each index in turn (called at every change of a VM: spelt out, not looped).
        if pending:
            self.pending[vm_id] = None
        else:
            self.pending.pop(vm_id, None)
        if usable and vm.free.cpus > 0 and vm.free.memory_gb > 0:
            self.roomy[vm_id] = None
        else:
            self.roomy.pop(vm_id, None)
        if usable and not vm.attempts:
            self.idle[vm_id] = None
        else:
            self.idle.pop(vm_id, None)
        if draining:
            self.draining[vm_id] = None
        else:
            self.draining.pop(vm_id, None)
