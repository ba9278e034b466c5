"""`spotbag simulate`: the real scheduler, store and admission on a virtual clock.

The sim driver samples VM lifetimes from the configured preemption model; the
sim executor runs each attempt for its declared runtime. Time jumps from one
event to the next, but the scheduler acts at most once per `simulation.tick_s`
(as the daemon reacts at most once per pass; unset, 1/360 of the bag's job runtime
within 1-10 s: `auto_tick_s`), so events close together are handled together. The
run ends when every bag has finished and every VM has been released; the summary is
read back from the store like a real run's.

With `simulation.price_trace` (`--price-trace`), the spot market follows one series of
a price trace (controller/traces/price_trace.py TraceMarket) from `trace_start`: the
sim driver launches spot VMs only at or below their bid (the on-demand price) and
preempts them when the price rises above it (besides the lifetime model); the deadline
policy sees the price now and the expected outage; the price changes over the run are
recorded as the store's price samples, so the cost figures (the bag's, reports') bill
each spot VM ∫ price dt over its life, on-demand VMs their fixed price.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from controller.bags.admission import admit
from controller.bags.spec import BagSpec
from controller.clock import SimClock
from controller.config import Config
from controller.costs.bag_cost import compute_bag_costs
from controller.costs.fleet_cost import compute_fleet_cost
from controller.costs.report import CostRule
from controller.costs.summary import bag_view, fleet_view
from controller.errors import SpotbagError
from controller.executors.sim import SimExecutor
from controller.ids import SequentialIds
from controller.preemption.checkpoint_tables import TableCache, planned_notices
from controller.scheduler import Scheduler
from controller.store import Store
from controller.traces.price_trace import (
    PriceTrace,
    TraceError,
    TraceMarket,
    parse_series,
    read_trace,
)
from controller.traces.trace_io import parse_time
from controller.wiring import make_driver, make_model_book

log = logging.getLogger("spotbag.simulation")


class SimulationSetupError(SpotbagError, ValueError):
    """The simulation's settings cannot be used (a price trace that cannot be read)."""


class SimulationStalled(SpotbagError, RuntimeError):
    """Nothing can happen any more, yet bags are unfinished (a scheduler bug or an impossible setup)."""


@dataclass(frozen=True)
class SimulationResult:
    bag: dict[str, Any]  # the bag view, as GET /v1/bags/{id} shows it
    fleet: dict[str, Any]  # VM totals
    ticks: int
    wall_s: float
    state_dir: Path | None  # where its database is kept (None: it was not)


async def simulate(
    spec: Any, config: Config, *, seed: int | None = None, state_dir: Path | None = None
) -> SimulationResult:
    """Run the bag `spec` to its end on a virtual clock. Its database is kept in
    `state_dir` (`spotbag simulate --keep`), whole, with its indexes, for `spotbag
    report` and the like; without one, in a temporary directory that goes with it (no
    index the summary does not read is built: ~0.5 s of the bench's 100,000 jobs)."""
    if state_dir is not None:
        return await _simulate(spec, config, seed, state_dir, keep=True)
    with tempfile.TemporaryDirectory(prefix="spotbag-sim-") as scratch:
        return await _simulate(spec, config, seed, Path(scratch), keep=False)


async def _simulate(
    spec: Any, config: Config, seed: int | None, state_dir: Path, *, keep: bool
) -> SimulationResult:
    wall_start = time.perf_counter()
    seed = config.simulation.seed if seed is None else seed
    lifetime_rng, runtime_rng = np.random.default_rng(seed).spawn(2)
    clock = SimClock(config.simulation.start_at)
    market = await asyncio.to_thread(trace_market, config)
    store = Store(state_dir / "spotbag.db", threaded=False, durable=False, group_commit=True)
    await store.open()
    # Only the run writes while it lasts: its indexes are built once, before the
    # summary is read (controller/store/engine.py DEFERRABLE_INDEXES), when kept.
    await store.defer_indexes()
    try:
        book = make_model_book(
            config, driver_name="sim", boot_delay_s=config.simulation.boot_delay_s, time_scale=1.0
        )
        driver = make_driver(
            config,
            name="sim",
            now=clock.now,
            call_at=clock.call_at,
            rng=lifetime_rng,
            boot_delay_s=config.simulation.boot_delay_s,
            time_scale=1.0,
            book=book,
            notice_lead_s=config.simulation.notice_lead_s,
            spot_market=market,
        )
        executor = SimExecutor(now=clock.now, call_at=clock.call_at, rng=runtime_rng)
        ids = SequentialIds()
        # Simulated calls return at once: run them one after another, without tasks.
        settings = config.scheduler.model_copy(update={"max_concurrent_calls": 1})
        scheduler = Scheduler(
            store=store,
            driver=driver,
            executor=executor,
            clock=clock,
            ids=ids,
            settings=settings,
            catalog=config.catalog(),
            controller_id=f"sim-{seed}",
            book=book,
            checkpointing=config.checkpoint,
            ledger=config.ledger,
            tables=TableCache(
                None,
                step_h=config.checkpoint.step_s / 3600.0,
                restart_h=book.launch_h,
                max_work_h=config.checkpoint.max_work_h,
                inline=True,
                notices=planned_notices(config.simulation.notice_lead_s),
            ),
            spot_feed=market,
        )
        scheduler.deadlines.project_every_s = config.simulation.projection_every_s
        with _no_cycle_collection():
            bag_row, _ = await admit(
                spec,
                store=store,
                scheduler=scheduler,
                catalog=config.catalog(),
                bag_id=ids.new_bag_id(),
                now=clock.now(),
                max_jobs=config.api.max_jobs_per_bag,
                offload=False,
            )
            tick_s = config.simulation.tick_s or auto_tick_s(
                BagSpec.from_stored(bag_row["spec"]), config.simulation.notice_lead_s
            )
            await run_scheduler(scheduler, clock, tick_s)
            if keep:
                await store.restore_indexes()
            if market is not None:
                # The prices the run's VMs paid, as the store's price samples: the cost
                # reports bill each spot VM by them (∫ price dt), as the hopper's samples.
                catalog = [(t.name, t.zone) for t in config.catalog()]
                await store.add_price_samples(
                    market.samples(catalog, config.simulation.start_at, clock.now())
                )
            bag = await store.get_bag(bag_row["id"])
            assert bag is not None  # the simulation's own bag, never deleted
            fleet = fleet_view((await compute_fleet_cost(store, clock.now()))[0])
            costs = await compute_bag_costs(store, [bag["id"]], clock.now(), CostRule.of(config))
            return SimulationResult(
                bag_view(bag, clock.now(), costs[bag["id"]]),
                fleet,
                scheduler.ticks,
                time.perf_counter() - wall_start,
                state_dir if keep else None,
            )
    finally:
        try:  # a kept database stays whole
            if keep:
                await store.restore_indexes()
        except Exception as exc:  # the run's own error is the one to raise
            log.warning("simulation: its indexes were not built (%s); the next open does", exc)
        await store.close()


# `simulation.tick_s` unset: the scheduler acts at most once per this share of a job's
# runtime, within these bounds. A job that ends waits for the next pass for half a tick
# on average, its VM idle meanwhile: at 1/360, 0.14 % of a job of the bag's runtime on
# average and 0.28 % at most (more of the shorter ones when runtimes vary). The bench's
# 100,000 one-hour jobs: 35,292 passes at 10 s against 88,102 at 1 s, 17 % less CPU, and
# VM-hours 0.03 % more (bench/simulate_fleet.py).
AUTO_TICK_SHARE = 1 / 360
AUTO_TICK_MIN_S, AUTO_TICK_MAX_S = 1.0, 10.0


def auto_tick_s(spec: BagSpec, notice_lead_s: float = 0.0) -> float:
    """The default `simulation.tick_s` for a bag: AUTO_TICK_SHARE of the runtime the sim
    executor gives its jobs (`simulation.runtime_s`, else `estimated_runtime_s`, else
    `max_runtime_s`), clamped to [AUTO_TICK_MIN_S, AUTO_TICK_MAX_S].

    The least where seconds count: each job taking its own runtime
    (`simulation.runtime_param`: some may be short); a checkpointable bag with
    preemption notices (a checkpoint is asked at a notice only if it can be written
    before the VM goes: a pass 10 s late lost work that 1 s did not) or with a deadline
    (whose checkpoint bounds the timer keeps to the second)."""
    hints = spec.simulation
    if hints is not None and hints.runtime_param:
        return AUTO_TICK_MIN_S
    if spec.checkpointable and (notice_lead_s > 0 or spec.deadline is not None):
        return AUTO_TICK_MIN_S
    runtime_s = (
        (hints.runtime_s if hints is not None else None)
        or spec.estimated_runtime_s
        or spec.max_runtime_s
    )
    return min(AUTO_TICK_MAX_S, max(AUTO_TICK_MIN_S, runtime_s * AUTO_TICK_SHARE))


def trace_market(config: Config) -> TraceMarket | None:
    """The market `simulation.price_trace` describes (None: the catalog's fixed prices)."""
    settings = config.simulation
    if not settings.price_trace:
        return None
    try:
        path = Path(settings.price_trace)
        stat = path.stat()
        trace = _read_trace(path, stat.st_mtime_ns, stat.st_size)
        series = parse_series(settings.trace_series) if settings.trace_series else trace.vms[0]
        start_s = parse_time(settings.trace_start) if settings.trace_start else trace.common_start_s
        return TraceMarket(trace, series, settings.start_at, start_s)
    except (TraceError, OSError, ValueError) as exc:
        raise SimulationSetupError(f"simulation.price_trace: {exc}") from None


@functools.lru_cache(maxsize=2)
def _read_trace(path: Path, mtime_ns: int, size: int) -> PriceTrace:
    """The trace file, read once per version of it (a benchmark simulates many runs
    over one trace; a second or two each to read the shipped one)."""
    return read_trace(path)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """No cyclic garbage collection while the bag is admitted, the scheduler runs and
    the costs are read back; one collection after.

    A large simulation keeps hundreds of thousands of objects alive (jobs, attempts,
    VMs, their rows waiting for group commit), and each collection traverses the live
    objects made since the last one: with the thresholds of before (100,000, 50,
    1,000,000) 0.7-0.8 s of a 20 s run of the 100,000-job bench, where Python's
    defaults took 1.2 s of 13 s for 50,000 jobs; the admission's and the cost report's
    collections another 0.3 s. A simulation makes no garbage in reference
    cycles (everything it drops is freed by reference counting: the collection after
    the bench's run finds none, and tests/controller/test_simulation_outcome.py checks
    it), so nothing waits for a collection; what exists before the run is frozen out
    of the one after."""
    gc.freeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        found = gc.collect()
        log.debug("simulation: %d objects in reference cycles after the run", found)
        if enabled:
            gc.enable()
        gc.unfreeze()


async def run_scheduler(
    scheduler: Scheduler, clock: SimClock, tick_s: float, until: float | None = None
) -> None:
    """Tick and advance the virtual clock until nothing is open (or the clock reaches `until`)."""
    while until is None or clock.now() < until:
        wanted = await scheduler.tick()
        last_tick = clock.now()
        if scheduler.has_inputs():
            continue  # the pass itself produced events (e.g. a VM already running)
        if not scheduler.has_work():
            return
        candidates = [t for t in (clock.next_at(), wanted) if t is not None]
        if not candidates:
            if scheduler.held_jobs() or scheduler.budgets.held:
                # The rest waits, held for credit or by a budget (controller/budgets.py),
                # for a change no one will make here.
                return
            raise SimulationStalled(
                f"nothing left to happen at t={clock.now():.0f} with {len(scheduler.world.bags)} bags open, "
                f"{len(scheduler.world.vms)} VMs alive"
            )
        target = max(min(candidates), last_tick + tick_s)
        clock.advance_to(target if until is None else min(target, until))
