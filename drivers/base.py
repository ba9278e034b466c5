"""The Driver protocol: what the controller needs from one cloud (or fake cloud).

A driver launches, describes, lists and terminates VMs and reports spot prices.
It knows nothing of jobs or policies. Every call is async; drivers over
synchronous SDKs run them in threads so the event loop never blocks.

Identity: the controller picks a `token` for every launch and records the VM
under that token before calling `launch`; launching twice with one token must
give one VM (clouds: ClientToken / requestId). Drivers return `VmStatus` keyed
by the provider's id and carrying the token back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable


class VmState(StrEnum):
    PENDING = "pending"  # requested, not yet usable
    RUNNING = "running"  # booted; jobs can run on it
    PREEMPTED = "preempted"  # reclaimed by the provider (reason says why)
    TERMINATED = "terminated"  # stopped by the controller (or vanished)
    FAILED = "failed"  # could not be launched or broke


@dataclass(frozen=True)
class VmType:
    """A kind of VM a driver can launch, with its capacity and prices."""

    name: str
    cpus: int
    memory_gb: float
    gpus: int = 0
    spot_price_per_hour: float = 0.0
    on_demand_price_per_hour: float = 0.0
    zone: str = ""
    # The cloud's machine type when `name` is not one: the same machine type listed once
    # per zone needs distinct names ("m5.large-1b", instance_type "m5.large").
    instance_type: str = ""

    @property
    def machine(self) -> str:
        """What the cloud calls this type."""
        return self.instance_type or self.name


@dataclass(frozen=True)
class LaunchRequest:
    token: str  # the controller's id for this VM; idempotency key
    vm_type: VmType
    spot: bool = True
    zone: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    # Values for the VM's bootstrap (node.env): what it needs to join the executor's
    # cluster, e.g. its Slurm node name. The driver renders them into its user data.
    bootstrap: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VmStatus:
    vm_id: str  # the provider's id
    token: str  # the controller's id given at launch
    vm_type: str
    state: VmState
    zone: str = ""
    reason: str = ""  # why it is PREEMPTED / FAILED / TERMINATED
    launched_at: float = 0.0  # epoch seconds
    changed_at: float = 0.0  # epoch seconds of the last state change
    # A preemption notice: the provider takes the VM by this time (epoch seconds). The VM
    # still runs; None: no notice (yet).
    notice_until: float | None = None


@dataclass(frozen=True)
class PriceSample:
    vm_type: str
    zone: str
    price_per_hour: float
    at: float  # epoch seconds


class SpotMarket(Protocol):
    """A spot price that moves, for the local and sim drivers (`spotbag simulate
    --price-trace`: controller/traces/price_trace.py TraceMarket): a spot VM is
    launched only while the price is at or below its bid and preempted when the price
    first rises above it."""

    def price_at(self, vm_type: str, zone: str, at: float) -> float:
        """The spot price (USD/h) in effect at `at`."""
        ...

    def first_above(self, vm_type: str, zone: str, bid: float, after: float) -> float:
        """The first moment after `after` the price is above `bid` (inf: never)."""
        ...


class DriverError(Exception):
    """Base of the typed driver errors; `retry_after_s` is a hint, not a promise."""

    retry_after_s: float | None = None


class CapacityError(DriverError):
    """The provider has no capacity of this type (in this zone) right now."""


class QuotaError(DriverError):
    """An account limit (vCPU quota, spot instance count) was reached."""


class TransientError(DriverError):
    """Throttling or a network error: the same call may succeed later."""


class PermanentError(DriverError):
    """The request cannot succeed as made (bad type, bad image, no permission)."""


StatusListener = Callable[[VmStatus], None]


@runtime_checkable
class Driver(Protocol):
    name: str

    def vm_types(self) -> Sequence[VmType]:
        """The catalog of types this driver can launch."""

    async def launch(self, req: LaunchRequest) -> VmStatus:
        """Launch one VM; idempotent on `req.token`."""

    async def describe(self, vm_ids: Sequence[str]) -> Mapping[str, VmStatus]:
        """Current status of the given provider ids; unknown ids are left out."""

    async def list_owned(self) -> Sequence[VmStatus]:
        """Every live VM this controller owns (by tag), for reconciling after a restart."""

    async def terminate(self, vm_ids: Sequence[str]) -> None:
        """Terminate; idempotent; ids that are already gone are fine."""

    async def spot_prices(
        self, types: Sequence[str], zones: Sequence[str]
    ) -> Sequence[PriceSample]:
        """Recent spot prices for the given types and zones."""

    def subscribe(self, listener: StatusListener) -> None:
        """Push status changes to `listener` as they happen (drivers that can);
        drivers that cannot are polled with `describe`."""


# --- optional capabilities, checked once when the daemon wires its driver ---------------


@runtime_checkable
class HostedDriver(Protocol):
    """A driver with state of its own to start and close (the local driver's VM hosts)."""

    vms_outlive_controller: bool  # its VMs live on when the daemon stops (as cloud VMs do)

    async def start(self) -> None:
        """Take back what outlived the last daemon."""

    async def close(self) -> None:
        """Stop watching; what outlives the daemon is left as it is."""


@runtime_checkable
class PreemptionInjector(Protocol):
    """A driver that can preempt its VMs on request (fault injection: local and sim)."""

    def inject_preemption(self, vm_id: str, reason: str = "", notice_s: float = 0.0) -> bool:
        """Preempt a live VM now, or after a notice `notice_s` ahead. False if not live."""
