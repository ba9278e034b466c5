"""Preemption notices in the scheduler, on the virtual clock (docs/design.md#checkpoint-notices):
a noticed VM takes no new job, its checkpointable jobs checkpoint and move to a VM
launched at the notice, and a bag loses next to no work; the planner keeps or launches
a VM for a noticed VM's jobs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from controller.planner import CatalogType, DemandGroup, Snapshot, VmView, plan
from controller.simulation import simulate
from drivers.base import VmState
from policies.packing import Shape
from tests.controller.simworld import bag, check_store_consistent, config, rows
from tests.controller.test_checkpointing import BATHTUB

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
