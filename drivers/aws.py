"""The AWS driver: one-time EC2 Spot instances (or on-demand ones) through boto3.

Every SDK call runs in a worker thread (`asyncio.to_thread`) under a semaphore of
`max_concurrency` slots, with one EC2 client per region, made on first use from one
boto3 session. botocore's own retries are off: this module retries throttling and
transient failures itself (full-jitter exponential backoff), so the number of
attempts and the waits are the configured ones and the errors come out typed.

Identity
    vm_id is the EC2 instance id (unique across regions). The launch's ClientToken is
    derived from (controller id, token): a retried launch, even from a restarted
    controller, is the same request to EC2 and returns the instance the first one
    made. Tags `spotbag:controller` and `spotbag:token` mark our instances and carry
    the exact token back; the controller keys VMs by it.

Launch
    `run_instances` with `InstanceMarketOptions` spot, one-time, terminate on
    interruption (spot VMs) and no MaxPrice unless configured (the cap is then the
    on-demand price), tags on the instance and its volumes, and user data: the boot
    script of drivers/bootstrap.py (or a configured template), which joins the VM to
    Slurm when the executor asked for a node. Placement:
    the request's zone, else the type's zone if it is an availability zone; a
    configured subnet for that zone wins over both.

Describe
    Batched: one `describe_instance_status` (IncludeAllInstances, pages of 1,000) per
    region gives the state of every instance; only the ids it cannot settle from that
    (ended ones, whose state reason says whether a Spot interruption ended them, and
    ones this driver has never seen, whose token it needs) are read with
    `describe_instances`, filtered by instance id in batches of 200. A fleet of 1,000
    VMs costs one small call per region in the common case.
    State reasons `Server.SpotInstanceTermination` / `Server.SpotInstanceShutdown`
    (any `Server.SpotInstance*`) are PREEMPTED; `Client.UserInitiatedShutdown` and
    the VM shutting itself down are TERMINATED; other `Server.*`/`Client.*` reasons
    (an internal error, a volume limit, a launch that failed) are FAILED. The reason
    is kept, verbatim. An ended status, once known, is final and not read again. An
    instance that vanishes from the listing (EC2 keeps terminated ones for about an
    hour) after this driver saw it is TERMINATED, unless it was already known to be
    preempted.
    changed_at: LaunchTime for pending, the first sighting for running, and for an
    ended instance the time in its StateTransitionReason ("User initiated (... GMT)")
    when there is one, never later than `now()`.

Terminate
    `terminate_instances` in batches of 1,000 per region. EC2 refuses the whole call
    when one id does not exist (InvalidInstanceID.NotFound names it); those ids are
    dropped and the rest sent again, so ids that are gone are fine.

Errors
    InsufficientInstanceCapacity and its kin, Unsupported (type not offered in the
    zone), SpotMaxPriceTooLow -> CapacityError; MaxSpotInstanceCountExceeded,
    VcpuLimitExceeded, InstanceLimitExceeded -> QuotaError; RequestLimitExceeded,
    throttling, InternalError, 5xx, connection errors -> retried (`max_retries`
    times after the first attempt), then TransientError; anything else (bad
    parameters, no permission, no credentials) -> PermanentError.

Prices
    `spot_prices` reads `describe_spot_price_history` (Linux/UNIX, the last
    `price_lookback_s`, every page) per region and caches each answer for
    `price_cache_s`. A `price_source` callable given to the constructor replaces the
    API (trace replay, tests). On-demand prices come from the catalog, else the
    bundled table drivers/data/aws_on_demand.json (Linux, per region), and
    `AwsSettings.on_demand_prices` overrides both.

Credentials
    Only boto3's standard chain (environment, shared config/credentials files, SSO,
    the instance profile of the head node). Nothing in spotbag's config, nothing
    logged.

Status changes are not pushed: `subscribe` keeps the listener and the controller
polls `describe`. (The two-minute Spot interruption notice is visible only from
inside the instance or through EventBridge, neither of which a head node polls.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from operator import methodcaller
from pathlib import Path
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from drivers import bootstrap
from drivers.base import (
    CapacityError,
    DriverError,
    LaunchRequest,
    PermanentError,
    PriceSample,
    QuotaError,
    StatusListener,
    TransientError,
    VmState,
    VmStatus,
    VmType,
)
from drivers.retry import Backoff, with_retries

log = logging.getLogger("spotbag.drivers.aws")

T = TypeVar("T")

CONTROLLER_TAG = "spotbag:controller"
TOKEN_TAG = "spotbag:token"
VM_TYPE_TAG = "spotbag:vm-type"  # the catalog's name (the instance type may differ)
STATUS_PAGE = 1000  # describe_instance_status / describe_instances: the API's largest page
ID_FILTER_BATCH = 200  # instance ids per describe_instances filter
# EC2's interruption notice comes two minutes before it interrupts a Spot Instance.
INTERRUPTION_NOTICE_S = 120.0
MARKED_CODES = ("marked-for-termination", "marked-for-stop", "marked-for-hibernation")
TERMINATE_BATCH = 1000
USER_DATA_MAX_BYTES = 16 * 1024  # EC2's limit (before base64)
LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")

PENDING_STATES = frozenset({"pending"})
RUNNING_STATES = frozenset({"running"})
ENDED_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "Unsupported",
    }
)
QUOTA_CODES = frozenset(
    {
        "MaxSpotInstanceCountExceeded",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "ResourceLimitExceeded",
        "MaxSpotFleetRequestCountExceeded",
    }
)
RETRIED_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound"})

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_INSTANCE_IDS_IN_TEXT = re.compile(r"\bi-[0-9a-f]{8,17}\b")
_REGION_OF_ZONE = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d+)(?:[a-z]|-.+)$")
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


@dataclass(frozen=True, kw_only=True)
class AwsSettings:
    """Where and how the AWS driver launches instances. Keyword-only; required:
    region, controller_id."""

    region: str  # default region; a type's availability zone implies its own
    controller_id: str  # value of the spotbag:controller tag: which instances are ours
    image_id: str = "resolve:ssm:/aws/service/debian/release/12/latest/amd64"
    endpoint_url: str | None = None  # e.g. "http://127.0.0.1:5000" for moto; None: AWS's
    subnet_ids: Mapping[str, str] = field(default_factory=dict, hash=False)  # zone -> subnet
    security_group_ids: tuple[str, ...] = ()
    iam_instance_profile: str | None = None  # a name, or an ARN
    key_name: str | None = None
    max_spot_price: float | None = None  # USD/hour; None: the on-demand price
    user_data_template: str | None = None  # a file; None: the bundled template
    controller_url: str = ""  # given to the user data: where the node calls back
    on_demand_prices: Mapping[str, float] = field(default_factory=dict, hash=False)
    max_concurrency: int = 8  # SDK calls in flight at once (and HTTP connections)
    max_retries: int = 5  # retries after the first attempt of a throttled/failed call
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0
    price_cache_s: float = 300.0
    price_lookback_s: float = 3600.0
    http_timeout_s: float = 60.0
    # Read interruption notices: every describe of running instances also asks which of
    # their spot requests EC2 marked for termination (one call per region and 200 ids).
    notices: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "subnet_ids", dict(self.subnet_ids))
        object.__setattr__(self, "security_group_ids", tuple(self.security_group_ids))
        object.__setattr__(self, "on_demand_prices", dict(self.on_demand_prices))
        if not self.region:
            raise ValueError("region is required")
        if not self.controller_id:
            raise ValueError("controller_id is required")
        if not self.image_id:
            raise ValueError("image_id is required")
        if self.max_concurrency < 1 or self.max_retries < 0:
            raise ValueError("max_concurrency must be >= 1 and max_retries >= 0")
        if min(self.backoff_base_s, self.backoff_max_s, self.price_cache_s) < 0:
            raise ValueError("backoff and cache intervals must be >= 0")
        if self.max_spot_price is not None and self.max_spot_price <= 0:
            raise ValueError("max_spot_price must be > 0 (or unset: the on-demand price)")


# --- names and places -------------------------------------------------------------------


def client_token(controller_id: str, token: str) -> str:
    """The launch's ClientToken (at most 64 ASCII characters): same inputs, same token."""
    return "sb-" + hashlib.sha256(f"{controller_id}\0{token}".encode()).hexdigest()[:48]


def region_of(zone: str) -> str | None:
    """The region of an availability zone ("us-east-1a" -> "us-east-1",
    "us-west-2-lax-1a" -> "us-west-2"); None if `zone` is not one."""
    match = _REGION_OF_ZONE.fullmatch(zone)
    return match.group(1) if match else None


def is_instance_id(text: str) -> bool:
    return bool(_INSTANCE_ID.fullmatch(text))


def bundled_on_demand_prices() -> dict[str, dict[str, float]]:
    """region -> type -> USD/hour (Linux, on-demand) from drivers/data/aws_on_demand.json."""
    text = resources.files("drivers").joinpath("data/aws_on_demand.json").read_text()
    table = json.loads(text)
    return {region: dict(prices) for region, prices in table["prices"].items()}


def render_user_data(template: str | None, settings: Mapping[str, str]) -> str:
    """The VM's boot script (drivers/bootstrap.py: the bundled one when `template` is
    None) with its SPOTBAG_* settings; a bad template or one too large for EC2 is a
    PermanentError."""
    try:
        return bootstrap.render(template, settings, max_bytes=USER_DATA_MAX_BYTES)
    except bootstrap.BootstrapError as exc:
        raise PermanentError(f"user data: {exc}") from None


def _epoch_s(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return None


def _transition_time_s(reason: str) -> float | None:
    match = _TRANSITION_TIME.search(reason or "")
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _tags(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", ())}


# --- errors -----------------------------------------------------------------------------


class _Retry(TransientError):
    """A failure worth retrying the same call for (throttling, 5xx, network)."""


class _NotFound(PermanentError):
    """InvalidInstanceID.NotFound: `missing` are the ids EC2 named."""

    missing: frozenset[str] = frozenset()


def classify(exc: BaseException, what: str) -> DriverError | None:
    """The typed error for a botocore exception; _Retry ones may be retried. None: not ours."""
    if isinstance(exc, DriverError):
        return exc
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = f"{what}: {code}: {error.get('Message', '')}"
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        typed: DriverError
        if code in CAPACITY_CODES:
            typed = CapacityError(message)
        elif code in QUOTA_CODES:
            typed = QuotaError(message)
        elif code in NOT_FOUND_CODES:
            typed = _NotFound(message)
            typed.missing = frozenset(_INSTANCE_IDS_IN_TEXT.findall(str(error.get("Message", ""))))
        elif code in RETRIED_CODES or status == 429 or status >= 500:
            typed = _Retry(message)
        else:
            typed = PermanentError(message)
        return typed
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.NoRegionError):
        return PermanentError(f"{what}: {exc}")
    if isinstance(
        exc,
        botocore.exceptions.ConnectionError
        | botocore.exceptions.HTTPClientError
        | botocore.exceptions.ReadTimeoutError,
    ):
        return _Retry(f"{what}: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return PermanentError(f"{what}: {exc}")
    return None


def _state_of(aws_state: str, reason_code: str, terminating: bool) -> VmState:
    """Our state for an instance's state name and state-reason code."""
    if aws_state in PENDING_STATES:
        return VmState.PENDING
    if aws_state in RUNNING_STATES:
        return VmState.RUNNING
    if reason_code.startswith("Server.SpotInstance"):
        return VmState.PREEMPTED
    if terminating or reason_code in ("Client.UserInitiatedShutdown", ""):
        return VmState.TERMINATED
    if reason_code == "Client.InstanceInitiatedShutdown":
        return VmState.TERMINATED
    return VmState.FAILED


# --- the driver ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seen:
    """What describe needs about an instance besides its state."""

    token: str
    vm_type: str
    zone: str
    region: str
    launched_at: float


PriceSource = Callable[[Sequence[str], Sequence[str]], Sequence[PriceSample]]


class AwsDriver:
    """Spot instances on EC2; see the module docstring for the design."""

    name = "aws"

    def __init__(
        self,
        catalog: Sequence[VmType],
        settings: AwsSettings,
        *,
        now: Callable[[], float] = time.time,
        price_source: PriceSource | None = None,
        session: Any = None,
    ) -> None:
        self._settings = settings
        self._types = {t.name: self._priced(t) for t in catalog}
        self._now = now
        self._price_source = price_source
        self._session = session  # a boto3 Session; None: made on first use (standard chain)
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._rng = random.Random()  # backoff jitter only
        self._listeners: list[StatusListener] = []
        self._seen: dict[str, _Seen] = {}  # vm_id -> what we know
        self._final: dict[str, VmStatus] = {}  # vm_id -> its ended status (never changes)
        self._noticed: dict[str, float] = {}  # vm_id -> when EC2 interrupts it (its notice)
        self._terminating: set[str] = set()  # vm_ids we asked EC2 to terminate
        self._first_seen: dict[str, tuple[VmState, float]] = {}
        self._price_cache: dict[tuple, tuple[float, list[PriceSample]]] = {}
        template_path = settings.user_data_template
        self._template = Path(template_path).read_text() if template_path else None

    def _priced(self, vm_type: VmType) -> VmType:
        """`vm_type` with its on-demand price: the override, else its own, else the table."""
        override = self._settings.on_demand_prices.get(
            vm_type.name, self._settings.on_demand_prices.get(vm_type.machine)
        )
        if override is not None:
            price = override
        elif vm_type.on_demand_price_per_hour > 0:
            return vm_type
        else:
            region = region_of(vm_type.zone) or self._settings.region
            price = bundled_on_demand_prices().get(region, {}).get(vm_type.machine, 0.0)
        return VmType(**{**vm_type.__dict__, "on_demand_price_per_hour": price})

    # --- Driver protocol -----------------------------------------------------------------

    def vm_types(self) -> Sequence[VmType]:
        return list(self._types.values())

    def subscribe(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    async def launch(self, req: LaunchRequest) -> VmStatus:
        vm_type = self._types.get(req.vm_type.name)
        if vm_type is None:
            raise PermanentError(f"unknown VM type {req.vm_type.name!r}")
        zone = self.zone_for(req)
        region = region_of(zone) or self._settings.region
        what = f"launch of token {req.token} ({vm_type.name} in {zone or region})"
        params = self.run_instances_params(req, zone)
        response = await self._api(region, what, lambda ec2: ec2.run_instances(**params))
        assert response is not None
        instance = response["Instances"][0]
        vm_id = instance["InstanceId"]
        token = _tags(instance).get(TOKEN_TAG, req.token)
        if token != req.token:
            raise PermanentError(f"{what}: instance {vm_id} carries token {token!r}")
        self._remember(vm_id, instance, region, token=req.token)
        state_name = instance["State"]["Name"]
        log.info("launched %s for token %s (%s)", vm_id, req.token, state_name)
        if state_name in ENDED_STATES:  # a repeated launch of an instance that has ended
            return (await self.describe([vm_id]))[vm_id]
        return self._live_status(vm_id, state_name)

    async def describe(self, vm_ids: Sequence[str]) -> Mapping[str, VmStatus]:
        wanted = [v for v in dict.fromkeys(vm_ids) if is_instance_id(v)]
        open_ids = [v for v in wanted if v not in self._final]
        listed: dict[str, str] = {}  # vm_id -> EC2 state name
        if open_ids:
            listed = await self._states(self._regions_of(open_ids))
        unknown_or_ended = [
            v
            for v in open_ids
            if v in listed and (v not in self._seen or listed[v] in ENDED_STATES)
        ]
        details = await self._details(unknown_or_ended) if unknown_or_ended else {}
        result: dict[str, VmStatus] = {}
        for vm_id in wanted:
            if vm_id in self._final:
                result[vm_id] = self._final[vm_id]
            elif vm_id in details:
                result[vm_id] = self._status_from_detail(vm_id, details[vm_id])
            elif vm_id in listed and vm_id in self._seen:
                if listed[vm_id] in ENDED_STATES:  # listed, then gone before the detail read
                    result[vm_id] = self._vanished(vm_id)
                else:
                    result[vm_id] = self._live_status(vm_id, listed[vm_id])
            elif vm_id in self._seen:
                result[vm_id] = self._vanished(vm_id)
        if self._settings.notices:
            await self._add_notices(result)
        return result

    async def _add_notices(self, result: dict[str, VmStatus]) -> None:
        """Running instances whose spot request EC2 marked for termination (its
        interruption notice) get notice_until: the mark's time + 2 minutes."""
        running = [v for v, s in result.items() if s.state is VmState.RUNNING]
        unknown = [v for v in running if v not in self._noticed]
        by_region: dict[str, list[str]] = {}
        for vm_id in unknown:
            by_region.setdefault(self._seen[vm_id].region, []).append(vm_id)
        calls = [
            (region, ids[i : i + ID_FILTER_BATCH])
            for region, ids in by_region.items()
            for i in range(0, len(ids), ID_FILTER_BATCH)
        ]
        pages = await asyncio.gather(
            *(
                self._api(
                    region,
                    f"describe (interruption notices in {region})",
                    methodcaller(
                        "describe_spot_instance_requests",
                        Filters=[
                            {"Name": "instance-id", "Values": ids},
                            {"Name": "status-code", "Values": list(MARKED_CODES)},
                        ],
                    ),
                )
                for region, ids in calls
            )
        )
        for page in pages:
            for request in (page or {}).get("SpotInstanceRequests", ()):
                status = request.get("Status") or {}
                marked_at = _epoch_s(status.get("UpdateTime"))
                vm_id = request.get("InstanceId", "")
                if vm_id in result and status.get("Code") in MARKED_CODES:
                    self._noticed[vm_id] = (
                        marked_at if marked_at is not None else self._now()
                    ) + INTERRUPTION_NOTICE_S
        for vm_id in running:
            if vm_id in self._noticed:
                result[vm_id] = replace(result[vm_id], notice_until=self._noticed[vm_id])

    async def list_owned(self) -> Sequence[VmStatus]:
        filters = [
            {"Name": f"tag:{CONTROLLER_TAG}", "Values": [self._settings.controller_id]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
        found = await asyncio.gather(
            *(self._describe_instances(region, filters) for region in self._all_regions())
        )
        statuses = []
        for region, instances in zip(self._all_regions(), found, strict=True):
            for instance in instances:
                vm_id = instance["InstanceId"]
                self._remember(vm_id, instance, region)
                statuses.append(self._status_from_detail(vm_id, instance))
        return [s for s in statuses if s.state in (VmState.PENDING, VmState.RUNNING)]

    async def terminate(self, vm_ids: Sequence[str]) -> None:
        by_region: dict[str, list[str]] = {}
        for vm_id in dict.fromkeys(vm_ids):
            if not is_instance_id(vm_id):
                continue  # not an EC2 id: nothing of ours to end
            seen = self._seen.get(vm_id)
            by_region.setdefault(seen.region if seen else self._settings.region, []).append(vm_id)
            self._terminating.add(vm_id)
        batches = [
            (region, ids[i : i + TERMINATE_BATCH])
            for region, ids in by_region.items()
            for i in range(0, len(ids), TERMINATE_BATCH)
        ]
        results = await asyncio.gather(
            *(self._terminate_batch(region, ids) for region, ids in batches),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def spot_prices(
        self, types: Sequence[str], zones: Sequence[str]
    ) -> Sequence[PriceSample]:
        names = sorted(set(types) if types else set(self._types))
        if self._price_source is not None:
            return list(self._price_source(names, zones))
        catalog = [self._types[n] for n in names if n in self._types]
        machines = {t.machine for t in catalog} | {n for n in names if n not in self._types}
        regions = sorted({region_of(z) or self._settings.region for z in zones}) or [
            self._settings.region
        ]
        history: list[PriceSample] = []
        for region in regions:
            history += await self._region_prices(region, tuple(sorted(machines)))
        if zones:  # zones may name availability zones or whole regions
            wanted = set(zones)
            history = [p for p in history if p.zone in wanted or region_of(p.zone) in wanted]
        # Back to catalog names: a type placed in an availability zone gets that zone's
        # prices; one without a zone gets every zone's. A name that is not in the catalog
        # is a machine type asked for as it is.
        samples = []
        for price in history:
            matched = [
                t
                for t in catalog
                if t.machine == price.vm_type and (not region_of(t.zone) or t.zone == price.zone)
            ]
            if matched:
                samples += [dataclasses.replace(price, vm_type=t.name) for t in matched]
            elif price.vm_type in names and price.vm_type not in self._types:
                samples.append(price)
        return samples

    # --- what we send ---------------------------------------------------------------------

    def zone_for(self, req: LaunchRequest) -> str:
        """The request's zone, else the type's if it is an availability zone; "" lets EC2
        choose (in the subnet's zone when a default subnet is configured)."""
        zone = req.zone or req.vm_type.zone
        return zone if region_of(zone) else ""

    def boot_settings(self, req: LaunchRequest, zone: str) -> dict[str, str]:
        """The VM's /etc/spotbag/node.env: who it is, whose it is, where the secret
        store is (its region; the endpoint when one is configured, e.g. moto's), and
        what the executor asked for (its Slurm node)."""
        s = self._settings
        settings = {
            "SPOTBAG_VM_ID": req.token,
            "SPOTBAG_CONTROLLER_ID": s.controller_id,
            "SPOTBAG_CONTROLLER_URL": s.controller_url,
            "SPOTBAG_VM_TYPE": req.vm_type.name,
            "SPOTBAG_AWS_REGION": region_of(zone) or s.region,
            # A Slurm node watches its metadata server for notices (notice_watch.py).
            "SPOTBAG_NOTICE_WATCH": "aws",
        }
        if s.endpoint_url:
            settings["SPOTBAG_AWS_ENDPOINT_URL"] = s.endpoint_url
        settings.update(req.bootstrap)
        return settings

    def run_instances_params(self, req: LaunchRequest, zone: str) -> dict[str, Any]:
        """The keyword arguments of the run_instances call that launches `req`."""
        s = self._settings
        vm_type = self._types[req.vm_type.name]
        tags = [{"Key": str(k), "Value": str(v)} for k, v in req.tags.items()]
        tags += [
            {"Key": CONTROLLER_TAG, "Value": s.controller_id},
            {"Key": TOKEN_TAG, "Value": req.token},
            {"Key": VM_TYPE_TAG, "Value": vm_type.name},
            {"Key": "Name", "Value": f"spotbag-{req.token}"[:255]},
        ]
        params: dict[str, Any] = {
            "ImageId": s.image_id,
            "InstanceType": vm_type.machine,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(s.controller_id, req.token),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            "UserData": render_user_data(self._template, self.boot_settings(req, zone)),
            # The controller ends the VM; a VM that shuts itself down is gone, not stopped.
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if req.spot:
            spot_options: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if s.max_spot_price is not None:
                spot_options["MaxPrice"] = f"{s.max_spot_price:.5f}"
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot_options}
        subnet = s.subnet_ids.get(zone) if zone else None
        if subnet:
            params["SubnetId"] = subnet
        elif zone:
            params["Placement"] = {"AvailabilityZone": zone}
        if s.security_group_ids:
            params["SecurityGroupIds"] = list(s.security_group_ids)
        if s.iam_instance_profile:
            key = "Arn" if s.iam_instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: s.iam_instance_profile}
        if s.key_name:
            params["KeyName"] = s.key_name
        return params

    # --- what we read -----------------------------------------------------------------------

    def _remember(
        self, vm_id: str, instance: Mapping[str, Any], region: str, *, token: str | None = None
    ) -> None:
        launched = _epoch_s(instance.get("LaunchTime"))
        self._seen[vm_id] = _Seen(
            token=token if token is not None else _tags(instance).get(TOKEN_TAG, ""),
            vm_type=_tags(instance).get(VM_TYPE_TAG, instance.get("InstanceType", "")),
            zone=instance.get("Placement", {}).get("AvailabilityZone", ""),
            region=region,
            launched_at=launched if launched is not None else self._now(),
        )

    def _live_status(self, vm_id: str, state_name: str) -> VmStatus:
        seen = self._seen[vm_id]
        if state_name in RUNNING_STATES:
            state, at = VmState.RUNNING, None
        else:  # pending, or a state EC2 added after this was written
            state, at = VmState.PENDING, seen.launched_at
        return self._make(vm_id, state, "", at)

    def _status_from_detail(self, vm_id: str, instance: Mapping[str, Any]) -> VmStatus:
        state_name = instance["State"]["Name"]
        if state_name not in ENDED_STATES:
            return self._live_status(vm_id, state_name)
        state_reason = instance.get("StateReason") or {}
        code = str(state_reason.get("Code", ""))
        message = str(state_reason.get("Message", "")) or code
        state = _state_of(state_name, code, vm_id in self._terminating)
        if state is VmState.PREEMPTED:
            reason = f"spot interruption: {message} (instance {state_name})"
        elif vm_id in self._terminating:
            reason = f"terminated by the controller (instance {state_name})"
        else:
            reason = f"instance {state_name}: {message}" if message else f"instance {state_name}"
        at = _transition_time_s(instance.get("StateTransitionReason", ""))
        status = self._make(vm_id, state, reason, at)
        if state_name in ("terminated", "stopped") or state is VmState.PREEMPTED:
            self._final[vm_id] = status
        return status

    def _vanished(self, vm_id: str) -> VmStatus:
        status = self._make(vm_id, VmState.TERMINATED, "instance no longer listed by EC2", None)
        self._final[vm_id] = status
        return status

    def _make(self, vm_id: str, state: VmState, reason: str, provider_at: float | None) -> VmStatus:
        seen = self._seen[vm_id]
        now = self._now()
        first = self._first_seen.get(vm_id)
        # EC2's transition times are whole seconds, so the change happened in [t, t + 1),
        # after the previous state was seen (or the launch) and by now: the middle of that.
        floor = first[1] if first is not None else seen.launched_at
        if first is None or first[0] is not state:
            first = (state, now)
            self._first_seen[vm_id] = first
        if provider_at is None:
            changed_at = first[1]
        else:
            low, high = max(provider_at, floor), min(provider_at + 1.0, now)
            changed_at = (low + high) / 2 if low <= high else min(max(provider_at, floor), now)
        return VmStatus(
            vm_id=vm_id,
            token=seen.token,
            vm_type=seen.vm_type,
            state=state,
            zone=seen.zone,
            reason=reason,
            launched_at=seen.launched_at,
            changed_at=changed_at,
        )

    def _all_regions(self) -> list[str]:
        """Every region this driver may have launched in: the default and the catalog's."""
        regions = {self._settings.region}
        regions |= {r for t in self._types.values() if (r := region_of(t.zone))}
        regions |= {seen.region for seen in self._seen.values()}
        return sorted(regions)

    def _regions_of(self, vm_ids: Sequence[str]) -> list[str]:
        regions = {self._seen[v].region for v in vm_ids if v in self._seen}
        if any(v not in self._seen for v in vm_ids):
            regions |= set(self._all_regions())
        return sorted(regions)

    async def _states(self, regions: Sequence[str]) -> dict[str, str]:
        """vm_id -> EC2 state name of every instance in `regions` (ours or not)."""

        async def one_region(region: str) -> dict[str, str]:
            states: dict[str, str] = {}
            kwargs: dict[str, Any] = {"IncludeAllInstances": True, "MaxResults": STATUS_PAGE}
            while True:
                page = await self._api(
                    region,
                    f"describe (instance states in {region})",
                    methodcaller("describe_instance_status", **kwargs),
                )
                assert page is not None
                for item in page.get("InstanceStatuses", ()):
                    states[item["InstanceId"]] = item["InstanceState"]["Name"]
                if not page.get("NextToken"):
                    return states
                kwargs["NextToken"] = page["NextToken"]

        merged: dict[str, str] = {}
        for states in await asyncio.gather(*(one_region(r) for r in regions)):
            merged.update(states)
        return merged

    async def _details(self, vm_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """The full descriptions of `vm_ids` (ids EC2 no longer knows are left out)."""
        by_region: dict[str, list[str]] = {}
        for vm_id in vm_ids:
            seen = self._seen.get(vm_id)
            for region in [seen.region] if seen else self._all_regions():
                by_region.setdefault(region, []).append(vm_id)
        calls = [
            (region, ids[i : i + ID_FILTER_BATCH])
            for region, ids in by_region.items()
            for i in range(0, len(ids), ID_FILTER_BATCH)
        ]
        pages = await asyncio.gather(
            *(
                self._describe_instances(region, [{"Name": "instance-id", "Values": ids}])
                for region, ids in calls
            )
        )
        found: dict[str, Mapping[str, Any]] = {}
        for (region, _), instances in zip(calls, pages, strict=True):
            for instance in instances:
                vm_id = instance["InstanceId"]
                if vm_id not in self._seen:
                    self._remember(vm_id, instance, region)
                found[vm_id] = instance
        return found

    async def _describe_instances(
        self, region: str, filters: list[dict[str, Any]]
    ) -> list[Mapping[str, Any]]:
        instances: list[Mapping[str, Any]] = []
        kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": STATUS_PAGE}
        while True:
            page = await self._api(
                region,
                f"describe (instances in {region})",
                methodcaller("describe_instances", **kwargs),
            )
            assert page is not None
            for reservation in page.get("Reservations", ()):
                instances += reservation.get("Instances", ())
            if not page.get("NextToken"):
                return instances
            kwargs["NextToken"] = page["NextToken"]

    async def _terminate_batch(self, region: str, vm_ids: list[str]) -> None:
        remaining = list(vm_ids)
        while remaining:
            try:
                await self._api(
                    region,
                    f"terminate {len(remaining)} instance(s) in {region}",
                    methodcaller("terminate_instances", InstanceIds=list(remaining)),
                )
                log.info("terminating %s", ", ".join(remaining))
                return
            except _NotFound as exc:
                gone = exc.missing & set(remaining)
                if not gone:  # EC2 did not say which: end them one by one
                    if len(remaining) == 1:
                        return
                    for vm_id in remaining:
                        await self._terminate_batch(region, [vm_id])
                    return
                remaining = [v for v in remaining if v not in gone]

    async def _region_prices(self, region: str, names: tuple[str, ...]) -> list[PriceSample]:
        """Spot price history of `names` in `region` over the lookback, every page; cached."""
        key = (region, names)
        now = self._now()
        cached = self._price_cache.get(key)
        if cached is not None and now - cached[0] < self._settings.price_cache_s:
            return cached[1]
        start = datetime.fromtimestamp(now - self._settings.price_lookback_s, UTC)
        kwargs: dict[str, Any] = {
            "InstanceTypes": list(names),
            "ProductDescriptions": list(LINUX_PRODUCTS),
            "StartTime": start,
            "MaxResults": 1000,
        }
        samples: list[PriceSample] = []
        while True:
            page = await self._api(
                region,
                f"spot prices in {region}",
                methodcaller("describe_spot_price_history", **kwargs),
            )
            assert page is not None
            for item in page.get("SpotPriceHistory", ()):
                at = _epoch_s(item.get("Timestamp"))
                samples.append(
                    PriceSample(
                        vm_type=item["InstanceType"],
                        zone=item.get("AvailabilityZone", region),
                        price_per_hour=float(item["SpotPrice"]),
                        at=at if at is not None else now,
                    )
                )
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
        self._price_cache[key] = (now, samples)
        return samples

    # --- calling the SDK --------------------------------------------------------------------

    def _client(self, region: str) -> Any:
        """One EC2 client per region (boto3 clients are thread-safe; sessions are not)."""
        with self._clients_lock:
            client = self._clients.get(region)
            if client is None:
                if self._session is None:
                    self._session = boto3.session.Session()
                s = self._settings
                config = botocore.config.Config(
                    region_name=region,
                    retries={"total_max_attempts": 1, "mode": "standard"},  # we retry
                    max_pool_connections=s.max_concurrency,
                    connect_timeout=min(10.0, s.http_timeout_s),
                    read_timeout=s.http_timeout_s,
                )
                client = self._session.client("ec2", endpoint_url=s.endpoint_url, config=config)
                self._clients[region] = client
            return client

    async def _api(self, region: str, what: str, call: Callable[[Any], T]) -> T:
        """Run `call(ec2 client of region)` in a thread under a slot, retrying throttling
        and transient failures (drivers/retry.py); errors come out typed."""
        s = self._settings

        async def run() -> T:
            async with self._slots:
                return await asyncio.to_thread(lambda: call(self._client(region)))

        backoff = Backoff(s.max_retries, s.backoff_base_s, s.backoff_max_s)
        return await with_retries(run, classify, what, backoff, self._rng, retryable=_Retry)
