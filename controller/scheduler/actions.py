"""Acting on a pass's decisions.

`Actions` hands attempts to the executor, launches and terminates VMs through the
driver, cancels attempts and signals checkpoints, at most
`scheduler.max_concurrent_calls` calls at a time (`Calls`,
controller/scheduler/calls.py), and records what each call returned: recording a result
(an attempt that could not start, a launch that failed) moves jobs, attempts and VMs on
through the transitions of the scheduler's `World` (controller/scheduler/world.py), and
an attempt the executor could not start is recorded as that attempt's end by
`Events.on_attempt_end` (controller/scheduler/events.py), which it is given. What failed
actions hold back is `Backoff`'s (controller/scheduler/backoff.py). What pool events
decided (Slurm jobs refused, pool nodes released) is carried out before, by
`SlurmPools.carry_out` (controller/scheduler/slurm_pools.py).

It owns what the executor returned for starts handed to it in the background, until
the next pass records them (`take_started`), and `replan`: an action failed, so the
scheduler plans again at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from controller.executors.base import (
    RESOURCE_ERRNOS,
    AttemptEvent,
    AttemptSpec,
    Executor,
    ExecutorError,
    ExecutorUnavailable,
    Outcome,
    start_error,
)
from controller.planner import Terminate
from controller.plumbing.metrics import Metrics
from controller.scheduler.backoff import Backoff
from controller.scheduler.calls import Calls
from controller.scheduler.checkpoints import CheckpointTimer
from controller.scheduler.events import Events
from controller.scheduler.inputs import Clock, Inbox
from controller.scheduler.runs import VmRun
from controller.scheduler.world import World
from controller.states import AttemptState, check_transition
from controller.store import WriteBatch
from drivers.base import Driver, DriverError, LaunchRequest, VmState, VmStatus

log = logging.getLogger("spotbag.scheduler")

# What the executor returned for an attempt handed to it: (its spec, its reference there,
# the error that kept it from starting, if one did).
StartResult = tuple[AttemptSpec, str, Exception | None]


class Actions:
    """The acting half of a pass (see the module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        driver: Driver,
        executor: Executor,
        clock: Clock,
        controller_id: str,
        metrics: Metrics | None,
        backoff: Backoff,
        checkpoints: CheckpointTimer,
        events: Events,
        inbox: Inbox,
        calls: Calls,
    ) -> None:
        self.world = world
        self.driver = driver
        self.executor = executor
        self.clock = clock
        self.controller_id = controller_id
        self.metrics = metrics
        self.backoff = backoff
        self.checkpoints = checkpoints
        self.events = events
        self.inbox = inbox
        self.calls = calls
        # What starts handed over in the background returned, recorded by the next pass.
        self.started: list[StartResult] = []
        self.replan = False  # an action failed: plan again at once, not at the next event

    def take_started(self) -> list[StartResult]:
        """What the starts handed over in the background returned, for a pass to record."""
        started, self.started = self.started, []
        return started

    async def _start(self, spec: AttemptSpec) -> StartResult:
        """Hand an attempt to the executor: (spec, its reference there, the error if any)."""
        try:
            return spec, await self.executor.start(spec), None
        except Exception as exc:
            return self._start_failed(spec, exc)

    def _enqueue(self, spec: AttemptSpec) -> StartResult | None:
        """Hand an attempt to the executor's queue without waiting, as `_start` returns
        (None: the executor must `start` it)."""
        try:
            return (spec, "", None) if self.executor.enqueue(spec) else None
        except Exception as exc:
            return self._start_failed(spec, exc)

    @staticmethod
    def _start_failed(spec: AttemptSpec, exc: Exception) -> StartResult:
        if isinstance(exc, ExecutorError):
            return spec, "", exc
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            # The host ran out of something the executor did not expect to need.
            return spec, "", start_error("starting the attempt", exc)
        log.error("starting %s failed", spec.attempt_id, exc_info=exc)
        return spec, "", ExecutorError(f"internal error: {exc}")

    async def _cancel(self, attempt_id: str) -> None:
        await self.calls.call(self.executor.cancel(attempt_id))

    async def _signal(self, attempt_id: str, timeout_s: float) -> None:
        await self.calls.call(self.executor.signal_checkpoint(attempt_id, timeout_s))

    async def _launch(self, vm: VmRun) -> tuple[VmRun, VmStatus | None, Exception | None]:
        request = LaunchRequest(
            token=vm.id,
            vm_type=vm.vm_type,
            spot=vm.spot,
            zone=vm.zone,
            tags={"spotbag-controller": self.controller_id},
            bootstrap=self.executor.bootstrap_values(vm.id, vm.vm_type, vm.pool_node),
        )
        try:
            return vm, await self.driver.launch(request), None
        except DriverError as exc:
            return vm, None, exc
        except Exception as exc:
            log.exception("launching %s failed", vm.id)
            return vm, None, exc

    def _start_in_background(self, starts: list[AttemptSpec]) -> None:
        """Hand attempts to the executor without waiting for it: the pass goes on, and
        the next one records what each start returned (`record_starts`), within
        START_RECORD_DELAY_S (at once if one failed). Their intents are written already."""

        async def start_all() -> None:
            results = await self.calls.run_all([functools.partial(self._start, s) for s in starts])
            self.started.extend(results)
            if any(error is not None for _, _, error in results):
                self.inbox.wake.set()  # their jobs wait to be tried again

        self.calls.start_in_background(start_all())

    def _enqueue_all(
        self, starts: list[AttemptSpec]
    ) -> tuple[list[StartResult], list[AttemptSpec]]:
        """Hand attempts to the executor's queue here and now (`Executor.enqueue`): what
        each returned, and the attempts it must `start` instead. No task an attempt, as
        `run_all` makes (its tasks and gather ~5 % of the daemon's samples holding the GIL
        with trivial jobs, py-spy --gil on bench/local_dispatch.py)."""
        queued: list[StartResult] = []
        rest: list[AttemptSpec] = []
        for spec in starts:
            result = self._enqueue(spec)
            if result is None:
                rest.append(spec)
            else:
                queued.append(result)
        return queued, rest

    def record_starts(self, results: Sequence[StartResult], batch: WriteBatch, now: float) -> None:
        """Record what the executor returned for attempts handed to it: each RUNNING (or
        handed to its queue), or ended if it could not start; starts back off while the
        executor cannot take attempts."""
        world = self.world
        unavailable = None
        for spec, ref, error in results:
            attempt = world.attempts.get(spec.attempt_id)
            if attempt is None or attempt.state is not AttemptState.STARTING:
                continue
            if error is None:
                changed = ref != attempt.ref
                attempt.ref = ref
                if not self.executor.queues_attempts:
                    check_transition("attempt", attempt.state, AttemptState.RUNNING)
                    attempt.state = AttemptState.RUNNING
                    attempt.ran_at = attempt.started_at
                    # A start recorded a pass late may be cancelled already.
                    if not attempt.cancelling and not attempt.vm_gone:
                        self.checkpoints.plan(attempt, now)
                    changed = True
                # else it runs once the executor says so (AttemptStarted), and its row,
                # written as its intent, changes only if the executor gave it a reference
                # (a Slurm job id; the local executor gives none): not written again, a
                # pass's second transaction and fsync are saved (bench/local_dispatch.py).
                if changed:
                    world.write_attempt(attempt, batch)
            elif isinstance(error, ExecutorUnavailable):
                unavailable = error
                self.events.on_attempt_end(
                    AttemptEvent(spec.attempt_id, now, Outcome.NOT_STARTED, None, str(error)), batch
                )
            else:
                self.events.on_attempt_end(
                    AttemptEvent(spec.attempt_id, now, Outcome.START_FAILED, None, str(error)),
                    batch,
                )
        self.backoff.after_starts(unavailable, now, bool(results))

    async def execute(
        self,
        starts: list[AttemptSpec],
        launches: list[VmRun],
        cancels: list[str],
        terminations: list[Terminate],
        batch: WriteBatch,
        signals: Sequence[tuple[str, float]] = (),
        *,
        background_starts: bool = False,
    ) -> None:
        """Act on a pass's decisions and record what each call returned: starts,
        launches, cancels and checkpoint signals together, then terminations.

        `background_starts`: the starts are not waited for (`_start_in_background`)."""
        world = self.world
        if background_starts and starts:
            self._start_in_background(starts)
            starts = []
        queued: list[StartResult] = []
        if starts and self.executor.queues_attempts:
            queued, starts = self._enqueue_all(starts)
        if not (queued or starts or launches or cancels or terminations or signals):
            return
        if cancels or signals:
            await self.calls.starts_settled()  # they may be about attempts still being started
        calls: list[Callable[[], Awaitable[Any]]] = []
        if launches:
            calls += [functools.partial(self._launch, v) for v in launches]
        if cancels:
            calls += [functools.partial(self._cancel, a) for a in cancels]
        if signals:
            calls += [functools.partial(self._signal, a, t) for a, t in signals]
        if self.calls.max_concurrent_calls == 1:
            # One call at a time (the simulator): the starts in turn, then the rest, in
            # the order run_all would take them, without a partial per start.
            results: list[Any] = [await self._start(s) for s in starts]
            if calls:
                results += await self.calls.run_all(calls)
        else:
            starting = [functools.partial(self._start, s) for s in starts]
            results = await self.calls.run_all(starting + calls)
        now = self.clock.now()
        if queued or starts:
            self.record_starts(queued + results[: len(starts)], batch, now)
        launched = results[len(starts) : len(starts) + len(launches)]
        for vm, status, error in launched:
            self._launched(vm, status, error, now, batch)
        self.backoff.after_launches(launched, now)
        if terminations:
            await self._terminate(
                [world.vms[t.vm_id] for t in terminations if t.vm_id in world.vms]
            )

    def _launched(
        self,
        vm: VmRun,
        status: VmStatus | None,
        error: Exception | None,
        now: float,
        batch: WriteBatch,
    ) -> None:
        world = self.world
        if self.metrics is not None:
            self.metrics.vm_launches.labels(
                vm_type=vm.vm_type.name, result="ok" if error is None else "error"
            ).inc()
        if error is not None:
            log.warning("launch of %s (%s) failed: %s", vm.id, vm.vm_type.name, error)
            if vm.id in world.vms:
                world.end_vm(vm, VmState.FAILED, now, f"launch failed: {error}", batch)
            if vm.pool_node:  # Slurm should not wait ResumeTimeout for it: requeue now
                self.calls.spawn(self.executor.vm_lost(vm.id, vm.pool_node))
            self.replan = True
            return
        if vm.id not in world.vms:
            return
        assert status is not None  # a launch that raised nothing returned the VM's status
        world.set_provider_id(vm, status.vm_id)
        batch.vm(vm.row(world.driver_name, world.time_scale))
        if status.state is not vm.state:
            self.inbox.push(status)

    async def _terminate(self, vms: list[VmRun]) -> None:
        try:
            await self.driver.terminate([vm.provider_id for vm in vms if vm.provider_id])
        except Exception:
            log.exception("terminating %s failed; will retry", [vm.id for vm in vms])
            for vm in vms:
                vm.terminating = False
                self.world.refresh_vm_sets(vm)
