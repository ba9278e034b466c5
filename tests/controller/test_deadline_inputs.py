"""What the daemon tells the deadline policy (controller/scheduler/deadlines.py
`Deadlines._inputs`), from a World built by the scheduler's own methods: VMs tracked,
attempts placed and started as a planning pass does, a checkpoint written, a VM
preempted and its job queued again. Each input the simulator passes
(policies/deadline_sim.py) is checked against the value worked out by hand: the queue
in the scheduler's order with the retry's saved work taken off, each running spot
attempt's work left, VM age and unsaved work, the ages of the spot VMs the next
attempts would reuse, and whether spot can be launched (not while the launch back-off
blocks every type)."""

from __future__ import annotations

import numpy as np
import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.config import CheckpointConfig
from controller.executors.base import CheckpointEvent
from controller.scheduler.runs import AttemptRun, VmRun, capacity_of
from controller.store import WriteBatch
from drivers.base import VmState
from policies.deadline import deadline_checkpoint_interval_h, decide
from policies.index import Policy, TypeMarket
from tests.controller.simworld import bag, config, world

HOUR = 3600.0
START = 1_800_000_000.0
NOW = START + 0.9 * HOUR
BAG = "b0000000001"


def deadline_config():
    # small: 2 cpus, so two 1-cpu jobs a VM; big: 8 cpus, not allowed for the bag.
    return config(**{"preemption.model": "exponential", "preemption.mttf_h": 3.0})


async def scheduler_with_bag(tmp_path, checkpointing=None, **extra):
    cfg = deadline_config()
    clock = SimClock(START)
    scheduler = await world(tmp_path, clock, 1, cfg, checkpointing=checkpointing)
    spec = bag(8, runtime_s=HOUR, deadline="10h", **extra)
    spec["resources"]["vm_types"] = ["small"]
    await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=BAG,
        now=START,
        max_jobs=100,
        offload=False,
    )
    # The scheduler takes the bag at its next pass: as that pass does.
    commands, scheduler.inbox.commands = scheduler.inbox.commands, []
    scheduler.commands.run(WriteBatch(), commands, START)
    return scheduler


def running_vm(scheduler, vm_id: str, type_name: str, requested_at: float, spot=True) -> VmRun:
    world = scheduler.world
    vm_type = world.catalog[type_name]
    vm = VmRun(
        id=vm_id,
        vm_type=vm_type,
        state=VmState.RUNNING,
        requested_at=requested_at,
        spot=spot,
        zone=vm_type.zone,
        running_at=requested_at + 60,
        free=capacity_of(vm_type),
    )
    world.assume_model(vm)
    world.track_vm(vm)
    return vm


def place(scheduler, vm: VmRun, at: float, batch: WriteBatch, *, start=True) -> AttemptRun:
    """The next queued job onto the VM, as a planning pass records it; started (as the
    executor's answer is recorded) unless `start` is False."""
    world = scheduler.world
    run = world.bags[BAG]
    spec = scheduler.planning._new_attempt(run, vm, run.queue.popleft(), at, batch)
    world.refresh_vm_sets(vm)
    if start:
        scheduler.actions.record_starts([(spec, "ref", None)], batch, at)
    return world.attempts[spec.attempt_id]


def checkpoint(scheduler, attempt: AttemptRun, requested_at: float, at: float, batch) -> None:
    attempt.signalled_at = requested_at  # the checkpoint timer asked for it
    scheduler.events._on_checkpoint(CheckpointEvent(attempt.id, requested_at, at, True), batch)


async def test_each_input_the_simulator_passes_comes_from_the_world(tmp_path):
    scheduler = await scheduler_with_bag(tmp_path, checkpointable=True, checkpoint_cost_s=60)
    world, batch = scheduler.world, WriteBatch()
    run = world.bags[BAG]
    assert run.runtime_estimate_s == HOUR and list(run.queue) == list(range(8))

    # Jobs 0 and 1 on an old spot VM (2 h old at the start), job 2 on an on-demand VM.
    old = running_vm(scheduler, "vm-old", "small", START - 2 * HOUR)
    a0, a1 = place(scheduler, old, START, batch), place(scheduler, old, START, batch)
    on_demand = running_vm(scheduler, "vm-od", "small", START - HOUR / 2, spot=False)
    place(scheduler, on_demand, START, batch)
    # Job 3 checkpoints 15 min in (a minute to write it).
    doomed = running_vm(scheduler, "vm-doomed", "small", START)
    a3 = place(scheduler, doomed, START, batch)
    checkpoint(scheduler, a3, START + 900, START + 960, batch)
    # Job 4 is placed on a spot VM launched an hour before the start, half an hour in,
    # and has not yet begun to run; that VM has room for one more.
    roomy = running_vm(scheduler, "vm-roomy", "small", START - HOUR)
    a4 = place(scheduler, roomy, START + 0.5 * HOUR, batch, start=False)
    assert a4.ran_at is None
    # Job 0 checkpoints half an hour in; job 3's VM is preempted at 45 min.
    checkpoint(scheduler, a0, START + 1800, START + 1860, batch)
    world.end_vm(doomed, VmState.PREEMPTED, START + 0.75 * HOUR, "preempted", batch)
    assert a3.id not in world.attempts
    # An idle spot VM launched half an hour in (room for two); an idle on-demand VM and
    # a spot VM of a type the bag does not allow, which its next attempts do not take.
    running_vm(scheduler, "vm-idle", "small", START + HOUR / 2)
    running_vm(scheduler, "vm-idle-od", "small", START, spot=False)
    running_vm(scheduler, "vm-big", "big", START)

    inputs, times = scheduler.deadlines._inputs(run, NOW)

    # The queue as the scheduler takes it: job 3's retry first, resuming from its
    # checkpoint (15 of its 60 min saved), then jobs 5, 6 and 7 never run.
    assert list(run.queue) == [3, 5, 6, 7]
    assert inputs.queue_ordered is True
    assert inputs.queued_work_h == pytest.approx([0.75, 1.0, 1.0, 1.0])
    # Running spot attempts: (work left, VM age, work since the last checkpoint).
    # Job 0: 30 min saved, then 23 min since the checkpoint was written at 31 min.
    # Job 1: 54 min run, nothing saved. Job 4: not yet running, nothing done.
    spot = sorted(zip(inputs.spot_work_h, inputs.spot_age_h, inputs.spot_unsaved_h, strict=True))
    expected = sorted(
        [
            (1.0 - 0.5 - 23 / 60, 2.9, 23 / 60),
            (1.0 - 0.9, 2.9, 0.9),
            (1.0, 1.9, 0.0),
        ]
    )
    assert np.array(spot) == pytest.approx(np.array(expected))
    assert inputs.on_demand_left_h == pytest.approx([0.1])
    # The next attempts reuse the roomy spot VM (best fit first: one free slot), then
    # the idle one's two slots; not the on-demand VM nor the type not allowed.
    assert inputs.free_spot_age_h == pytest.approx([1.9, 0.4, 0.4])
    assert inputs.spot_available is True and inputs.spot_outage_h == 0.0
    assert a1.saved_s == 0.0 and a0.saved_s == 1800.0

    # The policy takes them as they are (one unsaved figure per running spot attempt).
    decision = decide(inputs, times, (), project=False)
    assert decision.on_demand_slots >= 1  # the one running there


async def test_spot_is_unavailable_while_every_allowed_type_is_backed_off(tmp_path):
    scheduler = await scheduler_with_bag(tmp_path)
    run = scheduler.world.bags[BAG]
    backoff = scheduler.backoff
    # Only a type the bag may not use is backed off: spot can be had.
    backoff.types["big"] = (NOW + 600, 300)
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.spot_available is True and inputs.spot_outage_h == 0.0
    # Its only allowed type backed off for 10 more minutes: not until then.
    backoff.types["small"] = (NOW + 600, 300)
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.spot_available is False
    assert inputs.spot_outage_h == pytest.approx(600 / HOUR)
    # The back-off over: available again.
    inputs, _ = scheduler.deadlines._inputs(run, NOW + 601)
    assert inputs.spot_available is True and inputs.spot_outage_h == 0.0


async def test_a_retry_that_cannot_checkpoint_is_queued_whole_and_loses_all_it_ran(tmp_path):
    scheduler = await scheduler_with_bag(tmp_path)  # not checkpointable
    world, batch = scheduler.world, WriteBatch()
    run = world.bags[BAG]
    vm = running_vm(scheduler, "vm-1", "small", START)
    place(scheduler, vm, START, batch)
    doomed = running_vm(scheduler, "vm-2", "small", START)
    place(scheduler, doomed, START, batch)
    world.end_vm(doomed, VmState.PREEMPTED, START + 0.5 * HOUR, "preempted", batch)
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert list(run.queue) == [1, 2, 3, 4, 5, 6, 7]  # the retry first
    assert inputs.queued_work_h == pytest.approx([1.0] * 7)
    assert inputs.spot_work_h == pytest.approx([0.1])
    assert inputs.spot_unsaved_h == pytest.approx([0.9])
    # vm-1's second slot is free: the next attempt reuses it.
    assert inputs.free_spot_age_h == pytest.approx([0.9])


async def test_spot_is_priced_at_the_hopping_markets_price_now(tmp_path):
    """The cost of staying on spot is the market's price now (the planner launches at
    it), not the configuration's; a type the market has no price for keeps the catalog's."""
    scheduler = await scheduler_with_bag(tmp_path)
    run = scheduler.world.bags[BAG]
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    # The catalog: small (2 cpus, two 1-cpu jobs) at 0.02 $/h spot, 0.08 on demand.
    assert inputs.spot_price_per_hour == pytest.approx(0.01)
    assert inputs.on_demand_price_per_hour == pytest.approx(0.04)

    def market(small_now: float) -> TypeMarket:
        return TypeMarket(
            policy=Policy.COST,
            names=("small", "big"),
            cpus=np.array([2.0, 8.0]),
            memory_gb=np.array([4.0, 32.0]),
            on_demand=np.array([0.08, 0.40]),
            bid=np.array([0.08, 0.40]),
            now_price=np.array([small_now, 0.1]),
            mean_price=np.array([small_now, 0.1]),
            std_price=np.zeros(2),
        )

    scheduler.world.market = market(0.05)  # spot's price rose
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.spot_price_per_hour == pytest.approx(0.025)
    assert inputs.on_demand_price_per_hour == pytest.approx(0.04)
    scheduler.world.market = market(float("nan"))  # no price known: the catalog's
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.spot_price_per_hour == pytest.approx(0.01)


@pytest.mark.slow  # builds completion-time tables for 3-h work: ~1 s
async def test_jobs_own_estimates_are_planned_scaled_by_what_finished_jobs_took(tmp_path):
    """`estimated_runtime_param`: each queued and running job is planned at its own
    estimate (not the bag's one figure for all), and once five jobs with one have
    succeeded, at it × Σ runtime / Σ estimate of those: right whatever order the jobs
    run in (the first to finish may be the longest)."""
    own_h = [2.0, 1.5, 1.0, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.125]
    scheduler = await scheduler_with_bag(
        tmp_path,
        parameters=None,
        points=[{"i": i, "est": h * HOUR} for i, h in enumerate(own_h)],
        estimated_runtime_param="est",
        max_runtime_s=4 * HOUR,
    )
    world, batch = scheduler.world, WriteBatch()
    run = world.bags[BAG]
    vm = running_vm(scheduler, "vm-1", "small", START)
    place(scheduler, vm, START, batch)  # job 0, 2 h, running since the start
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.queued_work_h == pytest.approx(own_h[1:])
    assert inputs.spot_work_h == pytest.approx([2.0 - 0.9])
    # Five jobs succeeded, each taking 1.5 × its estimate: the rest are planned at 1.5 ×.
    for i in range(1, 6):
        run.job_succeeded(1.5 * own_h[i] * HOUR, {"i": i, "est": own_h[i] * HOUR})
    assert run.estimate_scale() == pytest.approx(1.5)
    inputs, _ = scheduler.deadlines._inputs(run, NOW)
    assert inputs.queued_work_h == pytest.approx([1.5 * h for h in own_h[1:]])
    assert inputs.spot_work_h == pytest.approx([1.5 * 2.0 - 0.9])
    # One job's estimate (what the checkpoint bounds use) is the same figure.
    to_h = world.time_scale / HOUR
    every = scheduler.deadlines._own_estimates_h(run, run.runtime_estimate_s * to_h)
    one = [scheduler.deadlines._job_estimate_h(run, i, to_h) for i in range(len(own_h))]
    assert one == pytest.approx(list(every)) and one[0] == pytest.approx(3.0)
    # Without the parameter, the bag's one estimate (1 h) is every job's.
    plain = await scheduler_with_bag(tmp_path / "plain")
    inputs, _ = plain.deadlines._inputs(plain.world.bags[BAG], NOW)
    assert inputs.queued_work_h == pytest.approx([1.0] * 8)


async def test_a_spot_attempt_near_its_deadline_checkpoints_within_the_deadlines_bounds(
    tmp_path,
):
    """With the deadline near (1 h jobs, 1.8 h to go), a spot attempt's next checkpoint
    is the DP's (19-20 min: the exponential fit's MTTF is 3 h) clipped to the bounds
    `deadline_checkpoint_interval_h` gives for its work and the hours to the policy's
    switch (deadline − lag − launch) from its last checkpoint: the bound the policy's
    last round counts on (`DeadlineInputs.checkpoint_h`). With 1.32 h to go the DP's
    interval is too long (a preemption just before it would leave the retry too little
    time) and the longest bound (15 min) is taken; with 1.2 h no plan fits, and the
    DP's stands. Early in the bag, on an on-demand VM, for a bag that does not
    escalate, and for Uniform Progress's, there are no bounds."""
    scheduler = await scheduler_with_bag(tmp_path, checkpointable=True, checkpoint_cost_s=60)
    world, batch, deadlines = scheduler.world, WriteBatch(), scheduler.deadlines
    run = world.bags[BAG]
    early = place(scheduler, running_vm(scheduler, "vm-early", "small", START), START, batch)
    assert deadlines.checkpoint_interval_bounds_s(early, START) is None
    launch_h = deadlines.book.launch_h
    lag_h = deadlines.decide_every_s / HOUR + launch_h
    for to_go_h, expect in ((1.8, "dp"), (1.32, "longest"), (1.2, "none")):
        at = START + (10 - to_go_h) * HOUR
        vm = running_vm(scheduler, f"vm-{to_go_h}", "small", at)
        attempt = place(scheduler, vm, at, batch)
        shortest_h, longest_h, to_end = deadline_checkpoint_interval_h(
            1.0, to_go_h - lag_h - launch_h, 1 / 60, launch_h
        )
        bounds = deadlines.checkpoint_interval_bounds_s(attempt, at)
        scheduler.checkpoints.interval_bounds_s = None  # the DP's own plan
        scheduler.checkpoints.plan(attempt, at)
        dp_s = attempt.due_at - attempt.mark_at
        # The DP's interval on its 1-min grid: 19 min on the machines this was written
        # on, 20 on another with the same code and packages (2026-11-27: a near tie the
        # CPU's floating-point path decides). What matters here is how bounds clip it.
        assert 19 * 60 <= dp_s <= 20 * 60
        scheduler.checkpoints.interval_bounds_s = deadlines.checkpoint_interval_bounds_s
        scheduler.checkpoints.plan(attempt, at)
        planned_s = attempt.due_at - attempt.mark_at
        if expect == "none":
            assert bounds is None and np.isnan(shortest_h)
            assert planned_s == pytest.approx(dp_s)
            continue
        assert bounds[:2] == pytest.approx((shortest_h * HOUR, longest_h * HOUR))
        assert bounds[2] == to_end
        if expect == "dp":
            assert bounds[0] < dp_s < bounds[1]
            assert planned_s == pytest.approx(dp_s)
        else:
            assert bounds[0] < bounds[1] < dp_s
            assert planned_s == pytest.approx(bounds[1])
            # The floor between checkpoints gives way to the bound (a floor of real
            # seconds is long in model time at a large time_scale).
            timer = scheduler.checkpoints
            floor = timer.settings
            timer.settings = floor.model_copy(update={"min_interval_s": 2 * bounds[1]})
            timer.plan(attempt, at)
            assert attempt.due_at - attempt.mark_at == pytest.approx(bounds[1])
            timer.settings = floor
    inputs, _ = deadlines._inputs(run, at)
    assert inputs.checkpoint_h == pytest.approx(1 / 60)
    # On an on-demand VM: no bounds (never preempted).
    od_vm = running_vm(scheduler, "vm-od", "small", at, spot=False)
    od_attempt = place(scheduler, od_vm, at, batch)
    assert deadlines.checkpoint_interval_bounds_s(od_attempt, at) is None

    # Nor for a bag that does not escalate, Uniform Progress's, or with a checkpoint timer
    # that plans no checkpoint (`checkpoint.policy = "none"`).
    for extra in (
        {"on_demand": "never"},
        {"deadline_policy": "uniform_progress"},
        {"checkpointing": CheckpointConfig(policy="none")},
    ):
        other = await scheduler_with_bag(
            tmp_path / str(next(iter(extra))),
            checkpointable=True,
            checkpoint_cost_s=60,
            **extra,
        )
        vm = running_vm(other, "vm-late", "small", at)
        attempt = place(other, vm, at, WriteBatch())
        assert other.deadlines.checkpoint_interval_bounds_s(attempt, at) is None
        other_inputs = other.deadlines._inputs(other.world.bags[BAG], at)
        assert other_inputs is None or other_inputs[0].checkpoint_h is None


async def test_the_policy_bounds_a_job_past_its_estimate_as_the_timer_does(tmp_path):
    """A spot attempt running 1.15 h of a 1-h estimate, 0.27 h from the deadline: what a
    preemption loses counts at most the estimate (`spot_unsaved_h`), but the checkpoint
    bounds are planned from the real time since its last checkpoint
    (`spot_since_mark_h`), as the checkpoint timer plans them: from those inputs the
    policy finds the timer's bounds (with the capped time, a shortest of 0 where the
    timer's is 9 min)."""
    scheduler = await scheduler_with_bag(tmp_path, checkpointable=True, checkpoint_cost_s=60)
    deadlines, batch = scheduler.deadlines, WriteBatch()
    run = scheduler.world.bags[BAG]
    started = run.deadline_at - (1.15 + 0.27) * HOUR
    attempt = place(scheduler, running_vm(scheduler, "vm-late", "small", started), started, batch)
    now = started + 1.15 * HOUR
    inputs, _ = deadlines._inputs(run, now)
    assert inputs.spot_unsaved_h[0] == pytest.approx(1.0)
    assert inputs.spot_since_mark_h[0] == pytest.approx(1.15)
    launch_h = deadlines.book.launch_h
    lag_h = deadlines.decide_every_s / HOUR + launch_h
    to_switch_h = (run.deadline_at - now) / HOUR - lag_h - launch_h

    def bounds_from(since_h: float) -> tuple[float, float]:
        shortest, longest, _ = deadline_checkpoint_interval_h(
            float(inputs.spot_work_h[0]) + since_h, to_switch_h + since_h, 1 / 60, launch_h
        )
        return float(shortest) * HOUR, float(longest) * HOUR

    timer = deadlines.checkpoint_interval_bounds_s(attempt, now)
    assert timer is not None
    assert timer[:2] == pytest.approx(bounds_from(float(inputs.spot_since_mark_h[0])))
    assert timer[0] > 0 and bounds_from(float(inputs.spot_unsaved_h[0]))[0] == 0
