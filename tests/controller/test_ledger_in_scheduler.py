"""The CPU-hour ledger in the real scheduler and store, on the virtual clock: admission
reserves or refuses, attempts are charged what they used, held jobs wait for credit,
and after a crash the charges still equal the attempts' recorded usage exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.errors import InsufficientBalance, NotFound
from controller.simulation import simulate
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world

HOUR = 3600.0


def credit_config(cpu_h: float, **extra):
    return config(**{"ledger.new_accounts": "credit", "ledger.new_account_cpu_h": cpu_h, **extra})


def check_ledger(state_dir: Path) -> dict[str, float]:
    """From the store alone: every reservation reserved once and settled once (a charge
    and a release, or a release), charges = rate × time of every ended attempt, and
    nothing left reserved. Returns the sums per kind."""
    entries = rows(state_dir, "SELECT kind, cpu_h, key FROM ledger WHERE kind != 'credit'")
    kinds = Counter((key, kind) for kind, _, key in entries)
    assert all(n == 1 for n in kinds.values())
    keys = {key for _, _, key in entries}
    for key in keys:
        assert (key, "reserve") in kinds and (key, "release") in kinds, key
    charged = {key: cpu_h for kind, cpu_h, key in entries if kind == "charge"}
    for bag_id, idx, number, started_at, ended_at, spec in rows(
        state_dir,
        "SELECT a.bag_id, a.idx, a.number, a.started_at, a.ended_at, b.spec FROM attempts a "
        "JOIN bags b ON b.id = a.bag_id",
    ):
        resources = json.loads(spec)["resources"]
        rate = resources["cpus"] + 20 * resources["gpus"]
        assert charged.pop(f"{bag_id}:{idx}:{number}") == pytest.approx(
            rate * (ended_at - started_at) / HOUR, abs=1e-9
        )
    assert not charged  # no charge without its attempt
    sums = dict(rows(state_dir, "SELECT kind, sum(cpu_h) FROM ledger GROUP BY kind"))
    assert sums.get("reserve", 0) == pytest.approx(
        sums.get("charge", 0) + sums.get("release", 0), abs=1e-9
    )
    return sums


async def test_a_bag_the_account_cannot_cover_is_refused_with_the_numbers(tmp_path):
    cfg = credit_config(5.0)
    spec = bag(10, runtime_s=HOUR)  # max_runtime 4 h: 4 CPU-hours per job
    with pytest.raises(InsufficientBalance) as refused:
        await simulate(spec, cfg, seed=1, state_dir=tmp_path)
    error = refused.value
    assert error.status == 402
    assert error.detail["needed_cpu_h"] == pytest.approx(40.0)
    assert error.detail["available_cpu_h"] == pytest.approx(5.0)
    assert error.detail["jobs_it_can_cover"] == 1
    assert "a shorter max_runtime_s" in error.message.lower()
    assert rows(tmp_path, "SELECT count(*) FROM bags") == [(0,)]
    assert rows(tmp_path, "SELECT count(*) FROM ledger") == [(0,)]  # the new account too
    refuse = config(**{"ledger.new_accounts": "refuse"})
    with pytest.raises(NotFound, match="does not exist"):
        await simulate(spec, refuse, seed=1, state_dir=tmp_path / "refuse")


async def test_held_jobs_run_as_reservations_are_released(tmp_path):
    # 3 jobs' reservations of 4 CPU-hours, and enough for the last one's after 9 charges.
    cfg = credit_config(14.0)
    spec = bag(10, runtime_s=HOUR, on_insufficient_balance="hold")
    result = await simulate(spec, cfg, seed=1, state_dir=tmp_path)
    assert result.bag["state"] == "succeeded" and result.bag["counts"]["succeeded"] == 10
    held = rows(
        tmp_path,
        "SELECT count(DISTINCT entity_id) FROM transitions WHERE from_state = 'held' "
        "AND to_state = 'queued'",
    )[0][0]
    assert held == 7
    sums = check_ledger(tmp_path)
    assert sums["credit"] == 14.0
    assert sums["charge"] == pytest.approx(10.0, abs=1e-6)  # 10 one-hour jobs on 1 cpu
    # Never more reserved than the account had: at most 3 jobs ran at once.
    assert rows(tmp_path, "SELECT count(*) FROM vms")[0][0] <= 2
    check_store_consistent(tmp_path)


async def test_preempted_attempts_are_charged_and_retries_reserve_again(tmp_path):
    cfg = credit_config(400.0, **{"preemption.model": "exponential", "preemption.mttf_h": 1.5})
    spec = bag(12, runtime_s=HOUR, max_attempts=20, resources={"cpus": 2, "memory_gb": 1})
    result = await simulate(spec, cfg, seed=3, state_dir=tmp_path)
    assert result.bag["state"] == "succeeded"
    assert result.bag["usage"]["interrupted_attempts"] > 0
    sums = check_ledger(tmp_path)
    attempts = rows(tmp_path, "SELECT sum(ended_at - started_at) FROM attempts")[0][0]
    assert sums["charge"] == pytest.approx(2 * attempts / HOUR)
    # Not charging preemptions: only the successful attempts are charged.
    free = credit_config(
        400.0,
        **{
            "preemption.model": "exponential",
            "preemption.mttf_h": 1.5,
            "ledger.charge_preempted": False,
        },
    )
    await simulate(spec, free, seed=3, state_dir=tmp_path / "free")
    charged = rows(tmp_path / "free", "SELECT sum(cpu_h) FROM ledger WHERE kind = 'charge'")[0][0]
    successes = rows(
        tmp_path / "free",
        "SELECT sum(ended_at - started_at) FROM attempts WHERE state = 'succeeded'",
    )[0][0]
    assert charged == pytest.approx(2 * successes / HOUR)


async def test_a_retry_the_account_cannot_cover_waits_held_until_credit(tmp_path):
    # 4.5 CPU-hours: the first attempt reserves 4 and, failing with a retryable code
    # after an hour, is charged 1; its retry needs 4 and 3.5 are left.
    cfg = credit_config(4.5)
    clock = SimClock(1_000_000.0)
    scheduler = await world(tmp_path, clock, 4, cfg)
    spec = bag(
        1,
        runtime_s=HOUR,
        max_attempts=3,
        retryable_exit_codes=[75],
        simulation={"failure_probability": 1.0, "failure_exit_code": 75},
    )
    await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=10,
        offload=False,
    )
    await run_until(scheduler, clock, clock.now() + 20 * HOUR)
    state, reason = rows(tmp_path, "SELECT state, reason FROM jobs")[0]
    assert state == "held"
    assert "needs 4.00 CPU-hours and account 'a' has 3.50 available" in reason
    assert scheduler.accounts.view("a")["held_jobs"] == 1
    # Credit arrives (as the API gives it): the job runs its remaining attempts.
    scheduler.accounts.credit("a", 100.0)
    await scheduler.store.append_ledger([(clock.now(), "a", "credit", 100.0, "", "top-up")])
    scheduler.credited()
    await run_until(scheduler, clock, clock.now() + 60 * HOUR)
    assert not scheduler.has_work()
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state, attempts FROM jobs") == [("failed", 3)]
    sums = check_ledger(tmp_path)
    assert sums["charge"] == pytest.approx(3.0)


async def test_after_a_crash_the_charges_still_equal_the_recorded_usage(tmp_path):
    cfg = credit_config(200.0, **{"preemption.model": "exponential", "preemption.mttf_h": 2.0})
    clock = SimClock(1_000_000.0)
    first = await world(tmp_path, clock, 1, cfg)
    await admit(
        bag(8, runtime_s=HOUR, max_attempts=20, on_insufficient_balance="hold"),
        store=first.store,
        scheduler=first,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=100,
        offload=False,
    )
    await run_until(first, clock, clock.now() + 1.5 * HOUR)
    # Crash: memory, VMs and processes are gone; a new scheduler rebuilds from the store.
    second = await world(tmp_path, clock, 2, cfg, store=first.store)
    await second.recover()
    before = second.accounts.view("a")
    assert before["reserved_cpu_h"] == pytest.approx(
        sum(cpu_h for _, cpu_h in second.accounts.ledger.open.values())
    )
    await run_until(second, clock, clock.now() + 40 * HOUR)
    assert not second.has_work()
    after = second.accounts.view("a")
    await second.store.close()
    sums = check_ledger(tmp_path)
    assert rows(tmp_path, "SELECT count(*) FROM attempts WHERE state = 'lost'")[0][0] >= 1
    assert after["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-9)
    assert after["charged_cpu_h"] == pytest.approx(sums["charge"])
    assert after["available_cpu_h"] == pytest.approx(200.0 - sums["charge"])
