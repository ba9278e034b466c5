"""The scheduler: observe -> plan -> execute -> record, one pass at a time.

It keeps the open part of the world in memory (active bags and their queues,
open jobs, live attempts and VMs), mirrors every change to the store, and is
the only writer of job, attempt and VM state. Each pass (`tick`):

1. takes commands (bags admitted, cancellations) and events (VM status from
   the driver, attempt ends from the executor), oldest event first;
2. asks the pure planner what to do;
3. records the intents (attempts STARTING, VMs PENDING) in one transaction
   *before* acting, so a crash never leaves an unrecorded VM or process;
4. starts attempts, launches and terminates VMs, signals checkpoints, and
   records the results (the daemon's local starts: with the next pass, `tick`).

The daemon runs `run()`, which ticks when woken by an event or a submission
and at least every `poll_interval_s`; the simulator calls `tick()` itself
while it moves a virtual clock. `recover()` rebuilds memory from the store
after a restart.

This module owns the pass loop, the commands callers queue between passes, and the
hook the hopper moves jobs through (`request_migration`); the parts of a pass live
beside it in this package:

- state.py: the state every part shares, built by the constructor, and the inbox
  the driver and the executor push events to (`SchedulerState`, the mixins' base);
- inputs.py: the commands and protocols that reach the scheduler;
- events.py: the driver's and executor's events (EventsMixin);
- planning.py: the planner's snapshot and its decision recorded as intents
  (PlanningMixin);
- actions.py: acting on the decision (ActionsMixin);
- backoff.py: the back-off after failed actions (`Backoff`, a collaborator);
- transitions.py: every job, attempt and VM state change and its record
  (TransitionsMixin);
- checkpoints.py: checkpoint timing, docs/design.md#checkpoints (`CheckpointTimer`, a collaborator);
- recovery.py: restart re-adoption (RecoveryMixin);
- slurm_pools.py: Slurm's power-saving pool nodes and the runs on them (PoolsMixin).

The mixins share the open world (bags, jobs, attempts, VMs and their indexes) that
`SchedulerState.__init__` sets up, and each inherits the mixins whose methods it calls
(state.py says in which order); the collaborators own their state and are reached as
`self.backoff` and `self.checkpoints`. Which VMs to move and where is the hopper's
(controller/hopper.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence

from controller.bags.spec import BagSpec
from controller.bags.waiting_jobs import FreshParams, HeldJobs, JobQueue
from controller.executors.base import ExecutorEvent
from controller.planner import plan
from controller.runtime import BagRun, shape_of
from controller.scheduler.actions import ActionsMixin
from controller.scheduler.events import EventsMixin
from controller.scheduler.inputs import (
    Clock,
    Command,
    IdSource,
    PoolPower,
    PoolRunEvent,
    _Admit,
    _Cancel,
)
from controller.scheduler.planning import PlanningMixin
from controller.scheduler.recovery import RecoveryMixin
from controller.scheduler.slurm_pools import PoolsMixin
from controller.scheduler.transitions import TransitionsMixin
from controller.states import AttemptState, JobState
from controller.store import StoreUnavailable, WriteBatch
from drivers.base import VmState, VmStatus

log = logging.getLogger("spotbag.scheduler")

__all__ = ["CANCEL_CHUNK", "Clock", "IdSource", "PoolPower", "PoolRunEvent", "Scheduler"]

CANCEL_CHUNK = 500  # waiting jobs cancelled per pass (~10-25 ms of the loop on a small VM)
# How long what the executor returned for attempts started in the background may wait
# for a pass to record it with whatever else comes (a busy host's next job end: sooner).
START_RECORD_DELAY_S = 0.05


class Scheduler(
    RecoveryMixin, ActionsMixin, EventsMixin, PlanningMixin, PoolsMixin, TransitionsMixin
):
    """The daemon's scheduler: one pass at a time over the open world (see the module
    docstring for its parts). Its constructor, and the state it builds, are
    `SchedulerState`'s (state.py)."""

    # --- inputs ------------------------------------------------------------------

    def note(self, event: ExecutorEvent) -> None:
        """An event from outside the executor's own watch (a callback it did not take)."""
        self._on_attempt_event(event)

    def bag_admitted(
        self,
        bag_id: str,
        spec: BagSpec,
        params_json: Sequence[str],
        held_from: int | None = None,
    ) -> None:
        """A bag was written to the store (its reservations made by `self.accounts`);
        schedule its jobs from the next pass on. `params_json`: each job's parameters,
        as compact JSON (decoded when the job first runs: a million small strings take
        a fraction of the memory of a million dicts)."""
        held = len(params_json) if held_from is None else held_from
        self._commands.append(_Admit(bag_id, spec, params_json, held))
        if self._handing_over.pop(bag_id, False):
            self._commands.append(_Cancel(bag_id))  # cancelled while handed over
        self._wake.set()

    def bag_written(self, bag_id: str) -> None:
        """A bag was written and will come with `bag_admitted` once its reservations
        are open (admission.hand_over): a cancel meanwhile is kept for it."""
        self._handing_over[bag_id] = False

    def credited(self) -> None:
        """An account got CPU-hours: held jobs may run (the next pass admits them)."""
        self._wake.set()

    def cancel_requested(self, bag_id: str) -> None:
        if bag_id in self._handing_over:
            self._handing_over[bag_id] = True
        self._commands.append(_Cancel(bag_id))
        self._wake.set()

    def has_inputs(self) -> bool:
        """True when events or commands wait for the next pass."""
        return bool(self._inbox or self._commands or self._started)

    def held_jobs(self) -> int:
        """Jobs waiting, held, for their accounts to have CPU-hours."""
        return sum(len(bag.held) for bag in self.bags.values())

    def has_work(self) -> bool:
        """True while anything is open: bags, VMs, or unprocessed inputs."""
        return bool(self.bags or self.vms or self._inbox or self._commands)

    # --- the loop -------------------------------------------------------------------------

    async def run(self, *, describe: bool, max_failures: int = 3) -> None:
        """Tick until `stop()`; `describe` polls the driver for drivers that push no events.

        A pass that fails leaves memory possibly ahead of the store: memory is then
        rebuilt from the store (the pass's inputs are kept and handled again).

        A store that cannot be written (a full disk, an I/O error) is outside the
        daemon and may pass: the pass is retried with back-off for as long as it
        takes, and `problem` says why meanwhile (/healthz answers 503). Any other
        error `max_failures` times in a row is raised: the daemon stops rather than
        run on a state it cannot trust, and its supervisor restarts it.
        """
        failures = 0
        store_failures = 0
        must_recover = False
        while not self._stopping:
            next_at: float | None = None
            try:
                if must_recover:
                    await self.recover()
                    must_recover = False
                if describe:
                    await self._describe_if_due()
                # Starts are not waited for here: the next pass records them.
                next_at = await self.tick(background_starts=not self.executor.queues_attempts)
                failures = store_failures = 0
                self.problem = None
            except StoreUnavailable as exc:
                store_failures += 1
                must_recover = True
                self.problem = f"the scheduler cannot write its database ({exc}); retrying"
                delay_s = min(30.0, self.settings.poll_interval_s * 2 ** min(store_failures, 8))
                log.error("%s in %.1f s (%d in a row)", self.problem, delay_s, store_failures)
                await self._pause(delay_s)
                continue
            except Exception:
                failures += 1
                must_recover = True
                log.exception("scheduler pass failed (%d in a row)", failures)
                if failures >= max_failures:
                    raise
                await self._pause(min(5.0, self.settings.poll_interval_s * failures))
                continue
            timeout = self.settings.poll_interval_s
            if self._starting or self._started:  # recorded soon, with whatever else comes
                soon = self.clock.now() + START_RECORD_DELAY_S
                next_at = soon if next_at is None else min(next_at, soon)
            if next_at is not None:
                timeout = max(0.0, min(timeout, next_at - self.clock.now()))
            if not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if the scheduler is stopped meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)
            self._wake.clear()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def shutdown(self, *, vms_die_with_controller: bool) -> None:
        """Stop every attempt and record it LOST (it is queued again on the next start);
        record the VMs gone when they do not outlive the controller (local driver).
        Attempts that ended before they could be stopped are recorded as they ended.

        Attempts that outlive the controller (Slurm jobs on VMs that outlive it) are left
        running and recorded as they are: the next start re-adopts them."""
        await self._starts_settled()
        if vms_die_with_controller:
            for vm in list(self.vms.values()):  # a cluster forgets their nodes
                await self._call(self.executor.vm_lost(vm.id, vm.pool_node))
        await self.executor.shutdown()
        now = self.clock.now()
        batch = self.store.new_batch()
        started, self._started = self._started, []
        self._record_starts(started, batch, now)
        await self._handle_events(batch)
        keep_running = self.executor.attempts_outlive_controller and not vms_die_with_controller
        for attempt in [] if keep_running else list(self.attempts.values()):
            self._finish_attempt(
                attempt, AttemptState.LOST, now, None, "the controller stopped", batch
            )
        if vms_die_with_controller:
            for vm in list(self.vms.values()):
                self._end_vm(vm, VmState.TERMINATED, now, "the controller stopped", batch)
        await self.store.apply(batch)

    async def _describe_if_due(self) -> None:
        now = self.clock.now()
        if now - self._last_describe < self.settings.describe_interval_s:
            return
        self._last_describe = now
        ids = [vm.provider_id for vm in self.vms.values() if vm.provider_id]
        if not ids:
            return
        statuses = await self.driver.describe(ids)
        for provider_id in ids:
            status = statuses.get(provider_id)
            vm = self.vms.get(self._by_provider_id.get(provider_id, ""))
            if vm is None:
                continue
            if status is None:  # vanished: deleted by us, or on preemption
                gone = VmState.TERMINATED if vm.terminating else VmState.PREEMPTED
                status = VmStatus(
                    provider_id,
                    vm.id,
                    vm.vm_type.name,
                    gone,
                    vm.zone,
                    "VM vanished",
                    vm.requested_at,
                    now,
                )
            noticed = status.notice_until is not None and vm.notice_until is None
            if status.state is not vm.state or noticed:
                self._push(status)

    async def tick(self, *, background_starts: bool = False) -> float | None:
        """One scheduling pass; returns when the scheduler next wants to run (or None).

        If the pass fails, its inputs are put back (see `run`).

        `background_starts` (the daemon's loop, with an executor that runs attempts at
        once): the pass hands its attempts to the executor and ends without waiting
        for them to start (a fork and an exec each, for the local executor); what each
        start returned is recorded by the next pass, which it wakes. Their intents are
        written first, as always: nothing runs unrecorded, and an attempt whose start
        is still under way is only ever STARTING, as after a crash in between (the
        executor then re-adopts it or reports its end: recovery.py). Before the executor
        is told to stop attempts, the starts under way are waited for
        (`_starts_settled`)."""
        started = time.perf_counter()
        self.ticks += 1
        now = self.clock.now()
        events, self._inbox = self._inbox, []
        commands, self._commands = self._commands, []
        starts_done, self._started = self._started, []
        try:
            batch = self.store.new_batch()
            # What the executor returned for the last pass's starts, before any end of
            # theirs; then events, before commands: what happened before a command (a
            # job exiting 0 just before its bag is cancelled) keeps its outcome.
            self._record_starts(starts_done, batch, now)
            await self._handle_events(batch, events)
            cancels = self._run_commands(batch, commands, now)
            cancels += self._migration_stops
            self._migration_stops = []
            self._admit_held(batch, now)
            pool_wake_at = self._release_unfit_pool_vms(now)
            decision = plan(self._snapshot(now))
            if self._terminate_now:
                decision.terminations.extend(self._terminate_now)
                self._terminate_now = []
            starts, launches = self._record_plan(decision, batch, now)
            launches += self._pool_launches
            self._pool_launches = []
            await self.store.apply(batch)
        except BaseException:
            self._inbox = events + self._inbox
            self._commands = commands + self._commands
            self._started = starts_done + self._started
            raise

        batch = self.store.new_batch()
        self._replan = False
        signals = self.checkpoints.due_signals(now)
        await self._execute(
            starts,
            launches,
            cancels,
            decision.terminations,
            batch,
            signals,
            background_starts=background_starts,
        )
        await self.store.apply(batch)
        if self.metrics is not None:
            self.metrics.tick_seconds.observe(time.perf_counter() - started)
        if self._replan:
            return now
        wanted = [
            t
            for t in (decision.next_wake_at, self.checkpoints.next_due(), pool_wake_at)
            if t is not None
        ]
        if self.backoff.starts_blocked_until > now:
            wanted.append(self.backoff.starts_blocked_until)
        return min(wanted) if wanted else None

    # --- commands ----------------------------------------------------------------------

    def _run_commands(self, batch: WriteBatch, commands: list[Command], now: float) -> list[str]:
        cancels: list[str] = []
        for command in commands:
            if isinstance(command, _Admit):
                self._admit(command, batch, now)
            elif isinstance(command, _Cancel):
                cancels += self._cancel_bag(command.bag_id, batch, now)
            elif isinstance(command, PoolPower):
                self._pool_power(command, batch, now)
            elif isinstance(command, PoolRunEvent):
                self._pool_run(command, batch, now)
        return cancels

    def _admit(self, command: _Admit, batch: WriteBatch, now: float) -> None:
        if command.bag_id in self.bags:
            return  # already loaded from the store by a recovery
        bag = BagRun(
            id=command.bag_id,
            spec=command.spec,
            shape=shape_of(command.spec),
            # A range and the packed parameters: no object per job (waiting_jobs.py).
            queue=JobQueue(command.held_from),
            fresh=FreshParams(command.params_json),
            open_jobs=len(command.params_json),
            failed_jobs=0,
        )
        # Jobs past the account's credit wait, held: a range, not an entry per job.
        bag.held = HeldJobs(command.held_from, len(command.params_json))
        self.bags[bag.id] = bag
        self.accounts.hold_range(
            bag.spec.account, bag.id, command.held_from, len(command.params_json)
        )

    def _admit_held(self, batch: WriteBatch, now: float) -> None:
        """Jobs held for credit run, oldest first per account, as far as their accounts
        can now reserve for them."""
        for queue in self.accounts.held.values():
            while queue:
                bag_id, idx = queue[0]
                bag = self.bags.get(bag_id)
                if bag is None:
                    queue.drop_first_run()  # its bag is gone: none of the run can run
                    continue
                if idx not in bag.held:
                    queue.popleft()  # cancelled
                    continue
                job = self.jobs.get((bag_id, idx))
                number = (job.attempts if job is not None else 0) + 1
                entries = self.accounts.reserve_next(bag_id, idx, number, bag.spec)
                if entries is None:
                    break
                queue.popleft()
                del bag.held[idx]
                batch.ledger_entries(now, entries, "held job admitted")
                job = job or self._held_job(bag, idx)
                self._job_to(job, JobState.QUEUED, now, batch, "CPU-hours reserved")

    def _cancel_bag(self, bag_id: str, batch: WriteBatch, now: float) -> list[str]:
        bag = self.bags.get(bag_id)
        if bag is None:
            return []
        bag.cancel_requested = True  # nothing of it is placed any more
        # A pass cancels at most CANCEL_CHUNK waiting jobs and asks for another pass:
        # a bag of a million jobs never holds the event loop for long.
        budget = CANCEL_CHUNK
        while bag.queue and budget:
            idx = bag.queue.popleft()
            job = self._job_to_cancel(bag, idx, JobState.QUEUED)
            self._job_to(job, JobState.CANCELLED, now, batch, "cancelled by user")
            budget -= 1
        for idx in list(itertools.islice(bag.held, budget)):
            del bag.held[idx]
            job = self._job_to_cancel(bag, idx, JobState.HELD)
            self._job_to(job, JobState.CANCELLED, now, batch, "cancelled by user")
        if bag.queue or bag.held:
            self._commands.append(_Cancel(bag_id))
            self._wake.set()
        cancels = []
        for attempt in list(self.attempts.values()):
            if attempt.bag_id == bag_id and not attempt.cancelling:
                attempt.cancelling = True
                cancels.append(attempt.id)
                self._job_to(
                    self.jobs[(bag_id, attempt.idx)],
                    JobState.CANCELLED,
                    now,
                    batch,
                    "cancelled by user",
                )
        return cancels

    # --- the hopper's hook (controller/hopper.py chooses what moves) -------------------

    def request_migration(self, vm_id: str, reason: str) -> list[tuple[str, int]]:
        """Move every job off `vm_id`: no new job goes there, each is asked to checkpoint
        now and, once it has, stopped and queued again (LOST, not counted) to resume on
        a VM the planner picks by the hopping policy; the VM ends when empty. Returns the
        jobs asked to move (none if the VM cannot be drained any more)."""
        vm = self.vms.get(vm_id)
        if vm is None or vm.state is not VmState.RUNNING or vm.terminating or vm.draining:
            return []
        now = self.clock.now()
        vm.draining = reason
        self._refresh_vm_sets(vm)
        moved = []
        for attempt_id in vm.attempts:
            attempt = self.attempts.get(attempt_id)
            if attempt is None or attempt.state is not AttemptState.RUNNING:
                continue
            attempt.migrating = reason
            moved.append((attempt.bag_id, attempt.idx))
            if attempt.signalled_at is None:  # else the checkpoint under way will do
                self.checkpoints.signal_now(attempt, now)
        self._wake.set()
        return moved

    # --- observability ---------------------------------------------------------------------

    def gauges(self) -> dict[str, dict[str, int]]:
        """Current counts for /metrics: open jobs by state and live VMs by state."""
        running_jobs = sum(1 for a in self.attempts.values() if not a.cancelling)
        pending = len(self._pending)
        return {
            "jobs": {
                "queued": sum(len(b.queue) for b in self.bags.values()),
                "running": running_jobs,
            },
            "vms": {
                "pending": pending,
                "running": len(self.vms) - pending,
                "idle": len(self._idle),
            },
        }
