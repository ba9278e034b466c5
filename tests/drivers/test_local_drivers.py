"""The local and sim drivers: pushed status changes and the time scale, beside the
contract every driver keeps (test_cloud_contract.py)."""

from __future__ import annotations

import pytest

from controller.clock import SimClock
from drivers import driver_class
from drivers.base import Driver, LaunchRequest, PermanentError, VmState, VmType

TYPES = [VmType("t-2", 2, 4.0, 0, 0.02, 0.08, "z1"), VmType("t-8", 8, 32.0, 0, 0.1, 0.4, "z1")]


def make(name: str, clock: SimClock, lifetime_h: float = float("inf")) -> Driver:
    cls = driver_class(name)
    return cls(
        TYPES,
        now=clock.now,
        call_at=clock.call_at,
        lifetime_h=lambda t: lifetime_h,
        boot_delay_s=30.0,
        time_scale=1.0,
    )


# The drivers on a simulated clock (clouds are checked in test_cloud_contract.py).
@pytest.fixture(params=["local", "sim"])
def name(request) -> str:
    return request.param


async def test_launch_is_idempotent_and_boots(name):
    clock = SimClock(100.0)
    driver = make(name, clock)
    assert isinstance(driver, Driver)
    seen = []
    driver.subscribe(seen.append)
    first = await driver.launch(LaunchRequest("tok-1", TYPES[0]))
    again = await driver.launch(LaunchRequest("tok-1", TYPES[0]))
    assert first == again and first.state is VmState.PENDING and first.token == "tok-1"
    assert [s.vm_id for s in await driver.list_owned()] == [first.vm_id]
    clock.advance_to(130.0)
    assert [(s.state, s.changed_at) for s in seen] == [(VmState.RUNNING, 130.0)]
    assert (await driver.describe([first.vm_id, "missing"]))[first.vm_id].state is VmState.RUNNING


async def test_terminate_is_idempotent_and_missing_is_fine(name):
    clock = SimClock(0.0)
    driver = make(name, clock)
    vm = await driver.launch(LaunchRequest("tok-1", TYPES[1]))
    await driver.terminate([vm.vm_id, "never-existed"])
    await driver.terminate([vm.vm_id])
    status = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert status.state is VmState.TERMINATED and await driver.list_owned() == []
    clock.advance_to(1000.0)  # the boot timer of a terminated VM changes nothing
    assert (await driver.describe([vm.vm_id]))[vm.vm_id].state is VmState.TERMINATED


async def test_preemption_is_pushed_with_a_reason(name):
    clock = SimClock(0.0)
    driver = make(name, clock, lifetime_h=2.0)
    seen = []
    driver.subscribe(seen.append)
    vm = await driver.launch(LaunchRequest("tok-1", TYPES[0]))
    on_demand = await driver.launch(LaunchRequest("tok-2", TYPES[0], spot=False))
    clock.advance_to(3 * 3600.0)
    ends = [s for s in seen if s.state is VmState.PREEMPTED]
    assert [(s.vm_id, s.changed_at) for s in ends] == [(vm.vm_id, 7200.0)]
    assert "sampled lifetime 2.000 h" in ends[0].reason
    assert [s.vm_id for s in await driver.list_owned()] == [on_demand.vm_id]


async def test_unknown_types_are_permanent_errors_and_prices_are_listed(name):
    driver = make(name, SimClock(5.0))
    with pytest.raises(PermanentError):
        await driver.launch(LaunchRequest("tok", VmType("nope", 1, 1.0)))
    prices = await driver.spot_prices(["t-8"], [])
    assert [(p.vm_type, p.price_per_hour, p.at) for p in prices] == [("t-8", 0.1, 5.0)]


def test_local_time_scale_compresses_lifetimes():
    clock = SimClock(0.0)
    driver = driver_class("local")(
        TYPES,
        now=clock.now,
        call_at=clock.call_at,
        lifetime_h=lambda t: 24.0,
        boot_delay_s=0.0,
        time_scale=1440.0,
    )
    seen = []
    driver.subscribe(seen.append)

    async def go():
        return await driver.launch(LaunchRequest("tok", TYPES[0]))

    import asyncio

    asyncio.run(go())
    clock.advance_to(61.0)
    assert [(s.state, s.changed_at) for s in seen] == [
        (VmState.RUNNING, 0.0),
        (VmState.PREEMPTED, 60.0),
    ]
