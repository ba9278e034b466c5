"""The GCE driver with the real google-cloud-compute client against the loopback fake API
(tests/fakes/gce_api.py): idempotent launches, operation polling, describe and its
batching, preemptions under both termination actions, terminate, ownership by
label, typed errors and retries."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import datetime

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from drivers.base import (
    CapacityError,
    Driver,
    LaunchRequest,
    PermanentError,
    QuotaError,
    TransientError,
    VmState,
    VmType,
)
from drivers.gce import (
    GceDriver,
    GceSettings,
    instance_name,
    label_value,
    request_id,
)
from tests.fakes.gce_api import PREEMPTED, FakeGceApi, GceHarness

# Every test drives the fake GCE API: in `make test`, left out of `make test-fast` (marker clouds).
pytestmark = pytest.mark.clouds

PROJECT = "spotbag-test"
ZONES = ("us-central1-a", "us-central1-b")
TYPES = [
    VmType("e2-standard-2", 2, 8.0, 0, 0.02, 0.067, "us-central1-a"),
    VmType("n2-standard-8", 8, 32.0, 0, 0.09, 0.39, ""),  # no zone: placed by token hash
    # The same machine type listed for another zone under its own name.
    VmType("e2-2-b", 2, 8.0, 0, 0.019, 0.067, "us-central1-b", instance_type="e2-standard-2"),
]
E2, N2, E2_B = TYPES
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.fixture
def api():
    with FakeGceApi(boot_s=0.15, stop_s=0.1, zones=ZONES) as fake:
        yield fake


def make_driver(api: FakeGceApi, **overrides) -> GceDriver:
    settings = {
        "project": PROJECT,
        "zones": ZONES,
        "api_endpoint": api.endpoint,
        "controller_id": "ctl-1",
        "max_retries": 3,
        "backoff_base_s": 0.005,
        "backoff_max_s": 0.02,
        "operation_poll_s": 0.01,
        "operation_timeout_s": 5.0,
        **overrides,
    }
    return GceDriver(TYPES, GceSettings(**settings), credentials=AnonymousCredentials())


async def until(driver: GceDriver, vm_id: str, state: VmState, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        status = (await driver.describe([vm_id])).get(vm_id)
        if status is not None and status.state is state:
            return status
        assert time.monotonic() < deadline, f"{vm_id} not {state} after {timeout_s} s: {status}"
        await asyncio.sleep(0.02)


def stored(api: FakeGceApi, vm_id: str) -> dict | None:
    zone, _, name = vm_id.partition("/")
    found = [i for i in api.instances(PROJECT) if i["name"] == name and i["zone"].endswith(zone)]
    return found[0] if found else None


# --- names and ids ----------------------------------------------------------------------


def test_names_request_ids_and_labels_are_valid_and_deterministic():
    tokens = ["vm-0123456789ab", "VM_Odd.Token/42", "7" * 200, "", "--x--", "Ünïcode token"]
    names = [instance_name("ctl-1", t) for t in tokens]
    assert all(NAME_RE.match(n) and len(n) <= 63 for n in names), names
    assert names == [instance_name("ctl-1", t) for t in tokens]
    assert len(set(names)) == len(names)
    # Another controller in the same project, and tokens differing only in case, differ.
    assert instance_name("ctl-2", "vm-1") != instance_name("ctl-1", "vm-1")
    assert instance_name("ctl-1", "VM-1") != instance_name("ctl-1", "vm-1")
    rid = request_id(PROJECT, "ctl-1", "vm-1")
    assert uuid.UUID(rid).version == 5 and rid == request_id(PROJECT, "ctl-1", "vm-1")
    assert rid != request_id(PROJECT, "ctl-2", "vm-1")
    assert label_value("VM_Odd.Token/42") == "vm_odd-token-42"
    assert len(label_value("x" * 100)) <= 63
    with pytest.raises(ValueError, match="termination_action"):
        GceSettings(project="p", zones=ZONES, controller_id="c", termination_action="KEEP")


# --- launch -------------------------------------------------------------------------------


async def test_launch_is_idempotent_on_the_token(api):
    driver = make_driver(api)
    first = await driver.launch(LaunchRequest("vm-1", E2))
    again = await driver.launch(LaunchRequest("vm-1", E2))
    assert first.vm_id == again.vm_id == f"us-central1-a/{instance_name('ctl-1', 'vm-1')}"
    assert (first.token, first.state, first.vm_type) == ("vm-1", VmState.PENDING, "e2-standard-2")
    assert api.calls["instances.insert"] == 2
    assert len(api.operations(PROJECT, "insert")) == 1  # same requestId, same operation
    # A restarted controller retrying the launch: still the same request to GCE.
    restarted = make_driver(api)
    assert (await restarted.launch(LaunchRequest("vm-1", E2))).vm_id == first.vm_id
    # After GCE forgot the requestId the insert is 409 alreadyExists: the VM is ours.
    api.forget_request_ids()
    assert (await restarted.launch(LaunchRequest("vm-1", E2))).vm_id == first.vm_id
    assert len(api.instances(PROJECT)) == 1
    # The same token under another controller is another VM.
    other = await make_driver(api, controller_id="ctl-2").launch(LaunchRequest("vm-1", E2))
    assert other.vm_id != first.vm_id and len(api.instances(PROJECT)) == 2


async def test_launch_polls_the_insert_operation_pending_running_done(api):
    driver = make_driver(api)
    await driver.launch(LaunchRequest("vm-1", E2))
    [op] = api.operations(PROJECT, "insert")
    assert api.op_history[op["name"]] == ["PENDING", "RUNNING", "DONE"]
    assert api.calls["zoneOperations.get"] == 2


async def test_an_operation_that_never_finishes_is_a_transient_error():
    with FakeGceApi(op_polls_to_done=10**6, op_done_s=None) as api:
        driver = make_driver(api, operation_timeout_s=0.1)
        with pytest.raises(TransientError, match=r"not done after 0\.1 s"):
            await driver.launch(LaunchRequest("vm-1", E2))


async def test_the_instance_is_a_spot_vm_carrying_our_labels_and_exact_token(api):
    driver = make_driver(api, startup_script="#!/bin/sh\necho hi\n")
    token = "VM_Odd.Token/42"
    tags = {"spotbag-controller": "ctl-1", "Team": "Data Science"}
    status = await driver.launch(LaunchRequest(token, E2, tags=tags))
    body = stored(api, status.vm_id)
    assert status.token == token and NAME_RE.match(body["name"])
    assert body["machineType"].endswith("/zones/us-central1-a/machineTypes/e2-standard-2")
    assert body["labels"] == {
        "spotbag-controller": "ctl-1",
        "spotbag-token": "vm_odd-token-42",
        "team": "data-science",
    }
    metadata = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert metadata == {
        "spotbag-token": token,
        "spotbag-vm-type": "e2-standard-2",
        "startup-script": "#!/bin/sh\necho hi\n",
    }
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
        "preemptible": False,
    }
    legacy = make_driver(api, provisioning="preemptible", controller_id="ctl-legacy")
    vm = await legacy.launch(LaunchRequest("vm-2", N2))
    scheduling = stored(api, vm.vm_id)["scheduling"]
    assert scheduling["preemptible"] is True and scheduling["provisioningModel"] == "STANDARD"
    assert vm.zone in ZONES  # a type without a zone goes to one of the settings' zones
    on_demand = await driver.launch(LaunchRequest("vm-3", E2, spot=False))
    scheduling = stored(api, on_demand.vm_id)["scheduling"]
    assert (scheduling["provisioningModel"], scheduling["automaticRestart"]) == ("STANDARD", True)


# --- describe, terminate, list_owned ---------------------------------------------------------


async def test_describe_follows_a_vm_from_boot_to_terminate(api):
    driver = make_driver(api)
    vm = await driver.launch(LaunchRequest("vm-1", E2))
    running = await until(driver, vm.vm_id, VmState.RUNNING)
    assert vm.launched_at <= running.changed_at <= time.time()
    assert [s.vm_id for s in await driver.list_owned()] == [vm.vm_id]
    await driver.terminate([vm.vm_id])
    await driver.terminate([vm.vm_id])  # GCE: resourceNotReady while deleting; fine
    assert api.calls["instances.delete"] == 2 and len(api.operations(PROJECT, "delete")) == 1
    stopping = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert stopping.state is VmState.TERMINATED
    assert stopping.reason == "terminated by the controller (instance STOPPING)"
    await asyncio.sleep(0.15)  # the fake's stop_s: the instance is gone now
    gone = await driver.describe([vm.vm_id, "garbage", "us-central1-a/never-existed"])
    assert list(gone) == [vm.vm_id] and gone[vm.vm_id].state is VmState.TERMINATED
    assert gone[vm.vm_id].changed_at == stopping.changed_at
    await driver.terminate([vm.vm_id, "us-central1-a/never-existed", "garbage"])
    assert await driver.list_owned() == []


@pytest.mark.parametrize(
    ("provisioning", "action", "left"),
    [
        ("spot", "STOP", "TERMINATED"),
        ("spot", "DELETE", None),
        ("preemptible", "STOP", "TERMINATED"),
    ],
)
async def test_a_preemption_is_reported_with_its_reason(api, provisioning, action, left):
    driver = make_driver(api, provisioning=provisioning, termination_action=action)
    vm = await driver.launch(LaunchRequest("vm-1", E2))
    keep = await driver.launch(LaunchRequest("vm-2", E2))
    await until(driver, vm.vm_id, VmState.RUNNING)
    await until(driver, keep.vm_id, VmState.RUNNING)
    api.reset_counts()  # (describing running VMs lists preemptions too: notices)
    zone, _, name = vm.vm_id.partition("/")
    assert api.preempt(PROJECT, zone, name)
    [op] = api.operations(PROJECT, PREEMPTED)
    statuses = await driver.describe([vm.vm_id, keep.vm_id])
    preempted = statuses[vm.vm_id]
    assert preempted.state is VmState.PREEMPTED and statuses[keep.vm_id].state is VmState.RUNNING
    assert preempted.reason == "preempted by GCE: Instance was preempted. (instance STOPPING)"
    # changed_at is when GCE preempted it: the operation's insertTime.
    assert preempted.changed_at == datetime.fromisoformat(op["insertTime"]).timestamp()
    await asyncio.sleep(0.15)  # past stop_s: TERMINATED (STOP) or gone (DELETE)
    assert (stored(api, vm.vm_id) or {}).get("status") == left
    later = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert (later.state, later.changed_at) == (VmState.PREEMPTED, preempted.changed_at)
    assert [s.vm_id for s in await driver.list_owned()] == [keep.vm_id]
    # The preemption is remembered: no more operation lists for this VM.
    lists = api.calls["zoneOperations.list"]
    await driver.describe([vm.vm_id])
    assert api.calls["zoneOperations.list"] == lists == 1


@pytest.mark.parametrize("action", ["STOP", "DELETE"])
async def test_a_preemption_notice_is_read_from_the_running_preemption_operation(api, action):
    """GCE begins a Spot VM's preemption ~30 s before it stops it: the preemption
    operation runs meanwhile. describe reports the VM running with notice_until (the
    operation's insertTime + 30 s), then preempted when it stops, at the notice's end."""
    driver = make_driver(api, termination_action=action)
    vm = await driver.launch(LaunchRequest("vm-1", E2))
    await until(driver, vm.vm_id, VmState.RUNNING)
    assert (await driver.describe([vm.vm_id]))[vm.vm_id].notice_until is None
    zone, _, name = vm.vm_id.partition("/")
    # 3 s (0.4 s was too short for the two describes on a busy host, as the AWS twin found)
    assert api.preempt(PROJECT, zone, name, notice_s=3.0)
    [op] = api.operations(PROJECT, PREEMPTED)
    inserted = datetime.fromisoformat(op["insertTime"]).timestamp()
    noticed = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert noticed.state is VmState.RUNNING
    assert noticed.notice_until == inserted + 30.0
    again = (await driver.describe([vm.vm_id]))[vm.vm_id]  # it stays noticed
    assert again.notice_until == noticed.notice_until
    ended = await until(driver, vm.vm_id, VmState.PREEMPTED, timeout_s=15.0)
    assert ended.reason.startswith("preempted by GCE")
    # The fake's notice is 3 s, not 30: the end is when it was seen, not insertTime.
    assert inserted + 3.0 <= ended.changed_at <= time.time()
    # A driver told not to read notices sees only the end.
    quiet = make_driver(api, notices=False)
    other = await quiet.launch(LaunchRequest("vm-2", E2))
    await until(quiet, other.vm_id, VmState.RUNNING)
    assert api.preempt(PROJECT, *other.vm_id.split("/"), notice_s=0.4)
    assert (await quiet.describe([other.vm_id]))[other.vm_id].notice_until is None


async def test_a_vm_deleted_by_someone_else_is_terminated_not_preempted(api):
    driver = make_driver(api)
    vm = await driver.launch(LaunchRequest("vm-1", E2))
    zone, _, name = vm.vm_id.partition("/")
    assert api.vanish(PROJECT, zone, name)
    status = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert status.state is VmState.TERMINATED
    assert status.reason == "instance deleted, not by a preemption"
    # A restarted driver never saw it, so cannot name its token: it leaves it out.
    assert await make_driver(api).describe([vm.vm_id]) == {}


async def test_list_owned_sees_only_this_controllers_vms(api):
    mine, theirs = make_driver(api), make_driver(api, controller_id="ctl-2")
    a = await mine.launch(LaunchRequest("vm-1", E2))
    b = await mine.launch(LaunchRequest("vm-2", N2))
    c = await theirs.launch(LaunchRequest("vm-3", E2))
    api.put_instance(PROJECT, ZONES[0], {"name": "foreign", "machineType": "x/e2-micro"})
    api.reset_counts()
    assert sorted(s.vm_id for s in await mine.list_owned()) == sorted([a.vm_id, b.vm_id])
    assert api.calls == {"instances.aggregatedList": 1}  # filtered by label on the server
    assert [s.vm_id for s in await theirs.list_owned()] == [c.vm_id]
    assert await mine.describe([c.vm_id, f"{ZONES[0]}/foreign"]) == {}
    assert {s.token for s in await make_driver(api).list_owned()} == {"vm-1", "vm-2"}


async def test_describe_of_1000_vms_uses_a_bounded_number_of_calls(api):
    driver = make_driver(api)
    vm_ids = []
    for i in range(1000):
        req = LaunchRequest(f"vm-{i:06d}", E2, zone=ZONES[i % 2])
        body = json.loads(compute_v1.Instance.to_json(driver.instance_resource(req, req.zone)))
        if i % 3 == 0:
            body["scheduling"]["instanceTerminationAction"] = "STOP"
        api.put_instance(PROJECT, req.zone, body)
        vm_ids.append(f"{req.zone}/{body['name']}")
    api.reset_counts()
    started = time.perf_counter()
    first = await driver.describe(vm_ids)
    first_s = time.perf_counter() - started
    assert len(first) == 1000 and {s.state for s in first.values()} == {VmState.RUNNING}
    # Pages of 500; one list of preemption operations per zone (notices).
    assert api.calls == {"instances.aggregatedList": 2, "zoneOperations.list": 2}
    for vm_id in vm_ids[:30]:  # every third of them stops, the others vanish
        assert api.preempt(PROJECT, *vm_id.split("/"))
    for vm_id in vm_ids[30:40]:
        assert api.vanish(PROJECT, *vm_id.split("/"))
    await asyncio.sleep(0.15)
    api.reset_counts()
    started = time.perf_counter()
    second = await driver.describe(vm_ids)
    second_s = time.perf_counter() - started
    states = [second[v].state for v in vm_ids]
    assert states == [VmState.PREEMPTED] * 30 + [VmState.TERMINATED] * 10 + [VmState.RUNNING] * 960
    # One aggregated list per 500 VMs, one preemption list per zone; never one call per VM.
    assert api.calls == {"instances.aggregatedList": 2, "zoneOperations.list": 2}
    print(
        f"\ndescribe of 1,000 VMs: {first_s * 1000:.0f} ms; with 40 ended: {second_s * 1000:.0f} ms"
    )


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("capacity", CapacityError),
        ("capacity_details", CapacityError),
        ("quota", QuotaError),
        ("quota_http", QuotaError),
        ("permanent", PermanentError),
        ("forbidden", PermanentError),
    ],
)
async def test_launch_errors_are_typed_and_not_retried(api, kind, error):
    driver = make_driver(api)
    api.fail_next(kind)
    with pytest.raises(error):
        await driver.launch(LaunchRequest("vm-1", E2))
    assert api.calls["instances.insert"] == 1 and api.instances(PROJECT) == []


async def test_unknown_types_fail_before_any_call_and_capacity_is_per_zone(api):
    driver = make_driver(api)
    with pytest.raises(PermanentError, match="unknown VM type"):
        await driver.launch(LaunchRequest("vm-0", VmType("nope", 1, 1.0)))
    assert sum(api.calls.values()) == 0
    api.exhaust("us-central1-a", "e2-standard-2")
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await driver.launch(LaunchRequest("vm-1", E2))
    assert (await driver.launch(LaunchRequest("vm-2", E2, zone="us-central1-b"))).zone == (
        "us-central1-b"
    )


@pytest.mark.parametrize("kind", ["throttle", "throttle_403", "unavailable"])
async def test_throttling_is_retried_then_a_transient_error(api, kind):
    driver = make_driver(api, max_retries=3)
    api.fail_next(kind, 3)
    # Launched (the fake boots it 0.15 s later: on a busy host it may be up already).
    launched = await driver.launch(LaunchRequest("vm-1", E2))
    assert launched.state in (VmState.PENDING, VmState.RUNNING)
    assert api.calls["instances.insert"] == 4 and len(api.instances(PROJECT)) == 1
    api.reset_counts()
    api.fail_next(kind, 4)
    with pytest.raises(TransientError, match="still failing after 4 attempts"):
        await driver.launch(LaunchRequest("vm-2", E2))
    assert api.calls["instances.insert"] == 4 and len(api.instances(PROJECT)) == 1


async def test_a_fifth_of_all_calls_failing_still_launches_everything(api):
    driver = make_driver(api, max_retries=6)
    api.fail_fraction(0.2, "throttle", seed=11)
    launched = await asyncio.gather(
        *(driver.launch(LaunchRequest(f"vm-{i}", TYPES[i % 2])) for i in range(20))
    )
    described = await driver.describe([s.vm_id for s in launched])
    assert len(described) == 20 and len(api.instances(PROJECT)) == 20
    await driver.terminate([s.vm_id for s in launched])
    assert api.faults_injected["throttle"] >= 10  # of about 100 calls
    # Every one is stopping, or already gone (stop_s is short: a slow run sees both).
    assert {i["status"] for i in api.instances(PROJECT)} <= {"STOPPING"}


# --- prices, subscribe, the contract harness -----------------------------------------------------


async def test_spot_prices_come_from_the_settings_then_the_catalog(api):
    driver = GceDriver(
        TYPES,
        GceSettings(
            project=PROJECT,
            zones=ZONES,
            controller_id="c",
            api_endpoint=api.endpoint,
            spot_prices={"e2-standard-2": 0.021},
        ),
        now=lambda: 50.0,
        credentials=AnonymousCredentials(),
    )
    prices = await driver.spot_prices([], [])
    assert [(p.vm_type, p.zone, p.price_per_hour, p.at) for p in prices] == [
        ("e2-standard-2", "us-central1-a", 0.021, 50.0),
        ("n2-standard-8", "us-central1-a", 0.09, 50.0),
        ("n2-standard-8", "us-central1-b", 0.09, 50.0),
        ("e2-2-b", "us-central1-b", 0.019, 50.0),
    ]
    assert [p.zone for p in await driver.spot_prices(["n2-standard-8"], ["europe-west4-a"])] == [
        "europe-west4-a"
    ]
    assert sum(api.calls.values()) == 0


async def test_the_contract_harness():
    harness = GceHarness()
    try:
        driver = harness.driver
        assert isinstance(driver, Driver) and driver.name == "gce"
        seen = []
        driver.subscribe(seen.append)
        vm = await driver.launch(LaunchRequest("tok-1", harness.types[0]))
        assert (await harness.wait_running(vm.vm_id)).state is VmState.RUNNING
        foreign = harness.foreign_vm()
        assert [s.vm_id for s in await driver.list_owned()] == [vm.vm_id]
        assert foreign not in await driver.describe([foreign])
        harness.preempt(vm.vm_id)
        assert (await driver.describe([vm.vm_id]))[vm.vm_id].state is VmState.PREEMPTED
        for n, (kind, error) in enumerate(
            [
                ("capacity", CapacityError),
                ("quota", QuotaError),
                ("permanent", PermanentError),
                ("throttle", TransientError),
            ]
        ):
            harness.fail_next(kind, 1 if kind != "throttle" else 4)  # max_retries is 3
            with pytest.raises(error):
                await driver.launch(LaunchRequest(f"tok-err-{n}", harness.types[1]))
        harness.fail_next("throttle", 3)
        assert (await driver.launch(LaunchRequest("tok-2", harness.types[1]))).token == "tok-2"
        assert seen == []  # GCE pushes nothing; the controller polls describe
    finally:
        harness.close()


async def test_a_type_listed_per_zone_launches_its_machine_type_there(api):
    driver = make_driver(api)
    status = await driver.launch(LaunchRequest("per-zone", E2_B))
    body = stored(api, status.vm_id)
    assert body["machineType"].endswith("/zones/us-central1-b/machineTypes/e2-standard-2")
    assert status.vm_type == "e2-2-b" and status.zone == "us-central1-b"
    fresh = make_driver(api)  # a restarted controller reads the catalog name back
    assert (await fresh.describe([status.vm_id]))[status.vm_id].vm_type == "e2-2-b"
