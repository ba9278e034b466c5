"""The real scheduler and store on the virtual clock: retries, failures, cancellation,
recovery, accounting — checked against what the store says."""

from __future__ import annotations

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.errors import InvalidBag, NoVmTypeFits
from controller.simulation import simulate
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world


async def test_a_bag_without_preemptions_packs_the_cheapest_slots(tmp_path):
    result = await simulate(bag(20), config(), seed=1, state_dir=tmp_path)
    view = result.bag
    assert view["state"] == "succeeded" and view["counts"]["succeeded"] == 20
    assert view["usage"]["attempts"] == 20 and view["usage"]["interrupted_attempts"] == 0
    # small: $0.01 per 1-cpu slot-hour beats big's $0.015: 5 small VMs, 10 slots, 2 rounds of 1 h.
    assert rows(tmp_path, "SELECT DISTINCT vm_type FROM vms") == [("small",)]
    assert rows(tmp_path, "SELECT count(*) FROM vms") == [(5,)]
    assert view["elapsed_s"] == pytest.approx(60 + 2 * 3600 + 1, abs=5)
    # docs/design.md#cost-reports: the jobs split their VMs' cost, and what no job held (a VM's time
    # before its first job and idle before release) is shared among the bags on it. The
    # only bag pays its VMs' whole life: each job holds half a small VM (1 of 2 cpus), so
    # 20 job-hours are 10 VM-hours, plus the VMs' time without a job.
    ((life_h, spot_usd, on_demand_usd),) = rows(
        tmp_path,
        "SELECT sum(ended_at - running_at) / 3600.0, "
        "sum((ended_at - running_at) * spot_price_per_hour) / 3600.0, "
        "sum((ended_at - running_at) * on_demand_price_per_hour) / 3600.0 FROM vms",
    )
    assert life_h > 10.0
    assert view["usage"]["vm_hours"] == pytest.approx(life_h, rel=1e-9)
    assert view["usage"]["spot_cost_usd"] == pytest.approx(spot_usd, rel=1e-9)
    assert view["usage"]["on_demand_cost_usd"] == pytest.approx(on_demand_usd, rel=1e-9)
    assert view["usage"]["cost_final"] and view["usage"]["cost_as_of"] >= view["finished_at"]
    # So, alone on its VMs, the bag's cost is the fleet's.
    assert result.fleet["total"]["vm_hours"] == pytest.approx(view["usage"]["vm_hours"])
    assert result.fleet["total"]["spot_cost_usd"] == pytest.approx(view["usage"]["spot_cost_usd"])
    check_store_consistent(tmp_path)


async def test_preempted_attempts_are_retried_and_the_run_is_deterministic(tmp_path):
    cfg = config(**{"preemption.model": "exponential", "preemption.mttf_h": 2.0})
    spec = bag(40, simulation={"runtime_cv": 0.3})
    first = await simulate(spec, cfg, seed=11, state_dir=tmp_path / "a")
    again = await simulate(spec, cfg, seed=11, state_dir=tmp_path / "b")
    other = await simulate(spec, cfg, seed=12, state_dir=tmp_path / "c")
    assert first.bag["state"] == "succeeded" and first.bag["counts"]["succeeded"] == 40
    assert first.bag["usage"]["interrupted_attempts"] > 0
    assert first.bag["usage"]["attempts"] == 40 + first.bag["usage"]["interrupted_attempts"]
    for key in ("usage", "counts", "elapsed_s"):
        assert first.bag[key] == again.bag[key]
    assert first.fleet == again.fleet
    assert other.bag["usage"] != first.bag["usage"]
    retried = rows(tmp_path / "a", "SELECT count(*) FROM jobs WHERE attempts > 1")[0][0]
    assert retried > 0
    check_store_consistent(tmp_path / "a")


async def test_jobs_that_keep_getting_preempted_fail_after_max_attempts(tmp_path):
    # VMs live 30 minutes on average; 4-hour jobs almost never finish in 2 attempts.
    cfg = config(**{"preemption.model": "exponential", "preemption.mttf_h": 0.5})
    result = await simulate(
        bag(5, runtime_s=4 * 3600, max_attempts=2), cfg, seed=3, state_dir=tmp_path
    )
    assert result.bag["state"] == "failed"
    failed = rows(tmp_path, "SELECT attempts, reason FROM jobs WHERE state = 'failed'")
    assert failed and all(n == 2 and "gave up after max_attempts=2" in why for n, why in failed)
    check_store_consistent(tmp_path)


async def test_nonzero_exit_fails_the_job_unless_the_code_is_retryable(tmp_path):
    failing = bag(30, simulation={"failure_probability": 0.5, "failure_exit_code": 3})
    result = await simulate(failing, config(), seed=5, state_dir=tmp_path / "plain")
    failed = rows(
        tmp_path / "plain", "SELECT attempts, exit_code, reason FROM jobs WHERE state = 'failed'"
    )
    assert result.bag["state"] == "failed" and 5 < len(failed) < 25
    assert all(row == (1, 3, "exited with code 3") for row in failed)

    retryable = dict(failing, retryable_exit_codes=[3], max_attempts=10)
    result = await simulate(retryable, config(), seed=5, state_dir=tmp_path / "retry")
    assert result.bag["state"] == "succeeded"
    assert result.bag["usage"]["attempts"] > 30
    check_store_consistent(tmp_path / "retry")


async def test_attempts_over_max_runtime_time_out_and_fail(tmp_path):
    spec = bag(3, runtime_s=100, max_runtime_s=50)
    spec["estimated_runtime_s"] = None
    spec["simulation"] = {"runtime_s": 100}
    result = await simulate(spec, config(), seed=0, state_dir=tmp_path)
    assert result.bag["counts"]["failed"] == 3
    assert rows(tmp_path, "SELECT DISTINCT reason FROM jobs") == [("exceeded max_runtime_s=50",)]


async def test_idle_vms_are_released_after_the_idle_timeout(tmp_path):
    cfg = config(**{"scheduler.idle_timeout_s": 600.0})
    result = await simulate(bag(2, runtime_s=3600), cfg, seed=0, state_dir=tmp_path)
    (ended_after_s,) = rows(tmp_path, "SELECT max(ended_at) - min(running_at) FROM vms")[0]
    # Boot, one hour of work, then ten idle minutes (plus the 1 s scheduler tick).
    assert ended_after_s == pytest.approx(3600 + 600, abs=3)
    assert rows(tmp_path, "SELECT DISTINCT reason FROM vms") == [("idle for 600 s",)]
    assert result.fleet["total"]["vm_hours"] == pytest.approx((3600 + 600) / 3600, abs=0.01)


async def test_admission_rejects_what_no_vm_can_run(tmp_path):
    with pytest.raises(NoVmTypeFits) as caught:
        await simulate(
            bag(1, resources={"cpus": 4, "memory_gb": 64}), config(), state_dir=tmp_path / "a"
        )
    assert "memory_gb=64" in caught.value.message and "big" in caught.value.message
    with pytest.raises(InvalidBag):
        await simulate(
            bag(1, resources={"cpus": 1, "vm_types": ["nope"]}), config(), state_dir=tmp_path / "b"
        )


async def test_a_crashed_scheduler_recovers_from_the_store(tmp_path):
    cfg = config()
    clock = SimClock(1_000_000.0)
    first = await world(tmp_path, clock, 1, cfg)
    row, _ = await admit(
        bag(12, runtime_s=1800),
        store=first.store,
        scheduler=first,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=1000,
        offload=False,
    )
    await run_until(first, clock, clock.now() + 3600)  # one round done, the second running
    view = await first.store.get_bag(row["id"])
    assert view["counts"].get("succeeded") == 10 and view["counts"].get("running") == 2
    # Crash: the first scheduler's memory, VMs and running attempts are simply gone.
    second = await world(tmp_path, clock, 2, cfg)  # same database, new driver and executor
    await second.recover()
    assert len(second.world.jobs) == 2 and len(second.world.vms) == 0
    await run_until(second, clock, clock.now() + 10 * 3600)
    assert not second.has_work()
    await second.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("lost", 2),
        ("succeeded", 12),
    ]
    lost_jobs = rows(tmp_path, "SELECT attempts, counted_attempts FROM jobs WHERE attempts > 1")
    assert lost_jobs == [(2, 1), (2, 1)]  # the lost attempt is numbered but not counted
    check_store_consistent(tmp_path)


async def test_cancelling_a_bag_stops_running_attempts_and_releases_vms(tmp_path):
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    row, _ = await admit(
        bag(30),
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=0.0,
        max_jobs=1000,
        offload=False,
    )
    await run_until(scheduler, clock, 1800)
    scheduler.cancel_requested(row["id"])
    await run_until(scheduler, clock, 10 * 3600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM jobs GROUP BY state") == [("cancelled", 30)]
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("cancelled", 10)
    ]
    (finished_at,) = rows(tmp_path, "SELECT finished_at FROM bags")[0]
    assert finished_at == pytest.approx(1801, abs=2)  # at once, not after the jobs' hour
    check_store_consistent(tmp_path)


async def test_launch_failures_back_off_and_other_types_are_used(tmp_path):
    cfg = config(**{"scheduler.launch_backoff_s": 300.0})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    real_launch = scheduler.driver.launch
    calls: list[tuple[float, str]] = []

    async def flaky_launch(request):
        calls.append((clock.now(), request.vm_type.name))
        if request.vm_type.name == "small" and clock.now() < 1000:
            from drivers.base import CapacityError

            raise CapacityError("no small capacity")
        return await real_launch(request)

    scheduler.driver.launch = flaky_launch
    await admit(
        bag(4),
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=0.0,
        max_jobs=1000,
        offload=False,
    )
    await run_until(scheduler, clock, 20 * 3600)
    await scheduler.store.close()
    # The first small launches failed; while small was backed off the planner used big.
    assert calls[0] == (0.0, "small")
    assert any(t == "big" for _, t in calls)
    assert (
        rows(
            tmp_path,
            "SELECT count(*) FROM vms WHERE state = 'failed' AND reason LIKE 'launch failed: no small%'",
        )[0][0]
        >= 1
    )
    assert rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]
    check_store_consistent(tmp_path)
