"""The GCE driver: Spot (or legacy preemptible) VMs on Google Compute Engine.

Talks to the Compute Engine v1 API through google-cloud-compute's synchronous REST
client. Every SDK call runs in a worker thread (`asyncio.to_thread`) under a
semaphore of `max_concurrency` slots, so the event loop never blocks and the API
never sees more than that many calls from us at once.

Identity
    vm_id is "zone/name": GCE instance names are unique per zone, not per project,
    and with the zone in the id `terminate` and `describe` need no lookup. The name
    is derived from the controller id and the token (`instance_name`): "sb-", a
    readable slug of the token, and 12 hex digits of a SHA-256 over both, so two
    controllers in one project never collide and tokens that differ only in case or
    punctuation get different names. The insert's `requestId` is a UUID5 of
    (project, controller id, token): a retried launch, even from a restarted
    controller, is the same request to GCE and never makes a second VM. The API
    forgets requestIds after about an hour; a later insert of the same name gets
    409 alreadyExists and launch returns the instance that exists, after checking
    that its token is ours.
    Labels `spotbag-controller` and `spotbag-token` mark our VMs (label values are
    restricted to [a-z0-9_-]{0,63}, so both are sanitised); the exact token rides in
    the instance metadata (`spotbag-token`) because the controller keys VMs by it.

Launch
    Capacity and quota errors usually arrive in the insert *operation*, not in the
    HTTP answer, so launch polls the operation (with our own ZoneOperationsClient:
    `ExtendedOperation.result()` polls through an internal client that ignores the
    configured endpoint) every `operation_poll_s` until DONE or
    `operation_timeout_s`, then reads the instance. The poll sleeps on the event
    loop, not in a thread, and holds no semaphore slot between polls.

Describe
    One aggregated list, filtered server-side on the controller label, pages of 500:
    a fleet of N VMs costs ceil(N / 500) calls however many ids are asked about. A
    VM that has stopped (STOPPING, TERMINATED, SUSPENDED, ...) or vanished was
    preempted if a `compute.instances.preempted` zone operation targets it; those
    are listed once per zone that has such VMs, not once per VM. A preemption, once
    found, is remembered. A vanished VM is reported only if this driver has seen it
    (launched, described or listed it), since only then does it know the token; the
    controller treats an id left out as vanished.
    changed_at is the provider's time when it has one (creationTimestamp,
    lastStartTimestamp, lastStopTimestamp, the preemption's insertTime), never
    later than `now()`; otherwise the first time this driver saw the state.

Terminate
    DELETE per VM, with one requestId per call (repeats inside the call are
    deduplicated by GCE; a later terminate is a new request). It does not wait for
    the delete operation (tens of seconds on GCE): describe shows the VM STOPPING,
    then gone, both reported TERMINATED. 404 (already gone) and resourceNotReady
    (already being deleted) are fine.

Errors
    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] -> CapacityError; QUOTA_EXCEEDED,
    403 quotaExceeded -> QuotaError; 429, 403 rateLimitExceeded, 500/502/503/504,
    connection errors -> retried (`max_retries` times after the first attempt,
    full-jitter exponential backoff from `backoff_base_s` up to `backoff_max_s`),
    then TransientError; other 400/401/403/404 -> PermanentError. An insert
    operation that ended in an error is final for its requestId (GCE answers a
    repeat with the same failed operation), so operation errors are not retried
    here: the controller launches again under a new token.

Clients
    One InstancesClient and one ZoneOperationsClient per driver, made on first use.
    Compute Engine has a single global endpoint for every region and zone, so
    per-region clients (as for AWS) would only multiply connection pools and token
    refreshes. The clients share one requests session each; its pool holds 10
    connections, so a max_concurrency above 10 opens and closes extra connections.

Credentials
    The SDK's standard chain (`google.auth.default`) unless `credentials` is passed
    (tests pass AnonymousCredentials). They are resolved lazily, on the first call,
    and never logged.

Prices
    GCE has no spot price history API (Spot prices change at most once a day and are
    published through the Cloud Billing Catalog API); `spot_prices` answers from
    `GceSettings.spot_prices` (per type), else the catalog's spot price.

Status changes are not pushed: `subscribe` keeps the listener and the controller
polls `describe`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import requests
from google.api_core import exceptions as core_exceptions
from google.cloud import compute_v1

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

log = logging.getLogger("spotbag.drivers.gce")

T = TypeVar("T")

CONTROLLER_LABEL = "spotbag-controller"
TOKEN_LABEL = "spotbag-token"
TOKEN_METADATA_KEY = "spotbag-token"
VM_TYPE_METADATA_KEY = "spotbag-vm-type"  # the catalog's name (the machine type may differ)
PREEMPTED_OPERATION = "compute.instances.preempted"
# A Spot VM stops about 30 s after its preemption begins (the operation is inserted, the
# metadata server's instance/preempted turns TRUE, shutdown scripts run).
PREEMPTION_NOTICE_S = 30.0
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PAGE_SIZE = 500  # the API's largest page
HTTP_TIMEOUT_S = 60.0  # per HTTP request; operations are polled, so no call waits long
STARTUP_SCRIPT_MAX_BYTES = 256 * 1024  # GCE's limit on one metadata value
# Fixed forever: requestIds of existing VMs are derived from it.
REQUEST_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://spotbag/drivers/gce/request-id")

# GCE instance status -> ours. Stopped ones become PREEMPTED or TERMINATED in describe.
PENDING_STATUSES = frozenset({"PROVISIONING", "STAGING"})
# REPAIRING: the host failed and GCE is moving the VM; it comes back or terminates.
RUNNING_STATUSES = frozenset({"RUNNING", "REPAIRING"})
ENDED_STATUSES = frozenset(
    {"STOPPING", "PENDING_STOP", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"}
)

CAPACITY_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})
TRANSIENT_OPERATION_CODES = frozenset(
    {"RESOURCE_OPERATION_RATE_EXCEEDED", "RATE_LIMIT_EXCEEDED", "INTERNAL_ERROR"}
)
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
QUOTA_REASONS = frozenset({"quotaExceeded", "QUOTA_EXCEEDED"})
RETRIED_HTTP_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

_NAME_SLUG_BAD = re.compile(r"[^a-z0-9]+")
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


@dataclass(frozen=True, kw_only=True)
class GceSettings:
    """Where and how the GCE driver launches VMs. Keyword-only; required: project,
    zones, controller_id."""

    project: str
    zones: tuple[str, ...]  # default placement: a type's own zone wins, else hashed by token
    controller_id: str  # value of the spotbag-controller label: which VMs are ours
    api_endpoint: str | None = None  # e.g. "http://127.0.0.1:8080" for a fake; None: Google's
    source_image: str = "projects/debian-cloud/global/images/family/debian-12"
    network: str = "global/networks/default"
    subnetwork: str | None = None  # "regions/R/subnetworks/S"; None: the network's default
    service_account_email: str | None = None  # None: no service account on the VM
    provisioning: str = "spot"  # "spot" (provisioningModel SPOT) or legacy "preemptible"
    termination_action: str = "DELETE"  # on preemption of a Spot VM: "DELETE" or "STOP"
    max_concurrency: int = 8  # SDK calls in flight at once
    max_retries: int = 5  # retries after the first attempt of a throttled/failed call
    backoff_base_s: float = 0.2
    backoff_max_s: float = 5.0
    operation_poll_s: float = 0.2
    operation_timeout_s: float = 120.0
    # Read preemption notices: every describe of running VMs also lists their zones'
    # preemption operations (one call per zone), to see a preemption that has begun.
    notices: bool = True
    spot_prices: Mapping[str, float] = field(default_factory=dict, hash=False)  # USD/hour
    startup_script: str | None = None  # metadata startup-script; None: the bundled boot script

    def __post_init__(self) -> None:
        object.__setattr__(self, "zones", tuple(self.zones))
        object.__setattr__(self, "spot_prices", dict(self.spot_prices))
        if not self.project:
            raise ValueError("project is required")
        if not self.zones:
            raise ValueError("at least one zone is required")
        if not self.controller_id:
            raise ValueError("controller_id is required")
        if self.provisioning not in ("spot", "preemptible"):
            raise ValueError(
                f"provisioning must be 'spot' or 'preemptible', not {self.provisioning!r}"
            )
        if self.termination_action not in ("DELETE", "STOP"):
            raise ValueError(
                f"termination_action must be 'DELETE' or 'STOP', not {self.termination_action!r}"
            )
        if self.max_concurrency < 1 or self.max_retries < 0:
            raise ValueError("max_concurrency must be >= 1 and max_retries >= 0")
        if min(self.backoff_base_s, self.backoff_max_s, self.operation_poll_s) < 0:
            raise ValueError("backoff and poll intervals must be >= 0")
        if self.operation_timeout_s <= 0:
            raise ValueError("operation_timeout_s must be > 0")


# --- names, labels, ids ---------------------------------------------------------------


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def instance_name(controller_id: str, token: str) -> str:
    """A valid GCE name ([a-z]([-a-z0-9]{0,61}[a-z0-9])?), the same for the same inputs."""
    slug = _NAME_SLUG_BAD.sub("-", token.lower()).strip("-")[:44].strip("-")
    digest = _digest(controller_id, token)[:12]
    return f"sb-{slug}-{digest}" if slug else f"sb-{digest}"


def request_id(project: str, controller_id: str, token: str) -> str:
    """The insert's requestId: the same token is the same request, across restarts."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, "\0".join((project, controller_id, token))))


def label_value(text: str) -> str:
    """`text` as a label value ([a-z0-9_-]{0,63}); long ones keep a hash of the whole."""
    value = _LABEL_BAD.sub("-", text.lower())
    if len(value) > 63:
        value = f"{value[:50]}-{_digest(text)[:12]}"
    return value


def label_key(text: str) -> str:
    """`text` as a label key: a label value that starts with a letter."""
    key = label_value(text)
    if not key[:1].isalpha():
        key = label_value("k-" + text)
    return key


def parse_vm_id(vm_id: str) -> tuple[str, str] | None:
    """(zone, name) of a "zone/name" vm_id; None if it is not one."""
    zone, sep, name = vm_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        return None
    return zone, name


def _last_segment(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def _epoch_s(timestamp: str) -> float | None:
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return None


# --- errors -----------------------------------------------------------------------------


class _Retry(TransientError):
    """A failure worth retrying the same call for (throttling, 5xx, network)."""


class _NotReady(_Retry):
    """resourceNotReady: another operation on the resource is in progress."""


class _NotFound(PermanentError):
    """404: the resource does not exist."""


class _AlreadyExists(PermanentError):
    """409 alreadyExists: an instance of that name exists."""


def _reasons(exc: core_exceptions.GoogleAPICallError) -> set[str]:
    reasons = {e.get("reason", "") for e in exc.errors or () if isinstance(e, dict)}
    if exc.reason:
        reasons.add(exc.reason)
    return reasons


def _retry_after_s(exc: core_exceptions.GoogleAPICallError) -> float | None:
    response = getattr(exc, "response", None)
    header = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(header) if header else None
    except ValueError:
        return None  # an HTTP date; the backoff decides


def classify(exc: BaseException, what: str) -> DriverError | None:
    """The typed error for an SDK exception; _Retry ones may be retried. None: not ours."""
    if isinstance(exc, DriverError):
        return exc
    if isinstance(exc, core_exceptions.GoogleAPICallError):
        code = exc.code if isinstance(exc.code, int) else 0
        reasons = _reasons(exc)
        message = f"{what}: {exc.message}"
        error: DriverError
        if code == 404:
            error = _NotFound(message)
        elif code == 409 and "alreadyExists" in reasons:
            error = _AlreadyExists(message)
        elif "resourceNotReady" in reasons:
            error = _NotReady(message)
        elif reasons & RATE_REASONS or code in RETRIED_HTTP_STATUSES or code == 409:
            error = _Retry(message)
        elif reasons & QUOTA_REASONS:
            error = QuotaError(message)
        elif 400 <= code < 500:
            error = PermanentError(message)
        else:
            error = _Retry(message)
        error.retry_after_s = _retry_after_s(exc)
        return error
    if isinstance(exc, core_exceptions.RetryError | requests.ConnectionError | requests.Timeout):
        return _Retry(f"{what}: {exc}")
    # google.auth: no credentials found is permanent; a failed refresh may pass.
    module = type(exc).__module__
    if module.startswith("google.auth"):
        if type(exc).__name__ == "DefaultCredentialsError":
            return PermanentError(f"{what}: no Google credentials: {exc}")
        if getattr(exc, "retryable", True):
            return _Retry(f"{what}: credentials: {exc}")
        return PermanentError(f"{what}: credentials: {exc}")
    return None


def operation_error(op: compute_v1.Operation, what: str) -> DriverError:
    """The typed error for an operation that ended with `error.errors`."""
    errors = [(e.code, e.message) for e in op.error.errors]
    codes = {code for code, _ in errors}
    message = f"{what}: " + "; ".join(f"{code}: {text}" for code, text in errors)
    if codes & CAPACITY_CODES:
        return CapacityError(message)
    if codes & QUOTA_CODES:
        return QuotaError(message)
    if codes & TRANSIENT_OPERATION_CODES:
        return TransientError(message)
    return PermanentError(message)


# --- the driver ---------------------------------------------------------------------------


@dataclass
class _Clients:
    instances: compute_v1.InstancesClient
    operations: compute_v1.ZoneOperationsClient


@dataclass(frozen=True)
class _Seen:
    """What describe needs about a VM after it has vanished."""

    token: str
    vm_type: str
    zone: str
    launched_at: float
    instance_id: int


@dataclass(frozen=True)
class _Preemption:
    instance_id: int  # 0: unknown
    at: float  # epoch seconds (the operation's insertTime)
    message: str
    noticed: bool = False  # seen while it ran: a notice, the VM stopped ~30 s after `at`


class GceDriver:
    """Spot VMs on Compute Engine; see the module docstring for the design."""

    name = "gce"

    def __init__(
        self,
        catalog: Sequence[VmType],
        settings: GceSettings,
        *,
        now: Callable[[], float] = time.time,
        credentials: Any = None,
    ) -> None:
        self._types = {t.name: t for t in catalog}
        self._settings = settings
        self._now = now
        self._credentials = credentials
        self._clients: _Clients | None = None
        self._clients_lock = threading.Lock()
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._rng = random.Random()  # backoff jitter only
        self._controller_label = label_value(settings.controller_id)
        self._listeners: list[StatusListener] = []
        self._seen: dict[str, _Seen] = {}  # vm_id -> what we know
        self._preempted: dict[str, _Preemption] = {}  # vm_id -> found preemption (final)
        self._terminating: set[str] = set()  # vm_ids we asked GCE to delete
        self._first_seen: dict[str, tuple[VmState, float]] = {}  # vm_id -> (state, since)

    # --- Driver protocol -----------------------------------------------------------------

    def vm_types(self) -> Sequence[VmType]:
        return list(self._types.values())

    def subscribe(self, listener: StatusListener) -> None:
        # GCE has no push channel we can listen on here; the controller polls describe.
        self._listeners.append(listener)

    async def launch(self, req: LaunchRequest) -> VmStatus:
        vm_type = self._types.get(req.vm_type.name)
        if vm_type is None:
            raise PermanentError(f"unknown VM type {req.vm_type.name!r}")
        s = self._settings
        zone = self.zone_for(req)
        name = instance_name(s.controller_id, req.token)
        vm_id = f"{zone}/{name}"
        insert = compute_v1.InsertInstanceRequest(
            project=s.project,
            zone=zone,
            instance_resource=self.instance_resource(req, zone),
            request_id=request_id(s.project, s.controller_id, req.token),
        )
        what = f"launch of {vm_id} ({vm_type.name})"
        op = await self._api_accepting(
            what,
            lambda c: c.instances.insert_unary(request=insert, retry=None, timeout=HTTP_TIMEOUT_S),
            accept=(_AlreadyExists,),
        )
        if op is None:
            log.info("%s: the instance exists already; checking it is ours", what)
        else:
            await self._wait(zone, op, what)
        try:
            instance = await self._api(
                what,
                lambda c: c.instances.get(
                    project=s.project, zone=zone, instance=name, retry=None, timeout=HTTP_TIMEOUT_S
                ),
            )
        except _NotFound:
            # Made and already gone (preempted at once, or deleted): describe says which.
            self._seen[vm_id] = _Seen(req.token, vm_type.name, zone, self._now(), 0)
            return (await self.describe([vm_id]))[vm_id]
        token = _token_of(instance)
        if token != req.token:
            raise PermanentError(
                f"{what}: instance {vm_id} exists with token {token!r}, not {req.token!r}"
            )
        log.info("launched %s for token %s (%s)", vm_id, req.token, instance.status)
        if instance.status in ENDED_STATUSES:  # stopped already: was it preempted?
            self._remember(vm_id, instance)
            return (await self.describe([vm_id]))[vm_id]
        return self._status(vm_id, instance)

    async def describe(self, vm_ids: Sequence[str]) -> Mapping[str, VmStatus]:
        wanted = [vm_id for vm_id in dict.fromkeys(vm_ids) if parse_vm_id(vm_id)]
        if not wanted:
            return {}
        owned = await self._owned_instances()
        result: dict[str, VmStatus] = {}
        ended: dict[str, compute_v1.Instance | None] = {}  # stopped or vanished
        for vm_id in wanted:
            instance = owned.get(vm_id)
            if instance is None:
                if vm_id in self._seen:
                    ended[vm_id] = None
            elif instance.status in ENDED_STATUSES:
                self._remember(vm_id, instance)
                ended[vm_id] = instance
            else:
                result[vm_id] = self._status(vm_id, instance)
        running = [v for v, s in result.items() if s.state is VmState.RUNNING]
        zones = {v.partition("/")[0] for v in ended if v not in self._preempted}
        if self._settings.notices:
            zones |= {v.partition("/")[0] for v in running if v not in self._preempted}
        if zones:
            await self._find_preemptions(sorted(zones))
        for vm_id, instance in ended.items():
            result[vm_id] = self._ended_status(vm_id, instance)
        for vm_id in running:  # a preemption that has begun: the VM stops within ~30 s
            preemption = self._preempted.get(vm_id)
            if preemption is not None:
                result[vm_id] = replace(
                    result[vm_id], notice_until=preemption.at + PREEMPTION_NOTICE_S
                )
        return result

    async def list_owned(self) -> Sequence[VmStatus]:
        owned = await self._owned_instances()
        statuses = (self._status(vm_id, inst) for vm_id, inst in owned.items())
        return [st for st in statuses if st.state in (VmState.PENDING, VmState.RUNNING)]

    async def terminate(self, vm_ids: Sequence[str]) -> None:
        targets = [(v, p) for v in dict.fromkeys(vm_ids) if (p := parse_vm_id(v)) is not None]
        results = await asyncio.gather(
            *(self._delete(vm_id, zone, name) for vm_id, (zone, name) in targets),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def spot_prices(
        self, types: Sequence[str], zones: Sequence[str]
    ) -> Sequence[PriceSample]:
        now = self._now()
        samples = []
        for vm_type in self._types.values():
            if types and vm_type.name not in types:
                continue
            price = self._settings.spot_prices.get(vm_type.name, vm_type.spot_price_per_hour)
            where = list(zones) or ([vm_type.zone] if vm_type.zone else list(self._settings.zones))
            samples += [PriceSample(vm_type.name, zone, price, now) for zone in where]
        return samples

    # --- what we send ---------------------------------------------------------------------

    def zone_for(self, req: LaunchRequest) -> str:
        """The request's zone, else its type's, else one of the settings' zones by token hash
        (deterministic, so a retried launch goes to the same zone)."""
        zones = self._settings.zones
        return req.zone or req.vm_type.zone or zones[int(_digest(req.token)[:8], 16) % len(zones)]

    def boot_settings(self, req: LaunchRequest) -> dict[str, str]:
        """The VM's /etc/spotbag/node.env: who it is, whose it is, what the executor
        asked for (its Slurm node); with a configured API endpoint (a fake, in tests),
        the metadata server and Secret Manager are looked for there too."""
        s = self._settings
        settings = {
            "SPOTBAG_VM_ID": req.token,
            "SPOTBAG_CONTROLLER_ID": s.controller_id,
            "SPOTBAG_VM_TYPE": req.vm_type.name,
            # A Slurm node watches its metadata server for notices (notice_watch.py).
            "SPOTBAG_NOTICE_WATCH": "gce",
        }
        if s.api_endpoint:
            settings["SPOTBAG_GCE_METADATA_URL"] = f"{s.api_endpoint}/computeMetadata/v1"
            settings["SPOTBAG_SECRETMANAGER_URL"] = s.api_endpoint
        settings.update(req.bootstrap)
        return settings

    def startup_script(self, req: LaunchRequest) -> str:
        """The configured startup script as it is, else the bundled boot script."""
        if self._settings.startup_script:
            return self._settings.startup_script
        try:
            return bootstrap.render(
                None, self.boot_settings(req), max_bytes=STARTUP_SCRIPT_MAX_BYTES
            )
        except bootstrap.BootstrapError as exc:
            raise PermanentError(f"startup script: {exc}") from None

    def instance_resource(self, req: LaunchRequest, zone: str) -> compute_v1.Instance:
        """The instance launch inserts for `req` in `zone`."""
        s = self._settings
        vm_type = self._types.get(req.vm_type.name, req.vm_type)
        labels = {label_key(k): label_value(v) for k, v in req.tags.items()}
        labels[CONTROLLER_LABEL] = self._controller_label
        labels[TOKEN_LABEL] = label_value(req.token)
        metadata = [
            compute_v1.Items(key=TOKEN_METADATA_KEY, value=req.token),
            compute_v1.Items(key=VM_TYPE_METADATA_KEY, value=vm_type.name),
        ]
        metadata.append(compute_v1.Items(key="startup-script", value=self.startup_script(req)))
        interface = compute_v1.NetworkInterface(network=s.network)
        if s.subnetwork:
            interface.subnetwork = s.subnetwork
        instance = compute_v1.Instance(
            name=instance_name(s.controller_id, req.token),
            machine_type=f"zones/{zone}/machineTypes/{vm_type.machine}",
            labels=labels,
            metadata=compute_v1.Metadata(items=metadata),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=s.source_image
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=self._scheduling(req.spot, vm_type),
        )
        if s.service_account_email:
            instance.service_accounts = [
                compute_v1.ServiceAccount(
                    email=s.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
                )
            ]
        return instance

    def _scheduling(self, spot: bool, vm_type: VmType) -> compute_v1.Scheduling:
        if not spot:
            # GPUs cannot live-migrate: their hosts' maintenance stops the VM.
            return compute_v1.Scheduling(
                provisioning_model="STANDARD",
                automatic_restart=True,
                on_host_maintenance="TERMINATE" if vm_type.gpus else "MIGRATE",
            )
        if self._settings.provisioning == "preemptible":
            # Legacy preemptible VMs are always stopped (TERMINATED) when preempted.
            return compute_v1.Scheduling(
                preemptible=True, automatic_restart=False, on_host_maintenance="TERMINATE"
            )
        return compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action=self._settings.termination_action,
            automatic_restart=False,
            on_host_maintenance="TERMINATE",
        )

    # --- what we read -----------------------------------------------------------------------

    def _status(self, vm_id: str, instance: compute_v1.Instance) -> VmStatus:
        """The status of a present instance (ended ones: see _ended_status)."""
        self._remember(vm_id, instance)
        if instance.status in ENDED_STATUSES:
            return self._ended_status(vm_id, instance)
        created = _epoch_s(instance.creation_timestamp)
        if instance.status in RUNNING_STATUSES:
            state = VmState.RUNNING
            at = _epoch_s(instance.last_start_timestamp) or created
        elif instance.status in PENDING_STATUSES:
            state, at = VmState.PENDING, created
        else:  # a status GCE added after this was written
            state, at = VmState.PENDING, None
        seen = self._seen[vm_id]
        return VmStatus(
            vm_id=vm_id,
            token=seen.token,
            vm_type=seen.vm_type,
            state=state,
            zone=seen.zone,
            reason="",  # live: nothing to explain (and a repeated launch compares equal)
            launched_at=seen.launched_at,
            changed_at=self._changed_at(vm_id, state, at),
        )

    def _ended_status(self, vm_id: str, instance: compute_v1.Instance | None) -> VmStatus:
        """A stopped (instance given) or vanished (None) VM: preempted or terminated."""
        seen = self._seen[vm_id]
        preemption = self._preempted.get(vm_id)
        gce_status = instance.status if instance is not None else "gone"
        at: float | None
        if preemption is not None:
            state, at = VmState.PREEMPTED, preemption.at
            if preemption.noticed:  # seen as a notice: it stopped when the notice ran out
                at = min(preemption.at + PREEMPTION_NOTICE_S, self._now())
            reason = f"preempted by GCE: {preemption.message or PREEMPTED_OPERATION} (instance {gce_status})"
        else:
            state = VmState.TERMINATED
            at = _epoch_s(instance.last_stop_timestamp) if instance is not None else None
            if vm_id in self._terminating:
                reason = f"terminated by the controller (instance {gce_status})"
            elif instance is None:
                reason = "instance deleted, not by a preemption"
            else:
                message = f": {instance.status_message}" if instance.status_message else ""
                reason = f"instance {gce_status}, not by a preemption{message}"
        return VmStatus(
            vm_id=vm_id,
            token=seen.token,
            vm_type=seen.vm_type,
            state=state,
            zone=seen.zone,
            reason=reason,
            launched_at=seen.launched_at,
            changed_at=self._changed_at(vm_id, state, at),
        )

    def _remember(self, vm_id: str, instance: compute_v1.Instance) -> None:
        created = _epoch_s(instance.creation_timestamp)
        self._seen[vm_id] = _Seen(
            token=_token_of(instance),
            vm_type=_metadata(instance, VM_TYPE_METADATA_KEY)
            or _last_segment(instance.machine_type),
            zone=_last_segment(instance.zone),
            launched_at=created if created is not None else self._now(),
            instance_id=instance.id,
        )

    def _changed_at(self, vm_id: str, state: VmState, provider_at: float | None) -> float:
        now = self._now()
        first = self._first_seen.get(vm_id)
        if first is None or first[0] is not state:
            first = (state, now)
            self._first_seen[vm_id] = first
        return min(provider_at, now) if provider_at is not None else first[1]

    async def _owned_instances(self) -> dict[str, compute_v1.Instance]:
        """Every instance with our controller label, by vm_id: one call per 500."""
        s = self._settings
        request = compute_v1.AggregatedListInstancesRequest(
            project=s.project,
            filter=f'labels.{CONTROLLER_LABEL} = "{self._controller_label}"',
            max_results=PAGE_SIZE,
        )
        found: dict[str, compute_v1.Instance] = {}
        while True:

            def page(c: _Clients) -> compute_v1.InstanceAggregatedList:
                pager = c.instances.aggregated_list(
                    request=request, retry=None, timeout=HTTP_TIMEOUT_S
                )
                return next(iter(pager.pages))  # this page only; the next is our next call

            response = await self._api("describe (aggregated list)", page)
            for scope in response.items.values():
                for instance in scope.instances:
                    found[f"{_last_segment(instance.zone)}/{instance.name}"] = instance
            if not response.next_page_token:
                return found
            request.page_token = response.next_page_token

    async def _find_preemptions(self, zones: Sequence[str]) -> None:
        """Record in self._preempted the VMs of ours that `compute.instances.preempted`
        operations in `zones` target: one list (per 500 operations) per zone."""

        async def one_zone(zone: str) -> None:
            request = compute_v1.ListZoneOperationsRequest(
                project=self._settings.project,
                zone=zone,
                filter=f'operationType = "{PREEMPTED_OPERATION}"',
                max_results=PAGE_SIZE,
            )
            while True:

                def page(c: _Clients) -> compute_v1.OperationList:
                    pager = c.operations.list(request=request, retry=None, timeout=HTTP_TIMEOUT_S)
                    return next(iter(pager.pages))

                response = await self._api(f"describe (preemptions in {zone})", page)
                for op in response.items:
                    self._note_preemption(zone, op)
                if not response.next_page_token:
                    return
                request.page_token = response.next_page_token

        await asyncio.gather(*(one_zone(zone) for zone in zones))

    def _note_preemption(self, zone: str, op: compute_v1.Operation) -> None:
        vm_id = f"{zone}/{_last_segment(op.target_link)}"
        seen = self._seen.get(vm_id)
        if seen is None or vm_id in self._preempted:
            return
        if op.target_id and seen.instance_id and op.target_id != seen.instance_id:
            return  # an earlier instance of the same name
        at = _epoch_s(op.insert_time)
        self._preempted[vm_id] = _Preemption(
            op.target_id,
            at if at is not None else self._now(),
            op.status_message,
            noticed=op.status != compute_v1.Operation.Status.DONE,
        )

    # --- operations and deletes ----------------------------------------------------------

    async def _wait(self, zone: str, op: compute_v1.Operation, what: str) -> None:
        """Poll a zone operation until DONE; raise its error as a typed one."""
        deadline = time.monotonic() + self._settings.operation_timeout_s
        project = self._settings.project
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                raise TransientError(
                    f"{what}: operation {op.name} not done after "
                    f"{self._settings.operation_timeout_s:g} s (status {op.status.name})"
                )
            await asyncio.sleep(self._settings.operation_poll_s)
            get = compute_v1.GetZoneOperationRequest(project=project, zone=zone, operation=op.name)
            op = await self._api(
                what,
                _operation_getter(get),
            )
        if op.error.errors:
            raise operation_error(op, what)

    async def _delete(self, vm_id: str, zone: str, name: str) -> None:
        self._terminating.add(vm_id)
        delete = compute_v1.DeleteInstanceRequest(
            project=self._settings.project,
            zone=zone,
            instance=name,
            request_id=str(uuid.uuid4()),
        )
        op = await self._api_accepting(
            f"terminate {vm_id}",
            lambda c: c.instances.delete_unary(request=delete, retry=None, timeout=HTTP_TIMEOUT_S),
            accept=(_NotFound, _NotReady),
        )
        log.info("terminating %s: %s", vm_id, "delete requested" if op else "already going")

    # --- calling the SDK --------------------------------------------------------------------

    def _get_clients(self) -> _Clients:
        with self._clients_lock:
            if self._clients is None:
                credentials = self._credentials
                if credentials is None:
                    import google.auth

                    credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
                kwargs: dict[str, Any] = {"credentials": credentials, "transport": "rest"}
                if self._settings.api_endpoint:
                    kwargs["client_options"] = {"api_endpoint": self._settings.api_endpoint}
                self._clients = _Clients(
                    compute_v1.InstancesClient(**kwargs),
                    compute_v1.ZoneOperationsClient(**kwargs),
                )
            return self._clients

    async def _api(self, what: str, call: Callable[[_Clients], T]) -> T:
        """Run `call` in a thread under a slot, retrying throttling and transient failures
        (drivers/retry.py); errors come out typed."""
        backoff = self._backoff()
        return await with_retries(
            self._in_slot(call), classify, what, backoff, self._rng, retryable=_Retry
        )

    async def _api_accepting(
        self, what: str, call: Callable[[_Clients], T], accept: tuple[type[DriverError], ...]
    ) -> T | None:
        """`_api`, except that the typed errors in `accept` come back as None (an
        insert of an instance that exists, a delete of one that is gone)."""
        return await with_retries(
            self._in_slot(call),
            classify,
            what,
            self._backoff(),
            self._rng,
            retryable=_Retry,
            accept=accept,
        )

    def _backoff(self) -> Backoff:
        s = self._settings
        return Backoff(s.max_retries, s.backoff_base_s, s.backoff_max_s)

    def _in_slot(self, call: Callable[[_Clients], T]) -> Callable[[], Awaitable[T]]:
        async def run() -> T:
            async with self._slots:
                return await asyncio.to_thread(lambda: call(self._get_clients()))

        return run


def _operation_getter(
    request: compute_v1.GetZoneOperationRequest,
) -> Callable[[_Clients], compute_v1.Operation]:
    return lambda c: c.operations.get(request=request, retry=None, timeout=HTTP_TIMEOUT_S)


def _metadata(instance: compute_v1.Instance, key: str) -> str:
    for item in instance.metadata.items:
        if item.key == key:
            return item.value
    return ""


def _token_of(instance: compute_v1.Instance) -> str:
    """The exact token from the metadata; else the (sanitised) label."""
    for item in instance.metadata.items:
        if item.key == TOKEN_METADATA_KEY:
            return item.value
    return instance.labels.get(TOKEN_LABEL, "")
