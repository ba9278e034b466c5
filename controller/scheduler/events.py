"""Events: what the driver and the executor reported since the last pass.

A pass handles them oldest first (by `VmStatus.changed_at` or the event's `at`),
before its commands, so that what happened before a command keeps its outcome (a job
that exited 0 just before its bag was cancelled succeeded):

- VM status: a VM running (it joins the executor's cluster, or takes attempts at
  once), or gone (preempted, terminated, failed: its attempts end with it);
- node events: a VM joined the executor's cluster, or its node broke, or the VM heard
  its cloud's preemption notice (or a rebalance recommendation) itself;
- attempt started, checkpoint written (or not), attempt ended, by outcome: success,
  a retry, a failure, or a loss that is not counted against max_attempts;
- callbacks of the executor's hook, recorded with the changes they caused.

`Events` is given the scheduler's `World` (controller/scheduler/world.py): each handler
moves jobs, attempts and VMs on through the world's transitions. It also calls the
driver and the executor (through `Calls`, controller/scheduler/calls.py), plans
checkpoints (`CheckpointTimer`), hands VMs whose node broke to the pass (`terminate`),
and keeps the attempts whose checkpoint for a move was written, for the pass to stop
(`take_migration_stops`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.executors.base import (
    CHECKPOINT_SIGNAL_EXIT_CODE,
    AttemptEvent,
    AttemptStarted,
    CallbackNoted,
    CheckpointEvent,
    Executor,
    ExecutorEvent,
    NodeEvent,
    NodeNotice,
    Outcome,
)
from controller.planner import Terminate
from controller.scheduler.calls import Calls
from controller.scheduler.checkpoints import CheckpointTimer
from controller.scheduler.inputs import Clock, Inbox
from controller.scheduler.runs import AttemptRun, VmRun
from controller.scheduler.world import World
from controller.states import AttemptState, JobState, check_transition
from controller.store import WriteBatch
from drivers.base import Driver, VmState, VmStatus

log = logging.getLogger("spotbag.scheduler")


def _event_time(event: VmStatus | ExecutorEvent) -> float:
    return event.changed_at if isinstance(event, VmStatus) else event.at


class Events:
    """The handlers of a pass's events (see the module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        driver: Driver,
        executor: Executor,
        clock: Clock,
        checkpoints: CheckpointTimer,
        inbox: Inbox,
        calls: Calls,
        terminate: Callable[[Terminate], None],
    ) -> None:
        self.world = world
        self.driver = driver
        self.executor = executor
        self.clock = clock
        self.checkpoints = checkpoints
        self.inbox = inbox
        self.calls = calls
        self._terminate = terminate  # a VM to terminate in this pass
        self._migration_stops: list[str] = []  # attempts checkpointed for a move: stop them

    def take_migration_stops(self) -> list[str]:
        """The attempts whose checkpoint for a move was written: the pass stops them."""
        stops, self._migration_stops = self._migration_stops, []
        return stops

    async def handle(
        self,
        batch: WriteBatch,
        events: list[VmStatus | ExecutorEvent] | None = None,
    ) -> None:
        """Handle events oldest first (by default, every event waiting in the inbox).
        A callback's key is recorded with the changes its event causes (or alone)."""
        if events is None:
            events, self.inbox.events = self.inbox.events, []
        if len(events) > 1:
            events.sort(key=_event_time)
        for event in events:
            # The commonest first (the classes are distinct: the order only saves tests).
            if isinstance(event, AttemptEvent):
                self.on_attempt_end(event, batch)
                if event.key:
                    batch.callback(event.key, event.at, f"end:{event.outcome}", event.attempt_id)
            elif isinstance(event, VmStatus):
                await self._on_status(event, batch)
            elif isinstance(event, CheckpointEvent):
                self._on_checkpoint(event, batch)
            elif isinstance(event, AttemptStarted):
                self._on_attempt_started(event, batch)
                if event.key:
                    batch.callback(event.key, event.at, "started", event.attempt_id)
            elif isinstance(event, NodeEvent):
                self._on_node(event, batch)
            elif isinstance(event, NodeNotice):
                self._on_node_notice(event, batch)
            elif isinstance(event, CallbackNoted):
                batch.callback(event.key, event.at, event.kind, event.subject)

    async def _on_status(self, status: VmStatus, batch: WriteBatch) -> None:
        world = self.world
        vm = world.vms.get(status.token)
        if vm is None:
            if status.state in (VmState.PENDING, VmState.RUNNING):
                # Ours (the driver reports only our VMs) but given up on, e.g. after a
                # launch that failed ambiguously: do not leave it running unwatched.
                log.warning("terminating VM %s: alive but not tracked", status.vm_id)
                await self.calls.call(self.driver.terminate([status.vm_id]))
            return
        if status.notice_until is not None and vm.notice_until is None:
            # Now, not the status's changed_at: that is when the VM last changed state.
            self._on_notice(vm, status.notice_until, self.clock.now(), batch)
        if status.state is vm.state:
            return
        at = status.changed_at
        if status.vm_id and not vm.provider_id:
            world.set_provider_id(vm, status.vm_id)
        if status.state is VmState.RUNNING and vm.state is VmState.PENDING:
            world.vm_to(vm, VmState.RUNNING, at, "", batch)
            vm.running_at = at
            if self.executor.joins_vms and not vm.pool_node:
                vm.ready = False  # it takes attempts once it has joined (a NodeEvent)
                await self.calls.call(self.executor.vm_started(vm.id, vm.vm_type))
            else:
                vm.ready_at = at
                vm.idle_since = at
                # Its capacity, for an executor that queues attempts itself (local).
                await self.calls.call(self.executor.vm_started(vm.id, vm.vm_type))
            world.refresh_vm_sets(vm)
            batch.vm(vm.row(world.driver_name, world.time_scale))
            return
        if status.state in (VmState.PREEMPTED, VmState.TERMINATED, VmState.FAILED):
            # Whatever ran there is dead; an executor with a cluster forgets the node (a
            # pool node is powered down by force: Slurm requeues its users' jobs), unless
            # Slurm itself let go of it (a pool node it suspended or gave up on).
            if not vm.released_by_slurm:
                await self.calls.starts_settled()  # attempts being started there are lost too
                await self.calls.call(self.executor.vm_lost(vm.id, vm.pool_node))
            # When we terminated it, our reason ("idle for 60 s") says more than the driver's.
            ours = vm.terminating and status.state is VmState.TERMINATED and vm.reason
            world.end_vm(vm, status.state, at, vm.reason if ours else status.reason, batch)

    def _on_notice(self, vm: VmRun, ends_by: float, at: float, batch: WriteBatch) -> None:
        """A preemption notice (docs/design.md#checkpoint-notices): the VM takes no new
        attempt (drained: it ends once empty), each running checkpointable attempt on it
        is asked to checkpoint now if the checkpoint can be written before the VM ends
        and there is work since the last one, then stopped and queued again to resume
        (a migration), and the planner launches a VM for the VM's jobs at once
        (`Planning.snapshot`'s expected demand), so their retries need not wait a boot."""
        world = self.world
        if vm.state not in (VmState.PENDING, VmState.RUNNING) or vm.terminating:
            return
        vm.notice_until = ends_by
        batch.vm(vm.row(world.driver_name, world.time_scale))
        left_s = max(0.0, ends_by - at)
        log.info("VM %s: preemption notice, ends within %.0f s", vm.id, left_s)
        if not vm.draining:
            vm.draining = f"spot notice: ends within {left_s:.0f} s"
            world.refresh_vm_sets(vm)
        self.move_off_noticed(vm, ends_by, at)

    def move_off_noticed(self, vm: VmRun, ends_by: float, at: float) -> None:
        """Move a noticed VM's attempts: those queued there stop (to start elsewhere);
        each running checkpointable one is asked to checkpoint now, if that can be
        written before `ends_by` and there is work since its last checkpoint, then
        stops and resumes elsewhere. Also after a restart that found a VM under notice
        (recovery.py): the attempts' moves lived in memory."""
        world = self.world
        self._move_queued(vm, f"spot notice on {vm.id}")
        for attempt_id in vm.attempts:
            attempt = world.attempts.get(attempt_id)
            if attempt is None or attempt.state is not AttemptState.RUNNING:
                continue
            spec = world.bags[attempt.bag_id].spec
            if not spec.checkpointable or attempt.cancelling or attempt.signalled_at is not None:
                continue
            if at + spec.checkpoint_cost_s <= ends_by and at > attempt.mark_at:
                # Moved as the hopper moves jobs: once its checkpoint is written it stops
                # and resumes on the VM launched for it, maybe before this one ends.
                attempt.migrating = f"spot notice on {vm.id}"
                self.checkpoints.signal_now(attempt, at)
        self.inbox.wake.set()

    def _on_node_notice(self, event: NodeNotice, batch: WriteBatch) -> None:
        """The VM heard its cloud's notice itself (docs/checkpoints.md#notices): as the
        driver's, whichever comes first (the second changes nothing). A rebalance
        recommendation (no end) only drains it: no new attempt; it ends once empty."""
        vm = self.world.vms.get(event.vm_id)
        if vm is None or vm.state is not VmState.RUNNING or vm.terminating:
            return
        if event.ends_by is not None:
            if vm.notice_until is None:
                self._on_notice(vm, event.ends_by, event.at, batch)
        elif not vm.draining:
            log.info("VM %s: %s", vm.id, event.detail)
            vm.draining = event.detail or "spot rebalance recommendation"
            self.world.refresh_vm_sets(vm)
            self._move_queued(vm, f"spot rebalance on {vm.id}")
            self.inbox.wake.set()

    def _move_queued(self, vm: VmRun, why: str) -> None:
        """A drained VM's attempts that have not started (queued ahead in Slurm, whose
        drained node would never start them) are stopped, to start elsewhere: lost,
        not counted."""
        for attempt_id in vm.attempts:
            attempt = self.world.attempts.get(attempt_id)
            if attempt is None or attempt.state is not AttemptState.STARTING:
                continue
            if not attempt.cancelling and not attempt.migrating:
                attempt.migrating = why
                self._migration_stops.append(attempt.id)

    def _on_node(self, event: NodeEvent, batch: WriteBatch) -> None:
        """The VM joined the executor's cluster (it takes attempts from now on), or its
        node broke under it (it is terminated: its attempts end with it)."""
        world = self.world
        vm = world.vms.get(event.vm_id)
        if vm is None or vm.state is not VmState.RUNNING or vm.terminating:
            return
        if event.ready and not vm.ready:
            vm.ready = True
            vm.rejoin_since = None
            vm.ready_at = vm.ready_at or event.at
            if not vm.attempts:
                vm.idle_since = event.at
            world.refresh_vm_sets(vm)
            batch.vm(vm.row(world.driver_name, world.time_scale))
            log.info("VM %s joined: %s", vm.id, event.detail or "ready")
        elif not event.ready and vm.ready:
            vm.ready = False
            vm.terminating = True
            vm.reason = f"its node broke: {event.detail}"
            world.refresh_vm_sets(vm)
            self._terminate(Terminate(vm.id, vm.reason))
            log.warning("terminating VM %s: %s", vm.id, vm.reason)

    def _on_attempt_started(self, event: AttemptStarted, batch: WriteBatch) -> None:
        """A queued attempt began to run: it is RUNNING from then (its time, and its
        checkpoint schedule, count from there)."""
        world = self.world
        attempt = world.attempts.get(event.attempt_id)
        if attempt is None or attempt.state is not AttemptState.STARTING:
            return
        check_transition("attempt", attempt.state, AttemptState.RUNNING)
        attempt.state = AttemptState.RUNNING
        attempt.started_at = max(attempt.started_at, event.at)
        attempt.ran_at = attempt.started_at
        attempt.mark_at = attempt.started_at
        world.write_attempt(attempt, batch)
        if not attempt.cancelling and not attempt.vm_gone:
            self.checkpoints.plan(attempt, event.at)

    def _on_checkpoint(self, event: CheckpointEvent, batch: WriteBatch) -> None:
        """A checkpoint we asked for ended. Written: the job's saved work moves on to
        what it had done when signalled, and work from now on is at risk only back to
        here. Either way the next one is planned."""
        world = self.world
        attempt = world.attempts.get(event.attempt_id)
        if attempt is None or attempt.signalled_at is None:
            return  # the attempt ended first: its retry resumes from the last one written
        attempt.signalled_at = None
        job = world.jobs.get((attempt.bag_id, attempt.idx))
        vm = world.vms.get(attempt.vm_id)
        age_h = (
            max(0.0, event.requested_at - vm.requested_at) * world.time_scale / 3600.0
            if vm is not None
            else 0.0
        )
        if event.ok and job is not None:
            attempt.missed_checkpoints = 0
            attempt.saved_s += max(0.0, event.requested_at - attempt.mark_at)
            attempt.mark_at = event.at
            job.work_saved_s = attempt.saved_s
            job.checkpoints += 1
        else:
            attempt.missed_checkpoints += 1
            log.warning(
                "attempt %s did not checkpoint (%s)%s",
                attempt.id,
                event.detail or "no reason given",
                "; not asking it again" if attempt.missed_checkpoints >= 3 else "",
            )
        batch.checkpoint(
            attempt.bag_id,
            attempt.idx,
            attempt.number,
            requested_at=event.requested_at,
            at=event.at,
            ok=event.ok and job is not None,
            work_saved_s=attempt.saved_s,
            checkpoints=job.checkpoints if job is not None else 0,
            vm_age_h=age_h,
            detail=event.detail,
        )
        if attempt.migrating and attempt.state is AttemptState.RUNNING:
            if event.ok and job is not None:
                self._migration_stops.append(attempt.id)  # it resumes from here elsewhere
                return
            log.warning("attempt %s stays: no checkpoint to move with", attempt.id)
            attempt.migrating = ""
        if attempt.state is AttemptState.RUNNING:
            self.checkpoints.plan(attempt, event.at)

    def on_attempt_end(self, event: AttemptEvent, batch: WriteBatch) -> None:
        world = self.world
        attempt = world.attempts.get(event.attempt_id)
        if attempt is None:
            return  # already finished (its VM died first, or a duplicate report)
        job = world.jobs.get((attempt.bag_id, attempt.idx))
        bag = world.bags[attempt.bag_id]
        at = event.at
        if attempt.ran_at is None and event.outcome in (Outcome.EXITED, Outcome.TIMED_OUT):
            # It left an exit status, or ran out of time: its program ran, though that
            # was never recorded (the controller died between starting it and writing
            # so, and found its exit status at the restart). It ran from when it was
            # started, as far as anyone knows, and is charged for it: only attempts
            # that never ran are charged nothing.
            attempt.ran_at = attempt.started_at
        if attempt.cancelling or job is None or job.state is not JobState.RUNNING:
            world.finish_attempt(
                attempt, AttemptState.CANCELLED, at, event.exit_code, "cancelled", batch
            )
            return
        code = event.exit_code
        if attempt.vm_gone and not (event.outcome is Outcome.EXITED and code == 0):
            self.end_on_gone_vm(attempt, event, batch)
            return
        if event.outcome is Outcome.KILLED and attempt.migrating:
            reason = f"migrated: {attempt.migrating}"
            world.finish_attempt(attempt, AttemptState.LOST, at, code, reason, batch)
            return
        if event.outcome is Outcome.NOT_STARTED:
            reason = "not started" + (f": {event.detail}" if event.detail else "")
            world.finish_attempt(attempt, AttemptState.LOST, at, None, reason, batch)
            return
        if event.outcome is Outcome.KILLED:
            # Stopped by the controller, not by a user or the job itself.
            reason = "stopped by the controller" + (f" ({event.detail})" if event.detail else "")
            world.finish_attempt(attempt, AttemptState.LOST, at, code, reason, batch)
            return
        if event.outcome is Outcome.EXITED and code == 0:
            world.finish_attempt(attempt, AttemptState.SUCCEEDED, at, 0, event.detail, batch)
            return
        if (
            event.outcome is Outcome.EXITED
            and code == CHECKPOINT_SIGNAL_EXIT_CODE
            and attempt.signalled_at is not None
            and attempt.mark_at > attempt.started_at
        ):
            # Our checkpoint signal killed a program that had handled it before: it came
            # while the program was not listening (Python restores the default action
            # as it exits, after its work). The controller's doing, not the job's: run
            # again from its last checkpoint, not counted (docs/design.md#checkpoints).
            reason = "killed by the checkpoint signal while not handling it (exiting?)"
            world.finish_attempt(attempt, AttemptState.LOST, at, code, reason, batch)
            return
        if event.outcome is Outcome.TIMED_OUT:
            reason = event.detail or "timed out"
            retry = False
        elif event.outcome is Outcome.START_FAILED:
            reason = f"could not start: {event.detail}"
            retry = True
        else:
            reason = f"exited with code {code}" + (f" ({event.detail})" if event.detail else "")
            retry = code in bag.spec.retryable_exit_codes
        world.finish_attempt(attempt, AttemptState.FAILED, at, code, reason, batch, retry=retry)

    def end_on_gone_vm(self, attempt: AttemptRun, event: AttemptEvent, batch: WriteBatch) -> None:
        """The executor confirms the end of an attempt whose VM had gone (and whose program
        did not exit 0 before): preempted if its program ran, else lost, never started
        (not counted). Its time ends when its VM did: the confirmation came later."""
        world = self.world
        at = max(attempt.started_at, min(event.at, attempt.vm_gone_at))
        if attempt.state is AttemptState.RUNNING:
            world.finish_attempt(
                attempt, AttemptState.PREEMPTED, at, event.exit_code, attempt.vm_gone, batch
            )
        else:
            why = f"never started: {attempt.vm_gone}"
            world.finish_attempt(attempt, AttemptState.LOST, at, None, why, batch)
