"""Acting on a pass's decisions.

`ActionsMixin` hands attempts to the executor, launches and terminates VMs through
the driver, cancels attempts and signals checkpoints, at most
`scheduler.max_concurrent_calls` calls at a time, and records what each call
returned; it also carries out what pool events decided (Slurm jobs refused, pool nodes
released, the hooks' verdicts). It is a mixin of `Scheduler`, not a collaborator: recording a result
(an attempt that could not start, a launch that failed) moves jobs, attempts and
VMs on through the transitions of controller/scheduler/transitions.py, which need
the whole open world. It inherits `EventsMixin`: an attempt the executor could not
start is recorded as that attempt's end. What failed actions hold back is `Backoff`'s
(controller/scheduler/backoff.py), a collaborator with its own state.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from controller.executors.base import (
    RESOURCE_ERRNOS,
    AttemptEvent,
    AttemptSpec,
    ExecutorError,
    ExecutorUnavailable,
    Outcome,
    PoolExecutor,
    start_error,
)
from controller.planner import Terminate
from controller.runtime import VmRun
from controller.scheduler.events import EventsMixin
from controller.scheduler.state import StartResult
from controller.states import AttemptState, check_transition
from controller.store import WriteBatch
from drivers.base import DriverError, LaunchRequest, VmState, VmStatus

log = logging.getLogger("spotbag.scheduler")

T = TypeVar("T")


class ActionsMixin(EventsMixin):
    """The acting half of a pass (part of `Scheduler`; see the module docstring)."""

    async def _call(self, awaitable: Awaitable[T]) -> T | None:
        """Await a driver/executor call; log and swallow its failure (the next pass retries)."""
        try:
            return await awaitable
        except Exception:
            log.exception("driver/executor call failed")
            return None

    async def _run_all(self, calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
        """Run driver/executor calls, at most max_concurrent_calls at a time."""
        if self.settings.max_concurrent_calls == 1:
            return [await call() for call in calls]

        async def bounded(call: Callable[[], Awaitable[T]]) -> T:
            async with self._call_slots:
                return await call()

        return await asyncio.gather(*(bounded(call) for call in calls))

    async def _start(self, spec: AttemptSpec) -> StartResult:
        """Hand an attempt to the executor: (spec, its reference there, the error if any)."""
        try:
            return spec, await self.executor.start(spec), None
        except ExecutorError as exc:
            return spec, "", exc
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
                # The host ran out of something the executor did not expect to need.
                return spec, "", start_error("starting the attempt", exc)
            log.exception("starting %s failed", spec.attempt_id)
            return spec, "", ExecutorError(f"internal error: {exc}")

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
        the next one records what each start returned (`_record_starts`), within
        START_RECORD_DELAY_S (at once if one failed). Their intents are written already."""

        async def start_all() -> None:
            results = await self._run_all([functools.partial(self._start, s) for s in starts])
            self._started.extend(results)
            if any(error is not None for _, _, error in results):
                self._wake.set()  # their jobs wait to be tried again

        task = asyncio.ensure_future(start_all())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _record_starts(self, results: Sequence[StartResult], batch: WriteBatch, now: float) -> None:
        """Record what the executor returned for attempts handed to it: each RUNNING (or
        handed to its queue), or ended if it could not start; starts back off while the
        executor cannot take attempts."""
        unavailable = None
        for spec, ref, error in results:
            attempt = self.attempts.get(spec.attempt_id)
            if attempt is None or attempt.state is not AttemptState.STARTING:
                continue
            if error is None:
                attempt.ref = ref
                if not self.executor.queues_attempts:
                    check_transition("attempt", attempt.state, AttemptState.RUNNING)
                    attempt.state = AttemptState.RUNNING
                    attempt.ran_at = attempt.started_at
                    # A start recorded a pass late may be cancelled already.
                    if not attempt.cancelling and not attempt.vm_gone:
                        self.checkpoints.plan(attempt, now)
                # else it runs once the executor says so (AttemptStarted)
                self._write_attempt(attempt, batch)
            elif isinstance(error, ExecutorUnavailable):
                unavailable = error
                self._on_attempt_end(
                    AttemptEvent(spec.attempt_id, now, Outcome.NOT_STARTED, None, str(error)), batch
                )
            else:
                self._on_attempt_end(
                    AttemptEvent(spec.attempt_id, now, Outcome.START_FAILED, None, str(error)),
                    batch,
                )
        self.backoff.after_starts(unavailable, now, bool(results))

    async def _execute(
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
        """Act on a pass's decisions and record what each call returned: first the Slurm
        jobs refused (cancelled) and the pool nodes released, then the hooks told their
        verdicts; then starts, launches, cancels and checkpoint signals together.

        `background_starts`: the starts are not waited for (`_start_in_background`)."""
        # Only the Slurm executor has pools (controller/daemon.py), so refusals and
        # releases exist only with an executor that has these two calls.
        refusals, self._refusals = self._refusals, []
        releases, self._pool_releases = self._pool_releases, []
        if refusals or releases:
            pools = self.executor
            assert isinstance(pools, PoolExecutor), "pool work without a pool executor"
            for job_id, why in refusals:
                await self._call(pools.cancel_job(job_id, why))
            for node, why in releases:
                await self._call(pools.release_pool_node(node, why))
        verdicts, self._verdicts = self._verdicts, []
        for future, verdict in verdicts:  # after the refused were cancelled
            if not future.done():
                future.set_result(verdict)
        if background_starts and starts:
            self._start_in_background(starts)
            starts = []
        if not (starts or launches or cancels or terminations or signals):
            return
        if cancels or signals:
            await self._starts_settled()  # they may be about attempts still being started
        results = await self._run_all(
            [
                *(lambda s=s: self._start(s) for s in starts),
                *(lambda v=v: self._launch(v) for v in launches),
                *(lambda a=a: self._call(self.executor.cancel(a)) for a in cancels),
                *(
                    lambda a=a, t=t: self._call(self.executor.signal_checkpoint(a, t))
                    for a, t in signals
                ),
            ]
        )
        now = self.clock.now()
        if starts:
            self._record_starts(results[: len(starts)], batch, now)
        launched = results[len(starts) : len(starts) + len(launches)]
        for vm, status, error in launched:
            self._launched(vm, status, error, now, batch)
        self.backoff.after_launches(launched, now)
        if terminations:
            await self._terminate([self.vms[t.vm_id] for t in terminations if t.vm_id in self.vms])

    def _launched(
        self,
        vm: VmRun,
        status: VmStatus | None,
        error: Exception | None,
        now: float,
        batch: WriteBatch,
    ) -> None:
        if self.metrics is not None:
            self.metrics.vm_launches.labels(
                vm_type=vm.vm_type.name, result="ok" if error is None else "error"
            ).inc()
        if error is not None:
            log.warning("launch of %s (%s) failed: %s", vm.id, vm.vm_type.name, error)
            if vm.id in self.vms:
                self._end_vm(vm, VmState.FAILED, now, f"launch failed: {error}", batch)
            if vm.pool_node:  # Slurm should not wait ResumeTimeout for it: requeue now
                self._spawn(self.executor.vm_lost(vm.id, vm.pool_node))
            self._replan = True
            return
        if vm.id not in self.vms:
            return
        assert status is not None  # a launch that raised nothing returned the VM's status
        self._set_provider_id(vm, status.vm_id)
        batch.vm(vm.row(self.driver.name, self.time_scale))
        if status.state is not vm.state:
            self._push(status)

    async def _terminate(self, vms: list[VmRun]) -> None:
        try:
            await self.driver.terminate([vm.provider_id for vm in vms if vm.provider_id])
        except Exception:
            log.exception("terminating %s failed; will retry", [vm.id for vm in vms])
            for vm in vms:
                vm.terminating = False
                self._refresh_vm_sets(vm)

    def _spawn(self, coroutine: Awaitable[object]) -> None:
        """Run a driver/executor call in the background, its failure logged (a pass
        does not wait for it)."""
        task = asyncio.ensure_future(self._call(coroutine))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
