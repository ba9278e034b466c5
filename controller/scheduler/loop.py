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
(at most every MIN_PASS_INTERVAL_S; while the executor's queue keeps every VM busy, at
most every `executor.backlog_pass_interval_s`) and at least every `poll_interval_s`; the
simulator calls `tick()` itself while it moves a virtual clock. `recover()` rebuilds
memory from the store after a restart.

`Scheduler` is the composition root of the scheduler: its constructor builds the
`World` and the collaborators, each given explicitly what it reads and changes, and
this module runs the pass loop over them, takes what callers hand it between passes,
and holds the hook the hopper moves jobs through (`request_migration`). Who owns what:

- world.py: `World`, the open bags, jobs, attempts and VMs, the VM indexes and the
  VM types on offer, and every state change with its record; it calls no collaborator;
- runs.py: the run records the world holds (`BagRun`, `JobRun`, `AttemptRun`, `VmRun`);
- inputs.py: the `Inbox` (events the driver and the executor push, commands callers
  queue, the loop's wake-up), the commands, and the clock and id protocols;
- calls.py: `Calls`, driver and executor calls (bounded, logged) and the starts under way;
- events.py: `Events`, the driver's and executor's events;
- commands.py: `Commands`, bags admitted and cancelled, held jobs admitted;
- planning.py: `Planning`, the planner's snapshot and its decision recorded as intents;
- actions.py: `Actions`, acting on the decision and recording the results (an attempt
  that could not start ends through `Events`);
- backoff.py: `Backoff`, the back-off after failed actions;
- checkpoints.py: `CheckpointTimer`, checkpoint timing (docs/design.md#checkpoints);
- slurm_pools.py: `SlurmPools`, Slurm's power-saving pool nodes and the runs on them;
- recovery.py: `Recovery`, restart re-adoption (it rebuilds the world, the pools' runs
  and the checkpoint plans);
- waiting.py: why a job waits and how fast its bag goes (read-only, for the API).

Who calls whom: `tick` calls Actions (what the last pass's starts returned), Events,
Commands (which hands pool reports to SlurmPools), SlurmPools, Planning, then
SlurmPools and Actions to act; Actions calls Events for an attempt that could not start,
and Recovery calls Events for an attempt whose VM is gone; every collaborator changes
state through the World. VMs to terminate at once (a node broke, Slurm let go of one)
reach the pass through the `terminate` callback Events and SlurmPools are given. Which
VMs to move and where is the hopper's (controller/hopper.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from controller.bags.spec import BagSpec
from controller.budgets import Budgets
from controller.config import CheckpointConfig, LedgerConfig, NotifyConfig, SchedulerConfig
from controller.executors.base import Executor, ExecutorEvent
from controller.ledger import Accounts
from controller.notify.emit import Notices
from controller.planner import Terminate, plan
from controller.plumbing.metrics import Metrics
from controller.preemption.checkpoint_tables import TableCache
from controller.preemption.model_book import ModelBook
from controller.scheduler.actions import Actions
from controller.scheduler.backoff import Backoff
from controller.scheduler.calls import Calls
from controller.scheduler.checkpoints import CheckpointTimer
from controller.scheduler.commands import CANCEL_CHUNK, Commands
from controller.scheduler.deadlines import Deadlines, SpotPriceFeed
from controller.scheduler.events import Events
from controller.scheduler.inputs import (
    Clock,
    IdSource,
    Inbox,
    PoolPower,
    PoolRunEvent,
    _Admit,
    _Cancel,
)
from controller.scheduler.planning import Planning
from controller.scheduler.recovery import Recovery
from controller.scheduler.slurm_pools import SlurmPools
from controller.scheduler.world import World
from controller.slurm.pools import PoolBook
from controller.states import AttemptState
from controller.store import Store, StoreUnavailable
from drivers.base import Driver, VmState, VmStatus, VmType

log = logging.getLogger("spotbag.scheduler")

__all__ = ["CANCEL_CHUNK", "Clock", "IdSource", "PoolPower", "PoolRunEvent", "Scheduler"]

# How long what the executor returned for attempts started in the background may wait
# for a pass to record it with whatever else comes (a busy host's next job end: sooner).
START_RECORD_DELAY_S = 0.05
# The daemon's loop starts a pass at most this often (`run`): what comes meanwhile waits
# for the next, so that a busy host's job ends and starts (one or more each millisecond
# with trivial jobs) are handled a few at a time, not one pass each. A pass costs a
# fraction of a millisecond of CPU and a commit whatever it carries (2,000 trivial jobs
# on 4 local slots: 0.64-0.68 passes a job unpaced, 0.36-0.43 paced, the daemon's CPU a
# job 1.77-2.06 against 1.58-2.04 ms at load 4.4-4.9; bench/local_dispatch.py), and the
# local executor starts the next attempt without one (docs/architecture.md#local-queue).
MIN_PASS_INTERVAL_S = 0.005


class Scheduler:
    """The daemon's scheduler: one pass at a time over the open world; the composition
    root of its parts (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        driver: Driver,
        executor: Executor,
        clock: Clock,
        ids: IdSource,
        settings: SchedulerConfig,
        catalog: Sequence[VmType],
        controller_id: str,
        metrics: Metrics | None = None,
        book: ModelBook | None = None,
        time_scale: float = 1.0,
        checkpointing: CheckpointConfig | None = None,
        tables: TableCache | None = None,
        ledger: LedgerConfig | None = None,
        notify: NotifyConfig | None = None,
        spot_feed: SpotPriceFeed | None = None,
    ) -> None:
        self.store = store
        self.driver = driver
        self.executor = executor
        self.clock = clock
        self.settings = settings
        self.metrics = metrics
        self.book = book  # preemption models; None: no reuse policy, no hot spares
        self.time_scale = time_scale  # model seconds per real second (local driver)
        self.accounts = Accounts(
            ledger or LedgerConfig()
        )  # CPU-hour balances (docs/design.md#ledger)
        # Dollar budgets (controller/budgets.py) and events (controller/notify/emit.py),
        # kept by the world with the accounts; the daemon wakes its webhook deliveries
        # through `notices.wake`.
        self.budgets = Budgets(
            time_scale=time_scale,
            # Followed market (simulate's trace): an attempt reserves at the price now.
            spot_price=spot_feed.price_at if spot_feed is not None else None,
        )
        self.notices = Notices(notify)
        self.world = World(
            catalog=catalog,
            accounts=self.accounts,
            executor=executor,
            driver_name=driver.name,
            time_scale=time_scale,
            book=book,
            metrics=metrics,
            budgets=self.budgets,
            notices=self.notices,
        )
        self.inbox = Inbox()
        self.calls = Calls(settings.max_concurrent_calls)
        self.backoff = Backoff(settings, executor.name)  # after failed launches and starts
        checkpointing = checkpointing or CheckpointConfig()
        tables = tables or TableCache(
            None,
            step_h=checkpointing.step_s / 3600.0,
            restart_h=book.launch_h if book else 0.0,
            max_work_h=checkpointing.max_work_h,
            inline=True,
        )
        self.checkpoints = (
            CheckpointTimer(  # when to signal checkpoints (docs/design.md#checkpoints)
                settings=checkpointing,
                tables=tables,
                time_scale=time_scale,
                world=self.world,
                wake=self.inbox.wake.set,
            )
        )
        # VMs whose node broke (or Slurm let go), terminated by this pass.
        self._terminate_now: list[Terminate] = []
        self.events = Events(
            world=self.world,
            driver=driver,
            executor=executor,
            clock=clock,
            checkpoints=self.checkpoints,
            inbox=self.inbox,
            calls=self.calls,
            terminate=self._terminate_now.append,
        )
        # Power-saving pools (controller/slurm/pools.py): Slurm users' jobs on spot VMs.
        self.slurm_pools = SlurmPools(
            world=self.world,
            accounts=self.accounts,
            executor=executor,
            ids=ids,
            inbox=self.inbox,
            calls=self.calls,
            terminate=self._terminate_now.append,
        )
        self.commands = Commands(
            world=self.world, accounts=self.accounts, inbox=self.inbox, pools=self.slurm_pools
        )
        # The deadline policy's on-demand slots per bag (docs/design.md#deadlines).
        self.deadlines = Deadlines(
            world=self.world,
            book=book,
            tables=tables,
            max_vms=settings.max_vms,
            backoff=self.backoff,
            spot_feed=spot_feed,
        )
        self.deadlines.on_ready = self.inbox.wake.set  # its completion-time tables built
        self.checkpoints.interval_bounds_s = self.deadlines.checkpoint_interval_bounds_s
        self.deadlines.checkpoints_planned = checkpointing.policy != "none"
        self.planning = Planning(
            world=self.world,
            executor=executor,
            backoff=self.backoff,
            book=book,
            settings=settings,
            ids=ids,
            time_scale=time_scale,
            deadlines=self.deadlines,
            spot_feed=spot_feed,
        )
        self.actions = Actions(
            world=self.world,
            driver=driver,
            executor=executor,
            clock=clock,
            controller_id=controller_id,
            metrics=metrics,
            backoff=self.backoff,
            checkpoints=self.checkpoints,
            events=self.events,
            inbox=self.inbox,
            calls=self.calls,
        )
        self.recovery = Recovery(
            world=self.world,
            store=store,
            driver=driver,
            executor=executor,
            clock=clock,
            accounts=self.accounts,
            pools=self.slurm_pools,
            checkpoints=self.checkpoints,
            events=self.events,
            inbox=self.inbox,
            calls=self.calls,
        )
        # Bags written but still being handed over (admission.hand_over): whether a
        # cancel came meanwhile (it is replayed once the bag is admitted).
        self._handing_over: dict[str, bool] = {}
        self._stopping = False
        self._last_describe = 0.0
        self.problem: str | None = None  # why passes fail now (None: they do not)
        self.ticks = 0
        driver.subscribe(self.inbox.on_vm_status)
        executor.subscribe(self.inbox.on_attempt_event)

    @property
    def pools(self) -> PoolBook:
        """The power-saving pools' configuration (the daemon sets it with Slurm's)."""
        return self.slurm_pools.book

    @pools.setter
    def pools(self, book: PoolBook) -> None:
        self.slurm_pools.book = book

    # --- inputs ------------------------------------------------------------------

    def note(self, event: ExecutorEvent) -> None:
        """An event from outside the executor's own watch (a callback it did not take)."""
        self.inbox.on_attempt_event(event)

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
        self.inbox.commands.append(_Admit(bag_id, spec, params_json, held))
        if self._handing_over.pop(bag_id, False):
            self.inbox.commands.append(_Cancel(bag_id))  # cancelled while handed over
        self.inbox.wake.set()

    def bag_written(self, bag_id: str) -> None:
        """A bag was written and will come with `bag_admitted` once its reservations
        are open (admission.hand_over): a cancel meanwhile is kept for it."""
        self._handing_over[bag_id] = False

    def credited(self) -> None:
        """An account got CPU-hours: held jobs may run (the next pass admits them)."""
        self.inbox.wake.set()

    def cancel_requested(self, bag_id: str) -> None:
        if bag_id in self._handing_over:
            self._handing_over[bag_id] = True
        self.inbox.commands.append(_Cancel(bag_id))
        self.inbox.wake.set()

    def pool_power(self, kind: str, nodes: Sequence[str]) -> int:
        """Slurm resumes, suspends or gave up on pool nodes; returns how many are ours."""
        return self.slurm_pools.pool_power(kind, nodes)

    def pool_run(self, event: PoolRunEvent) -> asyncio.Future[str] | None:
        """A run of a Slurm user's job on a pool began or ended: a future of what was
        decided (see PoolRunEvent.verdict); None if it is not on a pool."""
        return self.slurm_pools.pool_run(event)

    def has_inputs(self) -> bool:
        """True when events or commands wait for the next pass."""
        return bool(self.inbox.events or self.inbox.commands or self.actions.started)

    def held_jobs(self) -> int:
        """Jobs waiting, held, for their accounts to have CPU-hours."""
        return sum(len(bag.held) for bag in self.world.bags.values())

    def has_work(self) -> bool:
        """True while anything is open: bags, VMs, or unprocessed inputs."""
        world, inbox = self.world, self.inbox
        return bool(world.bags or world.vms or inbox.events or inbox.commands)

    async def recover(self) -> None:
        """Rebuild memory from the store and reconcile it with the driver and the
        executor (controller/scheduler/recovery.py)."""
        await self.recovery.recover()
        # Its decisions and what it told were of the world before: a `deadline_at_risk`
        # whose pass failed to write is told again (as after a daemon restart).
        self.deadlines.forget()

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
        last_pass_at = -MIN_PASS_INTERVAL_S
        while not self._stopping:
            next_at: float | None = None
            too_soon_s = last_pass_at + MIN_PASS_INTERVAL_S - time.monotonic()
            if too_soon_s > 0:  # at most one pass every MIN_PASS_INTERVAL_S
                await asyncio.sleep(too_soon_s)
            await self._while_backlogged(last_pass_at)
            if self._stopping:
                break
            last_pass_at = time.monotonic()
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
            # Starts under way or returned are recorded soon, with whatever else comes.
            if self.calls.starting or self.actions.started:
                soon = self.clock.now() + START_RECORD_DELAY_S
                next_at = soon if next_at is None else min(next_at, soon)
            if next_at is not None:
                timeout = max(0.0, min(timeout, next_at - self.clock.now()))
            if not self.inbox.wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.inbox.wake.wait(), timeout)
            self.inbox.wake.clear()

    async def _while_backlogged(self, last_pass_at: float) -> None:
        """Wait while the executor's queue keeps every VM busy, up to its
        `backlog_pass_interval_s` after the last pass: what the next pass records
        (ends, starts) waits a little and comes in one transaction, not a few each, and
        no slot waits for it (the executor starts the next queued attempt itself).
        Looked at every MIN_PASS_INTERVAL_S: once a VM's queue runs dry, the pass comes."""
        interval_s = self.executor.backlog_pass_interval_s
        while (
            interval_s > 0
            and not self._stopping
            and (left_s := last_pass_at + interval_s - time.monotonic()) > 0
            and self.executor.backlogged()
        ):
            await asyncio.sleep(min(left_s, MIN_PASS_INTERVAL_S))

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if the scheduler is stopped meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inbox.wake.wait(), left)
            self.inbox.wake.clear()

    def stop(self) -> None:
        self._stopping = True
        self.inbox.wake.set()

    async def shutdown(self, *, vms_die_with_controller: bool) -> None:
        """Stop every attempt and record it LOST (it is queued again on the next start);
        record the VMs gone when they do not outlive the controller (local driver).
        Attempts that ended before they could be stopped are recorded as they ended.

        Attempts that outlive the controller (Slurm jobs on VMs that outlive it) are left
        running and recorded as they are: the next start re-adopts them."""
        await self.calls.starts_settled()
        if vms_die_with_controller:
            for vm in list(self.world.vms.values()):  # a cluster forgets their nodes
                await self.calls.call(self.executor.vm_lost(vm.id, vm.pool_node))
        await self.executor.shutdown()
        now = self.clock.now()
        batch = self.store.new_batch()
        self.actions.record_starts(self.actions.take_started(), batch, now)
        await self.events.handle(batch)
        keep_running = self.executor.attempts_outlive_controller and not vms_die_with_controller
        for attempt in [] if keep_running else list(self.world.attempts.values()):
            self.world.finish_attempt(
                attempt, AttemptState.LOST, now, None, "the controller stopped", batch
            )
        if vms_die_with_controller:
            for vm in list(self.world.vms.values()):
                self.world.end_vm(vm, VmState.TERMINATED, now, "the controller stopped", batch)
        await self.store.apply(batch)

    async def _describe_if_due(self) -> None:
        now = self.clock.now()
        if now - self._last_describe < self.settings.describe_interval_s:
            return
        self._last_describe = now
        ids = [vm.provider_id for vm in self.world.vms.values() if vm.provider_id]
        if not ids:
            return
        statuses = await self.driver.describe(ids)
        for provider_id in ids:
            status = statuses.get(provider_id)
            vm = self.world.vms.get(self.world.by_provider_id.get(provider_id, ""))
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
                self.inbox.push(status)

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
        (`Calls.starts_settled`)."""
        started = time.perf_counter()
        self.ticks += 1
        now = self.clock.now()
        inbox = self.inbox
        events, inbox.events = inbox.events, []
        commands, inbox.commands = inbox.commands, []
        starts_done = self.actions.take_started()
        try:
            batch = self.store.new_batch()
            # What the executor returned for the last pass's starts, before any end of
            # theirs; then events, before commands: what happened before a command (a
            # job exiting 0 just before its bag is cancelled) keeps its outcome.
            if starts_done:
                self.actions.record_starts(starts_done, batch, now)
            if events:
                await self.events.handle(batch, events)
            cancels = self.commands.run(batch, commands, now) if commands else []
            cancels += self.events.take_migration_stops()
            self.commands.admit_held(batch, now)
            pool_wake_at = self.slurm_pools.release_unfit(now)
            decision = plan(self.planning.snapshot(now))
            if self._terminate_now:  # the list Events and SlurmPools append to: kept
                decision.terminations.extend(self._terminate_now)
                self._terminate_now.clear()
            starts, launches = self.planning.record_plan(decision, batch, now)
            self.deadlines.project(batch, now)
            launches += self.slurm_pools.take_launches()
            await self.store.apply(batch)
        except BaseException:
            inbox.events = events + inbox.events
            inbox.commands = commands + inbox.commands
            self.actions.started = starts_done + self.actions.started
            raise

        batch = self.store.new_batch()
        self.actions.replan = False
        signals = self.checkpoints.due_signals(now)
        if self.slurm_pools.has_decisions():
            await self.slurm_pools.carry_out()
        if starts or launches or cancels or decision.terminations or signals:
            await self.actions.execute(
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
        if self.actions.replan:
            return now
        wanted = [
            t
            for t in (
                decision.next_wake_at,
                self.checkpoints.next_due(),
                pool_wake_at,
                self.deadlines.next_due(now),
            )
            if t is not None
        ]
        if self.backoff.starts_blocked_until > now:
            wanted.append(self.backoff.starts_blocked_until)
        return min(wanted) if wanted else None

    # --- the hopper's hook (controller/hopper.py chooses what moves) -------------------

    def request_migration(self, vm_id: str, reason: str) -> list[tuple[str, int]]:
        """Move every job off `vm_id`: no new job goes there, each is asked to checkpoint
        now and, once it has, stopped and queued again (LOST, not counted) to resume on
        a VM the planner picks by the hopping policy; the VM ends when empty. Returns the
        jobs asked to move (none if the VM cannot be drained any more)."""
        vm = self.world.vms.get(vm_id)
        if vm is None or vm.state is not VmState.RUNNING or vm.terminating or vm.draining:
            return []
        now = self.clock.now()
        vm.draining = reason
        self.world.refresh_vm_sets(vm)
        moved = []
        for attempt_id in vm.attempts:
            attempt = self.world.attempts.get(attempt_id)
            if attempt is None or attempt.state is not AttemptState.RUNNING:
                continue
            attempt.migrating = reason
            moved.append((attempt.bag_id, attempt.idx))
            if attempt.signalled_at is None:  # else the checkpoint under way will do
                self.checkpoints.signal_now(attempt, now)
        self.inbox.wake.set()
        return moved

    # --- observability ---------------------------------------------------------------------

    def gauges(self) -> dict[str, dict[str, int]]:
        """Current counts for /metrics: open jobs by state and live VMs by state."""
        running_jobs = sum(1 for a in self.world.attempts.values() if not a.cancelling)
        pending = len(self.world.pending)
        return {
            "jobs": {
                "queued": sum(len(b.queue) for b in self.world.bags.values()),
                "running": running_jobs,
            },
            "vms": {
                "pending": pending,
                "running": len(self.world.vms) - pending,
                "idle": len(self.world.idle),
            },
        }
