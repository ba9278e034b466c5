"""Why a job waits and how fast its bag goes (controller/scheduler/waiting.py), read from
the real scheduler's state on the virtual clock: held for credit, a VM booting, the
fleet at max_vms, backing off after failed launches or starts; and the bag's pace."""

from __future__ import annotations

import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.executors.base import ExecutorUnavailable
from controller.scheduler.runs import VmRun, capacity_of
from controller.scheduler.waiting import bag_pace, waiting_reason
from drivers.base import VmState
from tests.controller.simworld import bag, config, run_until, world

HOUR = 3600.0


async def admitted(tmp_path, cfg, spec, clock):
    scheduler = await world(tmp_path, clock, 4, cfg)
    await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=clock.now(),
        max_jobs=100,
        offload=False,
    )
    return scheduler


async def test_a_held_job_says_what_its_account_lacks(tmp_path):
    # 4 CPU-hours an attempt (max_runtime 4 h on 1 CPU), 5 in the account: one job runs.
    cfg = config(**{"ledger.new_accounts": "credit", "ledger.new_account_cpu_h": 5.0})
    clock = SimClock(1_000_000.0)
    spec = bag(3, runtime_s=HOUR, on_insufficient_balance="hold")
    scheduler = await admitted(tmp_path, cfg, spec, clock)
    await run_until(scheduler, clock, clock.now() + 10)
    assert waiting_reason(scheduler, "b0000000001", 2, clock.now()) == (
        "held for credit: an attempt needs 4.00 CPU-hours and account 'a' has 1.00 "
        "available (a credit releases it)"
    )
    await scheduler.store.close()


async def test_a_queued_job_waits_for_a_booting_vm_then_for_a_slot(tmp_path):
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(1_000_000.0)
    # A job fills a "small" VM (2 CPUs); one VM at most.
    spec = bag(3, runtime_s=HOUR, resources={"cpus": 2, "memory_gb": 1, "vm_types": ["small"]})
    scheduler = await admitted(tmp_path, cfg, spec, clock)
    await run_until(scheduler, clock, clock.now() + 5)  # the VM boots for 60 s
    now = clock.now()
    assert waiting_reason(scheduler, "b0000000001", 2, now) == (
        "waiting for a VM to boot (1 VM starting)"
    )
    await run_until(scheduler, clock, clock.now() + 120)
    assert waiting_reason(scheduler, "b0000000001", 2, clock.now()) == (
        "waiting for a free slot: the fleet is at max_vms = 1 and its VMs are busy"
    )
    # The executor cannot take attempts: it backs off, and says until when.
    scheduler.backoff.after_starts(
        ExecutorUnavailable("out of file descriptors"), clock.now(), False
    )
    reason = waiting_reason(scheduler, "b0000000001", 2, clock.now())
    assert reason.startswith("backing off: the sim executor could not take attempts; next try in")
    await scheduler.store.close()


async def test_a_job_whose_types_all_failed_to_launch_says_so(tmp_path):
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(1_000_000.0)
    spec = bag(3, runtime_s=HOUR, resources={"cpus": 2, "memory_gb": 1, "vm_types": ["small"]})
    scheduler = await admitted(tmp_path, cfg, spec, clock)
    await run_until(scheduler, clock, clock.now() + 5)
    # A failed launch of the only type it may use (the scheduler's own back-off, as a pass
    # that saw it fail records it).
    small = scheduler.world.catalog["small"]
    failed = VmRun("vm-x", small, VmState.PENDING, clock.now(), free=capacity_of(small))
    scheduler.backoff.after_launches([(failed, None, RuntimeError("quota"))], clock.now())
    reason = waiting_reason(scheduler, "b0000000001", 2, clock.now())
    assert reason.startswith("backing off: launches of small failed; next try in"), reason
    await scheduler.store.close()


async def test_the_pace_is_the_rate_of_the_last_job_ends(tmp_path):
    cfg = config(**{"scheduler.max_vms": 2})
    clock = SimClock(1_000_000.0)
    spec = bag(40, runtime_s=600.0)
    scheduler = await admitted(tmp_path, cfg, spec, clock)
    assert bag_pace(scheduler, "b0000000001", clock.now()) is None  # nothing ended yet
    await run_until(scheduler, clock, clock.now() + 1800)
    run = scheduler.world.bags["b0000000001"]
    ends = list(run.recent_ends)
    assert len(ends) >= 2
    pace = bag_pace(scheduler, "b0000000001", clock.now())
    assert pace is not None
    per_s = (len(ends) - 1) / (ends[-1] - ends[0])
    assert pace["jobs_per_hour"] == pytest.approx(3600 * per_s)
    assert pace["eta_s"] == pytest.approx(run.open_jobs / per_s)
    assert pace["open_jobs"] == run.open_jobs == 40 - len(ends)
    await scheduler.store.close()
