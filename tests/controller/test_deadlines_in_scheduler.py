"""The deadline policy drives real launches: the real scheduler and store on the sim
driver's virtual clock. A bag whose deadline spot alone cannot meet (VMs preempted
every hour or so, jobs that cannot checkpoint) turns slots on-demand and meets it; a
bag with ample slack never launches an on-demand VM; `on_demand: always` uses only
on-demand VMs; the sim driver never preempts an on-demand VM."""

from __future__ import annotations

import json
import sqlite3

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world

HOUR = 3600.0
START = 1_800_000_000.0


def deadline_config(**overrides):
    # One small type (2 slots of a 1-cpu job), 5 VMs: 10 slots.
    base = {"vm_types": [config().vm_types[0]], "scheduler.max_vms": 5}
    base.update(overrides)
    return config(**base)


async def submit(scheduler, clock, cfg, bag_id: str, n: int, **extra) -> None:
    await admit(
        bag(n, runtime_s=HOUR, **extra),
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=bag_id,
        now=clock.now(),
        max_jobs=100,
        offload=False,
    )


def vm_markets(state_dir) -> dict[str, int]:
    """How many VMs were launched on each market, from the store."""
    found = rows(state_dir, "SELECT spot, count(*) FROM vms GROUP BY spot")
    return {("spot" if spot else "on_demand"): n for spot, n in found}


def finished(state_dir, bag_id: str) -> tuple[str, float | None, float | None]:
    ((state, finished_at, deadline_at),) = rows(
        state_dir, f"SELECT state, finished_at, deadline_at FROM bags WHERE id = '{bag_id}'"
    )
    return state, finished_at, deadline_at


async def run_tight_bag(state_dir, on_demand: str) -> None:
    # 20 one-hour jobs that cannot checkpoint on 10 slots: two rounds, 2 h on on-demand
    # VMs; on spot VMs that live 3 h on average some are lost and run again.
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})
    clock = SimClock(START)
    scheduler = await world(state_dir, clock, 3, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", 20, deadline="3h", on_demand=on_demand)
    await run_until(scheduler, clock, START + 12 * HOUR)
    await scheduler.store.flush()
    check_store_consistent(state_dir)


async def test_a_deadline_spot_cannot_meet_escalates_to_on_demand_and_is_met(tmp_path):
    # Spot alone (the same seed, on_demand: never) misses the deadline.
    await run_tight_bag(tmp_path / "spot", "never")
    _, finished_at, deadline_at = finished(tmp_path / "spot", "b0000000001")
    assert finished_at is not None and deadline_at is not None and finished_at > deadline_at
    assert vm_markets(tmp_path / "spot") == {"spot": vm_markets(tmp_path / "spot")["spot"]}

    await run_tight_bag(tmp_path / "escalated", "when_needed")
    state, finished_at, deadline_at = finished(tmp_path / "escalated", "b0000000001")
    assert deadline_at == START + 3 * HOUR
    assert state == "succeeded"
    assert finished_at is not None and finished_at <= deadline_at
    markets = vm_markets(tmp_path / "escalated")
    assert markets.get("on_demand", 0) >= 1 and markets.get("spot", 0) >= 1
    # Late, not early: spot first, on-demand VMs once the slack ran short.
    ((first_spot, first_on_demand),) = rows(
        tmp_path / "escalated",
        "SELECT min(CASE WHEN spot = 1 THEN requested_at END), "
        "min(CASE WHEN spot = 0 THEN requested_at END) FROM vms",
    )
    assert first_spot == START and first_on_demand > START + HOUR / 4
    # The sim driver never preempts an on-demand VM, and jobs succeeded on them.
    assert rows(
        tmp_path / "escalated", "SELECT count(*) FROM vms WHERE spot = 0 AND state = 'preempted'"
    ) == [(0,)]
    on_demand_successes = rows(
        tmp_path / "escalated",
        "SELECT count(*) FROM attempts a JOIN vms v ON v.id = a.vm_id "
        "WHERE a.state = 'succeeded' AND v.spot = 0",
    )[0][0]
    assert on_demand_successes >= 1


async def test_a_bag_with_ample_slack_never_launches_on_demand(tmp_path):
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 24.0})
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 4, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", 20, deadline="48h")
    await run_until(scheduler, clock, START + HOUR / 2)
    # The policy was consulted and said so: no slot on on-demand, the deadline safe.
    view = scheduler.deadlines.view("b0000000001")
    assert view is not None
    assert view["on_demand_slots"] == 0 and not view["at_risk"]
    assert view["p_meet"] > 0.99
    assert START < view["finish"]["p50"] <= view["finish"]["p95"] < START + 48 * HOUR
    await run_until(scheduler, clock, START + 12 * HOUR)
    await scheduler.store.flush()
    state, finished_at, deadline_at = finished(tmp_path, "b0000000001")
    assert state == "succeeded" and finished_at is not None and finished_at <= deadline_at
    markets = vm_markets(tmp_path)
    assert markets["spot"] >= 5 and "on_demand" not in markets
    assert scheduler.deadlines.view("b0000000001") is None  # the bag ended: forgotten
    check_store_consistent(tmp_path)


async def test_always_uses_only_on_demand_vms_and_they_are_never_preempted(tmp_path):
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 0.5})
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 5, cfg)
    # A budget with room: its attempts are reserved and charged, at the on-demand price.
    await submit(scheduler, clock, cfg, "b0000000001", 20, on_demand="always", budget_usd=50)
    await run_until(scheduler, clock, START + 12 * HOUR)
    await scheduler.store.flush()
    state, finished_at, _ = finished(tmp_path, "b0000000001")
    assert state == "succeeded"
    markets = vm_markets(tmp_path)
    assert set(markets) == {"on_demand"}
    assert rows(tmp_path, "SELECT count(*) FROM vms WHERE state = 'preempted'") == [(0,)]
    # One attempt per job: nothing was preempted.
    assert rows(tmp_path, "SELECT count(*) FROM attempts") == [(20,)]
    # Each job held half a small VM for an hour at the on-demand $0.08/h (spot: $0.02/h).
    ((charged,),) = rows(tmp_path, "SELECT sum(charged_usd) FROM budget_reservations")
    assert charged == pytest.approx(20 * 0.08 / 2)
    # Two rounds of one-hour jobs on 10 slots, plus boots.
    assert finished_at is not None and finished_at <= START + 2.2 * HOUR
    check_store_consistent(tmp_path)


async def test_a_restart_keeps_the_deadline_and_the_on_demand_vms(tmp_path):
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 3, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", 20, deadline="3h")
    # Run until the policy has turned slots on-demand, then restart the scheduler on
    # the same store, driver and executor (the VMs and jobs live on).
    for _ in range(40):
        await run_until(scheduler, clock, clock.now() + 300)
        if any(not vm.spot for vm in scheduler.world.vms.values()):
            break
    on_demand = {vm_id for vm_id, vm in scheduler.world.vms.items() if not vm.spot}
    assert on_demand
    await scheduler.store.flush()
    second = await world(
        tmp_path,
        clock,
        3,
        cfg,
        store=scheduler.store,
        driver=scheduler.driver,
        executor=scheduler.executor,
        ids=scheduler.planning.ids,
    )
    await second.recover()
    assert second.world.bags["b0000000001"].deadline_at == START + 3 * HOUR
    assert {vm_id for vm_id, vm in second.world.vms.items() if not vm.spot} >= on_demand
    await run_until(second, clock, START + 12 * HOUR)
    await second.store.flush()
    state, finished_at, deadline_at = finished(tmp_path, "b0000000001")
    assert state == "succeeded" and finished_at is not None and finished_at <= deadline_at


async def test_a_deadline_no_slot_count_can_meet_is_at_risk_and_told_once(tmp_path):
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 3, cfg)
    # One-hour jobs due in 30 minutes: not even on-demand VMs make it.
    await submit(scheduler, clock, cfg, "b0000000001", 20, deadline="30m")
    await run_until(scheduler, clock, START + HOUR / 4)
    view = scheduler.deadlines.view("b0000000001")
    assert view is not None and view["at_risk"] and view["p_meet"] < 0.5
    # At risk, every slot goes on-demand.
    assert view["on_demand_slots"] >= 10
    await run_until(scheduler, clock, START + 12 * HOUR)
    await scheduler.store.flush()
    told = rows(tmp_path, "SELECT bag_id, payload FROM events WHERE kind = 'deadline_at_risk'")
    assert [bag_id for bag_id, _ in told] == ["b0000000001"]  # once, not every projection
    payload = json.loads(told[0][1])
    assert payload["at"] == START + HOUR / 2 and payload["at_risk"] is True


async def test_an_at_risk_notice_whose_pass_failed_to_write_is_told_after_the_recovery(tmp_path):
    """The pass that first finds the bag at risk fails to write (the disk, say): the
    scheduler recovers from the store, and the bag, still at risk, is told then."""
    cfg = deadline_config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 3, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", 20, deadline="30m")
    store, apply = scheduler.store, scheduler.store.apply
    failed = []

    async def apply_failing_the_first_at_risk(batch):
        if not failed and any(e.kind == "deadline_at_risk" for e in batch.events):
            failed.append(batch)
            raise sqlite3.OperationalError("disk I/O error")
        return await apply(batch)

    store.apply = apply_failing_the_first_at_risk
    while not failed and clock.now() < START + HOUR / 4:
        try:
            await scheduler.tick()
        except sqlite3.OperationalError:
            break
        clock.advance_to(clock.now() + 1.0)
    assert failed, "no pass found the bag at risk"
    await scheduler.recover()  # as Scheduler.run does after a failed pass
    await run_until(scheduler, clock, START + 12 * HOUR)
    await store.flush()
    told = rows(tmp_path, "SELECT bag_id FROM events WHERE kind = 'deadline_at_risk'")
    assert told == [("b0000000001",)]
