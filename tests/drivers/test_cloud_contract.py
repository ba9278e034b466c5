"""One contract for every driver, on a real clock: local, sim, aws (the moto server)
and gce (the real client against tests/fakes/gce_api.py). Only loopback traffic.

Each driver comes with a harness (tests/fakes): `driver`, `types`, `missing_id`,
`wait_running(vm_id)`, `preempt(vm_id)`, `foreign_vm()` (a VM this controller does not
own), `fail_next(kind, n)` (the next launches fail with capacity, quota, throttle or
permanent errors) and `close()`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import time

import pytest

from controller.clock import RealClock, SimClock
from drivers import driver_class
from drivers.base import (
    CapacityError,
    Driver,
    LaunchRequest,
    PermanentError,
    QuotaError,
    TransientError,
    VmState,
    VmStatus,
    VmType,
)

TYPES = [VmType("t-2", 2, 4.0, 0, 0.02, 0.08, "z1"), VmType("t-8", 8, 32.0, 0, 0.1, 0.4, "z1")]


class LocalHarness:
    """The local driver on the real clock, or the sim driver on a virtual one."""

    missing_id = "local-999999"

    def __init__(self, name: str) -> None:
        self.types = TYPES
        self.name = name
        self.clock = SimClock(1000.0) if name == "sim" else RealClock()
        self.driver: Driver = self._make()

    def _make(self) -> Driver:
        return driver_class(self.name)(
            TYPES,
            now=self.clock.now,
            call_at=self.clock.call_at,
            lifetime_h=lambda vm_type: math.inf,
            boot_delay_s=0.05,
            time_scale=1.0,
        )

    async def wait_running(self, vm_id: str, timeout_s: float = 10) -> VmStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = (await self.driver.describe([vm_id]))[vm_id]
            if status.state is VmState.RUNNING:
                return status
            if isinstance(self.clock, SimClock):
                self.clock.advance_to(self.clock.now() + 0.05)
            else:
                await asyncio.sleep(0.01)
        raise TimeoutError(vm_id)

    def preempt(self, vm_id: str) -> None:
        assert self.driver.inject_preemption(vm_id, "preempted: injected by the contract suite")

    async def foreign_vm(self) -> str:
        """A VM of another controller: another driver launched it."""
        return (await self._make().launch(LaunchRequest("someone-else", TYPES[0]))).vm_id

    def fail_next(self, kind: str, n: int = 1) -> None:
        self.driver.inject_launch_errors(kind, n)

    def close(self) -> None:
        pass


def _cloud_harness(name: str):
    if name == "gce":
        from tests.fakes.gce_api import GceHarness

        harness = GceHarness()
        harness.missing_id = f"{harness.ZONES[0]}/sb-never-existed"
        return harness
    from tests.fakes.aws import AwsHarness

    return AwsHarness()


@pytest.fixture(
    params=[
        "local",
        "sim",
        pytest.param("aws", marks=pytest.mark.clouds),
        pytest.param("gce", marks=pytest.mark.clouds),
    ]
)
def harness(request):
    made = LocalHarness(request.param) if request.param in ("local", "sim") else None
    if made is None:
        made = _cloud_harness(request.param)
    yield made
    made.close()


_tokens = itertools.count(1)


def token() -> str:
    return f"contract-{time.time_ns()}-{next(_tokens)}"


async def until(harness, vm_id: str, state: VmState, timeout_s: float = 10.0) -> VmStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = (await harness.driver.describe([vm_id])).get(vm_id)
        if status is not None and status.state is state:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{vm_id} not {state} after {timeout_s} s: {status}")
        if isinstance(getattr(harness, "clock", None), SimClock):
            harness.clock.advance_to(harness.clock.now() + 0.05)
        await asyncio.sleep(0.02)


async def test_launch_is_idempotent_on_its_token_and_the_vm_boots(harness):
    driver, vm_type = harness.driver, harness.types[0]
    request = LaunchRequest(token(), vm_type)
    first = await driver.launch(request)
    again = await driver.launch(request)
    assert again.vm_id == first.vm_id and first.token == request.token
    assert first.state in (VmState.PENDING, VmState.RUNNING) and first.vm_type == vm_type.name
    running = await harness.wait_running(first.vm_id)
    assert running.token == request.token and running.launched_at > 0
    owned = [s for s in await driver.list_owned() if s.token == request.token]
    assert [s.vm_id for s in owned] == [first.vm_id]


async def test_describe_follows_the_vm_to_its_end_and_terminate_is_idempotent(harness):
    driver = harness.driver
    vm = await driver.launch(LaunchRequest(token(), harness.types[0]))
    await harness.wait_running(vm.vm_id)
    await driver.terminate([vm.vm_id])
    await driver.terminate([vm.vm_id, harness.missing_id])
    ended = await until(harness, vm.vm_id, VmState.TERMINATED)
    assert ended.token == vm.token
    assert vm.vm_id not in {s.vm_id for s in await driver.list_owned()}
    assert harness.missing_id not in await driver.describe([harness.missing_id])


async def test_a_preemption_is_reported_as_preempted_with_its_reason(harness):
    vm = await harness.driver.launch(LaunchRequest(token(), harness.types[0]))
    await harness.wait_running(vm.vm_id)
    harness.preempt(vm.vm_id)
    ended = await until(harness, vm.vm_id, VmState.PREEMPTED)
    assert ended.reason and ended.token == vm.token
    assert vm.vm_id not in {s.vm_id for s in await harness.driver.list_owned()}


async def test_list_owned_sees_only_this_controllers_vms(harness):
    foreign = harness.foreign_vm()
    if inspect.isawaitable(foreign):
        foreign = await foreign
    ours = await harness.driver.launch(LaunchRequest(token(), harness.types[0]))
    owned = {s.vm_id for s in await harness.driver.list_owned()}
    assert ours.vm_id in owned and foreign not in owned


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("capacity", CapacityError),
        ("quota", QuotaError),
        ("permanent", PermanentError),
        ("throttle", TransientError),
    ],
)
async def test_launch_failures_are_typed_errors_and_launch_nothing(harness, kind, error):
    # Throttling is retried by the cloud drivers: fail more often than they retry.
    harness.fail_next(kind, 50 if kind == "throttle" else 1)
    request = LaunchRequest(token(), harness.types[0])
    with pytest.raises(error):
        await harness.driver.launch(request)
    assert request.token not in {s.token for s in await harness.driver.list_owned()}


async def test_an_unknown_type_is_a_permanent_error(harness):
    with pytest.raises(PermanentError):
        await harness.driver.launch(LaunchRequest(token(), VmType("no-such-type", 1, 1.0)))
