"""A simulated world for scheduler tests: the real scheduler and store with the sim
driver and executor on a virtual clock, plus checks of what the store says."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from controller.clock import SimClock
from controller.config import Config, load_config
from controller.executors.sim import SimExecutor
from controller.ids import SequentialIds
from controller.scheduler import Scheduler
from controller.simulation import run_scheduler
from controller.store import Store
from controller.wiring import make_driver, make_model_book


def config(**overrides) -> Config:
    base = {
        "scheduler.max_vms": 5,
        "scheduler.idle_timeout_s": 120.0,
        "simulation.boot_delay_s": 60.0,
        "vm_types": [
            {
                "name": "small",
                "cpus": 2,
                "memory_gb": 4,
                "spot_price_per_hour": 0.02,
                "on_demand_price_per_hour": 0.08,
            },
            {
                "name": "big",
                "cpus": 8,
                "memory_gb": 32,
                "spot_price_per_hour": 0.12,
                "on_demand_price_per_hour": 0.40,
            },
        ],
    }
    base.update(overrides)
    return load_config(None, **base)


def bag(n: int = 20, runtime_s: float = 3600.0, **extra) -> dict:
    spec = {
        "account": "a",
        "command": "run {i}",
        "parameters": {"i": {"range": [0, n]}},
        "max_runtime_s": 4 * runtime_s,
        "estimated_runtime_s": runtime_s,
        "resources": {"cpus": 1, "memory_gb": 1},
    }
    spec.update(extra)
    return spec


def rows(state_dir: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(state_dir / "spotbag.db") as conn:
        return conn.execute(sql).fetchall()


def check_store_consistent(state_dir: Path) -> None:
    """Maintained counts equal the jobs table; one success per succeeded job; no live leftovers."""
    kept = {
        (b, s): n for b, s, n in rows(state_dir, "SELECT bag_id, state, n FROM bag_job_counts") if n
    }
    real = {
        (b, s): n
        for b, s, n in rows(state_dir, "SELECT bag_id, state, count(*) FROM jobs GROUP BY 1, 2")
    }
    assert kept == real
    assert rows(
        state_dir,
        """SELECT count(*) FROM jobs j WHERE j.state = 'succeeded' AND
        (SELECT count(*) FROM attempts a WHERE a.bag_id = j.bag_id AND a.idx = j.idx AND a.state = 'succeeded') != 1
        """,
    ) == [(0,)]
    assert rows(
        state_dir, "SELECT count(*) FROM attempts WHERE state IN ('starting', 'running')"
    ) == [(0,)]
    assert rows(state_dir, "SELECT count(*) FROM vms WHERE state IN ('pending', 'running')") == [
        (0,)
    ]
    # Each job's attempt counter matches its attempts.
    assert rows(
        state_dir,
        """SELECT count(*) FROM jobs j WHERE j.attempts !=
        (SELECT count(*) FROM attempts a WHERE a.bag_id = j.bag_id AND a.idx = j.idx)""",
    ) == [(0,)]


async def world(
    path: Path,
    clock: SimClock,
    seed: int,
    cfg: Config,
    *,
    store: Store | None = None,
    driver=None,
    executor=None,
    ids=None,
    checkpointing=None,
) -> Scheduler:
    """A scheduler on `path`'s database; pass a driver/executor to keep them across a restart."""
    if store is None:
        store = Store(path / "spotbag.db", threaded=False, durable=False)
        await store.open()
    lifetimes, runtimes = np.random.default_rng(seed).spawn(2)
    book = make_model_book(cfg, driver_name="sim", boot_delay_s=60, time_scale=1.0)
    driver = driver or make_driver(
        cfg,
        name="sim",
        now=clock.now,
        call_at=clock.call_at,
        rng=lifetimes,
        boot_delay_s=60,
        time_scale=1.0,
        book=book,
    )
    executor = executor or SimExecutor(now=clock.now, call_at=clock.call_at, rng=runtimes)
    settings = cfg.scheduler.model_copy(update={"max_concurrent_calls": 1})
    return Scheduler(
        store=store,
        driver=driver,
        executor=executor,
        clock=clock,
        ids=ids or SequentialIds(),
        settings=settings,
        catalog=cfg.catalog(),
        controller_id=f"test-{seed}",
        book=book,
        ledger=cfg.ledger,
        checkpointing=checkpointing,
    )


async def run_until(scheduler: Scheduler, clock: SimClock, stop_at: float) -> None:
    await run_scheduler(scheduler, clock, 1.0, until=stop_at)
