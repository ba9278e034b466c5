"""A fake Compute Engine API on loopback, good enough to drive the real google-cloud-compute client.

`FakeGceApi` serves the slice of the Compute Engine v1 REST API the GCE driver uses,
with the JSON shapes of the real API (ids as strings, zone / machineType / selfLink
as full URLs, RFC 3339 timestamps, `error.errors[{code, message}]` on operations,
`{"error": {"code", "message", "errors": [{domain, reason, message}]}}` on HTTP
errors), so `compute_v1.InstancesClient(transport="rest")` parses every answer:

    POST   /compute/v1/projects/{p}/zones/{z}/instances               insert (requestId)
    GET    /compute/v1/projects/{p}/zones/{z}/instances               list (filter, paging)
    GET    /compute/v1/projects/{p}/zones/{z}/instances/{name}        get
    DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}        delete (requestId)
    GET    /compute/v1/projects/{p}/aggregated/instances              aggregatedList
    GET    /compute/v1/projects/{p}/zones/{z}/operations              zoneOperations.list
    GET    /compute/v1/projects/{p}/zones/{z}/operations/{op}         zoneOperations.get
    POST   /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait    zoneOperations.wait

and, for the VMs' boot scripts, the metadata server's token and Secret Manager:

    GET    /computeMetadata/v1/instance/service-accounts/default/token (Metadata-Flavor)
    GET    /v1/projects/{p}/secrets/{s}/versions/{v}:access            (Bearer token)

It runs on its own event loop in its own thread (127.0.0.1, a free port), so sync
clients in worker threads and async tests can both talk to it; the Python methods
below (`preempt`, `fail_next`, ...) are called from the test's thread and take the
same lock as the handlers.

Time is lazy: an instance carries a timeline of (due, status) steps that are
applied whenever it is looked at, so nothing runs in the background.

- Instances: PROVISIONING -> STAGING -> RUNNING over `boot_s`; delete: STOPPING,
  gone after `stop_s`.
- Operations: PENDING when created, RUNNING at the first poll, DONE at poll
  number `op_polls_to_done` (or after `op_done_s` seconds, whichever comes first;
  `wait` answers DONE). Every status handed out is kept in `op_history[name]`.
- requestId: the same requestId gives the same operation and no second VM; an
  existing name under another requestId is 409 alreadyExists. `forget_request_ids`
  plays the real API forgetting them (after about an hour).
- Preemption (`preempt`): STOPPING, then TERMINATED (termination action STOP, and
  legacy preemptible VMs) or gone (DELETE); a DONE zone operation with operationType
  "compute.instances.preempted" targeting the instance is recorded at once.
- Faults (`fail_next`, `fail_fraction`, `exhaust`), by route, zone and machine
  type; see `FAULTS` for the kinds and how the real API reports each.
- `calls` counts requests per route ("instances.insert", "instances.aggregatedList",
  "zoneOperations.get", ...), faults included.

`GceHarness` at the end wraps a fake and a `GceDriver` for the cross-driver
contract suite.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from google.auth.credentials import AnonymousCredentials

from drivers.base import Driver, VmState, VmStatus, VmType
from drivers.gce import GceDriver, GceSettings

PREEMPTED = "compute.instances.preempted"
BASE_URL = "https://www.googleapis.com/compute/v1"  # what the real API writes in links
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
LIVE = ("PROVISIONING", "STAGING", "RUNNING")
MAX_PAGE = 500  # the real API's cap on maxResults

# kind -> how the real API reports it: ("op", code, message) ends the insert operation
# with that error (no VM is made); ("http", status, reason, domain, message) answers the
# request itself with an HTTP error.
FAULTS: dict[str, tuple] = {
    "capacity": (
        "op",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone '{zone}' does not have enough resources available to fulfill the request."
        "  Try a different zone, or try again later.",
    ),
    "capacity_details": (
        "op",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "The zone '{zone}' does not have enough resources available to fulfill the request."
        "  '(resource type:compute)'.",
    ),
    "quota": (
        "op",
        "QUOTA_EXCEEDED",
        "Quota 'PREEMPTIBLE_CPUS' exceeded.  Limit: 24.0 in region {region}.",
    ),
    "quota_http": (
        "http",
        403,
        "quotaExceeded",
        "usageLimits",
        "Quota 'CPUS' exceeded.  Limit: 24.0 in region {region}.",
    ),
    "throttle": ("http", 429, "rateLimitExceeded", "usageLimits", "Rate Limit Exceeded"),
    "throttle_403": (
        "http",
        403,
        "rateLimitExceeded",
        "usageLimits",
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' "
        "of service 'compute.googleapis.com'.",
    ),
    "unavailable": ("http", 503, "backendError", "global", "Internal error. Please try again."),
    "internal": ("http", 500, "backendError", "global", "Internal error. Please try again."),
    "permanent": (
        "http",
        400,
        "invalid",
        "global",
        "Invalid value for field 'resource.machineType': '{machine_type}'. "
        "Machine type with name '{machine_type}' does not exist in zone '{zone}'.",
    ),
    "forbidden": (
        "http",
        403,
        "forbidden",
        "global",
        "Required 'compute.instances.create' permission for 'projects/{project}'",
    ),
}


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


class HttpError(Exception):
    """An error answer in the real API's JSON shape."""

    def __init__(self, status: int, reason: str, message: str, domain: str = "global") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.domain = domain
        self.message = message

    def response(self) -> web.Response:
        error: dict[str, Any] = {
            "code": self.status,
            "message": self.message,
            "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}],
        }
        if self.reason == "rateLimitExceeded":
            error["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "RATE_LIMIT_EXCEEDED",
                    "domain": "googleapis.com",
                    "metadata": {"service": "compute.googleapis.com"},
                }
            ]
        return web.json_response({"error": error}, status=self.status)


def not_found(what: str) -> HttpError:
    return HttpError(404, "notFound", f"The resource '{what}' was not found")


# --- filters ---------------------------------------------------------------------
#
# The list filter language, as much as the driver and tests need: comparisons
# `field = "v"`, `field != "v"`, `field : "v"` (`: *` = present), the legacy regular
# expressions `field eq 'v'` / `field ne 'v'` (full match), parentheses, NOT, AND
# (also implicit, as in `(a = "x") (b = "y")`) and OR. Fields are dotted paths into
# the JSON resource (`labels.spotbag-controller`, `status`, `operationType`).

_TOKEN_RE = re.compile(
    r"""\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<op>!=|=|:|<=|>=|<|>)|"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'"""
    r"""|(?P<word>[^\s()=!:<>"']+))"""
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            raise HttpError(400, "invalid", f"Invalid list filter expression '{text}'.")
        pos = match.end()
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind in ("dq", "sq"):
            kind = "str"
        elif kind == "word" and value.upper() in ("AND", "OR", "NOT"):
            kind = value.upper()
        elif kind == "word" and value in ("eq", "ne"):
            kind = "op"
        out.append((kind, value))
    return out


def _field(resource: dict, path: str) -> Any:
    value: Any = resource
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _compare(actual: Any, op: str, literal: str) -> bool:
    if op == ":" and literal == "*":
        return actual is not None
    if actual is None:
        return op in ("!=", "ne")
    text = str(actual).lower() if isinstance(actual, bool) else str(actual)
    if op in ("=", ":"):
        return text == literal
    if op == "!=":
        return text != literal
    if op in ("eq", "ne"):
        matched = re.fullmatch(literal, text) is not None
        return matched if op == "eq" else not matched
    return {"<": text < literal, ">": text > literal, "<=": text <= literal, ">=": text >= literal}[
        op
    ]


def compile_filter(text: str | None) -> Callable[[dict], bool]:
    """A predicate on JSON resources for a list `filter`; empty matches everything."""
    if not text or not text.strip():
        return lambda resource: True
    return _FilterParser(text).parse()


class _FilterParser:
    """Recursive descent over a filter's tokens: OR of ANDs of (NOT) comparisons."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def parse(self) -> Callable[[dict], bool]:
        predicate = self.disjunction()
        if self.pos != len(self.tokens):
            raise self.invalid()
        return predicate

    def invalid(self) -> HttpError:
        return HttpError(400, "invalid", f"Invalid list filter expression '{self.text}'.")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise self.invalid()
        self.pos += 1
        return self.tokens[self.pos - 1]

    def disjunction(self) -> Callable[[dict], bool]:
        parts = [self.conjunction()]
        while (tok := self.peek()) is not None and tok[0] == "OR":
            self.take()
            parts.append(self.conjunction())
        return lambda r: any(p(r) for p in parts)

    def conjunction(self) -> Callable[[dict], bool]:
        parts = [self.unary()]
        while (tok := self.peek()) is not None and tok[0] not in ("OR", "rp"):
            if tok[0] == "AND":
                self.take()
            parts.append(self.unary())
        return lambda r: all(p(r) for p in parts)

    def unary(self) -> Callable[[dict], bool]:
        kind, path = self.take()
        if kind == "NOT":
            inner = self.unary()
            return lambda r: not inner(r)
        if kind == "lp":
            inner = self.disjunction()
            if self.take()[0] != "rp":
                raise self.invalid()
            return inner
        if kind != "word":
            raise self.invalid()
        op_kind, op = self.take()
        lit_kind, literal = self.take()
        if op_kind != "op" or lit_kind not in ("str", "word"):
            raise self.invalid()
        return lambda r: _compare(_field(r, path), op, literal)


# --- state ---------------------------------------------------------------------------


@dataclass
class _Instance:
    project: str
    zone: str
    body: dict  # the resource as the API returns it
    timeline: list[tuple[float, str | None]] = field(default_factory=list)  # (due, status|gone)


@dataclass
class _Operation:
    project: str
    zone: str
    body: dict
    created: float  # monotonic
    error: list[dict] | None = None  # error.errors once DONE
    http_status: int = 0
    polls: int = 0
    finished: bool = False  # DONE from the start (preemptions) or waited for
    done_at: float | None = None  # DONE from then on (monotonic; a preemption's notice)
    end_time: str = ""  # RFC 3339, fixed when first seen DONE


@dataclass
class _Fault:
    kind: str
    route: str | None  # None: every route (op-level kinds: inserts only)
    zone: str | None
    machine_type: str | None
    remaining: int | None  # None: until cleared
    fraction: float = 1.0
    rng: random.Random | None = None


class FakeGceApi:
    """The fake API server; `start()` it, point clients at `.endpoint`, `close()` it."""

    def __init__(
        self,
        *,
        boot_s: float = 0.3,
        stop_s: float = 0.2,
        op_polls_to_done: int = 2,
        op_done_s: float | None = 5.0,
        latency_s: float = 0.0,
        zones: Iterable[str] | None = None,
        machine_types: Iterable[str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host  # VM hosts in network namespaces reach it at the bridge's address
        self.secrets: dict[str, bytes] = {}  # "projects/P/secrets/S" -> payload
        self.boot_s = boot_s
        self.stop_s = stop_s
        self.op_polls_to_done = op_polls_to_done
        self.op_done_s = op_done_s
        self.latency_s = latency_s
        self.zones = set(zones) if zones is not None else None  # None: any zone exists
        self.machine_types = set(machine_types) if machine_types is not None else None
        self.calls: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.op_history: dict[str, list[str]] = {}
        self.endpoint = ""
        self._lock = threading.RLock()
        self._instances: dict[tuple[str, str, str], _Instance] = {}
        self._operations: dict[tuple[str, str, str], _Operation] = {}
        self._request_ids: dict[tuple[str, str], tuple[str, str]] = {}  # -> (zone, op name)
        self._faults: list[_Fault] = []
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._wall0 = time.time()
        self._mono0 = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._startup_error: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> FakeGceApi:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="fake-gce-api", daemon=True
        )
        self._thread.start()
        if not ready.wait(10.0):
            raise RuntimeError("the fake GCE API did not start in 10 s")
        if self._startup_error is not None:
            raise RuntimeError("the fake GCE API did not start") from self._startup_error
        return self

    def close(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)

    def __enter__(self) -> FakeGceApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self._app(), access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, 0)
            loop.run_until_complete(site.start())
            host, port = runner.addresses[0][:2]
            self.endpoint = f"http://{host}:{port}"
        except BaseException as exc:  # handed to start(), which raises it
            self._startup_error = exc
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    # --- test controls --------------------------------------------------------------

    def fail_next(
        self,
        kind: str,
        n: int = 1,
        *,
        route: str | None = "instances.insert",
        zone: str | None = None,
        machine_type: str | None = None,
    ) -> None:
        """The next `n` matching requests fail as `kind` (a key of FAULTS)."""
        self._add_fault(_Fault(kind, route, zone, machine_type, remaining=n))

    def fail_fraction(
        self,
        fraction: float,
        kind: str = "throttle",
        *,
        seed: int = 0,
        route: str | None = None,
        zone: str | None = None,
        machine_type: str | None = None,
    ) -> None:
        """Each matching request fails as `kind` with probability `fraction` (seeded)."""
        fault = _Fault(kind, route, zone, machine_type, None, fraction, random.Random(seed))
        self._add_fault(fault)

    def exhaust(self, zone: str, machine_type: str | None = None) -> None:
        """No capacity for this type (or any) in `zone` until `clear_faults()`."""
        self._add_fault(_Fault("capacity", "instances.insert", zone, machine_type, None))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()
            self.faults_injected.clear()

    def forget_request_ids(self) -> None:
        """What the real API does after about an hour: a requestId is new again."""
        with self._lock:
            self._request_ids.clear()

    def preempt(self, project: str, zone: str, name: str, notice_s: float = 0.0) -> bool:
        """Preempt a live instance; False if there is none. With `notice_s`, as GCE does
        for Spot VMs: the preemption operation is RUNNING from now while the instance
        still runs (its notice; the metadata server's instance/preempted is TRUE), and the
        instance stops `notice_s` later; without, it stops now."""
        with self._lock:
            now = time.monotonic()
            inst = self._instance(project, zone, name, now)
            if inst is None or inst.body["status"] not in LIVE:
                return False
            scheduling = inst.body.get("scheduling", {})
            gone = scheduling.get("instanceTerminationAction") == "DELETE"
            stops_at = now + notice_s
            end = None if gone else "TERMINATED"
            if notice_s > 0:
                inst.timeline = [(stops_at, "STOPPING"), (stops_at + self.stop_s, end)]
            else:
                inst.body["status"] = "STOPPING"
                inst.body["statusMessage"] = "Instance was preempted."
                inst.timeline = [(now + self.stop_s, end)]
            # Named and shaped like the real API's system events.
            name = f"systemevent-{int(self._wall(now) * 1000)}-{uuid.uuid4().hex[:13]}"
            op = self._new_operation(project, zone, PREEMPTED, inst.body, now, name=name)
            if notice_s > 0:
                op.done_at = stops_at
                inst.body["statusMessage"] = "Instance was preempted."
            else:
                op.finished = True
            op.body["user"] = "system"
            op.body["statusMessage"] = "Instance was preempted."
            return True

    def vanish(self, project: str, zone: str, name: str) -> bool:
        """Delete an instance behind everyone's back, leaving no operation."""
        with self._lock:
            return self._instances.pop((project, zone, name), None) is not None

    def put_instance(self, project: str, zone: str, body: dict, *, status: str = "RUNNING") -> dict:
        """Store an instance as if it had been made long ago (no operation); returns it."""
        with self._lock:
            inst = self._make_instance(project, zone, body, time.monotonic())
            inst.body["status"] = status
            inst.timeline.clear()
            if status == "RUNNING":
                inst.body["lastStartTimestamp"] = inst.body["creationTimestamp"]
            return json.loads(json.dumps(inst.body))

    def instances(self, project: str | None = None) -> list[dict]:
        """Snapshots of every stored instance (of `project`)."""
        with self._lock:
            now = time.monotonic()
            keys = [k for k in self._instances if project is None or k[0] == project]
            found = [self._instance(*key, now) for key in keys]
            return [json.loads(json.dumps(i.body)) for i in found if i is not None]

    def operations(self, project: str | None = None, operation_type: str | None = None) -> list:
        with self._lock:
            return [
                self._render_operation(op, time.monotonic())
                for (p, _, _), op in self._operations.items()
                if (project is None or p == project)
                and (operation_type is None or op.body["operationType"] == operation_type)
            ]

    # --- internals ----------------------------------------------------------------

    def _add_fault(self, fault: _Fault) -> None:
        if fault.kind not in FAULTS:
            raise ValueError(f"unknown fault kind {fault.kind!r}; known: {sorted(FAULTS)}")
        with self._lock:
            self._faults.append(fault)

    def _wall(self, mono: float) -> float:
        return self._wall0 + (mono - self._mono0)

    def _new_id(self) -> str:
        return str(next(self._ids))

    def _instance(self, project: str, zone: str, name: str, now: float) -> _Instance | None:
        """The instance with its due timeline steps applied; None if (now) gone."""
        inst = self._instances.get((project, zone, name))
        if inst is None:
            return None
        while inst.timeline and inst.timeline[0][0] <= now:
            due, status = inst.timeline.pop(0)
            if status is None:
                del self._instances[(project, zone, name)]
                return None
            inst.body["status"] = status
            if status == "RUNNING":
                inst.body["lastStartTimestamp"] = rfc3339(self._wall(due))
            elif status == "TERMINATED":
                inst.body["lastStopTimestamp"] = rfc3339(self._wall(due))
        return inst

    def _all_instances(self, project: str, now: float) -> list[_Instance]:
        keys = sorted(k for k in self._instances if k[0] == project)
        found = (self._instance(*key, now) for key in keys)
        return [inst for inst in found if inst is not None]

    def _make_instance(self, project: str, zone: str, body: dict, now: float) -> _Instance:
        body = json.loads(json.dumps(body))
        name = body["name"]
        machine_type = body.get("machineType", "").rsplit("/", 1)[-1]
        scheduling = {
            "provisioningModel": "STANDARD",
            "automaticRestart": True,
            "onHostMaintenance": "MIGRATE",
            "preemptible": False,
            **body.get("scheduling", {}),
        }
        body.update(
            kind="compute#instance",
            id=self._new_id(),
            creationTimestamp=rfc3339(self._wall(now)),
            zone=f"{BASE_URL}/projects/{project}/zones/{zone}",
            machineType=f"{BASE_URL}/projects/{project}/zones/{zone}/machineTypes/{machine_type}",
            selfLink=f"{BASE_URL}/projects/{project}/zones/{zone}/instances/{name}",
            status="PROVISIONING",
            scheduling=scheduling,
            labels=body.get("labels", {}),
            labelFingerprint=uuid.uuid4().hex[:12],
            fingerprint=uuid.uuid4().hex[:12],
            cpuPlatform="Unknown CPU Platform",
        )
        if "metadata" in body:
            body["metadata"] = {
                "kind": "compute#metadata",
                "fingerprint": uuid.uuid4().hex[:12],
                **body["metadata"],
            }
        inst = _Instance(project, zone, body)
        self._instances[(project, zone, name)] = inst
        return inst

    def _new_operation(
        self,
        project: str,
        zone: str,
        operation_type: str,
        target: dict,
        now: float,
        *,
        name: str | None = None,
    ) -> _Operation:
        name = name or f"operation-{int(self._wall(now) * 1000)}-{uuid.uuid4().hex[:13]}"
        body = {
            "kind": "compute#operation",
            "id": self._new_id(),
            "name": name,
            "zone": f"{BASE_URL}/projects/{project}/zones/{zone}",
            "operationType": operation_type,
            "targetLink": target["selfLink"],
            "targetId": target["id"],
            "status": "PENDING",
            "user": "spotbag-test@example.iam.gserviceaccount.com",
            "progress": 0,
            "insertTime": rfc3339(self._wall(now)),
            "selfLink": f"{BASE_URL}/projects/{project}/zones/{zone}/operations/{name}",
        }
        op = _Operation(project, zone, body, now)
        self._operations[(project, zone, name)] = op
        return op

    def _operation_status(self, op: _Operation, now: float) -> str:
        if op.done_at is not None:  # a system event: RUNNING until it is done
            return "DONE" if now >= op.done_at else "RUNNING"
        if op.finished or op.polls >= self.op_polls_to_done:
            return "DONE"
        if self.op_done_s is not None and now - op.created >= self.op_done_s:
            return "DONE"
        return "RUNNING" if op.polls >= 1 else "PENDING"

    def _render_operation(self, op: _Operation, now: float, *, record: bool = False) -> dict:
        status = self._operation_status(op, now)
        body = dict(op.body, status=status)
        if status != "PENDING":
            body["startTime"] = body["insertTime"]
        if status == "RUNNING":
            body["progress"] = 50
        if status == "DONE":
            body["progress"] = 100
            op.end_time = op.end_time or rfc3339(self._wall(now))
            body["endTime"] = op.end_time
            if op.error:
                body["error"] = {"errors": op.error}
                body["httpErrorStatusCode"] = op.http_status
                body["httpErrorMessage"] = (
                    "FORBIDDEN" if op.http_status == 403 else "SERVICE UNAVAILABLE"
                )
        if record:
            self.op_history.setdefault(op.body["name"], []).append(status)
        return body

    def _fault_for(self, route: str, zone: str | None, machine_type: str | None) -> _Fault | None:
        for fault in self._faults:
            op_level = FAULTS[fault.kind][0] == "op"
            if op_level and route != "instances.insert":
                continue
            if fault.route is not None and fault.route != route:
                continue
            if fault.zone is not None and fault.zone != zone:
                continue
            if fault.machine_type is not None and fault.machine_type != machine_type:
                continue
            if fault.rng is not None and fault.rng.random() >= fault.fraction:
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._faults.remove(fault)
            self.faults_injected[fault.kind] += 1
            return fault
        return None

    def _inject(
        self, route: str, project: str, zone: str | None, machine_type: str | None = None
    ) -> tuple[str, str] | None:
        """Raise the HTTP fault due for this request, or return an op-level (code, message)."""
        fault = self._fault_for(route, zone, machine_type)
        if fault is None:
            return None
        spec = FAULTS[fault.kind]
        region = (zone or "us-central1-a").rsplit("-", 1)[0]
        words = {"zone": zone, "region": region, "project": project, "machine_type": machine_type}
        if spec[0] == "op":
            return spec[1], spec[2].format(**words)
        _, status, reason, domain, message = spec
        raise HttpError(status, reason, message.format(**words), domain)

    # --- HTTP -------------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        prefix = "/compute/v1/projects/{project}"
        zone = prefix + "/zones/{zone}"
        app.router.add_post(zone + "/instances", self._insert)
        app.router.add_get(zone + "/instances", self._list)
        app.router.add_get(zone + "/instances/{name}", self._get)
        app.router.add_delete(zone + "/instances/{name}", self._delete)
        app.router.add_get(prefix + "/aggregated/instances", self._aggregated_list)
        app.router.add_get(zone + "/operations", self._list_operations)
        app.router.add_get(zone + "/operations/{op}", self._get_operation)
        app.router.add_post(zone + "/operations/{op}/wait", self._wait_operation)
        app.router.add_get(
            "/computeMetadata/v1/instance/service-accounts/default/token", self._metadata_token
        )
        app.router.add_get(
            "/v1/projects/{project}/secrets/{secret}/versions/{version}", self._access_secret
        )
        return app

    VM_TOKEN = "fake-vm-access-token"

    async def _metadata_token(self, request: web.Request) -> web.Response:
        """The metadata server hands a VM its service account's token (only to requests
        that say Metadata-Flavor: Google, as the real one does)."""
        self._count("metadata.token")
        if request.headers.get("Metadata-Flavor") != "Google":
            raise HttpError(403, "forbidden", "Missing Metadata-Flavor:Google header.")
        return web.json_response(
            {"access_token": self.VM_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
        )

    async def _access_secret(self, request: web.Request) -> web.Response:
        self._count("secretmanager.access")
        version, _, verb = request.match_info["version"].partition(":")
        if verb != "access":
            raise not_found(request.path)
        if request.headers.get("Authorization") != f"Bearer {self.VM_TOKEN}":
            raise HttpError(
                401, "unauthenticated", "Request had invalid authentication credentials."
            )
        name = f"projects/{request.match_info['project']}/secrets/{request.match_info['secret']}"
        with self._lock:
            data = self.secrets.get(name)
        if data is None:
            raise not_found(f"Secret [{name}] not found or has no versions.")
        return web.json_response(
            {
                "name": f"{name}/versions/{1 if version == 'latest' else version}",
                "payload": {"data": base64.b64encode(data).decode()},
            }
        )

    def put_secret(self, name: str, data: bytes) -> None:
        """A secret ("projects/P/secrets/S") the VMs may read with their token."""
        with self._lock:
            self.secrets[name] = data

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        try:
            return await handler(request)
        except HttpError as exc:
            return exc.response()
        except web.HTTPNotFound:
            return not_found(request.path).response()
        except web.HTTPMethodNotAllowed:
            return HttpError(405, "httpMethodNotAllowed", "Method not allowed").response()

    def _count(self, route: str) -> None:
        self.calls[route] += 1

    async def _insert(self, request: web.Request) -> web.Response:
        project, zone = request.match_info["project"], request.match_info["zone"]
        try:
            body = await request.json()
        except ValueError:
            raise HttpError(400, "parseError", "Parse Error") from None
        with self._lock:
            self._count("instances.insert")
            now = time.monotonic()
            name = body.get("name", "")
            machine_type = body.get("machineType", "").rsplit("/", 1)[-1]
            request_id = request.query.get("requestId")
            if request_id is not None:
                try:
                    uuid.UUID(request_id)
                except ValueError:
                    raise HttpError(
                        400, "invalid", f"Invalid value for field 'requestId': '{request_id}'."
                    ) from None
                seen = self._request_ids.get((project, request_id))
                if seen is not None and (project, *seen) in self._operations:
                    return web.json_response(
                        self._render_operation(self._operations[(project, *seen)], now)
                    )
            op_error = self._inject("instances.insert", project, zone, machine_type)
            self._validate(project, zone, name, machine_type, body)
            key = (project, zone, name)
            if key in self._instances and self._instance(*key, now) is not None:
                raise HttpError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                    "already exists",
                )
            if op_error is None:
                inst = self._make_instance(project, zone, body, now)
                inst.timeline = [
                    (now + self.boot_s / 2, "STAGING"),
                    (now + self.boot_s, "RUNNING"),
                ]
                target = inst.body
            else:  # the operation fails and no instance is made
                link = f"{BASE_URL}/projects/{project}/zones/{zone}/instances/{name}"
                target = {"selfLink": link, "id": self._new_id()}
            op = self._new_operation(project, zone, "insert", target, now)
            if op_error is not None:
                code, message = op_error
                op.error = [{"code": code, "message": message}]
                op.http_status = 403 if code == "QUOTA_EXCEEDED" else 503
            if request_id is not None:
                self._request_ids[(project, request_id)] = (zone, op.body["name"])
            return web.json_response(self._render_operation(op, now, record=True))

    def _validate(self, project: str, zone: str, name: str, machine_type: str, body: dict) -> None:
        if self.zones is not None and zone not in self.zones:
            raise not_found(f"projects/{project}/zones/{zone}")
        if not NAME_RE.match(name):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'",
            )
        if self.machine_types is not None and machine_type not in self.machine_types:
            message = FAULTS["permanent"][4].format(machine_type=machine_type, zone=zone)
            raise HttpError(400, "invalid", message)
        for key, value in body.get("labels", {}).items():
            if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(str(value)):
                raise HttpError(
                    400, "invalid", f"Invalid value for field 'resource.labels': '{key}={value}'."
                )

    async def _get(self, request: web.Request) -> web.Response:
        project, zone, name = (request.match_info[k] for k in ("project", "zone", "name"))
        with self._lock:
            self._count("instances.get")
            self._inject("instances.get", project, zone)
            inst = self._instance(project, zone, name, time.monotonic())
            if inst is None:
                raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
            return web.json_response(inst.body)

    async def _delete(self, request: web.Request) -> web.Response:
        project, zone, name = (request.match_info[k] for k in ("project", "zone", "name"))
        with self._lock:
            self._count("instances.delete")
            now = time.monotonic()
            request_id = request.query.get("requestId")
            seen = self._request_ids.get((project, request_id)) if request_id else None
            if seen is not None and (project, *seen) in self._operations:
                return web.json_response(
                    self._render_operation(self._operations[(project, *seen)], now)
                )
            self._inject("instances.delete", project, zone)
            inst = self._instance(project, zone, name, now)
            if inst is None:
                raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
            deleting = inst.timeline and inst.timeline[-1][1] is None
            if inst.body["status"] == "STOPPING" and deleting:
                raise HttpError(
                    400,
                    "resourceNotReady",
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready",
                )
            inst.body["status"] = "STOPPING"
            inst.timeline = [(now + self.stop_s, None)]
            op = self._new_operation(project, zone, "delete", inst.body, now)
            if request_id is not None:
                self._request_ids[(project, request_id)] = (zone, op.body["name"])
            return web.json_response(self._render_operation(op, now, record=True))

    def _page(self, request: web.Request, items: list) -> tuple[list, str | None]:
        try:
            size = min(MAX_PAGE, int(request.query.get("maxResults", MAX_PAGE)))
            token = request.query.get("pageToken")
            start = int(base64.urlsafe_b64decode(token.encode()).decode()) if token else 0
        except ValueError:
            raise HttpError(400, "invalid", "Invalid value for paging parameters.") from None
        end = start + max(1, size)
        more = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
        return items[start:end], more

    async def _list(self, request: web.Request) -> web.Response:
        project, zone = request.match_info["project"], request.match_info["zone"]
        with self._lock:
            self._count("instances.list")
            self._inject("instances.list", project, zone)
            keep = compile_filter(request.query.get("filter"))
            found = [
                i.body
                for i in self._all_instances(project, time.monotonic())
                if i.zone == zone and keep(i.body)
            ]
            page, token = self._page(request, found)
            answer: dict[str, Any] = {
                "kind": "compute#instanceList",
                "id": f"projects/{project}/zones/{zone}/instances",
                "items": page,
                "selfLink": f"{BASE_URL}/projects/{project}/zones/{zone}/instances",
            }
            if token:
                answer["nextPageToken"] = token
            return web.json_response(answer)

    async def _aggregated_list(self, request: web.Request) -> web.Response:
        project = request.match_info["project"]
        with self._lock:
            self._count("instances.aggregatedList")
            self._inject("instances.aggregatedList", project, None)
            keep = compile_filter(request.query.get("filter"))
            found = [i for i in self._all_instances(project, time.monotonic()) if keep(i.body)]
            page, token = self._page(request, found)
            scopes: dict[str, dict] = {}
            for inst in page:
                scopes.setdefault(f"zones/{inst.zone}", {"instances": []})["instances"].append(
                    inst.body
                )
            for zone in sorted(self.zones or ()):
                scopes.setdefault(
                    f"zones/{zone}",
                    {
                        "warning": {
                            "code": "NO_RESULTS_ON_PAGE",
                            "message": f"There are no results for scope 'zones/{zone}' on this page.",
                            "data": [{"key": "scope", "value": f"zones/{zone}"}],
                        }
                    },
                )
            answer: dict[str, Any] = {
                "kind": "compute#instanceAggregatedList",
                "id": f"projects/{project}/aggregated/instances",
                "items": scopes,
                "selfLink": f"{BASE_URL}/projects/{project}/aggregated/instances",
            }
            if token:
                answer["nextPageToken"] = token
            return web.json_response(answer)

    async def _get_operation(self, request: web.Request) -> web.Response:
        return self._poll(request, "zoneOperations.get")

    async def _wait_operation(self, request: web.Request) -> web.Response:
        return self._poll(request, "zoneOperations.wait")

    def _poll(self, request: web.Request, route: str) -> web.Response:
        project, zone, name = (request.match_info[k] for k in ("project", "zone", "op"))
        with self._lock:
            self._count(route)
            self._inject(route, project, zone)
            op = self._operations.get((project, zone, name))
            if op is None:
                raise not_found(f"projects/{project}/zones/{zone}/operations/{name}")
            op.polls += 1
            if route == "zoneOperations.wait":
                op.finished = True  # the real wait returns when DONE (or after ~2 min)
            return web.json_response(self._render_operation(op, time.monotonic(), record=True))

    async def _list_operations(self, request: web.Request) -> web.Response:
        project, zone = request.match_info["project"], request.match_info["zone"]
        with self._lock:
            self._count("zoneOperations.list")
            self._inject("zoneOperations.list", project, zone)
            now = time.monotonic()
            keep = compile_filter(request.query.get("filter"))
            found = [
                body
                for (p, z, _), op in self._operations.items()
                if p == project and z == zone and keep(body := self._render_operation(op, now))
            ]
            page, token = self._page(request, found)
            answer: dict[str, Any] = {
                "kind": "compute#operationList",
                "id": f"projects/{project}/zones/{zone}/operations",
                "items": page,
                "selfLink": f"{BASE_URL}/projects/{project}/zones/{zone}/operations",
            }
            if token:
                answer["nextPageToken"] = token
            return web.json_response(answer)


# --- the harness for the cross-driver contract suite ---------------------------------------


class GceHarness:
    """The GCE driver against a started FakeGceApi, with the hooks the contract suite uses.

    vm_ids are the driver's "zone/name". `fail_next` kinds: capacity, quota, throttle,
    permanent (plus any other key of FAULTS); they hit the next `n` instance inserts,
    so `fail_next("throttle", n)` with n <= max_retries is retried away and with
    n > max_retries ends in TransientError.
    """

    PROJECT = "spotbag-contract"
    ZONES = ("us-central1-a", "us-central1-b")

    def __init__(
        self,
        *,
        termination_action: str = "DELETE",
        boot_s: float = 0.4,
        max_retries: int = 3,
        controller_id: str = "contract-suite",
    ) -> None:
        self.types: list[VmType] = [
            VmType("e2-standard-2", 2, 8.0, 0, 0.02, 0.067, self.ZONES[0]),
            VmType("e2-standard-8", 8, 32.0, 0, 0.08, 0.268, self.ZONES[0]),
        ]
        self.api = FakeGceApi(boot_s=boot_s, stop_s=0.1, zones=self.ZONES).start()
        self.settings = GceSettings(
            project=self.PROJECT,
            zones=self.ZONES,
            api_endpoint=self.api.endpoint,
            controller_id=controller_id,
            termination_action=termination_action,
            max_retries=max_retries,
            backoff_base_s=0.01,
            backoff_max_s=0.05,
            operation_poll_s=0.02,
            operation_timeout_s=10.0,
        )
        self.driver: Driver = GceDriver(
            self.types, self.settings, credentials=AnonymousCredentials()
        )
        self._foreign = itertools.count(1)

    async def wait_running(self, vm_id: str, timeout_s: float = 10) -> VmStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            status = (await self.driver.describe([vm_id])).get(vm_id)
            if status is not None and status.state is VmState.RUNNING:
                return status
            if status is not None and status.state not in (VmState.PENDING, VmState.RUNNING):
                raise AssertionError(f"{vm_id} ended before running: {status}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{vm_id} not running after {timeout_s} s: {status}")
            await asyncio.sleep(0.02)

    def preempt(self, vm_id: str) -> None:
        zone, _, name = vm_id.partition("/")
        if not self.api.preempt(self.PROJECT, zone, name):
            raise AssertionError(f"cannot preempt {vm_id}: not a live instance")

    def foreign_vm(self) -> str:
        zone = self.ZONES[0]
        name = f"foreign-{next(self._foreign)}"
        self.api.put_instance(
            self.PROJECT,
            zone,
            {
                "name": name,
                "machineType": f"zones/{zone}/machineTypes/e2-standard-2",
                "labels": {"team": "someone-else"},
            },
        )
        return f"{zone}/{name}"

    def fail_next(self, kind: str, n: int = 1) -> None:
        self.api.fail_next(kind, n, route="instances.insert")

    def close(self) -> None:
        self.api.close()
