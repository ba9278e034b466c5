"""Edge paths of the scheduler: odd event orders, restarts at awkward moments,
failing passes, launch failures. Each test is a scenario that once went wrong."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.executors.base import AttemptEvent, NodeEvent, Outcome
from controller.executors.sim import SimExecutor
from controller.planner import CatalogType, DemandGroup, Launch, Snapshot, plan
from controller.scheduler import loop as scheduler_module
from drivers.base import CapacityError, LaunchRequest, VmState, VmType
from policies.packing import Shape
from tests.controller.simworld import bag, check_store_consistent, config, rows, run_until, world


async def submit(scheduler, cfg, spec, bag_id="b0000000001"):
    row, _ = await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=bag_id,
        now=scheduler.clock.now(),
        max_jobs=10_000,
        offload=False,
    )
    return row["id"]


def test_planner_backoff_with_a_type_that_does_not_fit():
    # "small" cannot hold the job and is not backed off; "big" can and is.
    small = CatalogType("small", "z", Shape(2, 0, 4.0), 0.01)
    big = CatalogType("big", "z", Shape(8, 0, 32.0), 0.1)
    snapshot = Snapshot(
        now=100.0,
        demand=[DemandGroup("b", Shape(4, 0, 8.0), 1)],
        vms=[],
        catalog=[small, big],
        alive_vms=0,
        max_vms=4,
        idle_timeout_s=60.0,
        blocked_until={"big": 130.0},
    )
    result = plan(snapshot)
    assert result.launches == [] and result.next_wake_at == 130.0
    assert plan(Snapshot(**{**snapshot.__dict__, "now": 131.0})).launches == [Launch("big", 1, "b")]


async def test_restart_while_a_cancelled_bag_still_has_attempts_being_killed(tmp_path):
    cfg = config()
    clock = SimClock(0.0)
    first = await world(tmp_path, clock, 1, cfg)
    bag_id = await submit(first, cfg, bag(6))
    await run_until(first, clock, 600)
    # The cancel is recorded (jobs cancelled) but the kills have not been confirmed yet.
    await first.store.request_cancel(bag_id, clock.now())
    batch = first.store.new_batch()
    first.commands.run(batch, [scheduler_module._Cancel(bag_id)], clock.now())
    await first.store.apply(batch)
    assert rows(tmp_path, "SELECT count(*) FROM attempts WHERE state = 'running'") == [(6,)]
    # Crash. The new controller must start, and finish the bag as cancelled.
    second = await world(tmp_path, clock, 2, cfg)
    await second.recover()
    await run_until(second, clock, 3 * 3600)
    await second.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [("lost", 6)]
    check_store_consistent(tmp_path)


async def test_a_bag_no_type_fits_any_more_fails_with_a_reason_and_others_go_on(tmp_path):
    cfg = config()
    clock = SimClock(0.0)
    first = await world(tmp_path, clock, 1, cfg)
    big_only = await submit(
        first, cfg, bag(2, resources={"cpus": 6, "memory_gb": 8}), "b0000000001"
    )
    await first.store.close()
    # Restart with a catalog that lost the big type, and a new bag that fits.
    small_only = config(
        vm_types=[
            {
                "name": "small",
                "cpus": 2,
                "memory_gb": 4,
                "spot_price_per_hour": 0.02,
                "on_demand_price_per_hour": 0.08,
            }
        ]
    )
    second = await world(tmp_path, clock, 2, small_only)
    await second.recover()
    await submit(second, small_only, bag(2), "b0000000002")
    await run_until(second, clock, 4 * 3600)
    await second.store.close()
    assert rows(tmp_path, "SELECT id, state FROM bags ORDER BY id") == [
        (big_only, "failed"),
        ("b0000000002", "succeeded"),
    ]
    reasons = rows(tmp_path, f"SELECT DISTINCT reason FROM jobs WHERE bag_id = '{big_only}'")
    assert len(reasons) == 1 and reasons[0][0].startswith("no VM type fits cpus=6")
    check_store_consistent(tmp_path)


async def test_a_rebuild_keeps_running_vms_and_releases_them_when_idle(tmp_path):
    cfg = config(**{"scheduler.idle_timeout_s": 120.0})
    clock = SimClock(0.0)
    first = await world(tmp_path, clock, 1, cfg)
    await submit(first, cfg, bag(2, runtime_s=600))
    await run_until(first, clock, 120)
    assert len(first.world.vms) == 1 and len(first.world.attempts) == 2
    # Same driver and executor (a rebuild after a failed pass, not a crash).
    second = await world(
        tmp_path, clock, 2, cfg, store=first.store, driver=first.driver, executor=first.executor
    )
    await second.recover()
    assert len(second.world.vms) == 1 and len(second.world.attempts) == 2  # re-adopted, not lost
    await run_until(second, clock, 4 * 3600)
    await second.store.close()
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("succeeded", 2)
    ]
    assert rows(tmp_path, "SELECT state, reason FROM vms") == [("terminated", "idle for 120 s")]
    check_store_consistent(tmp_path)


async def test_a_failing_pass_rebuilds_from_the_store_and_loses_no_input(tmp_path, monkeypatch):
    cfg = config(**{"scheduler.poll_interval_s": 0.01})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    await submit(scheduler, cfg, bag(2, runtime_s=60))
    await run_until(scheduler, clock, 61)  # both jobs start at t=60 (boot), end at t=120
    real_plan = scheduler_module.plan
    failures = []

    def flaky_plan(snapshot):
        if not failures:
            failures.append(snapshot.now)
            raise RuntimeError("injected planner failure")
        return real_plan(snapshot)

    monkeypatch.setattr(scheduler_module, "plan", flaky_plan)
    clock.advance_to(121)  # the jobs' end events wait in the inbox
    assert scheduler.has_inputs()
    task = asyncio.create_task(scheduler.run(describe=False))
    for _ in range(300):
        await asyncio.sleep(0.01)
        if rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]:
            break
    scheduler.stop()
    await task
    await scheduler.store.close()
    assert failures, "the injected failure happened"
    assert rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("succeeded", 2)
    ]


async def test_repeated_failures_stop_the_loop(tmp_path, monkeypatch):
    cfg = config(**{"scheduler.poll_interval_s": 0.01})
    scheduler = await world(tmp_path, SimClock(0.0), 1, cfg)

    def broken(snapshot):
        raise RuntimeError("always broken")

    monkeypatch.setattr(scheduler_module, "plan", broken)
    with pytest.raises(RuntimeError, match="always broken"):
        await asyncio.wait_for(scheduler.run(describe=False, max_failures=3), 10)
    await scheduler.store.close()


async def test_shutdown_records_ends_that_arrived_before_it(tmp_path):
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    await submit(scheduler, cfg, bag(2, runtime_s=600))
    await run_until(scheduler, clock, 120)
    clock.advance_to(700)  # both attempts ended; nobody handled their events yet
    await scheduler.shutdown(vms_die_with_controller=True)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("succeeded", 2)
    ]
    assert rows(tmp_path, "SELECT state FROM bags") == [("succeeded",)]


async def test_a_success_before_a_cancel_stays_a_success(tmp_path):
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    bag_id = await submit(scheduler, cfg, bag(3, runtime_s=600))  # two run, one waits
    await run_until(scheduler, clock, 650)  # the two end at 660
    clock.advance_to(661)
    scheduler.cancel_requested(bag_id)  # the cancel comes after their exits
    await run_until(scheduler, clock, 3600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM jobs ORDER BY idx") == [
        ("succeeded",),
        ("succeeded",),
        ("cancelled",),
    ]
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]


async def test_a_live_vm_the_controller_gave_up_on_is_terminated(tmp_path):
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    # A launch that raised after the cloud had made the VM (e.g. a timeout).
    stray = await scheduler.driver.launch(LaunchRequest("vm-stray", VmType("small", 2, 4.0)))
    clock.advance_to(100)  # it boots; its status names a token nobody tracks
    await scheduler.tick()
    status = (await scheduler.driver.describe([stray.vm_id]))[stray.vm_id]
    assert status.state is VmState.TERMINATED
    await scheduler.store.close()


async def test_backoff_is_counted_once_per_pass_and_decays(tmp_path):
    cfg = config(**{"scheduler.launch_backoff_s": 10.0, "scheduler.launch_backoff_max_s": 300.0})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)

    async def no_capacity(request):
        raise CapacityError("none left")

    scheduler.driver.launch = no_capacity
    await submit(
        scheduler, cfg, bag(10, resources={"cpus": 1, "memory_gb": 1, "vm_types": ["small"]})
    )
    await scheduler.tick()  # five small launches fail in one pass
    assert scheduler.backoff.types["small"] == (10.0, 10.0)
    clock.advance_to(15.0)
    await scheduler.tick()  # fails again soon after the back-off ended: doubled
    assert scheduler.backoff.types["small"] == (35.0, 20.0)
    clock.advance_to(2000.0)
    await scheduler.tick()  # a failure long after: back to the base delay
    assert scheduler.backoff.types["small"] == (2010.0, 10.0)
    # Spot launches failed: on-demand launches of the type are not held back by it.
    assert scheduler.backoff.on_demand_types == {}
    assert scheduler.backoff.blocked_types(spot=False) == {}
    await scheduler.store.close()


@pytest.mark.processes
async def test_an_attempt_killed_by_an_unknown_signal_still_ends(tmp_path):
    import time

    from controller.executors.local import LocalExecutor

    executor = LocalExecutor(tmp_path, controller_id=f"edges{os.getpid()}", now=time.time)
    events: list[AttemptEvent] = []
    executor.subscribe(lambda e: events.append(e) if isinstance(e, AttemptEvent) else None)
    from tests.controller.test_local_executor import spec

    # `exec`: the program itself is the attempt's process and dies of the signal.
    await executor.start(
        spec('exec python3 -c "import os, signal; os.kill(os.getpid(), signal.SIGRTMIN + 6)"')
    )
    for _ in range(200):
        if events:
            break
        await asyncio.sleep(0.02)
    (event,) = events
    assert event.outcome is Outcome.EXITED and event.exit_code == 128 + signal.SIGRTMIN + 6
    assert event.detail.startswith(f"killed by signal {signal.SIGRTMIN + 6}")


async def test_a_big_bag_is_cancelled_a_chunk_per_pass_and_none_of_it_starts(tmp_path):
    """Cancelling thousands of waiting jobs takes several short passes (the event loop
    serves requests in between); meanwhile no job of the bag is placed, and in the end
    every job is cancelled and every reservation released."""
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    n = 2 * scheduler_module.CANCEL_CHUNK + 10
    bag_id = await submit(scheduler, cfg, bag(n))
    await scheduler.tick()  # admitted: queued, VMs being launched
    await scheduler.store.request_cancel(bag_id, clock.now())
    scheduler.cancel_requested(bag_id)
    passes = 0
    while bag_id in scheduler.world.bags:  # until the bag is finished
        await scheduler.tick()
        passes += 1
        assert not scheduler.world.attempts  # nothing of a cancelled bag starts
        assert passes <= 10
    assert passes == 3  # CANCEL_CHUNK + CANCEL_CHUNK + 10 jobs
    await run_until(scheduler, clock, 600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM jobs GROUP BY state") == [("cancelled", n)]
    check_store_consistent(tmp_path)


class JoiningSimExecutor(SimExecutor):
    """The sim executor with VMs that join a cluster, as Slurm's nodes do: a VM's node
    is seen up by a later poll (half a second after it is watched)."""

    joins_vms = True

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        def up() -> None:
            for listener in self._listeners:
                listener(NodeEvent(vm_id, self._now(), True, "node up"))

        self._call_at(self._now() + 0.5, up)


async def test_a_rebuild_does_not_take_joined_vms_for_ones_that_never_booted(tmp_path):
    """VMs older than boot_timeout_s that had joined before a rebuild (a restart, a failed
    pass) wait to be seen joined again; the pass before that must not end them as VMs
    that "did not boot" (with their running jobs)."""
    cfg = config(**{"scheduler.boot_timeout_s": 900.0})
    clock = SimClock(1_000_000.0)
    executor = JoiningSimExecutor(
        now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(1)
    )
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    await submit(scheduler, cfg, bag(4, runtime_s=7200))
    await run_until(scheduler, clock, clock.now() + 1200)  # past the boot timeout
    running = {vm.id for vm in scheduler.world.vms.values() if vm.ready and vm.attempts}
    assert running and len(scheduler.world.attempts) == 4
    await scheduler.recover()
    await scheduler.tick()  # before the executor says the nodes are up again
    assert not [vm.reason for vm in scheduler.world.vms.values() if vm.terminating]
    await run_until(scheduler, clock, clock.now() + 5)
    assert {vm.id for vm in scheduler.world.vms.values() if vm.ready} == running
    assert len(scheduler.world.attempts) == 4
    await scheduler.store.close()


class HeldStarts(SimExecutor):
    """The sim executor with its starts held until `gate` opens: a start that takes long
    (the local executor's fork and exec on a busy host)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gate = asyncio.Event()

    async def start(self, spec):
        await self.gate.wait()
        return await super().start(spec)


async def test_starts_in_the_background_are_recorded_by_the_next_pass(tmp_path):
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    executor = HeldStarts(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    await submit(scheduler, cfg, bag(2, runtime_s=600))
    await run_until(scheduler, clock, 59)  # the VM boots until 60
    clock.advance_to(61)
    await scheduler.tick(background_starts=True)  # the pass ends, its starts under way
    assert rows(tmp_path, "SELECT state FROM attempts") == [("starting",), ("starting",)]
    executor.gate.set()
    await asyncio.wait(list(scheduler.calls.starting))
    await scheduler.tick(background_starts=True)
    assert rows(tmp_path, "SELECT state, ran_at FROM attempts") == [("running", 61.0)] * 2
    await run_until(scheduler, clock, 3600)
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM jobs") == [("succeeded",)] * 2
    check_store_consistent(tmp_path)


async def test_a_cancel_waits_for_the_starts_under_way_so_none_runs_after_it(tmp_path):
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    executor = HeldStarts(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    bag_id = await submit(scheduler, cfg, bag(2, runtime_s=600))
    await run_until(scheduler, clock, 59)
    clock.advance_to(61)
    await scheduler.tick(background_starts=True)
    scheduler.cancel_requested(bag_id)
    cancelling = asyncio.create_task(scheduler.tick(background_starts=True))
    await asyncio.sleep(0.1)
    # The executor is not told to stop attempts it has not got yet (it would not know
    # them, and they would start after the cancel and run to their end).
    assert not cancelling.done()
    executor.gate.set()
    await cancelling
    await run_until(scheduler, clock, 3600)
    await scheduler.store.close()
    # Ended when cancelled, not when the jobs would have ended (661).
    cancelled = ("cancelled", "cancelled", 61.0)
    assert rows(tmp_path, "SELECT state, reason, ended_at FROM attempts") == [cancelled] * 2
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]
    check_store_consistent(tmp_path)


HOUR_S = 3600.0


class QueuedStarts(SimExecutor):
    """The sim executor as an executor that queues attempts (the local one): what start()
    returns is no run yet, and gives no reference; the start comes as AttemptStarted."""

    queues_attempts = True


async def test_starts_a_queueing_executor_took_cost_no_second_transaction(tmp_path, monkeypatch):
    """A pass writes its intents and hands them over; an executor that queues them gives
    back nothing to record (no reference, no state: AttemptStarted says when one runs),
    so the pass commits once, not a second time for rows it would write unchanged."""
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    executor = QueuedStarts(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    await submit(scheduler, cfg, bag(2, runtime_s=600))
    await run_until(scheduler, clock, 59)  # the VM boots until 60
    clock.advance_to(61)
    written: list[str] = []
    write = scheduler.store.write

    async def counted(fn, *args):
        written.append(fn.__name__)
        return await write(fn, *args)

    monkeypatch.setattr(scheduler.store, "write", counted)
    await scheduler.tick()
    assert written == ["apply_batch"]  # the intents, once
    assert rows(tmp_path, "SELECT state, ran_at FROM attempts") == [("starting", None)] * 2
    await scheduler.store.close()


async def test_the_daemons_loop_runs_a_pass_at_most_every_min_pass_interval(tmp_path):
    """Woken all the time (as by a busy host's job ends), the daemon's loop still starts
    a pass at most every MIN_PASS_INTERVAL_S: what comes meanwhile waits for the next."""
    import time

    cfg = config(**{"scheduler.max_vms": 1})
    scheduler = await world(tmp_path, SimClock(0.0), 1, cfg)
    running = asyncio.create_task(scheduler.run(describe=False))
    await asyncio.sleep(0.05)
    began, ticks = time.monotonic(), scheduler.ticks
    while time.monotonic() - began < 0.3:
        scheduler.inbox.wake.set()  # what every attempt event does
        await asyncio.sleep(0)
    passes, took_s = scheduler.ticks - ticks, time.monotonic() - began
    scheduler.stop()
    await asyncio.wait_for(running, 5)
    await scheduler.store.close()
    assert 5 <= passes <= took_s / scheduler_module.MIN_PASS_INTERVAL_S + 1


class Backlogged(SimExecutor):
    """The sim executor as one whose queue refills VMs without the scheduler (the local
    one), `backlogged` as a test sets it."""

    backlog_pass_interval_s = 0.05
    backlog = True

    def backlogged(self) -> bool:
        return self.backlog


async def passes_while_woken(scheduler, seconds: float) -> tuple[int, float]:
    """(passes, seconds) of the daemon's loop woken all the time for `seconds`."""
    import time

    began, ticks = time.monotonic(), scheduler.ticks
    while time.monotonic() - began < seconds:
        scheduler.inbox.wake.set()  # what every attempt event does
        await asyncio.sleep(0)
    return scheduler.ticks - ticks, time.monotonic() - began


async def test_the_daemons_loop_spaces_its_passes_while_the_executors_queue_keeps_vms_busy(
    tmp_path,
):
    """Woken all the time, the loop passes at most every backlog_pass_interval_s while
    the executor is backlogged (every VM has attempts waiting in its queue), and every
    MIN_PASS_INTERVAL_S again the moment it is not."""
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    executor = Backlogged(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    running = asyncio.create_task(scheduler.run(describe=False))
    await asyncio.sleep(0.05)
    spaced, spaced_s = await passes_while_woken(scheduler, 0.4)
    executor.backlog = False
    paced, paced_s = await passes_while_woken(scheduler, 0.3)
    scheduler.stop()
    await asyncio.wait_for(running, 5)
    await scheduler.store.close()
    assert 2 <= spaced <= spaced_s / executor.backlog_pass_interval_s + 1
    # Unspaced, the same waking gives many more passes (up to one every 5 ms).
    assert paced / paced_s > 2 * spaced / spaced_s


async def test_the_executors_queue_is_deep_only_while_every_waiting_bag_is_short(tmp_path):
    """The queue's depth is one for every VM, whose queue takes the oldest bag's jobs
    first: an older bag of hour-long jobs waiting beside a bag of 2-ms jobs keeps it at
    queue_ahead (else a VM would take 16 VM-fulls of hours, review of 4743a49); alone,
    the short bag's queue is deep; and its jobs turning long end that at once, before
    its estimate is next re-read."""
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    executor = Backlogged(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    scheduler = await world(tmp_path, clock, 1, cfg, executor=executor)
    resources = {"cpus": 1, "memory_gb": 0.5, "vm_types": ["small"]}
    await submit(scheduler, cfg, bag(40, runtime_s=HOUR_S, resources=resources))
    await submit(scheduler, cfg, bag(400, runtime_s=1, resources=resources), "b0000000002")
    await run_until(scheduler, clock, 120)  # the VM runs the long bag's first jobs
    executor.queue_ahead = 1.0  # as the local executor's

    def depth() -> float:
        (view,) = [v for v in scheduler.planning.snapshot(clock.now()).vms if v.ahead]
        return (view.ahead.cpus + max(0, -view.free.cpus)) / view.capacity.cpus

    short = scheduler.world.bags["b0000000002"]
    short.runtimes_s.extend([0.002] * 30)  # 2-ms jobs succeeded
    short.refresh_estimate()
    assert depth() == 1.0  # the hour-long bag waits too
    scheduler.world.bags.pop("b0000000001")  # as if it had finished
    assert depth() == 16.0  # 2 * 0.05 s / 2 ms > 16: at most 16 VM-fulls
    short.runtimes_s.append(5.0)  # its latest success took 5 s
    assert short.runtime_estimate_s == 0.002  # not re-read yet
    assert depth() == 1.0


@pytest.mark.parametrize("checkpointed_before", [True, False])
async def test_a_program_killed_by_the_checkpoint_signal_it_handled_before_is_run_again(
    tmp_path, checkpointed_before
):
    """The checkpoint signal that reaches a program as it exits (Python restores the
    default action then) kills it: exit 128 + SIGUSR1. If the attempt had checkpointed
    before, that death is the controller's doing: LOST, not counted, and the job runs
    again from its checkpoint (a CI run of the Slurm spot-interruption test met this:
    exit 138 at the end of a 20-s program checkpointed every second, the bag failed).
    A program that never handled it fails as any exit code fails."""
    cfg = config(**{"scheduler.max_vms": 1})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    await submit(scheduler, cfg, bag(1, runtime_s=HOUR_S, checkpointable=True, max_attempts=1))
    await run_until(scheduler, clock, 120)
    (attempt,) = scheduler.world.attempts.values()
    if checkpointed_before:
        attempt.mark_at = attempt.started_at + 30
    attempt.signalled_at = clock.now()
    scheduler.inbox.push(
        AttemptEvent(attempt.id, clock.now(), Outcome.EXITED, 128 + signal.SIGUSR1, None)
    )
    await scheduler.tick()
    (state, reason), *_ = rows(tmp_path, "SELECT state, reason FROM attempts ORDER BY number")
    if checkpointed_before:
        assert (state, reason.startswith("killed by the checkpoint signal")) == ("lost", True)
        await run_until(scheduler, clock, 300)
        # Run again though max_attempts is 1: the lost attempt does not count.
        assert rows(tmp_path, "SELECT state, counted_attempts FROM jobs") == [("running", 0)]
        assert rows(tmp_path, "SELECT state FROM attempts ORDER BY number") == [
            ("lost",),
            ("running",),
        ]
    else:
        assert state == "failed"
        assert rows(tmp_path, "SELECT state FROM jobs") == [("failed",)]
    await scheduler.store.close()


async def test_nodes_that_break_in_successive_passes_are_each_terminated(tmp_path):
    """VMs to terminate at once reach the pass through one list the event handlers
    append to: a node that breaks after an earlier pass took that list is terminated
    too (issue 25: a pass once replaced the list, and the handlers kept the old one)."""
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    resources = {"cpus": 2, "memory_gb": 1, "vm_types": ["small"]}
    await submit(scheduler, cfg, bag(2, runtime_s=7200, resources=resources))
    await run_until(scheduler, clock, 120)
    vm_ids = sorted(v.id for v in scheduler.world.vms.values() if v.state is VmState.RUNNING)
    assert len(vm_ids) == 2
    for vm_id in vm_ids:
        scheduler.note(NodeEvent(vm_id, clock.now(), False, "slurmd died"))
        await run_until(scheduler, clock, clock.now() + 5)
    ended = rows(tmp_path, f"SELECT state, reason FROM vms WHERE id IN {tuple(vm_ids)} ORDER BY id")
    assert ended == [("terminated", "its node broke: slurmd died")] * 2
    await scheduler.store.close()
