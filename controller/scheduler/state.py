"""The scheduler's state: what every part of a pass reads and changes.

`SchedulerState` is the base class of the scheduler's mixins (controller/scheduler/
events.py, planning.py, actions.py, transitions.py, recovery.py, slurm_pools.py) and so
of `Scheduler` (loop.py). It builds, in `__init__` (the constructor of `Scheduler`),
and so declares with their types:

- what the scheduler is given: the store, the driver, the executor, the clock, the id
  source, the settings, the VM catalog, the preemption models, the metrics;
- the open world: active bags, open jobs, live attempts and VMs, and the VM indexes
  the planner's snapshot reads (pending, roomy, idle, draining, pool);
- the inputs between passes: the inbox of driver and executor events, which the
  driver and the executor push to (`_on_vm_status`, `_on_attempt_event`), and the
  commands that callers queue;
- what a pass leaves for its acting half or for the next pass (stops for migrations,
  VMs to terminate now, pool launches, refusals and releases, the hooks' verdicts);
- the collaborators: `backoff` (actions.py), `checkpoints` (checkpoints.py) and
  `accounts` (controller/ledger.py).

The mixins are layered so that each inherits the methods it calls: transitions on the
state; planning, pool handling and events on transitions; actions on events (a start
that failed is recorded as the attempt's end); recovery on actions. The one call
against that order (events await driver and executor calls through
`ActionsMixin._call`) is declared below for the type checker, which checks that the
real method matches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from controller.config import CheckpointConfig, LedgerConfig, SchedulerConfig
from controller.executors.base import (
    AttemptEvent,
    AttemptSpec,
    CallbackNoted,
    CheckpointEvent,
    Executor,
    ExecutorEvent,
)
from controller.ledger import Accounts
from controller.planner import CatalogType, Terminate
from controller.plumbing.metrics import Metrics
from controller.preemption.checkpoint_tables import TableCache
from controller.preemption.model_book import ModelBook
from controller.runtime import AttemptRun, BagRun, JobRun, VmRun, capacity_of
from controller.scheduler.backoff import Backoff
from controller.scheduler.checkpoints import CheckpointTimer
from controller.scheduler.inputs import Clock, Command, IdSource
from controller.slurm.pools import PoolBook
from controller.store import Store
from controller.store.rows import SlurmRunRow
from drivers.base import Driver, VmStatus, VmType
from policies.index import TypeMarket

T = TypeVar("T")
# What the executor returned for an attempt handed to it: (its spec, its reference there,
# the error that kept it from starting, if one did).
StartResult = tuple[AttemptSpec, str, Exception | None]


class SchedulerState:
    """The state the scheduler's parts share, and the inbox they are fed through."""

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
        self.catalog_view = [
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
        self._inbox: list[VmStatus | ExecutorEvent] = []
        self._commands: list[Command] = []
        # Starts handed to the executor in the background (actions.py), and what those
        # that returned said, recorded by the next pass.
        self._starting: set[asyncio.Task[None]] = set()
        self._started: list[StartResult] = []
        # Bags written but still being handed over (admission.hand_over): whether a
        # cancel came meanwhile (it is replayed once the bag is admitted).
        self._handing_over: dict[str, bool] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._last_describe = 0.0
        self._replan = False  # an action failed: plan again at once, not at the next event
        self._call_slots = asyncio.Semaphore(settings.max_concurrent_calls)
        self.backoff = Backoff(settings, executor.name)  # after failed launches and starts
        self._terminate_now: list[Terminate] = []  # VMs whose node broke (or Slurm let go)
        # Power-saving pools (controller/slurm/pools.py): Slurm users' jobs on spot VMs.
        self.pools = PoolBook((), ())
        self._pool_vms: dict[str, None] = {}  # ids of the VMs serving pool nodes
        self._pool_runs: dict[tuple[str, str], SlurmRunRow] = {}  # (job id, name) -> run
        self._pool_launches: list[VmRun] = []
        self._refusals: list[tuple[str, str]] = []  # (Slurm job id, why) to cancel
        self._pool_refused: dict[tuple[str, str], str] = {}  # (job id, name) -> why
        self._pool_released: dict[str, str] = {}  # VM id -> why spotbag let it go
        self.problem: str | None = None  # why passes fail now (None: they do not)
        self._pool_releases: list[tuple[str, str]] = []  # (node, why) to power down
        self._verdicts: list[tuple[asyncio.Future[str], str]] = []  # told after this pass
        self._background: set[asyncio.Task[object]] = set()
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
                bags=self.bags,
                vms=self.vms,
                attempts=self.attempts,
                wake=self._wake.set,
            )
        )
        self.accounts = Accounts(
            ledger or LedgerConfig()
        )  # CPU-hour balances (docs/design.md#ledger)
        self.ticks = 0
        driver.subscribe(self._on_vm_status)
        executor.subscribe(self._on_attempt_event)

    # --- the inbox -----------------------------------------------------------------

    def _on_vm_status(self, status: VmStatus) -> None:
        self._inbox.append(status)
        self._wake.set()

    def _on_attempt_event(self, event: ExecutorEvent) -> None:
        self._inbox.append(event)
        # A callback that changed nothing is written with the next pass (within
        # poll_interval_s); it needs no pass of its own.
        if not isinstance(event, CallbackNoted):
            self._wake.set()

    async def _starts_settled(self) -> None:
        """Wait for the starts handed to the executor in the background (actions.py):
        before it is told to stop attempts (a cancel, a VM lost, a shutdown, a
        recovery), it has every attempt it was given, so none starts after it was
        stopped."""
        while self._starting:
            await asyncio.wait(list(self._starting))

    def _push(self, item: VmStatus | AttemptEvent | CheckpointEvent) -> None:
        """An event the scheduler found itself (a VM's status seen on a poll or in a
        launch's answer): handled with the next pass, like a pushed one."""
        self._inbox.append(item)
        self._wake.set()

    # --- a call against the layering (see the module docstring) -----------------------

    if TYPE_CHECKING:

        async def _call(self, awaitable: Awaitable[T]) -> T | None:
            """`ActionsMixin._call`: await a driver/executor call, its failure logged."""
