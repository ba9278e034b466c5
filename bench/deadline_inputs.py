"""What gathering the deadline policy's inputs from the World costs the daemon's
scheduler (controller/scheduler/deadlines.py `Deadlines._inputs`,
docs/design.md#deadlines-in-the-daemon): run on the event loop for a bag with a
deadline whenever its decision is due (once per pass per such bag at most) and for
its projection.

The World, built by the scheduler's own methods (as
tests/controller/test_deadline_inputs.py does): the bag has 1,000 jobs of 1 h, 100
running on 50 spot VMs (each checkpointed once), 100 retries queued first with saved
work, 20 roomy spot VMs its next attempts would reuse; another bag has 4,000 attempts
running on 500 VMs (the inputs sweep every attempt, as before). Prints the median
time of `_inputs` and of the whole cheap decision (`_inputs` +
`decide(project=False)`).

Target: the cheap decision <= 10 ms (a pass's budget is tens of ms), as
bench/deadline_pass.py."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.executors.base import CheckpointEvent
from controller.scheduler.runs import VmRun, capacity_of
from controller.store import WriteBatch
from drivers.base import VmState
from policies.deadline import decide
from tests.controller.simworld import bag, config, world

HOUR = 3600.0
START = 1_800_000_000.0
NOW = START + 0.9 * HOUR
REPEATS = 50


async def build():
    cfg = config(
        **{"preemption.model": "exponential", "preemption.mttf_h": 3.0, "scheduler.max_vms": 2000}
    )
    clock = SimClock(START)
    scheduler = await world(Path(tempfile.mkdtemp()), clock, 1, cfg)
    for bag_id, n, extra in (
        ("b0000000001", 1000, {"deadline": "30h", "checkpointable": True}),
        ("b0000000002", 4000, {}),
    ):
        spec = bag(n, runtime_s=HOUR, checkpoint_cost_s=60, **extra)
        spec["resources"]["vm_types"] = ["small"] if bag_id.endswith("1") else ["big"]
        await admit(
            spec,
            store=scheduler.store,
            scheduler=scheduler,
            catalog=cfg.catalog(),
            bag_id=bag_id,
            now=START,
            max_jobs=10_000,
            offload=False,
        )
    commands, scheduler.inbox.commands = scheduler.inbox.commands, []
    batch = WriteBatch()
    scheduler.commands.run(batch, commands, START)
    world_ = scheduler.world
    count = 0

    def vm_of(type_name: str, requested_at: float) -> VmRun:
        nonlocal count
        count += 1
        vm_type = world_.catalog[type_name]
        vm = VmRun(
            id=f"vm-{count}",
            vm_type=vm_type,
            state=VmState.RUNNING,
            requested_at=requested_at,
            zone=vm_type.zone,
            running_at=requested_at + 60,
            free=capacity_of(vm_type),
        )
        world_.assume_model(vm)
        world_.track_vm(vm)
        return vm

    def fill(bag_id: str, vm: VmRun, jobs: int, at: float) -> list:
        run = world_.bags[bag_id]
        specs = [
            scheduler.planning._new_attempt(run, vm, run.queue.popleft(), at, batch)
            for _ in range(jobs)
        ]
        world_.refresh_vm_sets(vm)
        scheduler.actions.record_starts([(s, "ref", None) for s in specs], batch, at)
        return [world_.attempts[s.attempt_id] for s in specs]

    # 100 retries with 15 min saved: started, checkpointed, their VMs preempted.
    doomed = [vm_of("small", START) for _ in range(50)]
    for vm in doomed:
        for attempt in fill("b0000000001", vm, 2, START):
            attempt.signalled_at = START + 900
            scheduler.events._on_checkpoint(
                CheckpointEvent(attempt.id, START + 900, START + 960, True), batch
            )
    for vm in doomed:
        world_.end_vm(vm, VmState.PREEMPTED, START + 0.5 * HOUR, "preempted", batch)
    for k in range(50):  # 100 running (not the retries: those go first, start them later)
        vm = vm_of("small", START - k * 360)
        run = world_.bags["b0000000001"]
        retries = [run.queue.popleft() for _ in range(100)]  # the 100 put first
        for attempt in fill("b0000000001", vm, 2, START + 0.6 * HOUR):
            attempt.signalled_at = START + 0.7 * HOUR
            scheduler.events._on_checkpoint(
                CheckpointEvent(attempt.id, START + 0.7 * HOUR, START + 0.71 * HOUR, True), batch
            )
        for idx in reversed(retries):
            run.queue.appendleft(idx)
    for k in range(20):  # roomy spot VMs, idle
        vm_of("small", START - k * 600)
    for _ in range(500):  # the other bag's 4,000 attempts
        fill("b0000000002", vm_of("big", START), 8, START)
    return scheduler


def median_ms(call, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def main() -> None:
    scheduler = asyncio.run(build())
    deadlines = scheduler.deadlines
    run = scheduler.world.bags["b0000000001"]
    inputs, _ = deadlines._inputs(run, NOW)  # the completion-time tables, once
    assert len(inputs.queued_work_h) == 900 and len(inputs.spot_work_h) == 100
    assert len(inputs.free_spot_age_h) == 40 and inputs.spot_unsaved_h.max() > 0
    assert (inputs.queued_work_h[:100] < 1.0).all()
    inputs_ms = median_ms(lambda: deadlines._inputs(run, NOW))

    def cheap() -> None:
        got = deadlines._inputs(run, NOW)
        assert got is not None
        decide(got[0], got[1], (), project=False)

    cheap_ms = median_ms(cheap)
    print(
        f"bag of 1,000 jobs (900 queued, 100 of them retries; 100 running), 40 reusable "
        f"slots; {len(scheduler.world.attempts)} attempts in the World"
    )
    print(f"_inputs (median of {REPEATS}): {inputs_ms:.2f} ms")
    print(
        f"cheap decision, _inputs + decide (median of {REPEATS}): {cheap_ms:.2f} ms "
        f"{against(cheap_ms, 10, 'ms')}"
    )


if __name__ == "__main__":
    main()
