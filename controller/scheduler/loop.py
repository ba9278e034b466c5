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
   records the results.

Checkpointable jobs are signalled on the schedule of SPEC.md §4: whenever one
starts, completes a checkpoint, or reaches a planned review, the next checkpoint
is looked up from its VM's age and its remaining work (the bag's runtime estimate
less the work saved), in the VM's preemption model (policies.checkpoint). A
preemption loses the work since the last checkpoint; the retry resumes from it on
a fresh VM, where the schedule starts again from age 0.

The daemon runs `run()`, which ticks when woken by an event or a submission
and at least every `poll_interval_s`; the simulator calls `tick()` itself
while it moves a virtual clock. `recover()` rebuilds memory from the store
after a restart: attempts the executor cannot re-adopt are marked LOST (not
counted against max_attempts) and their jobs queued again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import heapq
import itertools
import json
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from controller.bagspec import BagSpec, render_command
from controller.checkpoint_tables import TableCache
from controller.config import CheckpointConfig, LedgerConfig, SchedulerConfig
from controller.executors.base import (
    AttemptEvent,
    AttemptSpec,
    AttemptStarted,
    CallbackNoted,
    CheckpointEvent,
    Executor,
    ExecutorError,
    ExecutorEvent,
    ExecutorUnavailable,
    LiveAttempt,
    NodeEvent,
    Outcome,
)
from controller.ledger import Accounts, UnknownAccount
from controller.metrics import Metrics
from controller.model_book import ModelBook
from controller.models import AttemptState, BagState, JobState, check_transition
from controller.planner import (
    CatalogType,
    DemandGroup,
    Plan,
    Snapshot,
    Terminate,
    VmView,
    plan,
    pool_vm_type,
    preferred_launch,
)
from controller.runtime import (
    AttemptRun,
    BagRun,
    JobRun,
    VmBilling,
    VmRun,
    capacity_of,
    shape_of,
)
from controller.slurm.pools import RUN_STATES, PoolBook, run_key
from controller.store import Store, StoreUnavailable, WriteBatch
from drivers.base import (
    Driver,
    DriverError,
    LaunchRequest,
    PermanentError,
    VmState,
    VmStatus,
    VmType,
)
from policies.checkpoint import next_checkpoint_h, planned_work_left
from policies.index import TypeMarket
from policies.ledger_rules import InsufficientCredit
from policies.packing import Shape

log = logging.getLogger("spotbag.scheduler")

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float: ...


class IdSource(Protocol):
    def new_vm_token(self) -> str: ...


@dataclass(frozen=True)
class _Admit:
    bag_id: str
    spec: BagSpec
    params_json: Sequence[str]
    held_from: int  # jobs from this index on are held for credit


@dataclass(frozen=True)
class _Cancel:
    bag_id: str


@dataclass(frozen=True)
class PoolPower:
    """Slurm's power saving about a pool node: resume, suspend or resume_fail."""

    kind: str
    node: str


@dataclass(frozen=True)
class PoolRunEvent:
    """A run of a Slurm user's job on a pool began (the prolog) or ended (jobcomp)."""

    kind: str  # "start" or "end"
    job_id: str
    job_name: str
    partition: str
    node: str
    user: str = ""
    account: str = ""
    restart: int = 0
    cpus: float | None = None
    limit_h: float | None = None  # its time limit (None: unlimited or unknown)
    state: str = ""
    exit_code: int | None = None
    started_at: float | None = None  # Slurm's START and END (jobcomp)
    ended_at: float | None = None
    # Resolved, once the pass that took it is done (a refused job cancelled), with
    # "reserved", "refused: <why>" or "repeat": the prolog hook waits for it.
    verdict: asyncio.Future | None = field(default=None, compare=False)


@dataclass(frozen=True)
class MigrationCandidate:
    """A running VM whose jobs could all move (controller/hopper.py decides)."""

    vm_id: str
    vm_type: str
    bag_id: str  # every job on it is of this bag
    cpus: float  # used by its jobs together
    memory_gb: float
    remaining_h: float  # model hours of work left, the shortest of its jobs
    jobs: list[tuple[str, int]]


def _queue_room(vm: VmRun, queue_ahead: float) -> Shape:
    """Room left on a VM for attempts that wait in the executor's queue: `queue_ahead`
    of its capacity, less what is placed beyond its capacity already."""
    cap, free = vm.capacity, vm.free
    return Shape(
        int(cap.cpus * queue_ahead) - max(0, -free.cpus),
        int(cap.gpus * queue_ahead) - max(0, -free.gpus),
        cap.memory_gb * queue_ahead - max(0.0, -free.memory_gb),
    )


CANCEL_CHUNK = 2_000  # waiting jobs cancelled per pass (about 50 ms of work)


class Scheduler:
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
    ) -> None:
        self.store = store
        self.book = book  # preemption models; None: no reuse policy, no hot spares
        self.time_scale = time_scale  # model seconds per real second (local driver)
        self.driver = driver
        self.executor = executor
        self.clock = clock
        self.ids = ids
        self.settings = settings
        self.controller_id = controller_id
        self.metrics = metrics
        self.catalog = {t.name: t for t in catalog}
        self._catalog_view = [
            CatalogType(t.name, t.zone, capacity_of(t), t.spot_price_per_hour) for t in catalog
        ]
        self.bags: dict[str, BagRun] = {}
        self.jobs: dict[tuple[str, int], JobRun] = {}
        self.attempts: dict[str, AttemptRun] = {}
        self.vms: dict[str, VmRun] = {}  # live VMs only (pending, running, terminating)
        self._pending: dict[str, None] = {}  # VMs not yet running
        self._roomy: dict[str, None] = {}  # running VMs with some free capacity
        self._idle: dict[str, None] = {}  # running VMs with no attempt
        self._draining: dict[str, None] = {}  # running VMs whose jobs the hopper moves away
        self._migration_stops: list[str] = []  # attempts checkpointed for a move: stop them
        self.market: TypeMarket | None = None  # live prices and policy (controller/hopper.py)
        self._by_provider_id: dict[str, str] = {}
        self._backoff: dict[str, tuple[float, float]] = {}  # type -> (blocked until, last delay)
        self._inbox: list[VmStatus | ExecutorEvent] = []
        self._commands: list[_Admit | _Cancel] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._last_describe = 0.0
        self._replan = False  # an action failed: plan again at once, not at the next event
        self._call_slots = asyncio.Semaphore(settings.max_concurrent_calls)
        # The executor could not take attempts (Slurm down): no new ones until then.
        self._starts_blocked_until = 0.0
        self._starts_backoff_s = 0.0
        self._terminate_now: list[Terminate] = []  # VMs whose node broke (or Slurm let go)
        # Power-saving pools (controller/slurm/pools.py): Slurm users' jobs on spot VMs.
        self.pools = PoolBook((), ())
        self._pool_vms: dict[str, None] = {}  # ids of the VMs serving pool nodes
        self._pool_runs: dict[tuple[str, str], dict[str, Any]] = {}  # (job id, name) -> run
        self._pool_launches: list[VmRun] = []
        self._refusals: list[tuple[str, str]] = []  # (Slurm job id, why) to cancel
        self._pool_refused: dict[tuple[str, str], str] = {}  # (job id, name) -> why
        self._pool_released: dict[str, str] = {}  # VM id -> why spotbag let it go
        self.problem: str | None = None  # why passes fail now (None: they do not)
        self._pool_releases: list[tuple[str, str]] = []  # (node, why) to power down
        self._verdicts: list[tuple[asyncio.Future, str]] = []  # told after this pass
        self._background: set[asyncio.Task] = set()
        self.checkpointing = checkpointing or CheckpointConfig()
        self.tables = tables or TableCache(
            None,
            step_h=self.checkpointing.step_s / 3600.0,
            restart_h=book.launch_h if book else 0.0,
            max_work_h=self.checkpointing.max_work_h,
            inline=True,
        )
        self.tables.on_ready = self._tables_ready
        self._due: list[tuple[float, str, bool]] = []  # (when, attempt id, signal or review)
        self._replan_checkpoints = False
        self.accounts = Accounts(ledger or LedgerConfig())  # CPU-hour balances (SPEC.md §6)
        self.ticks = 0
        driver.subscribe(self._on_vm_status)
        executor.subscribe(self._on_attempt_event)

    # --- inputs ------------------------------------------------------------------

    def _on_vm_status(self, status: VmStatus) -> None:
        self._inbox.append(status)
        self._wake.set()

    def _on_attempt_event(self, event: ExecutorEvent) -> None:
        self._inbox.append(event)
        # A callback that changed nothing is written with the next pass (within
        # poll_interval_s); it needs no pass of its own.
        if not isinstance(event, CallbackNoted):
            self._wake.set()

    def note(self, event: ExecutorEvent) -> None:
        """An event from outside the executor's own watch (a callback it did not take)."""
        self._on_attempt_event(event)

    def _tables_ready(self) -> None:
        """A checkpoint table finished solving: plan the running jobs with it."""
        self._replan_checkpoints = True
        self._wake.set()

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
        self._wake.set()

    def credited(self) -> None:
        """An account got CPU-hours: held jobs may run (the next pass admits them)."""
        self._wake.set()

    def cancel_requested(self, bag_id: str) -> None:
        self._commands.append(_Cancel(bag_id))
        self._wake.set()

    def has_inputs(self) -> bool:
        """True when events or commands wait for the next pass."""
        return bool(self._inbox or self._commands)

    def held_jobs(self) -> int:
        """Jobs waiting, held, for their accounts to have CPU-hours."""
        return sum(len(bag.held) for bag in self.bags.values())

    def has_work(self) -> bool:
        """True while anything is open: bags, VMs, or unprocessed inputs."""
        return bool(self.bags or self.vms or self._inbox or self._commands)

    # --- recovery -------------------------------------------------------------------

    async def recover(self) -> None:
        """Rebuild memory from the store (after a start, or after a failed pass) and
        reconcile it with what the driver and executor still have."""
        self._forget_everything()
        now = self.clock.now()
        self.accounts.load(await self.store.ledger_state())
        state = await self.store.load_active()
        batch = self.store.new_batch()
        for row in state["bags"]:
            spec = BagSpec.model_validate_json(row["spec"])
            counts = row["counts"]
            self.bags[row["id"]] = BagRun(
                id=row["id"],
                spec=spec,
                shape=shape_of(spec),
                queue=deque(),
                fresh={},
                open_jobs=sum(counts.get(s, 0) for s in ("queued", "held", "running")),
                failed_jobs=counts.get("failed", 0),
                cancelled_jobs=counts.get("cancelled", 0),
                cancel_requested=row["cancel_requested_at"] is not None,
            )
            bag = self.bags[row["id"]]
            bag.runtimes_s.extend(row["runtimes_s"])
            bag.successes = len(row["runtimes_s"])
            bag.refresh_estimate()
        for row in state["jobs"]:
            bag = self.bags[row["bag_id"]]
            if row["state"] in (JobState.QUEUED, JobState.HELD) and row["attempts"] == 0:
                bag.fresh[row["idx"]] = row["params"]
                if row["state"] == JobState.QUEUED:
                    bag.queue.append(row["idx"])
                else:
                    bag.held[row["idx"]] = None
                    self.accounts.hold(bag.spec.account, bag.id, row["idx"])
                continue
            job = JobRun(
                bag_id=row["bag_id"],
                idx=row["idx"],
                params=json.loads(row["params"]),
                state=JobState(row["state"]),
                attempts=row["attempts"],
                counted=row["counted_attempts"],
                vm_id=row["vm_id"],
                started_at=row["started_at"],
                work_saved_s=row["work_saved_s"],
                checkpoints=row["checkpoints"],
            )
            self.jobs[(job.bag_id, job.idx)] = job
            if job.state is JobState.QUEUED:
                bag.queue.append(job.idx)
            elif job.state is JobState.HELD:
                bag.held[job.idx] = None
                self.accounts.hold(bag.spec.account, bag.id, job.idx)

        self._pool_runs = {(r["job_id"], r["job_name"]): r for r in state["slurm_runs"]}
        owned = {s.token: s for s in await self.driver.list_owned()}
        missing: list[VmRun] = []
        for row in state["vms"]:
            vm_type = self._vm_type_of_row(row)
            vm = VmRun(
                id=row["id"],
                vm_type=vm_type,
                state=VmState(row["state"]),
                requested_at=row["requested_at"],
                spot=bool(row["spot"]),
                zone=row["zone"],
                provider_id=row["provider_id"],
                running_at=row["running_at"],
                reason=row["reason"],
                free=capacity_of(vm_type),
                # A VM joins the executor's cluster anew in its eyes: it says so again. A
                # pool VM is Slurm's to watch.
                ready=not self.executor.joins_vms or bool(row["pool_node"]),
                ready_at=row["ready_at"],
                pool_node=row["pool_node"],
            )
            status = owned.pop(vm.id, None)
            if status is not None and status.vm_id:
                vm.provider_id = status.vm_id
            self._assume_model(vm)
            self._track_vm(vm)
            if status is None:
                missing.append(vm)
            elif status.state is not vm.state:
                self._push(status)
        for status in owned.values():
            log.warning(
                "terminating VM %s (token %s): owned by this controller but not in the store",
                status.vm_id,
                status.token,
            )
            await self._call(self.driver.terminate([status.vm_id]))

        # Every live attempt first (a bag with live attempts is not done), then the
        # ones the executor does not run any more are lost.
        attempts = []
        ended_vm_types = {row["id"]: self._vm_type_of_row(row) for row in state["ended_vms"]}
        for row in state["attempts"]:
            bag = self.bags[row["bag_id"]]  # a live attempt keeps its bag active
            vm = self.vms.get(row["vm_id"])
            vm_type = vm.vm_type if vm is not None else ended_vm_types.get(row["vm_id"])
            attempt = AttemptRun(
                bag_id=row["bag_id"],
                idx=row["idx"],
                number=row["number"],
                vm_id=row["vm_id"],
                state=AttemptState(row["state"]),
                started_at=row["started_at"],
                log_path=row["log_path"],
                shape=bag.shape,
                ref=row["ref"],
                billing=VmBilling.of(bag.shape, vm_type) if vm_type is not None else None,
                mark_at=row["checkpointed_at"] or row["started_at"],
            )
            job = self.jobs.get((attempt.bag_id, attempt.idx))
            attempt.saved_s = job.work_saved_s if job is not None else 0.0
            self.attempts[attempt.id] = attempt
            bag.live_attempts += 1
            attempts.append(attempt)
        live = [vm.id for vm in self.vms.values() if vm.id not in {m.id for m in missing}]
        adopted = await self.executor.recover(
            [
                LiveAttempt(
                    a.id, a.vm_id, a.started_at, self.bags[a.bag_id].spec.max_runtime_s, a.ref
                )
                for a in attempts
            ],
            live,
        )
        # An attempt whose end is waiting in the inbox is not lost, even when its VM is
        # gone: its event (e.g. it finished while the controller was down) says how it ended.
        ended = {e.attempt_id for e in self._inbox if isinstance(e, AttemptEvent)}
        missing_ids = {vm.id for vm in missing}
        for attempt in attempts:
            vm = self.vms.get(attempt.vm_id)
            alive = vm is not None and vm.id not in missing_ids
            if attempt.id in adopted and alive:
                vm.attempts[attempt.id] = None
                vm.free = vm.free.minus(attempt.shape)
                if attempt.state is AttemptState.RUNNING:
                    self._plan_checkpoint(attempt, now)
                continue
            if attempt.id in ended:
                continue
            self._finish_attempt(
                attempt,
                AttemptState.LOST,
                now,
                None,
                "the controller restarted while it ran",
                batch,
            )
        for vm in missing:
            self._end_vm(vm, VmState.TERMINATED, now, "not found after controller restart", batch)
        for vm in self.vms.values():
            if vm.state is VmState.RUNNING and not vm.attempts:
                vm.idle_since = now
            self._refresh_vm_sets(vm)
            if vm.state is VmState.RUNNING and not vm.ready:
                await self._call(self.executor.vm_started(vm.id, vm.vm_type))
        for bag in list(self.bags.values()):
            if bag.done:
                self._finish_bag(bag, now, batch)
            elif bag.cancel_requested:
                self._commands.append(_Cancel(bag.id))
        await self.store.apply(batch)
        log.info(
            "recovered %d active bags, %d open jobs, %d live VMs, %d adopted attempts",
            len(self.bags),
            sum(b.open_jobs for b in self.bags.values()),
            len(self.vms),
            len(adopted),
        )

    def _vm_type_of_row(self, row: dict[str, Any]) -> VmType:
        """A stored VM's type: the catalog's, or as the row recorded it (a type since
        removed from the configuration)."""
        return self.catalog.get(row["vm_type"]) or VmType(
            row["vm_type"],
            row["cpus"],
            row["memory_gb"],
            row["gpus"],
            row["spot_price_per_hour"],
            row["on_demand_price_per_hour"],
            row["zone"],
        )

    def _forget_everything(self) -> None:
        self.bags.clear()
        self.jobs.clear()
        self.attempts.clear()
        self.vms.clear()
        for index in (
            self._pending,
            self._roomy,
            self._idle,
            self._draining,
            self._by_provider_id,
            self._pool_vms,
        ):
            index.clear()
        self._pool_runs.clear()
        self._pool_released.clear()
        self._due.clear()

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
                next_at = await self.tick()
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
        if vms_die_with_controller:
            for vm in list(self.vms.values()):  # a cluster forgets their nodes
                await self._call(self.executor.vm_lost(vm.id, vm.pool_node))
        await self.executor.shutdown()
        now = self.clock.now()
        batch = self.store.new_batch()
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
            if status.state is not vm.state:
                self._push(status)

    def _push(self, item: VmStatus | AttemptEvent | CheckpointEvent) -> None:
        self._inbox.append(item)
        self._wake.set()

    async def tick(self) -> float | None:
        """One scheduling pass; returns when the scheduler next wants to run (or None).

        If the pass fails, its inputs are put back (see `run`)."""
        started = time.perf_counter()
        self.ticks += 1
        now = self.clock.now()
        events, self._inbox = self._inbox, []
        commands, self._commands = self._commands, []
        try:
            batch = self.store.new_batch()
            # Events first: what happened before a command (a job exiting 0 just
            # before its bag is cancelled) keeps its outcome.
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
            raise

        batch = self.store.new_batch()
        self._replan = False
        signals = self._due_checkpoints(now)
        await self._execute(starts, launches, cancels, decision.terminations, batch, signals)
        await self.store.apply(batch)
        if self.metrics is not None:
            self.metrics.tick_seconds.observe(time.perf_counter() - started)
        if self._replan:
            return now
        wanted = [
            t for t in (decision.next_wake_at, self._next_due(), pool_wake_at) if t is not None
        ]
        if self._starts_blocked_until > now:
            wanted.append(self._starts_blocked_until)
        return min(wanted) if wanted else None

    # --- commands and events ------------------------------------------------------

    def _run_commands(self, batch: WriteBatch, commands: list[Any], now: float) -> list[str]:
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
            queue=deque(range(command.held_from)),
            fresh=dict(enumerate(command.params_json)),
            open_jobs=len(command.params_json),
            failed_jobs=0,
        )
        self.bags[bag.id] = bag
        for idx in range(command.held_from, len(command.params_json)):
            bag.held[idx] = None
            self.accounts.hold(bag.spec.account, bag.id, idx)

    def _admit_held(self, batch: WriteBatch, now: float) -> None:
        """Jobs held for credit run, oldest first per account, as far as their accounts
        can now reserve for them."""
        for queue in self.accounts.held.values():
            while queue:
                bag_id, idx = queue[0]
                bag = self.bags.get(bag_id)
                if bag is None or idx not in bag.held:
                    queue.popleft()  # cancelled, or its bag is gone
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

    def _held_job(self, bag: BagRun, idx: int) -> JobRun:
        """A held job that never started (made on first use, like `_queued_job`)."""
        job = self.jobs.get((bag.id, idx))
        if job is None:
            job = JobRun(bag.id, idx, json.loads(bag.fresh.pop(idx)), JobState.HELD)
            self.jobs[(bag.id, idx)] = job
        return job

    def _requeue(self, job: JobRun, bag: BagRun, at: float, batch: WriteBatch, reason: str) -> None:
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
                self._job_to(job, JobState.HELD, at, batch, why)
                bag.held[job.idx] = None
                self.accounts.hold(bag.spec.account, bag.id, job.idx, first=True)
                return
            batch.ledger_entries(at, entries, "retry")
        self._job_to(job, JobState.QUEUED, at, batch, reason)

    def _queued_job(self, bag: BagRun, idx: int) -> JobRun:
        """The job at `idx` of a bag's queue (made on first use: a 100,000-job bag
        costs no 100,000 objects until its jobs start)."""
        job = self.jobs.get((bag.id, idx))
        if job is None:
            job = JobRun(bag.id, idx, json.loads(bag.fresh.pop(idx)), JobState.QUEUED)
            self.jobs[(bag.id, idx)] = job
        return job

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
            self._job_to(
                self._queued_job(bag, idx), JobState.CANCELLED, now, batch, "cancelled by user"
            )
            budget -= 1
        for idx in list(itertools.islice(bag.held, budget)):
            del bag.held[idx]
            self._job_to(
                self._held_job(bag, idx), JobState.CANCELLED, now, batch, "cancelled by user"
            )
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

    async def _handle_events(
        self,
        batch: WriteBatch,
        events: list[VmStatus | ExecutorEvent] | None = None,
    ) -> None:
        """Handle events oldest first (by default, every event waiting in the inbox).
        A callback's key is recorded with the changes its event causes (or alone)."""
        if events is None:
            events, self._inbox = self._inbox, []
        events.sort(key=lambda e: e.changed_at if isinstance(e, VmStatus) else e.at)
        for event in events:
            if isinstance(event, VmStatus):
                await self._on_status(event, batch)
            elif isinstance(event, CheckpointEvent):
                self._on_checkpoint(event, batch)
            elif isinstance(event, AttemptEvent):
                self._on_attempt_end(event, batch)
                if event.key:
                    batch.callback(event.key, event.at, f"end:{event.outcome}", event.attempt_id)
            elif isinstance(event, AttemptStarted):
                self._on_attempt_started(event, batch)
                if event.key:
                    batch.callback(event.key, event.at, "started", event.attempt_id)
            elif isinstance(event, NodeEvent):
                self._on_node(event, batch)
            elif isinstance(event, CallbackNoted):
                batch.callback(event.key, event.at, event.kind, event.subject)

    async def _on_status(self, status: VmStatus, batch: WriteBatch) -> None:
        vm = self.vms.get(status.token)
        if vm is None:
            if status.state in (VmState.PENDING, VmState.RUNNING):
                # Ours (the driver reports only our VMs) but given up on, e.g. after a
                # launch that failed ambiguously: do not leave it running unwatched.
                log.warning("terminating VM %s: alive but not tracked", status.vm_id)
                await self._call(self.driver.terminate([status.vm_id]))
            return
        if status.state is vm.state:
            return
        at = status.changed_at
        if status.vm_id and not vm.provider_id:
            self._set_provider_id(vm, status.vm_id)
        if status.state is VmState.RUNNING and vm.state is VmState.PENDING:
            self._vm_to(vm, VmState.RUNNING, at, "", batch)
            vm.running_at = at
            if self.executor.joins_vms and not vm.pool_node:
                vm.ready = False  # it takes attempts once it has joined (a NodeEvent)
                await self._call(self.executor.vm_started(vm.id, vm.vm_type))
            else:
                vm.ready_at = at
                vm.idle_since = at
            self._refresh_vm_sets(vm)
            batch.vm(vm.row(self.driver.name, self.time_scale))
            return
        if status.state in (VmState.PREEMPTED, VmState.TERMINATED, VmState.FAILED):
            # Whatever ran there is dead; an executor with a cluster forgets the node (a
            # pool node is powered down by force: Slurm requeues its users' jobs), unless
            # Slurm itself let go of it (a pool node it suspended or gave up on).
            if not (vm.pool_node and vm.terminating):
                await self._call(self.executor.vm_lost(vm.id, vm.pool_node))
            # When we terminated it, our reason ("idle for 60 s") says more than the driver's.
            ours = vm.terminating and status.state is VmState.TERMINATED and vm.reason
            self._end_vm(vm, status.state, at, vm.reason if ours else status.reason, batch)

    def _on_node(self, event: NodeEvent, batch: WriteBatch) -> None:
        """The VM joined the executor's cluster (it takes attempts from now on), or its
        node broke under it (it is terminated: its attempts end with it)."""
        vm = self.vms.get(event.vm_id)
        if vm is None or vm.state is not VmState.RUNNING or vm.terminating:
            return
        if event.ready and not vm.ready:
            vm.ready = True
            vm.ready_at = vm.ready_at or event.at
            if not vm.attempts:
                vm.idle_since = event.at
            self._refresh_vm_sets(vm)
            batch.vm(vm.row(self.driver.name, self.time_scale))
            log.info("VM %s joined: %s", vm.id, event.detail or "ready")
        elif not event.ready and vm.ready:
            vm.ready = False
            vm.terminating = True
            vm.reason = f"its node broke: {event.detail}"
            self._refresh_vm_sets(vm)
            self._terminate_now.append(Terminate(vm.id, vm.reason))
            log.warning("terminating VM %s: %s", vm.id, vm.reason)

    def _on_attempt_started(self, event: AttemptStarted, batch: WriteBatch) -> None:
        """A queued attempt began to run: it is RUNNING from then (its time, and its
        checkpoint schedule, count from there)."""
        attempt = self.attempts.get(event.attempt_id)
        if attempt is None or attempt.state is not AttemptState.STARTING:
            return
        check_transition("attempt", attempt.state, AttemptState.RUNNING)
        attempt.state = AttemptState.RUNNING
        attempt.started_at = max(attempt.started_at, event.at)
        attempt.mark_at = attempt.started_at
        self._write_attempt(attempt, batch)
        if not attempt.cancelling:
            self._plan_checkpoint(attempt, event.at)

    def _on_checkpoint(self, event: CheckpointEvent, batch: WriteBatch) -> None:
        """A checkpoint we asked for ended. Written: the job's saved work moves on to
        what it had done when signalled, and work from now on is at risk only back to
        here. Either way the next one is planned."""
        attempt = self.attempts.get(event.attempt_id)
        if attempt is None or attempt.signalled_at is None:
            return  # the attempt ended first: its retry resumes from the last one written
        attempt.signalled_at = None
        job = self.jobs.get((attempt.bag_id, attempt.idx))
        vm = self.vms.get(attempt.vm_id)
        age_h = (
            max(0.0, event.requested_at - vm.requested_at) * self.time_scale / 3600.0
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
            self._plan_checkpoint(attempt, event.at)

    def _on_attempt_end(self, event: AttemptEvent, batch: WriteBatch) -> None:
        attempt = self.attempts.get(event.attempt_id)
        if attempt is None:
            return  # already finished (its VM died first, or a duplicate report)
        job = self.jobs.get((attempt.bag_id, attempt.idx))
        bag = self.bags[attempt.bag_id]
        at = event.at
        if attempt.cancelling or job is None or job.state is not JobState.RUNNING:
            self._finish_attempt(
                attempt, AttemptState.CANCELLED, at, event.exit_code, "cancelled", batch
            )
            return
        code = event.exit_code
        if event.outcome is Outcome.KILLED and attempt.migrating:
            reason = f"migrated: {attempt.migrating}"
            self._finish_attempt(attempt, AttemptState.LOST, at, code, reason, batch)
            return
        if event.outcome is Outcome.NOT_STARTED:
            reason = "not started" + (f": {event.detail}" if event.detail else "")
            self._finish_attempt(attempt, AttemptState.LOST, at, None, reason, batch)
            return
        if event.outcome is Outcome.KILLED:
            # Stopped by the controller, not by a user or the job itself.
            reason = "stopped by the controller" + (f" ({event.detail})" if event.detail else "")
            self._finish_attempt(attempt, AttemptState.LOST, at, code, reason, batch)
            return
        if event.outcome is Outcome.EXITED and code == 0:
            self._finish_attempt(attempt, AttemptState.SUCCEEDED, at, 0, event.detail, batch)
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
        self._finish_attempt(attempt, AttemptState.FAILED, at, code, reason, batch, retry=retry)

    # --- power-saving pools: Slurm users' jobs on spot VMs (controller/slurm/pools.py) ----

    def pool_power(self, kind: str, nodes: Sequence[str]) -> int:
        """Slurm resumes, suspends or gave up on pool nodes; returns how many are ours."""
        ours = [n for n in nodes if n in self.pools.by_node]
        for node in ours:
            self._commands.append(PoolPower(kind, node))
        if ours:
            self._wake.set()
        return len(ours)

    def pool_run(self, event: PoolRunEvent) -> asyncio.Future | None:
        """A run of a Slurm user's job on a pool began or ended: a future of what was
        decided (see PoolRunEvent.verdict); None if it is not on a pool."""
        if event.partition not in self.pools.by_partition:
            return None
        verdict = asyncio.get_running_loop().create_future()
        self._commands.append(dataclasses.replace(event, verdict=verdict))
        self._wake.set()
        return verdict

    def _pool_vm(self, node: str) -> VmRun | None:
        for vm_id in self._pool_vms:
            vm = self.vms[vm_id]
            if vm.pool_node == node and not vm.terminating:
                return vm
        return None

    def _pool_power(self, command: PoolPower, batch: WriteBatch, now: float) -> None:
        vm = self._pool_vm(command.node)
        if command.kind == "resume":
            if vm is not None:
                return  # it is on its way already (a repeated resume)
            pool = self.pools.by_node[command.node]
            name = pool_vm_type(
                self.market,
                Shape(pool.cpus, pool.gpus, pool.memory_gb),
                self._catalog_view,
                pool.vm_types,
            )
            if name is None:
                log.warning(
                    "no VM type of pool %s can be launched for %s", pool.partition, command.node
                )
                return
            vm_type = self.catalog[name]
            vm = VmRun(
                id=self.ids.new_vm_token(),
                vm_type=vm_type,
                state=VmState.PENDING,
                requested_at=now,
                zone=vm_type.zone,
                free=capacity_of(vm_type),
                pool_node=command.node,
            )
            self._assume_model(vm)
            self._track_vm(vm)
            batch.vm(vm.row(self.driver.name, self.time_scale))
            batch.transition(
                now, "vm", vm.id, "", VmState.PENDING, f"for Slurm node {command.node}"
            )
            self._pool_launches.append(vm)
            return
        if vm is None:
            return
        why = (
            f"Slurm powered node {command.node} down"
            if command.kind == "suspend"
            else f"Slurm gave up on node {command.node} (it did not join in ResumeTimeout)"
        )
        if command.kind == "suspend" and vm.id in self._pool_released:
            why += f" at spotbag's request: {self._pool_released.pop(vm.id)}"
        vm.terminating = True
        vm.reason = why
        self._terminate_now.append(Terminate(vm.id, why))

    def _release_unfit_pool_vms(self, now: float) -> float | None:
        """Idle pool VMs on which the reuse policy would not start a job of the pool's
        typical length are handed back to Slurm (powered down when idle), so that the
        next job gets a fresh VM. Returns when the next idle one turns unfit."""
        if not self._pool_vms:
            return None
        to_h = self.time_scale / 3600.0  # real seconds -> model hours
        busy = {run["node"] for run in self._pool_runs.values()}
        wake_at: float | None = None
        for vm_id in self._pool_vms:
            vm = self.vms[vm_id]
            if (
                vm.state is not VmState.RUNNING
                or vm.terminating
                or vm.table is None
                or vm.id in self._pool_released
                or vm.pool_node in busy
            ):
                continue
            job_h = self.pools.by_node[vm.pool_node].job_hours
            age_h = max(0.0, now - vm.requested_at) * to_h
            unfit_h = vm.table.unfit_from_h(age_h, job_h)
            if unfit_h is None or vm.table.unfit_from_h(0.0, job_h) == 0.0:
                continue  # never unfit, or no better when fresh: keep it
            if unfit_h > age_h:
                at = vm.requested_at + unfit_h / to_h
                wake_at = at if wake_at is None else min(wake_at, at)
                continue
            why = (
                f"at {age_h:.1f} h its preemption model says a fresh VM does a "
                f"{job_h:g} h job sooner"
            )
            log.info("releasing idle pool node %s (VM %s): %s", vm.pool_node, vm.id, why)
            self._pool_released[vm.id] = why
            self._pool_releases.append((vm.pool_node, why))
        return wake_at

    def _pool_run(self, event: PoolRunEvent, batch: WriteBatch, now: float) -> None:
        """Reserve for a run at its start (cancelling a job its account cannot pay for),
        charge what it used at its end and release the rest."""
        pool = self.pools.by_partition[event.partition]
        ident = (event.job_id, event.job_name)
        run = self._pool_runs.get(ident)
        account = event.account or event.user or "slurm"
        if event.kind == "start":
            if run is not None and run["restart"] >= event.restart:
                self._tell(event, "repeat")  # or out of order
                return
            cpus = event.cpus or pool.cpus
            reserved = cpus * (event.limit_h or pool.reserve_hours)
            key = run_key(event.job_id, event.restart, event.job_name)
            try:
                opened, entries = self.accounts.reserve_run(account, key, reserved, now)
            except (UnknownAccount, InsufficientCredit) as exc:
                self._refusals.append((event.job_id, str(exc)))
                self._pool_refused[ident] = str(exc)
                self._tell(event, f"refused: {exc}")
                log.warning("cancelling Slurm job %s on %s: %s", event.job_id, event.node, exc)
                return
            self._tell(event, "reserved")
            if opened is not None:
                batch.account(opened)
            batch.ledger_entries(now, entries, f"Slurm job {event.job_id} started")
            vm = self._pool_vm(event.node)
            run = {
                "key": key,
                "job_id": event.job_id,
                "job_name": event.job_name,
                "restart": event.restart,
                "user": event.user,
                "account": account,
                "partition": event.partition,
                "node": event.node,
                "vm_id": vm.id if vm is not None else "",
                "cpus": cpus,
                "reserved_cpu_h": reserved,
                "started_at": now,
                "ended_at": None,
                "state": "running",
                "exit_code": None,
                "reason": "",
            }
            self._pool_runs[ident] = run
            batch.slurm_run(run)
            return
        started = event.started_at if event.started_at is not None else now
        ended = max(started, event.ended_at if event.ended_at is not None else now)
        state = RUN_STATES.get(event.state, "failed")
        refused = self._pool_refused.pop(ident, None)
        if run is None and refused is not None:  # cancelled before it ran: nothing to pay
            return
        if run is None:  # its start was never reported: charge what it used, at once
            cpus = event.cpus or pool.cpus
            key = run_key(event.job_id, -int(ended), event.job_name)
            opened, entries = self.accounts.charge_unreserved(
                account, key, cpus, ended - started, now
            )
            if opened is not None:
                batch.account(opened)
            vm = self._pool_vm(event.node)
            run = {
                "key": key,
                "job_id": event.job_id,
                "job_name": event.job_name,
                "restart": -1,
                "user": event.user,
                "account": account,
                "partition": event.partition,
                "node": event.node,
                "vm_id": vm.id if vm is not None else "",
                "cpus": cpus,
                "reserved_cpu_h": 0.0,
                "reason": "its start was not reported",
            }
        else:
            del self._pool_runs[ident]
            cpus = event.cpus or run["cpus"]
            if not run["vm_id"]:  # allocated before Slurm resumed its node
                vm = self._pool_vm(event.node)
                run = run | {"vm_id": vm.id if vm is not None else ""}
            entries = self.accounts.settle_run(
                run["key"], cpus, ended - started, preempted=state == "preempted"
            )
        batch.ledger_entries(now, entries, f"Slurm job {event.job_id} {event.state.lower()}")
        batch.slurm_run(
            run
            | {
                "cpus": cpus,
                "started_at": started,
                "ended_at": ended,
                "state": state,
                "exit_code": event.exit_code,
            }
        )

    def _tell(self, event: PoolRunEvent, verdict: str) -> None:
        if event.verdict is not None:
            self._verdicts.append((event.verdict, verdict))

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(self._call(coroutine))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- migration (the hopper) ------------------------------------------------------

    def migration_candidates(self, now: float) -> list[MigrationCandidate]:
        """Running VMs whose every job can move (checkpointable, running, not already
        moving), with what the jobs use and how long they still run (model hours)."""
        to_h = self.time_scale / 3600.0
        found = []
        for vm in self.vms.values():
            if vm.state is not VmState.RUNNING or vm.terminating or vm.draining or not vm.attempts:
                continue
            attempts = [self.attempts[a] for a in vm.attempts if a in self.attempts]
            bag_ids = {a.bag_id for a in attempts}
            if len(bag_ids) != 1:
                continue  # jobs of several bags: where they would go is not one choice
            bag = self.bags.get(next(iter(bag_ids)))
            if (
                bag is None
                or not bag.spec.checkpointable
                or any(a.state is not AttemptState.RUNNING or a.cancelling for a in attempts)
            ):
                continue
            left_h = [
                max(bag.runtime_estimate_s - a.saved_s - max(0.0, now - a.mark_at), 0.0) * to_h
                for a in attempts
            ]
            found.append(
                MigrationCandidate(
                    vm_id=vm.id,
                    vm_type=vm.vm_type.name,
                    bag_id=bag.id,
                    cpus=sum(a.shape.cpus for a in attempts),
                    memory_gb=sum(a.shape.memory_gb for a in attempts),
                    remaining_h=min(left_h),
                    jobs=[(a.bag_id, a.idx) for a in attempts],
                )
            )
        return found

    def preferred_type(self, bag_id: str) -> tuple[str, int] | None:
        """The type the planner would launch now for `bag_id`'s jobs under the hopping
        policy and how many jobs one VM of it holds (None: no market, or no usable type)."""
        bag = self.bags.get(bag_id)
        if bag is None or self.market is None:
            return None
        group = DemandGroup(bag.id, bag.shape, 1, bag.allowed_types, bag.regions)
        choice = preferred_launch(self.market, group, self._catalog_view)
        return (choice[0].name, choice[1]) if choice is not None else None

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
                attempt.due_at = now
                heapq.heappush(self._due, (now, attempt.id, True))
        self._wake.set()
        return moved

    # --- state changes (the only places that change job/attempt/VM state) --------

    def _finish_attempt(
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
            self._refresh_vm_sets(vm)
        if attempt.state is AttemptState.STARTING and self.executor.queues_attempts:
            # It never left the executor's queue: it used nothing (charged nothing, and
            # takes no time on its VM in reports).
            attempt.started_at = max(attempt.started_at, at)
        attempt.state = state
        self._write_attempt(attempt, batch, at, exit_code, reason)
        self._record_usage(attempt, state, at, batch)
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
        if self.metrics is not None:
            self.metrics.attempts.labels(state=str(state)).inc()

        job = self.jobs.get((attempt.bag_id, attempt.idx))
        if job is None or job.state is not JobState.RUNNING:
            if bag.done:  # the job was cancelled meanwhile; this was the bag's last process
                self._finish_bag(bag, at, batch)
            return
        if state in AttemptState.counted():
            job.counted += 1
        job.exit_code = exit_code
        if state is AttemptState.SUCCEEDED:
            # The job's runtime: the work its checkpoints carried over from earlier
            # attempts plus this attempt's since its last checkpoint (= the attempt's
            # running time when it never checkpointed). Runtime estimates learn from it.
            work_s = attempt.saved_s + max(0.0, at - attempt.mark_at)
            self._job_to(job, JobState.SUCCEEDED, at, batch, "", runtime_s=work_s)
        elif state is AttemptState.LOST or (
            retry
            and state in (AttemptState.PREEMPTED, AttemptState.FAILED)
            and job.counted < bag.spec.max_attempts
        ):
            self._requeue(job, bag, at, batch, f"attempt {attempt.number} {state}: {reason}")
        else:
            if retry and job.counted >= bag.spec.max_attempts:
                reason = f"{reason}; gave up after max_attempts={bag.spec.max_attempts}"
            self._job_to(job, JobState.FAILED, at, batch, reason)

    def _write_attempt(
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
        )

    def _record_usage(
        self, attempt: AttemptRun, state: AttemptState, at: float, batch: WriteBatch
    ) -> None:
        """Add the ended attempt to its bag's usage: its time, and its share of its VM's
        time and cost (policies.cost.vm_share)."""
        elapsed_s = max(0.0, at - attempt.started_at)
        billing = attempt.billing
        vm_s = elapsed_s * billing.share if billing is not None else 0.0
        batch.usage(
            attempt.bag_id,
            preempted=state is AttemptState.PREEMPTED,
            attempt_s=elapsed_s,
            vm_s=vm_s,
            spot_cost_usd=vm_s * billing.spot_price_per_hour / 3600.0 if billing else 0.0,
            on_demand_cost_usd=vm_s * billing.on_demand_price_per_hour / 3600.0 if billing else 0.0,
        )

    def _job_to(
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
        ended_at = at if state in JobState.terminal() else None
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
            ended_at,
            runtime_s,
        )
        if state is JobState.SUCCEEDED and runtime_s is not None:
            bag.job_succeeded(runtime_s)
        if state is JobState.QUEUED:
            bag.queue.appendleft(job.idx)  # retries go first: the bag's tail finishes sooner
        elif state in JobState.terminal():
            del self.jobs[(job.bag_id, job.idx)]
            bag.open_jobs -= 1
            if state is JobState.FAILED:
                bag.failed_jobs += 1
            elif state is JobState.CANCELLED:
                bag.cancelled_jobs += 1
            if self.metrics is not None:
                self.metrics.jobs_finished.labels(state=str(state)).inc()
            if bag.done:
                self._finish_bag(bag, at, batch)

    def _finish_bag(self, bag: BagRun, at: float, batch: WriteBatch) -> None:
        if bag.cancel_requested or bag.cancelled_jobs:
            state = BagState.CANCELLED
        elif bag.failed_jobs:
            state = BagState.FAILED
        else:
            state = BagState.SUCCEEDED
        batch.bag_finished(bag.id, state, at)
        batch.transition(at, "bag", bag.id, BagState.ACTIVE, state, "")
        del self.bags[bag.id]
        log.info("bag %s finished: %s", bag.id, state)

    def _vm_to(self, vm: VmRun, state: VmState, at: float, reason: str, batch: WriteBatch) -> None:
        check_transition("vm", vm.state, state)
        batch.transition(at, "vm", vm.id, vm.state, state, reason)
        vm.state = state

    def _end_vm(self, vm: VmRun, state: VmState, at: float, reason: str, batch: WriteBatch) -> None:
        """A VM is gone: its attempts are preempted (retried) and it leaves memory. An
        attempt still waiting in the executor's queue never ran: it is lost (not counted)."""
        for attempt_id in list(vm.attempts):
            attempt = self.attempts[attempt_id]
            why = f"VM {vm.id} {state}" + (f": {reason}" if reason else "")
            if attempt.cancelling:
                ended = AttemptState.CANCELLED
            elif attempt.state is AttemptState.STARTING and self.executor.queues_attempts:
                ended, why = AttemptState.LOST, f"never started: {why}"
            else:
                ended = AttemptState.PREEMPTED
            self._finish_attempt(attempt, ended, at, None, why, batch)
        self._vm_to(vm, state, at, reason, batch)
        vm.reason = reason
        vm.ended_at = at
        if vm.running_at is not None:
            vm.running_at = min(vm.running_at, at)
        batch.vm(vm.row(self.driver.name, self.time_scale))
        self._untrack_vm(vm)
        if self.metrics is not None and state is VmState.PREEMPTED:
            self.metrics.preemptions.inc()

    # --- VM bookkeeping ----------------------------------------------------------------

    def _assume_model(self, vm: VmRun) -> None:
        """The preemption model the scheduler assumes for a VM (from the book, at its launch)."""
        if self.book is None:
            return
        launched = dt.datetime.fromtimestamp(vm.requested_at, dt.UTC)
        vm.belief = self.book.belief(vm.vm_type, vm.zone, launched)
        vm.table = self.book.table(vm.belief.model)

    def _track_vm(self, vm: VmRun) -> None:
        self.vms[vm.id] = vm
        if vm.provider_id:
            self._by_provider_id[vm.provider_id] = vm.id
        self._refresh_vm_sets(vm)

    def _untrack_vm(self, vm: VmRun) -> None:
        self.vms.pop(vm.id, None)
        self._by_provider_id.pop(vm.provider_id, None)
        for index in (self._pending, self._roomy, self._idle, self._draining, self._pool_vms):
            index.pop(vm.id, None)

    def _set_provider_id(self, vm: VmRun, provider_id: str) -> None:
        vm.provider_id = provider_id
        self._by_provider_id[provider_id] = vm.id

    def _refresh_vm_sets(self, vm: VmRun) -> None:
        """Keep the pending / roomy / idle indexes in step with the VM (a pool VM is in
        none of them: it is Slurm's)."""
        live = vm.id in self.vms
        if vm.pool_node:
            if live:
                self._pool_vms[vm.id] = None
            else:
                self._pool_vms.pop(vm.id, None)
            return
        # A running VM that has not joined the executor's cluster yet is capacity on its
        # way, like a booting one.
        booting = vm.state is VmState.PENDING or (vm.state is VmState.RUNNING and not vm.ready)
        pending = live and booting and not vm.terminating
        usable = live and vm.state is VmState.RUNNING and vm.ready and not vm.terminating
        draining = usable and bool(vm.draining)
        usable = usable and not draining
        for index, member in (
            (self._pending, pending),
            (self._roomy, usable and vm.free.cpus > 0 and vm.free.memory_gb > 0),
            (self._idle, usable and not vm.attempts),
            (self._draining, draining),
        ):
            if member:
                index[vm.id] = None
            else:
                index.pop(vm.id, None)

    # --- planning ------------------------------------------------------------------------

    def _snapshot(self, now: float) -> Snapshot:
        to_hours = self.time_scale / 3600.0  # real seconds -> model hours
        # While the executor cannot take attempts, nothing is placed (or launched for).
        blocked = now < self._starts_blocked_until
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
                )
                for bag in self.bags.values()
                if bag.queue and not bag.cancel_requested
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
                )
            )
        return Snapshot(
            now=now,
            demand=demand,
            vms=views,
            catalog=self._catalog_view,
            alive_vms=len(self.vms) - len(self._pool_vms),
            max_vms=self.settings.max_vms,
            idle_timeout_s=self.settings.idle_timeout_s,
            boot_timeout_s=self.settings.boot_timeout_s,
            hot_spare_s=self.book.settings.hot_spare_h * 3600.0 / self.time_scale
            if self.book
            else 0.0,
            blocked_until={t: until for t, (until, _) in self._backoff.items()},
            market=self.market,
        )

    def _record_plan(
        self, decision: Plan, batch: WriteBatch, now: float
    ) -> tuple[list[AttemptSpec], list[VmRun]]:
        for problem in decision.unplaceable:
            bag = self.bags[problem.bag_id]
            queued, bag.queue = bag.queue, deque()
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
            vm = self.vms.get(termination.vm_id)
            if vm is None:
                continue  # ended earlier in this pass
            vm.terminating = True
            vm.reason = termination.reason
            self._refresh_vm_sets(vm)
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
            billing=VmBilling.of(bag.shape, vm.vm_type),
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

    # --- acting ------------------------------------------------------------------------------

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

    async def _start(self, spec: AttemptSpec) -> tuple[AttemptSpec, str, Exception | None]:
        """Hand an attempt to the executor: (spec, its reference there, the error if any)."""
        try:
            return spec, await self.executor.start(spec), None
        except ExecutorError as exc:
            return spec, "", exc
        except Exception as exc:
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

    async def _execute(
        self,
        starts: list[AttemptSpec],
        launches: list[VmRun],
        cancels: list[str],
        terminations: list[Terminate],
        batch: WriteBatch,
        signals: Sequence[tuple[str, float]] = (),
    ) -> None:
        refusals, self._refusals = self._refusals, []
        for job_id, why in refusals:
            await self._call(self.executor.cancel_job(job_id, why))
        releases, self._pool_releases = self._pool_releases, []
        for node, why in releases:
            await self._call(self.executor.release_pool_node(node, why))
        verdicts, self._verdicts = self._verdicts, []
        for future, verdict in verdicts:  # after the refused were cancelled
            if not future.done():
                future.set_result(verdict)
        if not (starts or launches or cancels or terminations or signals):
            return
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
        unavailable = None
        for spec, ref, error in results[: len(starts)]:
            attempt = self.attempts.get(spec.attempt_id)
            if attempt is None or attempt.state is not AttemptState.STARTING:
                continue
            if error is None:
                attempt.ref = ref
                if not self.executor.queues_attempts:
                    check_transition("attempt", attempt.state, AttemptState.RUNNING)
                    attempt.state = AttemptState.RUNNING
                    self._plan_checkpoint(attempt, now)
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
        self._update_start_backoff(unavailable, now, bool(starts))
        launched = results[len(starts) : len(starts) + len(launches)]
        for vm, status, error in launched:
            self._launched(vm, status, error, now, batch)
        self._update_backoff(launched, now)
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
        self._set_provider_id(vm, status.vm_id)
        batch.vm(vm.row(self.driver.name, self.time_scale))
        if status.state is not vm.state:
            self._push(status)

    def _update_start_backoff(
        self, error: ExecutorUnavailable | None, now: float, started: bool
    ) -> None:
        """After the executor could not take attempts, start none for a while (from
        launch_backoff_s, doubling up to launch_backoff_max_s); a pass whose starts all
        went through clears it."""
        if error is None:
            if started:
                self._starts_backoff_s = 0.0
            return
        base, most = self.settings.launch_backoff_s, self.settings.launch_backoff_max_s
        self._starts_backoff_s = min(most, max(base, 2 * self._starts_backoff_s))
        self._starts_blocked_until = now + self._starts_backoff_s
        log.warning(
            "the %s executor cannot take attempts (%s); no new ones for %.0f s",
            self.executor.name,
            error,
            self._starts_backoff_s,
        )

    def _update_backoff(
        self, launched: list[tuple[VmRun, Any, Exception | None]], now: float
    ) -> None:
        """Back a VM type off after a pass in which its launches failed.

        The delay starts at launch_backoff_s and doubles (up to launch_backoff_max_s)
        only when the type fails again soon after its last back-off ended; a
        PermanentError blocks it for the maximum at once. Once per type per pass,
        however many of its launches failed; a pass with only successes clears it.
        """
        errors: dict[str, Exception] = {}
        succeeded: set[str] = set()
        for vm, _, error in launched:
            if error is None:
                succeeded.add(vm.vm_type.name)
            else:
                errors[vm.vm_type.name] = error
        base, most = self.settings.launch_backoff_s, self.settings.launch_backoff_max_s
        for name, error in errors.items():
            until, last = self._backoff.get(name, (0.0, 0.0))
            again_soon = last > 0 and now - until <= last
            delay = (
                most
                if isinstance(error, PermanentError)
                else (min(most, 2 * last) if again_soon else base)
            )
            self._backoff[name] = (now + delay, delay)
            log.warning("VM type %s backed off for %.0f s after: %s", name, delay, error)
        for name in succeeded - errors.keys():
            self._backoff.pop(name, None)

    async def _terminate(self, vms: list[VmRun]) -> None:
        try:
            await self.driver.terminate([vm.provider_id for vm in vms if vm.provider_id])
        except Exception:
            log.exception("terminating %s failed; will retry", [vm.id for vm in vms])
            for vm in vms:
                vm.terminating = False
                self._refresh_vm_sets(vm)

    # --- checkpoints --------------------------------------------------------------------------

    def _plan_checkpoint(self, attempt: AttemptRun, now: float) -> None:
        """When to signal a running checkpointable attempt next (SPEC.md §4), from its VM's
        age and its job's remaining work, both in model hours. When the schedule says to
        run to the end, the plan is reviewed when the job should have ended (a job that
        outruns its estimate is planned again with a tenth of the estimate left)."""
        attempt.due_at = None
        if attempt.migrating and attempt.signalled_at is None:  # moving: checkpoint now
            attempt.due_at = now
            heapq.heappush(self._due, (now, attempt.id, True))
            return
        bag = self.bags.get(attempt.bag_id)
        vm = self.vms.get(attempt.vm_id)
        settings = self.checkpointing
        if (
            bag is None
            or vm is None
            or vm.belief is None
            or not bag.spec.checkpointable
            or settings.policy == "none"
            or attempt.cancelling
            or attempt.missed_checkpoints >= 3
        ):
            return
        to_h = self.time_scale / 3600.0  # real seconds -> model hours
        step_s = settings.step_s / self.time_scale  # one grid step in real seconds
        estimate_s = bag.runtime_estimate_s
        done_s = attempt.saved_s + max(0.0, now - attempt.mark_at)
        left_s = planned_work_left(estimate_s, done_s, step_s)
        age_h = max(0.0, now - vm.requested_at) * to_h
        delta_h = bag.spec.checkpoint_cost_s * to_h
        model = vm.belief.model
        table = None
        if settings.policy == "optimal" and math.isfinite(model.expected_lifetime_h()):
            table = self.tables.lookup(model, delta_h, left_s * to_h)
        interval_h = next_checkpoint_h(settings.policy, model, left_s * to_h, age_h, delta_h, table)
        if interval_h is None:
            due = now + left_s  # review
        else:
            due = max(now + interval_h / to_h, attempt.mark_at + settings.min_interval_s)
        attempt.due_at = due
        heapq.heappush(self._due, (due, attempt.id, interval_h is not None))

    def _next_due(self) -> float | None:
        while self._due:
            due, attempt_id, _ = self._due[0]
            attempt = self.attempts.get(attempt_id)
            if attempt is not None and attempt.due_at == due:
                return due
            heapq.heappop(self._due)  # stale: the attempt ended or was planned again
        return None

    def _due_checkpoints(self, now: float) -> list[tuple[str, float]]:
        """Attempts to signal now, with how long each may take to confirm; plans that
        were due for review are made again."""
        if self._replan_checkpoints:
            self._replan_checkpoints = False
            for attempt in self.attempts.values():
                if attempt.due_at is not None and attempt.signalled_at is None:
                    self._plan_checkpoint(attempt, now)
        signals = []
        while (due := self._next_due()) is not None and due <= now:
            _, attempt_id, signal = heapq.heappop(self._due)
            attempt = self.attempts[attempt_id]
            attempt.due_at = None
            if attempt.state is not AttemptState.RUNNING or attempt.cancelling:
                continue
            if not signal:
                self._plan_checkpoint(attempt, now)
                continue
            attempt.signalled_at = now
            spec = self.bags[attempt.bag_id].spec
            timeout_s = max(self.checkpointing.confirm_timeout_s, 5 * spec.checkpoint_cost_s)
            signals.append((attempt_id, timeout_s))
        return signals

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
