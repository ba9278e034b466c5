"""Budgets in the real scheduler and store on the sim driver's virtual clock: two bags
of one account run at once under its budget, never pass it, stop exactly where the
next attempt would pass it (held: budget, budget_reached), and go on to the end once
it is raised (finished). A restart rebuilds the dollar book from the store."""

from __future__ import annotations

import json

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from tests.controller.simworld import bag, config, rows, run_until, world

HOUR = 3600.0
# A 1-cpu, 1 GB job takes half of a "small" VM (2 cpus, 4 GB, $0.02/h): $0.01/h. Its
# attempts reserve their worst case, max_runtime 4 h: $0.04; a job runs 1 h: $0.01.
PER_ATTEMPT_USD = 0.04
PER_JOB_USD = 0.01


def budget_config():
    return config(**{"preemption.model": "none", "vm_types": [config().vm_types[0]]})


def spent_and_reserved(state_dir) -> tuple[float, float]:
    ((charged, reserved),) = rows(
        state_dir,
        "SELECT coalesce(sum(charged_usd), 0), coalesce(sum(CASE WHEN settled_at IS NULL "
        "THEN reserved_usd END), 0) FROM budget_reservations",
    )
    return charged, reserved


async def submit(scheduler, clock, cfg, bag_id: str, **extra) -> None:
    await admit(
        bag(20, runtime_s=HOUR, **extra),
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=bag_id,
        now=clock.now(),
        max_jobs=100,
        offload=False,
    )


async def test_two_bags_of_one_account_stop_exactly_at_its_budget_and_go_on_when_raised(tmp_path):
    cfg = budget_config()
    clock = SimClock(1_800_000_000.0)  # 2027-01-15: one calendar month throughout
    scheduler = await world(tmp_path, clock, 1, cfg)
    cap = 0.30
    scheduler.budgets.set_account_cap("a", cap)
    await submit(scheduler, clock, cfg, "b0000000001")
    await submit(scheduler, clock, cfg, "b0000000002")
    # Step through the run, checking the cap at every step from the store alone.
    for _ in range(40):
        await run_until(scheduler, clock, clock.now() + HOUR / 2)
        await scheduler.store.flush()
        charged, reserved = spent_and_reserved(tmp_path)
        assert charged + reserved <= cap + 1e-9
    assert scheduler.world.bags and not scheduler.world.attempts  # both held, nothing running
    charged, reserved = spent_and_reserved(tmp_path)
    assert reserved == pytest.approx(0.0, abs=1e-12)
    # Stopped exactly at it: the next attempt would pass the cap, the last one did not.
    assert charged + PER_ATTEMPT_USD > cap + 1e-9
    assert charged <= cap + 1e-9
    succeeded = rows(tmp_path, "SELECT count(*) FROM jobs WHERE state = 'succeeded'")[0][0]
    assert charged == pytest.approx(succeeded * PER_JOB_USD)
    # The older bag goes first (the planner's order) and finished within the budget; the
    # other ran as far as the budget let it and waits, held.
    assert rows(tmp_path, "SELECT id, state FROM bags ORDER BY id") == [
        ("b0000000001", "succeeded"),
        ("b0000000002", "active"),
    ]
    assert list(scheduler.world.bags) == ["b0000000002"]
    assert scheduler.budgets.held["b0000000002"].why.startswith("account 'a' this month")
    assert (
        0
        < rows(
            tmp_path,
            "SELECT count(*) FROM jobs WHERE bag_id = 'b0000000002' AND state = 'succeeded'",
        )[0][0]
        < 20
    )
    # No VM is left for the held bag: launches stopped too.
    assert not scheduler.world.vms
    reached = rows(tmp_path, "SELECT bag_id, payload FROM events WHERE kind = 'budget_reached'")
    told = [b for b, _ in reached]
    assert "b0000000002" in told and len(told) == len(set(told))  # once per bag at most
    assert all("held: budget: account 'a'" in json.loads(p)["held"] for _, p in reached)

    # A restart rebuilds the book from the store: the same figures, still held.
    second = await world(tmp_path, clock, 2, cfg, store=scheduler.store)
    await second.recover()
    second.budgets.set_account_cap("a", cap)  # (an admin's PATCH writes it to the store)
    assert second.budgets.book.account_spent[("a", "2027-01")] == pytest.approx(charged)
    await run_until(second, clock, clock.now() + 2 * HOUR)
    assert list(second.world.bags) == ["b0000000002"] and not second.world.attempts

    second.budgets.set_account_cap("a", None)  # raised: no cap
    second.credited()
    await run_until(second, clock, clock.now() + 40 * HOUR)
    assert not second.world.bags
    await second.store.flush()
    assert rows(tmp_path, "SELECT count(*) FROM jobs WHERE state = 'succeeded'") == [(40,)]
    ended = rows(tmp_path, "SELECT bag_id FROM events WHERE kind = 'finished' ORDER BY bag_id")
    assert ended == [("b0000000001",), ("b0000000002",)]
    await second.store.close()


async def test_a_bag_budget_holds_its_bag_only(tmp_path):
    cfg = budget_config()
    clock = SimClock(1_800_000_000.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", budget_usd=0.1)
    await submit(scheduler, clock, cfg, "b0000000002")
    await run_until(scheduler, clock, clock.now() + 30 * HOUR)
    await scheduler.store.flush()
    assert list(scheduler.world.bags) == ["b0000000001"]
    charged = rows(
        tmp_path,
        "SELECT sum(charged_usd) FROM budget_reservations WHERE bag_id = 'b0000000001'",
    )[0][0]
    assert charged <= 0.1 + 1e-9 and charged + PER_ATTEMPT_USD > 0.1 + 1e-9
    # The other bag, without a budget, reserved nothing in dollars and finished.
    assert rows(
        tmp_path, "SELECT count(*) FROM budget_reservations WHERE bag_id = 'b0000000002'"
    ) == [(0,)]
    assert rows(tmp_path, "SELECT state FROM bags WHERE id = 'b0000000002'") == [("succeeded",)]
    await scheduler.store.close()


async def test_a_deadline_escalates_only_to_the_on_demand_vms_its_budget_pays_for(tmp_path):
    """A bag at risk of missing its deadline wants every slot on-demand; its budget pays
    for two on-demand attempts ($0.16 worst case each: half of a $0.08/h VM for 4 h) and
    then two on spot ($0.04 each) of its $0.40. No on-demand VM is launched that the
    budget then refuses to use (each ran an attempt), and the cap is never passed."""
    cfg = config(
        **{
            "preemption.model": "exponential",
            "preemption.mttf_h": 3.0,
            "vm_types": [config().vm_types[0]],
        }
    )
    clock = SimClock(1_800_000_000.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    await submit(scheduler, clock, cfg, "b0000000001", deadline="30m", budget_usd=0.40)
    await run_until(scheduler, clock, clock.now() + HOUR / 2)
    await scheduler.store.flush()
    on_demand = rows(
        tmp_path,
        "SELECT v.id, count(a.vm_id) FROM vms v LEFT JOIN attempts a ON a.vm_id = v.id "
        "WHERE v.spot = 0 GROUP BY v.id",
    )
    assert on_demand, "the deadline did not escalate"
    assert all(n > 0 for _, n in on_demand), on_demand
    attempts = rows(
        tmp_path,
        "SELECT v.spot, count(*) FROM attempts a JOIN vms v ON v.id = a.vm_id GROUP BY v.spot",
    )
    assert dict(attempts) == {0: 2, 1: 2}
    charged, reserved = spent_and_reserved(tmp_path)
    assert charged + reserved <= 0.40 + 1e-9
