"""The aws driver against moto's EC2 server (tests/fakes/aws.py): what it sends, how it
batches, retries and recovers. The behaviour every driver shares is in
test_cloud_contract.py."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid

import boto3
import botocore.exceptions
import pytest

from drivers.aws import (
    AwsDriver,
    AwsSettings,
    classify,
    client_token,
    region_of,
    render_user_data,
)
from drivers.base import (
    CapacityError,
    LaunchRequest,
    PermanentError,
    PriceSample,
    QuotaError,
    TransientError,
    VmState,
    VmType,
)
from tests.fakes.aws import REGION, MotoCloud

# Every test drives moto's EC2: in `make test`, left out of `make test-fast` (marker clouds).
pytestmark = pytest.mark.clouds

TYPES = [
    VmType("m5.large", 2, 8.0, 0, 0.035, 0.0, f"{REGION}a"),
    VmType("m5.xlarge", 4, 16.0, 0, 0.07, 0.192, f"{REGION}b"),
]


@pytest.fixture
def cloud():
    made = MotoCloud()
    yield made
    made.close()


def controller_id() -> str:
    return f"ctl-{uuid.uuid4().hex[:8]}"


def instance(cloud: MotoCloud, vm_id: str) -> dict:
    return cloud.client.describe_instances(InstanceIds=[vm_id])["Reservations"][0]["Instances"][0]


async def test_launch_sends_a_tagged_one_time_spot_request_with_user_data(cloud):
    ctl = controller_id()
    driver = cloud.driver(TYPES, ctl, controller_url="http://head:8080")
    status = await driver.launch(LaunchRequest("bag-1/vm 7", TYPES[1], tags={"team": "lab"}))
    got = instance(cloud, status.vm_id)
    assert got["InstanceLifecycle"] == "spot" and got["InstanceType"] == "m5.xlarge"
    assert got["Placement"]["AvailabilityZone"] == f"{REGION}b"
    assert got["ClientToken"] == client_token(ctl, "bag-1/vm 7")
    assert cloud.tags_of(status.vm_id) == {
        "spotbag:controller": ctl,
        "spotbag:token": "bag-1/vm 7",
        "spotbag:vm-type": "m5.xlarge",
        "Name": "spotbag-bag-1/vm 7",
        "team": "lab",
    }
    user_data = cloud.client.describe_instance_attribute(
        InstanceId=status.vm_id, Attribute="userData"
    )["UserData"]["Value"]
    script = base64.b64decode(user_data).decode()
    assert script.startswith("#!/bin/bash")
    assert "SPOTBAG_VM_ID='bag-1/vm 7'" in script and "http://head:8080" in script
    assert status.zone == f"{REGION}b" and status.token == "bag-1/vm 7"


async def test_an_on_demand_request_has_no_spot_market_options(cloud):
    driver = cloud.driver(TYPES, controller_id())
    status = await driver.launch(LaunchRequest("od", TYPES[0], spot=False))
    assert "InstanceLifecycle" not in instance(cloud, status.vm_id)


async def test_a_lost_launch_answer_is_retried_under_the_same_client_token(cloud):
    driver = cloud.driver(TYPES, controller_id())
    cloud.layer.lose_next_responses(2)  # the instance is made; the answer never arrives
    status = await driver.launch(LaunchRequest("lost", TYPES[0]))
    assert cloud.layer.calls["RunInstances"] == 3
    assert cloud.live_instances() == [status.vm_id]


async def test_a_restarted_controller_relaunching_a_token_gets_the_same_instance(cloud):
    ctl = controller_id()
    first = await cloud.driver(TYPES, ctl).launch(LaunchRequest("t1", TYPES[0]))
    again = await cloud.driver(TYPES, ctl).launch(LaunchRequest("t1", TYPES[0]))
    assert again.vm_id == first.vm_id and len(cloud.live_instances()) == 1
    # The same token with other parameters is not the same request.
    with pytest.raises(PermanentError, match="IdempotentParameterMismatch"):
        await cloud.driver(TYPES, ctl).launch(LaunchRequest("t1", TYPES[1]))


async def test_a_restarted_controller_finds_its_vms_and_their_tokens(cloud):
    ctl = controller_id()
    launched = [
        await cloud.driver(TYPES, ctl).launch(LaunchRequest(f"r{i}", TYPES[0])) for i in range(3)
    ]
    await cloud.driver(TYPES, "another").launch(LaunchRequest("theirs", TYPES[0]))
    fresh = cloud.driver(TYPES, ctl)
    described = await fresh.describe([s.vm_id for s in launched])
    assert {v: s.token for v, s in described.items()} == {s.vm_id: s.token for s in launched}
    owned = await cloud.driver(TYPES, ctl).list_owned()
    assert sorted(s.token for s in owned) == ["r0", "r1", "r2"]


async def test_describe_is_one_status_call_for_the_fleet_and_reads_only_ended_vms(cloud):
    driver = cloud.driver(TYPES, controller_id())
    vms = [(await driver.launch(LaunchRequest(f"f{i}", TYPES[0]))).vm_id for i in range(40)]
    before = cloud.layer.calls.copy()
    statuses = await driver.describe(vms)
    assert all(s.state is VmState.RUNNING for s in statuses.values()) and len(statuses) == 40
    # One status call, and one for interruption notices of the 40 running (ids per 200).
    assert cloud.layer.calls - before == {
        "DescribeInstanceStatus": 1,
        "DescribeSpotInstanceRequests": 1,
    }

    for vm_id in vms[:3]:
        cloud.interrupt(vm_id)
    await driver.terminate(vms[3:5])
    before = cloud.layer.calls.copy()
    statuses = await driver.describe(vms)
    assert cloud.layer.calls - before == {
        "DescribeInstanceStatus": 1,
        "DescribeInstances": 1,
        "DescribeSpotInstanceRequests": 1,
    }
    for vm_id in vms[:3]:
        assert statuses[vm_id].state is VmState.PREEMPTED
        assert "Server.SpotInstanceTermination" in statuses[vm_id].reason
    assert [statuses[v].state for v in vms[3:5]] == [VmState.TERMINATED] * 2
    assert "controller" in statuses[vms[3]].reason
    # Ended statuses are final: the next describe does not read them again.
    reads = cloud.layer.calls["DescribeInstances"]
    again = await driver.describe(vms)
    assert all(again[v] == statuses[v] for v in vms[:5])
    assert cloud.layer.calls["DescribeInstances"] == reads


async def test_an_interruption_notice_is_read_from_the_spot_request(cloud):
    """EC2 marks a Spot Instance's request for termination two minutes before it
    interrupts it: describe reports the instance running with notice_until (the mark's
    time + 120 s), then preempted; a driver told not to read notices sees only that."""
    driver = cloud.driver(TYPES, controller_id())
    vm = await driver.launch(LaunchRequest("n", TYPES[0]))
    other = await driver.launch(LaunchRequest("m", TYPES[0]))
    running = await driver.describe([vm.vm_id, other.vm_id])
    assert running[vm.vm_id].notice_until is None
    marked_at = time.time()
    # Interrupted 3 s after the mark (0.5 s was too short for the two describes on a
    # host the rest of the suite kept busy).
    cloud.notice(vm.vm_id, lead_s=3.0)
    noticed = await driver.describe([vm.vm_id, other.vm_id])
    assert noticed[vm.vm_id].state is VmState.RUNNING
    assert marked_at - 1 <= noticed[vm.vm_id].notice_until - 120.0 <= marked_at + 1
    assert noticed[other.vm_id].notice_until is None
    calls = cloud.layer.calls["DescribeSpotInstanceRequests"]
    again = await driver.describe([vm.vm_id])  # known: not asked again
    assert again[vm.vm_id].notice_until == noticed[vm.vm_id].notice_until
    assert cloud.layer.calls["DescribeSpotInstanceRequests"] == calls
    await asyncio.sleep(max(0.0, marked_at + 3.3 - time.time()))
    ended = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert ended.state is VmState.PREEMPTED and ended.notice_until is None
    quiet = cloud.driver(TYPES, controller_id(), notices=False)
    third = await quiet.launch(LaunchRequest("q", TYPES[0]))
    cloud.notice(third.vm_id, lead_s=60)
    assert (await quiet.describe([third.vm_id]))[third.vm_id].notice_until is None


async def test_preemption_time_comes_from_the_state_transition(cloud):
    driver = cloud.driver(TYPES, controller_id())
    vm = await driver.launch(LaunchRequest("t", TYPES[0]))
    cloud.interrupt(vm.vm_id)
    ended = (await driver.describe([vm.vm_id]))[vm.vm_id]
    assert ended.state is VmState.PREEMPTED
    assert ended.launched_at <= ended.changed_at <= driver._now()


async def test_throttled_calls_are_retried_and_give_up_as_transient(cloud):
    driver = cloud.driver(TYPES, controller_id(), max_retries=4)
    vm = await driver.launch(LaunchRequest("t", TYPES[0]))
    cloud.fail_next("DescribeInstanceStatus", "RequestLimitExceeded", 3)
    assert (await driver.describe([vm.vm_id]))[vm.vm_id].state is VmState.RUNNING
    assert cloud.layer.calls["DescribeInstanceStatus"] == 4
    cloud.fail_next("DescribeInstanceStatus", "InternalError", 5)
    with pytest.raises(TransientError, match="after 5 attempts"):
        await driver.describe([vm.vm_id])


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("InsufficientInstanceCapacity", CapacityError),
        ("MaxSpotInstanceCountExceeded", QuotaError),
        ("VcpuLimitExceeded", QuotaError),
        ("UnauthorizedOperation", PermanentError),
    ],
)
async def test_launch_errors_from_ec2_are_typed(cloud, code, error):
    driver = cloud.driver(TYPES, controller_id())
    cloud.fail_next("RunInstances", code)
    with pytest.raises(error, match=code):
        await driver.launch(LaunchRequest("t", TYPES[0]))
    assert cloud.layer.calls["RunInstances"] == 1  # not retried
    assert cloud.live_instances() == []


async def test_terminate_skips_ids_that_do_not_exist(cloud):
    driver = cloud.driver(TYPES, controller_id())
    vms = [(await driver.launch(LaunchRequest(f"t{i}", TYPES[0]))).vm_id for i in range(3)]
    await driver.terminate([vms[0], "i-0000000000000dead", vms[1], "i-00000000000000bad", "junk"])
    assert cloud.live_instances() == [vms[2]]
    await driver.terminate(vms)  # again, with the ones already gone
    assert cloud.live_instances() == []


async def test_spot_prices_are_read_page_by_page_and_cached(cloud):
    now = 1_790_000_000.0
    clock = [now]
    samples = [
        PriceSample(t.name, f"{REGION}{z}", round(0.01 + i * 1e-4, 6), now - 60 * i)
        for t in TYPES
        for z in "abcdef"
        for i in range(250)
    ]
    cloud.set_spot_prices(samples)
    driver = AwsDriver(
        TYPES,
        cloud.settings(controller_id(), price_cache_s=300.0),
        session=cloud.session(),
        now=lambda: clock[0],
    )
    got = await driver.spot_prices([], [])
    # Each catalog type is placed in one zone: it gets that zone's prices.
    placed = [
        p for p in samples if (p.vm_type, p.zone[-1]) in (("m5.large", "a"), ("m5.xlarge", "b"))
    ]
    assert sorted(got, key=repr) == sorted(placed, key=repr)
    assert cloud.layer.calls["DescribeSpotPriceHistory"] == 3  # 3,000 samples, pages of 1,000
    only_a = await driver.spot_prices(["m5.large"], [f"{REGION}a"])
    assert {(p.vm_type, p.zone) for p in only_a} == {("m5.large", f"{REGION}a")}
    assert len(only_a) == 250
    assert cloud.layer.calls["DescribeSpotPriceHistory"] == 5  # m5.large alone: 2 pages more
    clock[0] += 100
    await driver.spot_prices([], [])
    assert cloud.layer.calls["DescribeSpotPriceHistory"] == 5  # cached
    clock[0] += 300
    await driver.spot_prices([], [])
    assert cloud.layer.calls["DescribeSpotPriceHistory"] == 8  # expired: read again


async def test_a_price_source_replaces_the_api(cloud):
    def source(types, zones):
        return [PriceSample(t, "trace", 0.5, 0.0) for t in types]

    driver = cloud.driver(TYPES, controller_id(), price_source=source)
    assert [p.vm_type for p in await driver.spot_prices([], [])] == ["m5.large", "m5.xlarge"]
    assert cloud.layer.calls["DescribeSpotPriceHistory"] == 0


def test_on_demand_prices_come_from_the_catalog_the_table_or_the_override(cloud):
    driver = cloud.driver(TYPES, controller_id())
    prices = {t.name: t.on_demand_price_per_hour for t in driver.vm_types()}
    assert prices == {"m5.large": 0.096, "m5.xlarge": 0.192}  # m5.large from the table
    driver = cloud.driver(TYPES, controller_id(), on_demand_prices={"m5.xlarge": 0.2})
    assert {t.name: t.on_demand_price_per_hour for t in driver.vm_types()}["m5.xlarge"] == 0.2


async def test_credentials_stay_out_of_errors_and_logs(cloud, caplog):
    secret = "sb-SECRET-" + uuid.uuid4().hex
    session = boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key=secret, region_name=REGION
    )
    driver = AwsDriver(TYPES, cloud.settings(controller_id()), session=session)
    caplog.set_level(logging.DEBUG)
    cloud.fail_next("RunInstances", "RequestLimitExceeded", 2)
    cloud.fail_next("RunInstances", "UnauthorizedOperation")
    with pytest.raises(PermanentError) as failed:
        await driver.launch(LaunchRequest("t", TYPES[0]))
    assert secret not in str(failed.value) and secret not in caplog.text


async def test_no_credentials_is_a_permanent_error(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    settings = AwsSettings(region=REGION, controller_id="c", endpoint_url="http://127.0.0.1:9")
    with pytest.raises(PermanentError, match="credentials"):
        await AwsDriver(TYPES, settings).launch(LaunchRequest("t", TYPES[0]))


def test_errors_are_classified_by_code_and_status():
    def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
        return botocore.exceptions.ClientError(
            {
                "Error": {"Code": code, "Message": "m"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "RunInstances",
        )

    assert isinstance(classify(client_error("Unsupported", 400), "x"), CapacityError)
    assert isinstance(classify(client_error("SpotMaxPriceTooLow", 400), "x"), CapacityError)
    assert isinstance(classify(client_error("InstanceLimitExceeded", 400), "x"), QuotaError)
    assert isinstance(classify(client_error("Throttling", 400), "x"), TransientError)
    assert isinstance(classify(client_error("Whatever", 503), "x"), TransientError)
    assert isinstance(classify(client_error("InvalidAMIID.NotFound", 400), "x"), PermanentError)
    endpoint = botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")
    assert isinstance(classify(endpoint, "x"), TransientError)
    assert classify(ValueError("no"), "x") is None


def test_regions_of_zones():
    assert region_of("us-east-1a") == "us-east-1"
    assert region_of("us-west-2-lax-1a") == "us-west-2"
    assert region_of("us-gov-west-1b") == "us-gov-west-1"
    assert region_of("us-east-1") is None and region_of("local") is None
    # Drivers may not import policies, so this reading of AWS zone names is kept apart
    # from policies.registry.region_of, the one rule elsewhere; the two agree.
    from policies.registry import region_of as region_rule

    for zone in ("us-east-1a", "us-west-2-lax-1a", "us-gov-west-1b", "ap-south-1-ccu-1a"):
        assert region_rule(zone) == region_of(zone)
        assert region_rule(region_of(zone)) == region_of(zone)  # a region is its own


def test_user_data_values_are_shell_quoted_and_placeholders_checked():
    settings = {
        "SPOTBAG_VM_ID": "it's $(rm -rf /)",
        "SPOTBAG_CONTROLLER_ID": "c",
        "SPOTBAG_CONTROLLER_URL": "",
        "SPOTBAG_VM_TYPE": "m5.large",
    }
    rendered = render_user_data("T=$token C=$controller_id U=$controller_url V=$vm_type", settings)
    assert rendered == "T='it'\"'\"'s $(rm -rf /)' C='c' U='' V='m5.large'"
    with pytest.raises(PermanentError, match="placeholder"):
        render_user_data("$nope", settings)
    with pytest.raises(PermanentError, match="16384"):
        render_user_data("x" * 20_000, settings)
    # The bundled boot script carries every setting, quoted, in node.env.
    bundled = render_user_data(None, dict(settings, SPOTBAG_SLURM_NODE="sb-vm-1"))
    assert "SPOTBAG_VM_ID='it'\"'\"'s $(rm -rf /)'" in bundled
    assert "SPOTBAG_SLURM_NODE='sb-vm-1'" in bundled


async def test_one_instance_type_listed_per_zone_launches_and_is_priced_per_zone(cloud):
    per_zone = [
        VmType("m5-1a", 2, 8.0, 0, 0.04, 0.0, f"{REGION}a", instance_type="m5.large"),
        VmType("m5-1b", 2, 8.0, 0, 0.03, 0.0, f"{REGION}b", instance_type="m5.large"),
    ]
    now = 1_790_000_000.0
    cloud.set_spot_prices(
        [
            PriceSample("m5.large", f"{REGION}a", 0.041, now),
            PriceSample("m5.large", f"{REGION}b", 0.029, now),
            PriceSample("m5.large", f"{REGION}c", 0.001, now),
        ]
    )
    driver = cloud.driver(per_zone, controller_id())
    assert {t.name: t.on_demand_price_per_hour for t in driver.vm_types()} == {
        "m5-1a": 0.096,
        "m5-1b": 0.096,
    }
    prices = {(p.vm_type, p.zone): p.price_per_hour for p in await driver.spot_prices([], [])}
    assert prices == {("m5-1a", f"{REGION}a"): 0.041, ("m5-1b", f"{REGION}b"): 0.029}
    status = await driver.launch(LaunchRequest("z", per_zone[1]))
    got = instance(cloud, status.vm_id)
    assert (
        got["InstanceType"] == "m5.large" and got["Placement"]["AvailabilityZone"] == f"{REGION}b"
    )
    assert status.vm_type == "m5-1b"
    fresh = cloud.driver(per_zone, driver._settings.controller_id)
    assert (await fresh.describe([status.vm_id]))[status.vm_id].vm_type == "m5-1b"
