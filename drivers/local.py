"""The local driver: "VMs" are bookkeeping slots on this host (the embedded default).

A launched VM boots after `boot_delay_s`, then lives until its sampled lifetime
ends (PREEMPTED) or the controller terminates it. Lifetimes come from an
injected sampler in *model hours*; `time_scale` compresses them, so with
time_scale = 1440 a 24-hour VM life passes in one real minute. Jobs on a local
VM are real processes run by the local executor; this driver only says when the
VM lives and dies.

The clock is injected too (`now`, `call_at`): the sim driver is this class on a
virtual clock.

With VM hosts (drivers/local_hosts.py, `[driver] hosts = "netns"`) a VM is also a
host of its own: booting it runs its boot script (drivers/bootstrap.py) in a network
namespace, where a slurmd joins the head node's Slurm; its end kills that host. The
VMs then do the work, through Slurm, as cloud VMs do.

Preemption notices (`notice_lead_s`, `inject_preemption(notice_s=...)`) reach the
controller as a cloud's API tells them (`VmStatus.notice_until`; unless `api_notices`
is off) and, with VM hosts, the VM itself as a cloud's metadata server tells it
(drivers/local_metadata.py, `metadata` = "aws" or "gce"), where the notice watcher
its boot script starts hears it; `inject_rebalance` gives EC2's rebalance
recommendation, which only the metadata server tells.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from drivers import bootstrap
from drivers.base import (
    CapacityError,
    DriverError,
    LaunchRequest,
    PermanentError,
    PriceSample,
    QuotaError,
    SpotMarket,
    StatusListener,
    TransientError,
    VmState,
    VmStatus,
    VmType,
)

if TYPE_CHECKING:
    from drivers.local_metadata import MetadataServer

log = logging.getLogger("spotbag.drivers.local")

LifetimeSampler = Callable[[VmType], float]  # model hours; inf = never preempted


@dataclass
class _Vm:
    status: VmStatus
    timers: list[Any]
    bootstrap: Mapping[str, str] = field(default_factory=dict)
    death_at: float | None = None  # when its sampled lifetime ends (None: never)
    noticed_until: float | None = None  # a preemption notice was given: taken by then
    ending: bool = False  # its host is being halted; its end is told once it is
    on_demand: bool = False  # launched on-demand: never preempted (injections refused)


class LocalDriver:
    """VMs on a (real or virtual) timeline with sampled preemptions."""

    name = "local"
    id_prefix = "local"
    # One count for every driver in the process: two drivers (two controllers in a
    # test, a foreign one in the contract suite) never hand out the same VM id.
    _next_id = 1

    def __init__(
        self,
        types: Sequence[VmType],
        *,
        now: Callable[[], float],
        call_at: Callable[[float, Callable[[], None]], Any],
        lifetime_h: LifetimeSampler,
        boot_delay_s: float = 0.0,
        time_scale: float = 1.0,
        hosts: Any = None,
        controller_id: str = "",
        notice_lead_s: float = 0.0,
        api_notices: bool = True,
        metadata: str = "none",
        spot_market: SpotMarket | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if not notice_lead_s >= 0:
            raise ValueError("notice_lead_s must be >= 0")
        # A preemption notice comes this long (model seconds) before a sampled preemption,
        # as the cloud a VM stands for gives one (EC2 120 s, GCE 30 s); 0: none.
        self._notice_lead_s = notice_lead_s
        # Whether describe tells notices (as GCE's and EC2's APIs do), and which cloud's
        # metadata server the VM hosts see ("none": none, and no watcher on the VMs).
        self._api_notices = api_notices
        if metadata not in ("none", "aws", "gce"):
            raise ValueError(f"unknown metadata server {metadata!r} (none, aws, gce)")
        self._metadata_kind = metadata if hosts is not None else "none"
        self._metadata: MetadataServer | None = None
        self._hosts = hosts  # drivers.local_hosts.NamespaceHosts, or None: bookkeeping only
        self._controller_id = controller_id
        self._tasks: set[asyncio.Task] = set()
        self._types = {t.name: t for t in types}
        self._now = now
        self._call_at = call_at
        self._lifetime_h = lifetime_h
        self._boot_delay_s = boot_delay_s
        self._time_scale = time_scale
        self._vms: dict[str, _Vm] = {}
        self._by_token: dict[str, str] = {}
        self._listeners: list[StatusListener] = []
        self._launch_faults: list[DriverError] = []  # raised by the next launches
        # A moving spot price (None: the catalog's, fixed): spot VMs are launched at or
        # below their bid, the on-demand price, and preempted when it rises above it.
        self._spot_market = spot_market

    # --- Driver protocol -------------------------------------------------

    def vm_types(self) -> Sequence[VmType]:
        return list(self._types.values())

    def subscribe(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    async def launch(self, req: LaunchRequest) -> VmStatus:
        existing = self._by_token.get(req.token)
        if existing is not None:
            return self._vms[existing].status
        if self._launch_faults:
            raise self._launch_faults.pop(0)
        vm_type = self._types.get(req.vm_type.name)
        if vm_type is None:
            raise PermanentError(f"unknown VM type {req.vm_type.name!r}")
        now = self._now()
        outbid_at = math.inf  # when the spot price first rises above the VM's bid
        if req.spot and self._spot_market is not None:
            bid = vm_type.on_demand_price_per_hour or math.inf
            price = self._spot_market.price_at(vm_type.name, req.zone or vm_type.zone, now)
            if price > bid:
                # As EC2 answers a spot request whose maximum price is below the market's.
                raise CapacityError(f"spot price {price:g} $/h is above the bid {bid:g} $/h")
            outbid_at = self._spot_market.first_above(
                vm_type.name, req.zone or vm_type.zone, bid, now
            )
        vm_id = f"{self.id_prefix}-{LocalDriver._take_id():06d}"
        status = VmStatus(
            vm_id=vm_id,
            token=req.token,
            vm_type=vm_type.name,
            state=VmState.PENDING,
            zone=req.zone or vm_type.zone,
            launched_at=now,
            changed_at=now,
        )
        vm = _Vm(status=status, timers=[], bootstrap=dict(req.bootstrap), on_demand=not req.spot)
        self._vms[vm_id] = vm
        self._by_token[req.token] = vm_id
        vm.timers.append(self._call_at(now + self._boot_delay_s, lambda: self._boot(vm_id)))
        lifetime_h = self._lifetime_h(vm_type) if req.spot else float("inf")
        if lifetime_h != float("inf") or outbid_at != math.inf:
            sampled_at = now + lifetime_h * 3600.0 / self._time_scale
            vm.death_at = min(sampled_at, outbid_at)
            reason = (
                f"preempted: sampled lifetime {lifetime_h:.3f} h"
                if sampled_at <= outbid_at
                else "preempted: the spot price rose above the bid"
            )
            self._arm_death(vm_id, vm.death_at, reason)
            self._arm_notice(vm_id, vm.death_at)
        return status

    def _arm_notice(self, vm_id: str, death_at: float) -> None:
        """The notice of a sampled preemption, `notice_lead_s` ahead (now if that passed:
        a VM adopted after a restart is told again; a notice is idempotent)."""
        if self._notice_lead_s > 0:
            notice_at = max(self._now(), death_at - self._notice_lead_s / self._time_scale)
            self._vms[vm_id].timers.append(
                self._call_at(notice_at, lambda: self._notice(vm_id, death_at))
            )

    def _arm_death(self, vm_id: str, death_at: float, reason: str) -> None:
        self._vms[vm_id].timers.append(
            self._call_at(death_at, lambda: self._end(vm_id, VmState.PREEMPTED, reason))
        )

    async def describe(self, vm_ids: Sequence[str]) -> Mapping[str, VmStatus]:
        return {i: self._vms[i].status for i in vm_ids if i in self._vms}

    async def list_owned(self) -> Sequence[VmStatus]:
        live = (VmState.PENDING, VmState.RUNNING)
        return [vm.status for vm in self._vms.values() if vm.status.state in live]

    async def terminate(self, vm_ids: Sequence[str]) -> None:
        for vm_id in vm_ids:
            self._end(vm_id, VmState.TERMINATED, "terminated by the controller")

    async def spot_prices(
        self, types: Sequence[str], zones: Sequence[str]
    ) -> Sequence[PriceSample]:
        now = self._now()
        market = self._spot_market
        return [
            PriceSample(
                t.name,
                t.zone,
                t.spot_price_per_hour if market is None else market.price_at(t.name, t.zone, now),
                now,
            )
            for t in self._types.values()
            if not types or t.name in types
        ]

    # --- local-only: fault injection -------------------------------------

    def inject_preemption(
        self, vm_id: str, reason: str = "preempted: injected", notice_s: float = 0.0
    ) -> bool:
        """Preempt a live VM (like AWS FIS's spot interruption): now, or after a notice
        `notice_s` seconds (of this driver's clock) ahead. False if not live, or
        on-demand (the provider never takes those back)."""
        vm = self._vms.get(vm_id)
        if vm is None or vm.ending or vm.status.state not in (VmState.PENDING, VmState.RUNNING):
            return False
        if vm.on_demand:
            return False
        if notice_s > 0:
            death_at = self._now() + notice_s
            self._notice(vm_id, death_at)
            vm.timers.append(
                self._call_at(death_at, lambda: self._end(vm_id, VmState.PREEMPTED, reason))
            )
            return True
        self._end(vm_id, VmState.PREEMPTED, reason)
        return True

    def _notice(self, vm_id: str, death_at: float) -> None:
        """Announce the VM's preemption at `death_at` (once; a live VM only)."""
        vm = self._vms.get(vm_id)
        if vm is None or vm.ending or vm.status.state not in (VmState.PENDING, VmState.RUNNING):
            return
        if vm.noticed_until is not None and vm.noticed_until <= death_at:
            return
        vm.noticed_until = death_at
        if self._metadata is not None:
            self._metadata.notice(vm_id, death_at)
        if not self._api_notices:
            return
        vm.status = replace(vm.status, notice_until=death_at, changed_at=self._now())
        for listener in self._listeners:
            listener(vm.status)

    def inject_rebalance(self, vm_id: str) -> bool:
        """EC2's rebalance recommendation: the VM is at elevated risk of a preemption,
        which need not follow. Only its metadata server says so (EC2's API does not);
        False if the VM is not live or has no metadata server to tell it."""
        vm = self._vms.get(vm_id)
        if vm is None or vm.ending or vm.status.state not in (VmState.PENDING, VmState.RUNNING):
            return False
        if self._metadata is None:
            return False
        self._metadata.rebalance(vm_id, self._now())
        return True

    def inject_launch_errors(self, kind: str, n: int = 1) -> None:
        """Make the next `n` launches fail as a cloud's would: capacity, quota, throttle
        (this driver does not retry: TransientError) or permanent."""
        errors = {
            "capacity": (CapacityError, "injected: no capacity for this type"),
            "quota": (QuotaError, "injected: spot instance quota reached"),
            "throttle": (TransientError, "injected: request rate exceeded"),
            "permanent": (PermanentError, "injected: request refused"),
        }
        if kind not in errors:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(errors)}")
        cls, message = errors[kind]
        self._launch_faults += [cls(message) for _ in range(n)]

    # --- timeline ----------------------------------------------------------

    @property
    def vms_outlive_controller(self) -> bool:
        """VM hosts outlive the controller, like cloud VMs; bookkeeping VMs do not."""
        return self._hosts is not None

    async def start(self) -> None:
        """Watch again the VM hosts that outlived the last controller: each is a running
        VM again, with the lifetime it was given at launch."""
        if self._hosts is None:
            return
        if self._metadata_kind != "none":
            await self._start_metadata()
        for host in await self._hosts.adopt():
            record = host.record
            status = VmStatus(
                vm_id=host.vm_id,
                token=record["token"],
                vm_type=record["vm_type"],
                state=VmState.RUNNING,
                zone=record.get("zone", ""),
                launched_at=record["launched_at"],
                changed_at=record["launched_at"],
            )
            self._vms[host.vm_id] = _Vm(status, [], death_at=record.get("death_at"))
            self._by_token[status.token] = host.vm_id
            if record.get("death_at") is not None:
                self._arm_death(host.vm_id, record["death_at"], "preempted: sampled lifetime")
                self._arm_notice(host.vm_id, record["death_at"])
            number = int(host.vm_id.rpartition("-")[2])
            LocalDriver._next_id = max(LocalDriver._next_id, number + 1)

    async def _start_metadata(self) -> None:
        """The VM hosts' metadata server on their bridge, on the port the last
        controller used if it is free (the VMs that outlived it ask there)."""
        hosts = self._hosts
        await hosts.ensure_bridge()
        port_file = hosts.consoles / "metadata.port"
        try:
            port = int(port_file.read_text())
        except (OSError, ValueError):
            port = 0
        # Imported here: it brings aiohttp's server (a quarter of a second), which only
        # VM hosts with a metadata server need, not `spotbag simulate` nor plain local VMs.
        from drivers.local_metadata import MetadataServer

        self._metadata = MetadataServer(hosts.vm_at)
        url = await self._metadata.start(hosts.head_address, port)
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.write_text(url.rpartition(":")[2])
        log.info("VM hosts' metadata server (%s) at %s", self._metadata_kind, url)

    def _metadata_settings(self) -> dict[str, str]:
        """What a VM's boot script needs to watch its metadata server for notices."""
        if self._metadata is None:
            return {}
        settings = {"SPOTBAG_NOTICE_WATCH": self._metadata_kind}
        if self._metadata_kind == "aws":
            settings["SPOTBAG_AWS_METADATA_URL"] = self._metadata.url
        else:
            settings["SPOTBAG_GCE_METADATA_URL"] = f"{self._metadata.url}/computeMetadata/v1"
            if self._notice_lead_s > 0:  # GCE's 30 s otherwise
                settings["SPOTBAG_NOTICE_LEAD_S"] = f"{self._notice_lead_s / self._time_scale:g}"
        return settings

    @classmethod
    def _take_id(cls) -> int:
        number = cls._next_id
        cls._next_id += 1
        return number

    async def close(self) -> None:
        """Stop watching; VM hosts run on (the next controller adopts them)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._metadata is not None:
            await self._metadata.close()

    def _boot(self, vm_id: str) -> None:
        vm = self._vms[vm_id]
        if vm.status.state is not VmState.PENDING:
            return
        if self._hosts is None:
            self._set(vm, VmState.RUNNING, "")
            return
        self._spawn(self._boot_host(vm_id))

    async def _boot_host(self, vm_id: str) -> None:
        """Run the VM's boot script on a host of its own; it is RUNNING once that
        started (joining the cluster is the executor's to notice), FAILED if not."""
        vm = self._vms[vm_id]
        settings = {
            "SPOTBAG_VM_ID": vm.status.token,
            "SPOTBAG_CONTROLLER_ID": self._controller_id,
            "SPOTBAG_VM_TYPE": vm.status.vm_type,
            # slurmd shares the head's kernel here: it must report its start as a boot.
            "SPOTBAG_SLURMD_REPORT_BOOT": "1",
            **self._metadata_settings(),
            **vm.bootstrap,
        }
        record = {
            "token": vm.status.token,
            "vm_type": vm.status.vm_type,
            "zone": vm.status.zone,
            "launched_at": vm.status.launched_at,
            "death_at": vm.death_at,
        }
        try:
            script = bootstrap.render(None, settings)
            await self._hosts.boot(vm_id, script, hostname=vm.status.token, record=record)
        except Exception as exc:
            log.warning("VM %s could not boot its host: %s", vm_id, exc)
            self._end(vm_id, VmState.FAILED, f"its host did not boot: {exc}")
            return
        if vm.status.state is VmState.PENDING and not vm.ending:
            self._set(vm, VmState.RUNNING, "")
        else:  # ended while it booted (halting twice is fine)
            await self._hosts.halt(vm_id)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _end(self, vm_id: str, state: VmState, reason: str) -> None:
        vm = self._vms.get(vm_id)
        if vm is None or vm.ending or vm.status.state not in (VmState.PENDING, VmState.RUNNING):
            return
        for timer in vm.timers:
            timer.cancel()
        vm.timers.clear()
        if self._hosts is None:
            self._set(vm, state, reason)
            return
        vm.ending = True
        self._spawn(self._halt_then_end(vm_id, vm, state, reason))

    async def _halt_then_end(self, vm_id: str, vm: _Vm, state: VmState, reason: str) -> None:
        """A VM host's processes die before its end is told, as a real VM's do with it:
        nothing of it runs after the moment the controller hears that it ended."""
        if self._metadata is not None:
            self._metadata.forget(vm_id)
        try:
            await self._hosts.halt(vm_id)
        finally:
            self._set(vm, state, reason)

    def _set(self, vm: _Vm, state: VmState, reason: str) -> None:
        vm.status = replace(vm.status, state=state, reason=reason, changed_at=self._now())
        for listener in self._listeners:
            listener(vm.status)
