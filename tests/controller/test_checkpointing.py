"""Checkpoints in the scheduler, on the virtual clock: jobs are signalled on the schedule
of their VM's model, resume from their last checkpoint after a preemption, and the
store accounts for every second (work, checkpointing, work lost)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.preemption.checkpoint_tables import TableCache, table_size_h
from controller.simulation import simulate
from policies.checkpoint import build_table
from policies.preemption import Bathtub, Exponential
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world

WORK_S = 4 * 3600.0
DELTA_S = 60.0
BATHTUB = {
    "preemption.model": "bathtub",
    "preemption.bathtub_A": 0.351,
    "preemption.bathtub_tau1": 2.31,
    "preemption.bathtub_tau2": 109.736,
    "preemption.bathtub_b": 0.001,
    "preemption.deadline_h": 24.0,
}


def checkpointable(n: int, **extra) -> dict:
    return bag(
        n,
        runtime_s=WORK_S,
        checkpointable=True,
        checkpoint_cost_s=DELTA_S,
        max_attempts=40,
        **extra,
    )


def time_accounts(state_dir: Path) -> dict[int, dict[str, float]]:
    """Per job, from the store alone: time its attempts ran, checkpoints written and time
    spent writing them, and the time each interrupted attempt ran since its last
    checkpoint (the work it lost)."""
    written = defaultdict(list)
    for idx, number, requested_at, at in rows(
        state_dir, "SELECT idx, number, requested_at, at FROM checkpoints WHERE ok ORDER BY id"
    ):
        written[(idx, number)].append((requested_at, at))
    jobs: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for idx, number, state, started_at, ended_at in rows(
        state_dir, "SELECT idx, number, state, started_at, ended_at FROM attempts"
    ):
        job = jobs[idx]
        job["ran_s"] += ended_at - started_at
        done = written[(idx, number)]
        job["checkpoints"] += len(done)
        job["checkpoint_s"] += sum(at - asked for asked, at in done)
        if state in ("preempted", "lost"):
            mark = done[-1][1] if done else started_at
            job[f"{state}_s"] += ended_at - mark
    return jobs


async def test_jobs_checkpoint_resume_and_every_second_is_accounted_for(tmp_path):
    cfg = config(**BATHTUB, **{"scheduler.max_vms": 10})
    result = await simulate(checkpointable(30), cfg, seed=5, state_dir=tmp_path)
    view = result.bag
    assert view["state"] == "succeeded"
    usage = view["usage"]
    assert usage["interrupted_attempts"] > 0 and usage["checkpoints"] > 0
    jobs = time_accounts(tmp_path)
    saved = dict(rows(tmp_path, "SELECT idx, work_saved_s FROM jobs"))
    counted = dict(rows(tmp_path, "SELECT idx, checkpoints FROM jobs"))
    runtimes = dict(rows(tmp_path, "SELECT idx, runtime_s FROM jobs"))
    for idx, job in jobs.items():
        # An attempt runs the work not yet saved; a checkpoint pauses it for δ; a
        # preemption throws away what it did since its last checkpoint. So the time
        # the job's attempts ran is exactly its work + checkpointing + work lost.
        assert job["ran_s"] == pytest.approx(
            WORK_S + job["checkpoint_s"] + job["preempted_s"], abs=1e-6
        )
        assert job["checkpoint_s"] == pytest.approx(DELTA_S * job["checkpoints"])
        assert counted[idx] == job["checkpoints"]
        assert 0 <= saved[idx] < WORK_S
        # The job's runtime is its work, however many attempts it took.
        assert runtimes[idx] == pytest.approx(WORK_S)
    total_lost = sum(j["preempted_s"] for j in jobs.values())
    assert usage["lost_hours"] == pytest.approx(total_lost / 3600)
    assert usage["checkpoints"] == sum(j["checkpoints"] for j in jobs.values())
    assert usage["checkpoint_hours"] == pytest.approx(usage["checkpoints"] * DELTA_S / 3600)
    # Checkpoints are what make the lost work smaller than the interrupted attempts' time.
    assert usage["lost_hours"] < usage["preempted_attempt_hours"]
    # Work saved only ever grows within a job.
    for (idx,) in rows(tmp_path, "SELECT DISTINCT idx FROM checkpoints"):
        works = [
            w
            for (w,) in rows(
                tmp_path, f"SELECT work_s FROM checkpoints WHERE idx={idx} AND ok ORDER BY id"
            )
        ]
        assert works == sorted(works)
    check_store_consistent(tmp_path)


async def test_checkpoints_follow_the_optimal_schedule_for_the_vm_age_and_work_left(tmp_path):
    cfg = config(**BATHTUB)
    await simulate(checkpointable(6), cfg, seed=2, state_dir=tmp_path)
    model = Bathtub(A=0.351, tau1=2.31, tau2=109.736, b=0.001, L=24.0)
    table = build_table(model, table_size_h(4.0, 24.0), DELTA_S / 3600, 60 / 3600, 1 / 60)
    checked = 0
    attempts = rows(
        tmp_path,
        "SELECT a.idx, a.number, a.started_at, a.ended_at, v.requested_at FROM attempts a "
        "JOIN vms v ON v.id = a.vm_id ORDER BY a.idx, a.number",
    )
    for idx, number, started_at, ended_at, vm_requested_at in attempts:
        asked = rows(
            tmp_path,
            f"SELECT requested_at, at, work_s FROM checkpoints WHERE idx={idx} AND number={number} "
            "AND ok ORDER BY id",
        )
        prior = rows(
            tmp_path,
            f"SELECT max(work_s) FROM checkpoints WHERE idx={idx} AND number<{number} AND ok",
        )[0][0]
        # The whole no-failure path the table gives from the attempt's start...
        plan = table.schedule(
            (WORK_S - (prior or 0.0)) / 3600, (started_at - vm_requested_at) / 3600
        )
        expected = [started_at + t * 3600 for t in plan.checkpoint_times_h()]
        expected = [t for t in expected if t < ended_at]
        # ... is what the scheduler followed, checkpoint by checkpoint.
        assert [a for a, _, _ in asked] == pytest.approx(expected, abs=1e-6)
        checked += len(asked)
    assert checked >= 10
    # On a fresh VM the intervals grow (the early hazard falls).
    fresh = table.schedule(4.0, 1 / 60)
    assert fresh.intervals_h[1] > fresh.intervals_h[0]


async def test_young_daly_checkpoints_at_a_fixed_period_and_none_never(tmp_path):
    mttf_h = 2.0
    cfg = config(
        **{
            "preemption.model": "exponential",
            "preemption.mttf_h": mttf_h,
            "checkpoint.policy": "young-daly",
        }
    )
    await simulate(checkpointable(4), cfg, seed=4, state_dir=tmp_path / "yd")
    period_s = math.sqrt(2 * DELTA_S / 3600 * mttf_h) * 3600
    starts = dict(
        ((i, n), s)
        for i, n, s in rows(tmp_path / "yd", "SELECT idx, number, started_at FROM attempts")
    )
    gaps = []
    for (idx, number), started_at in starts.items():
        marks = [started_at] + [
            at
            for _, at in rows(
                tmp_path / "yd",
                f"SELECT requested_at, at FROM checkpoints WHERE idx={idx} AND number={number} ORDER BY id",
            )
        ]
        asked = [
            r
            for (r,) in rows(
                tmp_path / "yd",
                f"SELECT requested_at FROM checkpoints WHERE idx={idx} AND number={number} ORDER BY id",
            )
        ]
        gaps += [a - m for a, m in zip(asked, marks, strict=False)]
    assert gaps and gaps == pytest.approx([period_s] * len(gaps), abs=1e-6)

    off = config(
        **{
            "preemption.model": "exponential",
            "preemption.mttf_h": mttf_h,
            "checkpoint.policy": "none",
        }
    )
    result = await simulate(checkpointable(4), off, seed=4, state_dir=tmp_path / "none")
    assert result.bag["usage"]["checkpoints"] == 0
    # Without checkpoints a preemption loses the whole attempt.
    assert result.bag["usage"]["lost_hours"] == pytest.approx(
        result.bag["usage"]["preempted_attempt_hours"]
    )


async def test_the_optimal_policy_loses_less_than_no_checkpoints(tmp_path):
    results = {}
    for policy in ("optimal", "none"):
        cfg = config(**BATHTUB, **{"scheduler.max_vms": 20, "checkpoint.policy": policy})
        result = await simulate(checkpointable(60), cfg, seed=9, state_dir=tmp_path / policy)
        usage = result.bag["usage"]
        results[policy] = usage["attempt_hours"]
    # Checkpointing costs a little writing time and saves much more recomputation.
    assert results["optimal"] < results["none"]


async def test_no_checkpoints_on_vms_that_are_never_preempted_or_for_other_bags(tmp_path):
    result = await simulate(checkpointable(3), config(), seed=1, state_dir=tmp_path / "a")
    assert result.bag["usage"]["checkpoints"] == 0
    cfg = config(**BATHTUB)
    result = await simulate(bag(3, runtime_s=WORK_S), cfg, seed=1, state_dir=tmp_path / "b")
    assert result.bag["usage"]["checkpoints"] == 0
    assert rows(tmp_path / "b", "SELECT count(*) FROM checkpoints") == [(0,)]


@pytest.mark.parametrize("keep_processes", [True, False])
async def test_a_restarted_scheduler_keeps_the_saved_work(tmp_path, keep_processes):
    """A rebuild that finds the attempts still running carries on signalling them from
    their last checkpoint; a crash that loses them resumes their retries from it."""
    cfg = config(**BATHTUB)
    clock = SimClock(1_000_000.0)
    first = await world(tmp_path, clock, 1, cfg)
    await admit(
        checkpointable(2),
        store=first.store,
        scheduler=first,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=1000,
        offload=False,
    )
    await run_until(first, clock, clock.now() + 1.6 * 3600)
    before = dict(rows(tmp_path, "SELECT idx, work_saved_s FROM jobs"))
    rebuilt_at = clock.now()
    live = rows(tmp_path, "SELECT idx, number FROM attempts WHERE state = 'running'")
    assert live
    assert any(w > 0 for w in before.values())
    if keep_processes:
        second = await world(
            tmp_path, clock, 2, cfg, store=first.store, driver=first.driver, executor=first.executor
        )
    else:
        second = await world(tmp_path, clock, 2, cfg, store=first.store)
    await second.recover()
    for job in second.world.jobs.values():
        assert job.work_saved_s == before[job.idx]
    await run_until(second, clock, clock.now() + 30 * 3600)
    assert not second.has_work()
    await second.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]
    for idx, job in time_accounts(tmp_path).items():
        assert job["ran_s"] == pytest.approx(
            WORK_S + job["checkpoint_s"] + job["preempted_s"] + job["lost_s"], abs=1e-6
        ), idx
    if keep_processes:
        assert rows(tmp_path, "SELECT count(*) FROM attempts WHERE state = 'lost'") == [(0,)]
        # The attempts it found running were signalled on after the rebuild.
        after = rows(
            tmp_path,
            f"SELECT DISTINCT idx, number FROM checkpoints WHERE requested_at > {rebuilt_at}",
        )
        assert set(after) & set(live)
    else:
        assert rows(tmp_path, "SELECT count(*) FROM attempts WHERE state = 'lost'")[0][0] >= 1
    check_store_consistent(tmp_path)


# --- the table cache -----------------------------------------------------------------------


async def test_tables_are_solved_once_and_then_loaded_from_disk(tmp_path):
    model = Exponential(mttf_h=3.0, L=12.0)
    cache = TableCache(tmp_path, step_h=1 / 12, restart_h=0.05, max_work_h=24.0)
    assert cache.lookup(model, 1 / 60, 1.5) is None  # solving in a worker thread
    table = await cache.get(model, 1 / 60, 1.5)
    assert cache.solved == 1 and table.max_steps == round(2.0 * 12)  # rounded up to 2 h
    assert cache.lookup(model, 1 / 60, 0.7) is table  # a bigger table answers a smaller job
    again = TableCache(tmp_path, step_h=1 / 12, restart_h=0.05, max_work_h=24.0, inline=True)
    loaded = again.lookup(model, 1 / 60, 1.5)
    assert again.solved == 0 and again.loaded == 1
    assert np.array_equal(loaded.makespan, table.makespan)
    assert np.array_equal(loaded.choice, table.choice)
    assert loaded.schedule(1.5, 3.0) == table.schedule(1.5, 3.0)
    # Another δ, restart or model is another table.
    other = TableCache(tmp_path, step_h=1 / 12, restart_h=0.1, max_work_h=24.0, inline=True)
    other.lookup(model, 1 / 60, 1.5)
    assert other.solved == 1


def test_a_damaged_table_file_is_solved_again(tmp_path):
    model = Exponential(mttf_h=3.0, L=12.0)
    cache = TableCache(tmp_path, step_h=1 / 12, restart_h=0.0, max_work_h=4.0, inline=True)
    table = cache.lookup(model, 1 / 60, 1.0)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(b"not a table")
    fresh = TableCache(tmp_path, step_h=1 / 12, restart_h=0.0, max_work_h=4.0, inline=True)
    again = fresh.lookup(model, 1 / 60, 1.0)
    assert fresh.solved == 1 and np.array_equal(again.makespan, table.makespan)


def test_table_sizes_round_up_a_ladder():
    assert [table_size_h(w, 24.0) for w in (0.1, 1.0, 1.01, 3.0, 9.0, 24.0, 30.0)] == [
        1.0,
        1.0,
        2.0,
        4.0,
        16.0,
        24.0,
        24.0,
    ]
    assert table_size_h(40.0, 100.0) == 48.0
