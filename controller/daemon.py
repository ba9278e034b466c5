"""The daemon: `Controller` wires store, driver, executor and scheduler, which the HTTP
API reaches; it starts them (`start`: recovery from the store) and stops them in order.

Loaded by controller/service.py once the API's socket listens: importing this module
brings numpy, scipy, the scheduler and the store, seconds on a busy machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from controller.clock import RealClock
from controller.config import Config, ConfigError
from controller.costs.bag_cost import BagCosts
from controller.costs.fleet_cost import FleetCosts
from controller.costs.report import CostRule
from controller.executors.base import (
    AdmissionChecks,
    Executor,
    NodeNames,
    WorkdirChecks,
)
from controller.executors.job_users import JobUsers
from controller.hopper import Hopper, PriceSource
from controller.ids import RandomIds
from controller.notify.delivery import Deliverer
from controller.plumbing.loop_lag import LoopLagMonitor
from controller.plumbing.metrics import Metrics
from controller.preemption.checkpoint_tables import TableCache, planned_notices
from controller.preemption.learning import Learner
from controller.scheduler import Scheduler
from controller.service import logged_step
from controller.slurm.events import SlurmCallbacks
from controller.slurm.executor import SlurmExecutor
from controller.slurm.pools import PoolBook
from controller.store import Store
from controller.tokens import Tokens
from controller.traces.price_trace import TraceError, TraceReplay, read_trace
from controller.wiring import make_driver, make_executor, make_model_book
from drivers.base import Driver, HostedDriver, PreemptionInjector, PriceSample

log = logging.getLogger("spotbag.daemon")

# Drivers on this host (their VMs push their changes; a price trace may stand in for
# the market). Their VMs end with the daemon unless the driver says they outlive it
# (the local driver's VM hosts do).
EPHEMERAL_DRIVERS = {"local", "sim"}


class Controller:
    """Everything one running daemon holds; the API handlers reach it through the app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = config.resolved_state_dir()
        self.clock = RealClock()
        self.ids = RandomIds()
        self.catalog = config.catalog()
        self.metrics = Metrics()
        self.store = Store(self.state_dir / "spotbag.db")
        # Every bag's cost shown by the API: its split-cost report's (bag_cost.py).
        self.bag_costs = BagCosts(self.store, CostRule.of(config), self.clock.now)
        self.fleet_costs = FleetCosts(self.store, self.clock.now)
        self.token = ""
        self.tokens = Tokens("")
        self.controller_id = ""
        self._driver: Driver | None = None
        self._executor: Executor | None = None
        # The optional capabilities of the driver and executor, found once at start
        # (None: they have not got it).
        self.hosted: HostedDriver | None = None  # state of its own to start and close
        self.injector: PreemptionInjector | None = None  # fault injection
        self.admission_checks: AdmissionChecks | None = None
        self.workdir_checks: WorkdirChecks | None = None
        self.node_names: NodeNames | None = None
        self.slurm: SlurmCallbacks | None = None  # with the Slurm executor only
        self.scheduler: Scheduler | None = None
        self._loop_task: asyncio.Task | None = None
        self._learning_task: asyncio.Task | None = None
        self._hopper_task: asyncio.Task | None = None
        self.loop_lag = LoopLagMonitor(self.metrics.loop_lag_seconds.observe)
        self._loop_lag_task: asyncio.Task | None = None
        self.hopper: Hopper | None = None
        self.hook_secret = b""
        self.learner: Learner | None = None
        self.notify_secret = b""
        self.deliverer: Deliverer | None = None
        self._notify_task: asyncio.Task | None = None

    @property
    def driver(self) -> Driver:
        """The driver (made at start, before the API serves)."""
        if self._driver is None:
            raise RuntimeError("the driver is not made yet")
        return self._driver

    @property
    def executor(self) -> Executor:
        """The executor (made at start, before the API serves)."""
        if self._executor is None:
            raise RuntimeError("the executor is not made yet")
        return self._executor

    async def start(self) -> None:
        # `spotbag serve` has made the state directory private and locked it already
        # (controller/service.py); in process (tests) it may not exist yet.
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        await self.store.open()
        self.controller_id = await self.store.meta_value(
            "controller_id", lambda: secrets.token_hex(6)
        )
        self.token = self._resolve_token()
        self.tokens = Tokens(self.token, await self.store.tokens())
        seed = self.config.driver.seed
        rng = np.random.default_rng(seed)
        self.book = make_model_book(
            self.config,
            driver_name=self.config.driver.name,
            boot_delay_s=self.config.driver.boot_delay_s,
            time_scale=self.config.driver.time_scale,
        )
        driver = self._driver = make_driver(
            self.config,
            name=self.config.driver.name,
            now=self.clock.now,
            call_at=self.clock.call_at,
            rng=rng,
            boot_delay_s=self.config.driver.boot_delay_s,
            time_scale=self.config.driver.time_scale,
            book=self.book,
            controller_id=self.controller_id,
            state_dir=self.state_dir,
            notice_lead_s=self.config.driver.notice_lead_s,
        )
        # The driver's view of the catalog: it may fill in prices (aws: on-demand table).
        self.catalog = list(driver.vm_types())
        self.hosted = driver if isinstance(driver, HostedDriver) else None
        self.injector = driver if isinstance(driver, PreemptionInjector) else None
        if self.hosted is not None:
            await self.hosted.start()  # the local driver's VM hosts: none left from before
        executor = self._executor = await make_executor(
            self.config,
            state_dir=self.state_dir,
            controller_id=self.controller_id,
            now=self.clock.now,
            call_at=self.clock.call_at,
        )
        self.admission_checks = executor if isinstance(executor, AdmissionChecks) else None
        self.workdir_checks = executor if isinstance(executor, WorkdirChecks) else None
        self.node_names = executor if isinstance(executor, NodeNames) else None
        self._warn_about_job_users()
        self.hook_secret = b""
        pools = PoolBook((), ())
        if isinstance(executor, SlurmExecutor):
            self.slurm = SlurmCallbacks(executor, lambda: self.running_scheduler, self.clock)
            self.hook_secret = self._resolve_hook_secret()
            slurm = self.config.slurm
            pools = PoolBook(
                slurm.pools,
                self.catalog,
                unknown_accounts=slurm.unknown_accounts,
                unknown_account_cpu_h=slurm.unknown_account_cpu_h,
            )
        self.scheduler = Scheduler(
            store=self.store,
            driver=self.driver,
            executor=self.executor,
            clock=self.clock,
            ids=self.ids,
            settings=self.config.scheduler,
            catalog=self.catalog,
            controller_id=self.controller_id,
            metrics=self.metrics,
            book=self.book,
            time_scale=self.config.driver.time_scale,
            checkpointing=self.config.checkpoint,
            ledger=self.config.ledger,
            notify=self.config.notify,
            tables=TableCache(
                self.state_dir / "checkpoint-tables",
                step_h=self.config.checkpoint.step_s / 3600.0,
                restart_h=self.book.launch_h,
                max_work_h=self.config.checkpoint.max_work_h,
                notices=planned_notices(self.config.driver.notice_lead_s),
            ),
        )
        self.scheduler.pools = pools
        # Webhooks (docs/notifications.md): a task of its own, off the scheduler's path.
        self.notify_secret = self._resolve_notify_secret()
        self.deliverer = Deliverer(
            self.store, self.config.notify, self.notify_secret, self.clock.now
        )
        self.scheduler.notices.wake = self.deliverer.wake
        self.metrics.watch(self.scheduler.gauges)
        self.metrics.watch_loop_lag(lambda: self.loop_lag.max_lag_s)
        self._loop_lag_task = asyncio.create_task(self.loop_lag.run(), name="loop-lag")
        self.metrics.watch_health(lambda: (self.store.write_errors, self.problems()))
        self.learner = Learner(
            self.store, self.book, self.config.preemption, self.driver.name, self.clock.now
        )
        learned = await self.learner.load()
        if self.config.preemption.learn:
            self._learning_task = asyncio.create_task(self.learner.run(), name="learning")
        log.info(
            "preemption models: %s configured, %d learned", self.config.preemption.model, learned
        )
        await self.scheduler.recover()
        self.fleet_costs.refresh_in_background()  # GET /v1/vms then waits less, if at all
        if self.config.hopping.enabled:
            self.hopper = Hopper(
                settings=self.config.hopping,
                catalog=self.catalog,
                scheduler=self.scheduler,
                store=self.store,
                price_source=await self._price_source(),
                now=self.clock.now,
                time_scale=self.config.driver.time_scale,
                boot_delay_s=self.config.driver.boot_delay_s,
            )
            self._hopper_task = asyncio.create_task(self.hopper.run(), name="hopper")
        self._notify_task = asyncio.create_task(self.deliverer.run(), name="notify")
        pushes = self.driver.name in EPHEMERAL_DRIVERS
        self._loop_task = asyncio.create_task(
            self.scheduler.run(describe=not pushes), name="scheduler"
        )

    def _warn_about_job_users(self) -> None:
        """Say at start what jobs can touch when accounts are not kept apart
        (docs/operations.md#job-isolation)."""
        executor = self.config.executor
        users = JobUsers(executor.run_as, executor.run_as_accounts)
        if not users.configured:
            if self.executor.name == "local" and os.geteuid() == 0:
                log.warning(
                    "jobs run as root and can read this daemon's token and database: set "
                    '[executor] run_as = "spotbag-{account}" (docs/operations.md#job-isolation)'
                )
            elif self.executor.name == "slurm":
                log.warning(
                    "jobs run on the VMs as this daemon's user (uid %d), with its rights in "
                    "Slurm, and all accounts' jobs can touch each other's: set [executor] "
                    'run_as = "spotbag-{account}" (docs/operations.md#job-isolation)',
                    os.getuid(),
                )
        elif not users.per_account:
            log.warning(
                "jobs of several accounts run as one user: they can read and change each "
                'other\'s results and checkpoints; run_as = "spotbag-{account}" gives each '
                "account a user of its own (docs/operations.md#job-isolation)"
            )

    @property
    def running_scheduler(self) -> Scheduler:
        """The scheduler (made at start, before the API serves: requests and callbacks
        never see None)."""
        if self.scheduler is None:
            raise RuntimeError("the scheduler is not running yet")
        return self.scheduler

    async def _price_source(self) -> PriceSource:
        """The driver's spot prices, or for the local and sim drivers a replayed trace."""
        hopping = self.config.hopping
        if not hopping.trace:
            return self.driver.spot_prices
        if self.driver.name not in EPHEMERAL_DRIVERS:
            raise ConfigError("[hopping] trace replays prices for the local and sim drivers only")
        try:
            trace = await asyncio.to_thread(read_trace, hopping.trace)
        except TraceError as exc:
            raise ConfigError(f"[hopping] trace: {exc}") from None
        replay = TraceReplay(
            trace,
            self.clock.now(),
            type_map=hopping.trace_types,
            speed=hopping.trace_speed * self.config.driver.time_scale,
        )

        async def replayed(types: Sequence[str], zones: Sequence[str]) -> list[PriceSample]:
            return replay.prices_at(self.clock.now(), types, ())

        return replayed

    def critical_tasks(self) -> list[asyncio.Task]:
        """The tasks the daemon cannot live without: if one ends, the daemon exits."""
        tasks = (self._loop_task, self._hopper_task, self._learning_task)
        return [t for t in tasks if t is not None]

    def problems(self) -> list[str]:
        """Why the daemon is not healthy now (/healthz 503); empty when it is."""
        found = []
        if self.store.write_error:
            found.append(f"store: {self.store.write_error}")
        if self.scheduler is not None and self.scheduler.problem:
            found.append(f"scheduler: {self.scheduler.problem}")
        for task in (*self.critical_tasks(), self._notify_task):
            if task is not None and task.done():
                found.append(f"task {task.get_name()} ended")
        return found

    async def stop(self) -> None:
        """Stop in order, every step whatever an earlier one raised: the background
        tasks, the scheduler (its attempts recorded), the driver, the store."""
        tasks = (self._hopper_task, self._learning_task, self._loop_lag_task, self._notify_task)
        for task in tasks:
            if task is not None:
                task.cancel()
                await logged_step(f"stopping {task.get_name()}", task)
        if self.scheduler is not None and self._loop_task is not None:
            self.scheduler.stop()
            await logged_step("stopping the scheduler", self._loop_task)
            await logged_step(
                "ending the scheduler's attempts and VMs",
                self.scheduler.shutdown(vms_die_with_controller=not self._vms_outlive_controller()),
            )
        if self.hosted is not None:
            await logged_step("closing the driver", self.hosted.close())
        await logged_step("stopping bag cost refreshes", self.bag_costs.close())
        await logged_step("stopping fleet cost refreshes", self.fleet_costs.close())
        await logged_step("closing the store", self.store.close())

    def _vms_outlive_controller(self) -> bool:
        """Cloud VMs live on when the daemon stops; the local driver's, only as hosts."""
        if self.hosted is not None:
            return self.hosted.vms_outlive_controller
        return self.driver.name not in EPHEMERAL_DRIVERS

    def _resolve_hook_secret(self) -> bytes:
        """The secret slurmctld's hooks sign callbacks with: [slurm] hook_secret_file, made
        (random, mode 0600) when it does not exist yet."""
        configured = self.config.slurm.hook_secret_file
        path = Path(configured) if configured else self.state_dir / "slurm-hook.secret"
        return _secret_in(path, "[slurm] hook secret")

    def _resolve_notify_secret(self) -> bytes:
        """The secret webhooks' events are signed with: [notify] secret_file, made
        (random, mode 0600) when it does not exist yet."""
        configured = self.config.notify.secret_file
        path = Path(configured) if configured else self.state_dir / "notify.secret"
        return _secret_in(path, "[notify] secret")

    def _resolve_token(self) -> str:
        token = self.config.api.token or os.environ.get("SPOTBAG_TOKEN", "")
        token_file = self.state_dir / "token"
        if not token:
            if token_file.exists():
                token = token_file.read_text().strip()
            if not token:
                token = secrets.token_urlsafe(24)
        # Clients on this host find the token here (readable by the daemon's user only).
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token


def _secret_in(path: Path, what: str) -> bytes:
    """A shared secret kept in a file, made (32 random bytes in hex, mode 0600) when it
    does not exist yet; at least 16 bytes."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise ConfigError(f"{what} {path} is shorter than 16 bytes")
    return secret
