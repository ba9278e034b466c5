"""Preemption notices in the scheduler, on the virtual clock (docs/design.md#checkpoint-notices):
a noticed VM takes no new job, its checkpointable jobs checkpoint and move to a VM
launched at the notice, and a bag loses next to no work; the planner keeps or launches
a VM for a noticed VM's jobs."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from controller.clock import SimClock
from controller.executors.base import NodeNotice
from controller.executors.sim import SimExecutor
from controller.planner import CatalogType, DemandGroup, Snapshot, VmView, plan
from controller.simulation import simulate
from controller.states import AttemptState
from drivers.base import VmState, VmStatus
from policies.packing import Shape
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world
from tests.controller.test_checkpointing import BATHTUB
from tests.controller.test_scheduler_edges import HeldStarts, submit

BOOT_S = 60.0


def checkpointable_bag() -> dict:
    return bag(30, runtime_s=4 * 3600, checkpointable=True, checkpoint_cost_s=10, max_attempts=40)


async def run(tmp_path: Path, notice_lead_s: float) -> dict:
    cfg = config(
        **BATHTUB,
        **{
            "scheduler.max_vms": 10,
            "simulation.boot_delay_s": BOOT_S,
            "simulation.notice_lead_s": notice_lead_s,
        },
    )
    result = await simulate(checkpointable_bag(), cfg, seed=5, state_dir=tmp_path)
    assert result.bag["state"] == "succeeded"
    check_store_consistent(tmp_path)
    return result.bag


@pytest.mark.slow
async def test_with_notices_a_bag_loses_next_to_no_work(tmp_path):
    without = await run(tmp_path / "none", 0.0)
    noticed = await run(tmp_path / "gce", 30.0)
    assert without["usage"]["interrupted_attempts"] > 5
    assert without["usage"]["lost_hours"] > 1.0
    # The target: at most a tenth of the work lost without notices (here none at all).
    assert noticed["usage"]["lost_hours"] <= 0.1 * without["usage"]["lost_hours"]
    # Every job still succeeded once (check_store_consistent), and the moves are recorded.
    moved = rows(
        tmp_path / "gce",
        "SELECT count(*) FROM attempts WHERE state = 'lost' AND reason LIKE "
        "'migrated: spot notice on vm-%'",
    )[0][0]
    assert moved >= without["usage"]["interrupted_attempts"] / 2


@pytest.mark.slow
async def test_a_moved_job_resumes_on_a_vm_launched_at_the_notice(tmp_path):
    await run(tmp_path, 30.0)
    moves = rows(
        tmp_path,
        "SELECT idx, number, ended_at FROM attempts WHERE reason LIKE 'migrated: spot notice%'",
    )
    assert moves
    gaps = []
    for idx, number, ended_at in moves:
        (started_at,) = rows(
            tmp_path,
            f"SELECT started_at FROM attempts WHERE idx = {idx} AND number = {number + 1}",
        )[0]
        gaps.append(started_at - ended_at)
    # A VM launched only when the job was queued again would take a whole boot (60 s);
    # launched at the notice, its boot overlaps the checkpoint.
    assert max(gaps) < 2 * BOOT_S and sorted(gaps)[len(gaps) // 2] < BOOT_S, gaps
    assert min(gaps) >= 0


def view(vm_id: str, state: VmState, free: int, attempts: int, **extra) -> VmView:
    return VmView(
        vm_id,
        "small",
        "z",
        state,
        Shape(2, 0, 4.0),
        Shape(free, 0, 2.0 * free),
        attempts,
        None if attempts else 0.0,
        **extra,
    )


def snapshot(vms: list[VmView], expected: int, alive: int) -> Snapshot:
    return Snapshot(
        now=100.0,
        demand=[DemandGroup("b1", Shape(1, 0, 1.0), 0, None, None, 1.0, expected)],
        vms=vms,
        catalog=[CatalogType("small", "z", Shape(2, 0, 4.0), 0.02)],
        alive_vms=alive,
        max_vms=10,
        idle_timeout_s=30.0,
    )


def test_the_planner_launches_for_a_noticed_vms_jobs():
    noticed = view("vm-old", VmState.RUNNING, 0, 2, draining="spot notice: ends within 30 s")
    decision = plan(snapshot([noticed], expected=2, alive=0))
    assert [(launch.vm_type, launch.count) for launch in decision.launches] == [("small", 1)]
    assert decision.places == []  # nothing is placed: the jobs still run where they are


def test_an_idle_vm_with_room_is_kept_for_them_instead():
    noticed = view("vm-old", VmState.RUNNING, 0, 2, draining="spot notice: ends within 30 s")
    idle = view("vm-idle", VmState.RUNNING, 2, 0)
    decision = plan(replace(snapshot([noticed, idle], expected=2, alive=1), now=10_000.0))
    assert decision.launches == []
    # Idle far past its timeout, but kept: the noticed VM's jobs will need it.
    assert "vm-idle" not in [t.vm_id for t in decision.terminations]


# --- notices heard on the VM (the Slurm node poll's NodeNotice) -----------------------


async def running_world(tmp_path: Path, executor_cls=None):
    """Two checkpointable 1-h jobs running on one VM (the sim driver, virtual clock)."""
    cfg = config(**{"scheduler.max_vms": 2})
    clock = SimClock(0.0)
    executor = (executor_cls or SimExecutor)(
        now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2)
    )
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    spec = bag(2, runtime_s=3600, checkpointable=True, checkpoint_cost_s=5)
    await submit(scheduler, cfg, spec)
    return scheduler, clock, executor


def the_vm(scheduler):
    (vm,) = [v for v in scheduler.world.vms.values() if v.attempts]
    return vm


async def test_a_notice_heard_on_the_vm_moves_its_jobs_and_the_drivers_then_changes_nothing(
    tmp_path,
):
    scheduler, clock, _ = await running_world(tmp_path)
    await run_until(scheduler, clock, 600)
    vm = the_vm(scheduler)
    attempts = [scheduler.world.attempts[a] for a in vm.attempts]
    assert [a.state for a in attempts] == [AttemptState.RUNNING] * 2
    scheduler.inbox.on_attempt_event(NodeNotice(vm.id, 600.0, 630.0, "spot notice: ends by ..."))
    await scheduler.tick()
    assert vm.notice_until == 630.0 and vm.draining.startswith("spot notice")
    assert all(a.migrating == f"spot notice on {vm.id}" for a in attempts)
    # The driver's notice, later and saying another end: the first one stands.
    scheduler.inbox.push(replace(vm_status(scheduler, vm), notice_until=700.0, changed_at=601.0))
    clock.advance_to(601.0)
    await scheduler.tick()
    assert vm.notice_until == 630.0
    await run_until(scheduler, clock, 3 * 3600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM jobs") == [("succeeded",)] * 2
    moved = rows(tmp_path, "SELECT count(*) FROM attempts WHERE reason LIKE 'migrated: spot%'")
    assert moved == [(2,)]
    check_store_consistent(tmp_path)


async def test_a_rebalance_heard_on_the_vm_drains_it_and_its_jobs_finish_there(tmp_path):
    scheduler, clock, _ = await running_world(tmp_path)
    await run_until(scheduler, clock, 600)
    vm = the_vm(scheduler)
    scheduler.inbox.on_attempt_event(
        NodeNotice(vm.id, 600.0, None, "spot rebalance: recommended at T")
    )
    await scheduler.tick()
    assert vm.notice_until is None and vm.draining == "spot rebalance: recommended at T"
    assert not any(scheduler.world.attempts[a].migrating for a in vm.attempts)
    await run_until(scheduler, clock, 3 * 3600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state, vm_id FROM attempts") == [("succeeded", vm.id)] * 2
    ((state, reason),) = rows(tmp_path, f"SELECT state, reason FROM vms WHERE id = '{vm.id}'")
    assert state == "terminated" and "spot rebalance" in reason
    check_store_consistent(tmp_path)


async def test_attempts_not_started_on_a_noticed_vm_start_elsewhere(tmp_path):
    scheduler, clock, executor = await running_world(tmp_path, HeldStarts)
    await run_until(scheduler, clock, 59)  # the VM boots until 60
    clock.advance_to(61)
    await scheduler.tick(background_starts=True)  # handed to the VM, not started
    vm = the_vm(scheduler)
    assert [scheduler.world.attempts[a].state for a in vm.attempts] == [AttemptState.STARTING] * 2
    scheduler.inbox.on_attempt_event(
        NodeNotice(vm.id, 61.0, None, "spot rebalance: recommended at T")
    )
    stopping = asyncio.create_task(scheduler.tick(background_starts=True))
    await asyncio.sleep(0.1)
    executor.gate.set()
    await stopping
    await run_until(scheduler, clock, 3 * 3600)
    await scheduler.store.close()
    first = rows(tmp_path, "SELECT state, vm_id FROM attempts WHERE number = 1")
    assert first == [("lost", vm.id)] * 2
    again = rows(tmp_path, "SELECT state, vm_id FROM attempts WHERE number = 2")
    assert [s for s, _ in again] == ["succeeded"] * 2 and vm.id not in {v for _, v in again}
    check_store_consistent(tmp_path)


def vm_status(scheduler, vm) -> VmStatus:
    return VmStatus(
        vm.provider_id, vm.id, vm.vm_type.name, vm.state, vm.zone, "", vm.requested_at, 0.0
    )


async def test_a_notice_heard_before_a_restart_still_moves_the_vms_jobs(tmp_path):
    """The attempts' moves live in memory; the notice is stored with the VM. A scheduler
    rebuilt while the notice runs asks the VM's jobs to checkpoint and move again (without
    it they would run on to the VM's end and lose their work since their last checkpoint)."""
    first, clock, executor = await running_world(tmp_path)
    await run_until(first, clock, 600)
    vm = the_vm(first)
    first.inbox.on_attempt_event(NodeNotice(vm.id, 600.0, 1200.0, "spot notice: ends by ..."))
    await first.tick()
    assert vm.notice_until == 1200.0
    assert rows(tmp_path, f"SELECT notice_until FROM vms WHERE id = '{vm.id}'") == [(1200.0,)]
    second = await world(
        tmp_path,
        clock,
        1,
        config(**{"scheduler.max_vms": 2}),
        store=first.store,
        driver=first.driver,
        executor=executor,
    )
    await second.recover()
    noticed = second.world.vms[vm.id]
    assert noticed.notice_until == 1200.0 and noticed.draining
    moving = [second.world.attempts[a] for a in noticed.attempts]
    assert len(moving) == 2
    assert all(a.migrating == f"spot notice on {vm.id}" for a in moving)
    await run_until(second, clock, 3 * 3600)
    await second.store.close()
    assert rows(tmp_path, "SELECT state FROM jobs") == [("succeeded",)] * 2
    moved = rows(
        tmp_path,
        f"SELECT count(*) FROM attempts WHERE vm_id = '{vm.id}' AND reason LIKE 'migrated: spot%'",
    )
    assert moved == [(2,)]
    check_store_consistent(tmp_path)
