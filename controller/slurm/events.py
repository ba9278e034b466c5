"""Slurm's callbacks, once verified (controller/slurm/routes.py checks the signature
and the shape): about one of spotbag's attempts (the Slurm executor takes it), a
power-saving pool's nodes or its users' jobs (the scheduler), else only noted so that a
replay is known. docs/slurm.md says what each hook sends and when.

`SlurmCallbacks` is made by the daemon only with the Slurm executor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from controller.clock import RealClock
from controller.errors import ApiError
from controller.executors.base import CallbackNoted
from controller.scheduler import PoolRunEvent, Scheduler
from controller.slurm.callbacks import POOL_VERDICT_WAIT_S, POWER_EVENTS, SlurmEvent
from controller.slurm.commands import exit_status, hostlist_expand
from controller.slurm.executor import SlurmExecutor


class SlurmCallbacks:
    """What a verified callback does, and which ones were seen (a replay is answered as
    a duplicate)."""

    def __init__(
        self,
        executor: SlurmExecutor,
        scheduler: Callable[[], Scheduler],
        clock: RealClock,
    ) -> None:
        self.executor = executor
        self._scheduler = scheduler
        self._clock = clock
        # Pool jobs whose start is being taken (Slurm asked for its limits): their end
        # waits for it, so that the start is queued first.
        self._pool_starts: dict[tuple[str, str], asyncio.Event] = {}
        # Ends of pool runs answered 503 (not written in time), by callback key, until
        # written: the hook's next copy is a repeat, answered only once it is.
        self._unwritten_ends: dict[str, asyncio.Future[str]] = {}

    def seen(self, key: str) -> bool:
        return self.executor.seen(key)

    def remember(self, key: str) -> None:
        self.executor.remember(key)

    async def repeat_written(self, key: str) -> None:
        """A repeat of a callback: if it is a pool run's end that was answered 503, once
        that end is written (503 again if it still is not)."""
        unwritten = self._unwritten_ends.get(key)
        if unwritten is not None:
            await self._end_written(key, unwritten)

    async def take(self, event: SlurmEvent) -> bool:
        """A verified, new callback. True when it is acted on."""
        scheduler = self._scheduler()
        nodes: list[str] = []
        if event.event in POWER_EVENTS and scheduler.pools:
            # Bounded before it is expanded, and before anything is noted: Slurm names
            # only pool nodes (at most all of them), while a signed "spot-[0-99999999]"
            # would hold the loop for minutes. Raises HostlistError: a 400.
            nodes = hostlist_expand(event.nodes, limit=len(scheduler.pools.by_node))
        self.executor.remember(event.key)
        subject = event.job_name or event.nodes
        noted = CallbackNoted(event.key, self._clock.now(), event.event, subject)
        if event.event in POWER_EVENTS:
            scheduler.note(noted)
            return scheduler.pool_power(event.event, nodes) > 0
        if event.partition in scheduler.pools.by_partition:
            scheduler.note(noted)
            return await self._pool_job(event, scheduler)
        if event.about_a_job:
            taken = await self.executor.take_callback(
                key=event.key,
                event=event.event,
                job_name_=event.job_name,
                job_id=event.job_id,
                state=event.state,
                exit_code=event.exit_code,
            )
            if taken:
                return taken == "applied"
        scheduler.note(noted)
        return False

    async def _pool_job(self, event: SlurmEvent, scheduler: Scheduler) -> bool:
        """A Slurm user's job on a pool: its start (the prolog hook waits for the
        answer: a job its account cannot pay for is cancelled before the prolog ends, so
        it never runs) or its end."""
        if event.event == "prolog_slurmctld":
            await self._pool_run_started(event, scheduler)
            return True
        if event.event != "jobcomp":
            return False
        # After its start, if that is still being taken (its limits asked of Slurm): an
        # end taken first would leave the start's reservation open.
        starting = self._pool_starts.get((event.job_id, event.job_name))
        if starting is not None:
            await starting.wait()
        code, sig = exit_status(event.exit_code)
        ended = scheduler.pool_run(
            PoolRunEvent(
                "end",
                event.job_id,
                event.job_name,
                event.partition,
                event.nodes,
                user=event.user,
                account=event.account,
                cpus=event.cpus,
                state=event.state,
                exit_code=128 + sig if sig else code,
                started_at=event.start,
                ended_at=event.end,
            )
        )
        if ended is None:
            return False
        await self._end_written(event.key, ended)
        return True

    async def _end_written(self, key: str, ended: asyncio.Future[str]) -> None:
        """Return once the pass wrote a pool run's end (its verdict): a hook told it was
        taken forgets it, and a daemon killed before writing it left the run open for
        ever (reserved, never charged). Not written in time: 503, and the hook sends it
        again; that copy waits on the same end (`repeat_written`)."""
        try:
            await asyncio.wait_for(asyncio.shield(ended), POOL_VERDICT_WAIT_S)
        except TimeoutError:
            if key not in self._unwritten_ends:
                self._unwritten_ends[key] = ended
                ended.add_done_callback(lambda _: self._unwritten_ends.pop(key, None))
            raise ApiError(
                f"a Slurm job's end ({key}) is not recorded yet: send it again",
                status=503,
                code="not_recorded",
            ) from None

    async def _pool_run_started(self, event: SlurmEvent, scheduler: Scheduler) -> None:
        """A pool job was allocated: what it may use (Slurm's CPUs and time limit), then
        its reservation (or its cancellation), once decided."""
        ident = (event.job_id, event.job_name)
        # Its end, should it come meanwhile, waits until the start is queued (jobcomp).
        queued = self._pool_starts[ident] = asyncio.Event()
        try:
            cpus, limit_h = await self.executor.job_limits(event.job_id)
            verdict = scheduler.pool_run(
                PoolRunEvent(
                    "start",
                    event.job_id,
                    event.job_name,
                    event.partition,
                    event.nodes,
                    user=event.user,
                    account=event.account,
                    restart=event.restart_count,
                    cpus=cpus or event.cpus,
                    limit_h=limit_h,
                    # When slurmctld's hook sent it (a copy sent again keeps it): the
                    # run's start by the clock of jobcomp's START.
                    started_at=event.sent_at,
                )
            )
        finally:
            queued.set()
            if self._pool_starts.get(ident) is queued:
                del self._pool_starts[ident]
        if verdict is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(verdict), POOL_VERDICT_WAIT_S)
