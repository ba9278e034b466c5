"""The HTTP API (aiohttp, JSON, under /v1): thin handlers over the store and scheduler.

Every route is declared once in `ROUTES`, which builds both the router and the
OpenAPI document (controller/openapi.py), so the two cannot drift apart.
Middlewares turn every error into `{"error": {"code", "message", "detail"}}`
with a fitting status, check the bearer token, and count requests.

Two kinds of token (controller/tokens.py): the admin's (the daemon's token) may do
everything; an account token only sees and spends its own account. Routes marked
`admin_only` refuse account tokens with 403; the others check the account of what
they touch (a bag of another account is "not found", as if it did not exist).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError

from controller import report_render
from controller.admission import admit
from controller.errors import ApiError, Conflict, Forbidden, InvalidBag, NotFound, Unauthorized
from controller.ids import BAG_ID, JOB_ID
from controller.metrics import CONTENT_TYPE
from controller.models import BagState, JobState
from controller.report import ReportScopeEmpty, build_report
from controller.slurm import callbacks
from controller.store import StoreUnavailable
from controller.summary import bag_view, fleet_view, job_view
from controller.tokens import ADMIN, Principal, token_view
from drivers.base import VmState
from policies.allocation import Weights

if TYPE_CHECKING:
    from controller.daemon import Controller

log = logging.getLogger("spotbag.api")

CONTROLLER = web.AppKey("controller", Any)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path" or "query"
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    auth: bool = True
    admin_only: bool = False  # account tokens get 403
    params: tuple[Param, ...] = ()
    body: str | None = None  # component schema name of the JSON request body
    body_required: bool = True  # False: the body may be left out
    responses: dict[int, tuple[str, str | None]] = field(
        default_factory=dict
    )  # status -> (text, schema)


def _controller(request: web.Request) -> Controller:
    return request.app[CONTROLLER]


def _principal(request: web.Request) -> Principal:
    return request.get("principal", ADMIN)


def _require_account(request: web.Request, account: str) -> None:
    """403 unless the caller may use `account`."""
    principal = _principal(request)
    if not principal.may_use(account):
        raise Forbidden(
            f"this token belongs to account {principal.account!r} and may not use "
            f"account {account!r}",
            detail={"token_account": principal.account, "account": account},
        )


async def _visible_bag(request: web.Request, bag_id: str) -> dict[str, Any]:
    """The bag, if it exists and the caller may see it (404 otherwise: an account token
    cannot tell another account's bags from ones that do not exist)."""
    bag = await _controller(request).store.get_bag(bag_id)
    if bag is None or not _principal(request).may_use(bag["account"]):
        raise NotFound(f"bag {bag_id} does not exist")
    return bag


async def _check_bag_visible(request: web.Request, bag_id: str) -> None:
    if not _principal(request).is_admin:
        await _visible_bag(request, bag_id)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


_INTEGER = re.compile(r"-?[0-9]{1,18}")


def _int_param(request: web.Request, param: Param) -> int | None:
    """An integer query parameter within the bounds its documentation gives (the same
    Param object puts them into /openapi.json); its default when it is absent."""
    schema = param.schema
    return _int_query(
        request, param.name, schema.get("default"), schema["minimum"], schema["maximum"]
    )


def _int_query(request: web.Request, name: str, default: Any, low: int, high: int) -> Any:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise ApiError(f"query parameter {name}: {raw!r} is not an integer", code="invalid_query")
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(
            f"query parameter {name}: must be between {low} and {high}", code="invalid_query"
        )
    return value


def _enum_query(request: web.Request, name: str, allowed: list[str]) -> str | None:
    value = request.query.get(name)
    if value is not None and value not in allowed:
        raise ApiError(
            f"query parameter {name}: {value!r} is not one of {', '.join(allowed)}",
            code="invalid_query",
        )
    return value


def _bool_query(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false")
    if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise ApiError(
            f"query parameter {name}: {raw!r} is not true or false", code="invalid_query"
        )
    return raw.lower() in ("1", "true", "yes")


def _bag_id(request: web.Request) -> str:
    bag_id = request.match_info["bag_id"]
    if not BAG_ID.fullmatch(bag_id):
        raise NotFound(f"bag {bag_id!r} does not exist (bag ids look like b3f9a0c21d7)")
    return bag_id


def _job_key(request: web.Request) -> tuple[str, int]:
    job_id = request.match_info["job_id"]
    match = JOB_ID.fullmatch(job_id)
    if match is None:
        raise NotFound(f"job {job_id!r} does not exist (job ids look like b3f9a0c21d7-42)")
    return match[1], int(match[2])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _decode_json(body: bytes) -> Any:
    """Strict JSON (RFC 8259: UTF-8, no NaN/Infinity); every failure is a ValueError."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, RecursionError) as exc:
        kind = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "nested too deeply"
        raise ValueError(f"the body is {kind}") from None


# --- handlers ------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    """200 when the daemon works; 503 with the problems when it cannot (its database
    cannot be written, its scheduler keeps failing), for load balancers and monitors."""
    c = _controller(request)
    problems = c.problems()
    body: dict[str, Any] = {
        "ok": not problems,
        "driver": c.driver.name,
        "schema_version": c.store.schema_version,
    }
    if problems:
        body["problems"] = problems
        return _json(body, status=503)
    return _json(body)


async def openapi_document(request: web.Request) -> web.Response:
    from controller.openapi import build_openapi

    return _json(build_openapi(ROUTES))


async def metrics(request: web.Request) -> web.Response:
    body = _controller(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def create_bag(request: web.Request) -> web.Response:
    c = _controller(request)
    body = await request.read()
    try:
        # Parsing megabytes of JSON takes long enough to stall the event loop.
        data = await asyncio.to_thread(_decode_json, body)
    except ValueError as exc:
        raise InvalidBag(
            f"(body): not valid JSON ({exc})",
            detail={"errors": [{"field": "(body)", "message": str(exc)}]},
        ) from None
    principal = _principal(request)
    if not principal.is_admin and isinstance(data, dict):
        # An account token's bags are charged to its account, which may go unsaid.
        account = data.setdefault("account", principal.account)
        if isinstance(account, str):
            _require_account(request, account)
    key = request.headers.get("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise ApiError(
            "header Idempotency-Key: must be 1 to 200 printable ASCII characters "
            "(letters, digits, punctuation and inner spaces)",
            code="invalid_header",
            detail={"errors": [{"field": "Idempotency-Key", "message": "1-200 printable ASCII"}]},
        )
    bag, created = await admit(
        data,
        store=c.store,
        scheduler=c.scheduler,
        catalog=c.catalog,
        bag_id=c.ids.new_bag_id(),
        now=c.clock.now(),
        max_jobs=c.config.api.max_jobs_per_bag,
        idempotency_key=key,
        workdir_problem=getattr(c.executor, "workdir_problem", None),
    )
    view = bag_view(await c.store.get_bag(bag["id"]), c.clock.now())
    return _json(view, status=201 if created else 200)


async def list_bags(request: web.Request) -> web.Response:
    c = _controller(request)
    state = _enum_query(request, "state", [s.value for s in BagState])
    limit = _int_param(request, BAGS_LIMIT)
    offset = _int_param(request, BAGS_OFFSET)
    account = request.query.get("account")
    principal = _principal(request)
    if account is not None:
        _require_account(request, account)
    elif not principal.is_admin:
        account = principal.account
    bags = await c.store.list_bags(state=state, account=account, limit=limit, offset=offset)
    now = c.clock.now()
    views = [bag_view(b, now) for b in bags]
    for view in views:
        del view["spec"]
    return _json({"bags": views, "limit": limit, "offset": offset})


async def get_bag(request: web.Request) -> web.Response:
    c = _controller(request)
    bag = await _visible_bag(request, _bag_id(request))
    return _json(bag_view(bag, c.clock.now()))


async def cancel_bag(request: web.Request) -> web.Response:
    c = _controller(request)
    bag_id = _bag_id(request)
    bag = await _visible_bag(request, bag_id)
    if bag["state"] != BagState.ACTIVE:
        raise Conflict(
            f"bag {bag_id} already finished ({bag['state']})", detail={"state": bag["state"]}
        )
    await c.store.request_cancel(bag_id, c.clock.now())
    c.scheduler.cancel_requested(bag_id)
    return _json(bag_view(await c.store.get_bag(bag_id), c.clock.now()), status=202)


async def list_jobs(request: web.Request) -> web.Response:
    c = _controller(request)
    bag_id = _bag_id(request)
    state = _enum_query(request, "state", [s.value for s in JobState])
    limit = _int_param(request, JOBS_LIMIT)
    after = _int_param(request, JOBS_AFTER)
    await _visible_bag(request, bag_id)
    jobs = await c.store.list_jobs(bag_id, state=state, after_idx=after, limit=limit)
    views = [job_view(j) for j in jobs]
    next_after = jobs[-1]["idx"] if len(jobs) == limit else None
    return _json({"jobs": views, "next_after": next_after})


async def get_job(request: web.Request) -> web.Response:
    c = _controller(request)
    bag_id, idx = _job_key(request)
    await _check_bag_visible(request, bag_id)
    job = await c.store.get_job(bag_id, idx)
    if job is None:
        raise NotFound(f"job {bag_id}-{idx} does not exist")
    return _json(job_view(job))


async def get_job_log(request: web.Request) -> web.Response:
    c = _controller(request)
    bag_id, idx = _job_key(request)
    await _check_bag_visible(request, bag_id)
    attempt_number = _int_param(request, LOG_ATTEMPT)
    offset = _int_param(request, LOG_OFFSET)
    limit = _int_param(request, LOG_LIMIT)
    attempt = await c.store.get_attempt(bag_id, idx, attempt_number)
    if attempt is None:
        which = f"attempt {attempt_number}" if attempt_number else "any attempt"
        raise NotFound(f"job {bag_id}-{idx} has no {which} (it may not have started yet)")
    if not attempt["log_path"]:
        raise NotFound(f"the {c.executor.name} executor keeps no log for job {bag_id}-{idx}")
    data, size = await asyncio.to_thread(_read_log, Path(attempt["log_path"]), offset, limit)
    return web.Response(
        body=data,
        content_type="text/plain",
        charset="utf-8",
        headers={
            "X-Spotbag-Attempt": str(attempt["number"]),
            "X-Spotbag-Attempt-State": attempt["state"],
            "X-Spotbag-Log-Size": str(size),
            "X-Spotbag-Next-Offset": str(offset + len(data)),
        },
    )


def _read_log(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(min(offset, size))
            return f.read(limit), size
    except FileNotFoundError:
        return b"", 0


async def list_vms(request: web.Request) -> web.Response:
    c = _controller(request)
    state = _enum_query(request, "state", [s.value for s in VmState])
    limit = _int_param(request, VMS_LIMIT)
    include_ended = _bool_query(request, "all")
    states = [state] if state else None
    if state is None and not include_ended:
        states = [VmState.PENDING.value, VmState.RUNNING.value]
    vms = await c.store.list_vms(states=states, limit=limit)
    live = c.scheduler.vms
    now = c.clock.now()
    for vm in vms:
        # What the VM has cost so far: its price over its billed life (running → ended).
        billed_h = max(0.0, (vm["ended_at"] or now) - (vm["running_at"] or now)) / 3600.0
        paid = vm["spot_price_per_hour"] if vm["spot"] else vm["on_demand_price_per_hour"]
        vm["billed_hours"] = billed_h
        vm["cost_usd"] = billed_h * paid
        vm["on_demand_cost_usd"] = billed_h * vm["on_demand_price_per_hour"]
        run = live.get(vm["id"])
        vm["jobs"] = len(run.attempts) if run is not None else 0
        # Its Slurm node: a pool node it serves, or the node named after it.
        node_of = getattr(c.executor, "node_of", None)
        vm["slurm_node"] = vm["pool_node"] or (node_of(vm["id"]) if node_of else "")
        vm["terminating"] = bool(run and run.terminating)
    fleet = fleet_view(await c.store.vm_usage(c.clock.now()))
    return _json({"vms": vms, "usage": fleet})


def _vm_model_view(vm: Any, now: float, time_scale: float) -> dict[str, Any]:
    """The preemption model the scheduler assumes for a live VM, at its current age."""
    age_h = max(0.0, now - vm.requested_at) * time_scale / 3600.0
    belief = vm.belief
    return {
        "vm_id": vm.id,
        "vm_type": vm.vm_type.name,
        "zone": vm.zone,
        "age_h": age_h,
        "model": belief.model.name if belief else None,
        "parameters": belief.model.parameters if belief else None,
        "key": belief.key if belief else None,
        "source": belief.source if belief else None,
        "stable": vm.table.is_stable(age_h) if vm.table else None,
    }


async def list_models(request: web.Request) -> web.Response:
    c = _controller(request)
    settings = c.config.preemption
    now = c.clock.now()
    learned = await c.store.models(active_only=request.query.get("history") is None)
    return _json(
        {
            "configured": {
                "model": settings.model,
                "reuse_policy": settings.reuse_policy,
                "min_samples": settings.min_samples,
                "learn": settings.learn,
                "shipped_models": len(c.book.defaults.entries),
            },
            "learned": learned,
            "in_use": [
                _vm_model_view(vm, now, c.config.driver.time_scale)
                for vm in c.scheduler.vms.values()
            ],
        }
    )


async def hopping(request: web.Request) -> web.Response:
    c = _controller(request)
    limit = _int_param(request, HOPPING_LIMIT)
    market = c.scheduler.market
    rows = []
    if market is not None:
        for i, name in enumerate(market.names):
            size = math.sqrt(market.cpus[i] * market.memory_gb[i])
            rows.append(
                {
                    "vm_type": name,
                    "price_now": _finite(market.now_price[i]),
                    "price_mean": _finite(market.mean_price[i]),
                    "price_std": _finite(market.std_price[i]),
                    "on_demand": _finite(market.on_demand[i]),
                    "normalized_now": _finite(market.now_price[i] / size),
                }
            )
    return _json(
        {
            "configured": c.config.hopping.model_dump(),
            "market": rows,
            "migrations": await c.store.list_migrations(limit),
        }
    )


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


async def preempt_vm(request: web.Request) -> web.Response:
    c = _controller(request)
    vm_id = request.match_info["vm_id"]
    inject = getattr(c.driver, "inject_preemption", None)
    if inject is None:
        raise Conflict(f"the {c.driver.name} driver cannot inject preemptions")
    vm = c.scheduler.vms.get(vm_id)
    if vm is None or not vm.provider_id:
        raise NotFound(f"VM {vm_id} is not alive")
    if not inject(vm.provider_id, "preempted: injected through the API"):
        raise Conflict(f"VM {vm_id} is not alive")
    return _json({"id": vm_id, "preempted": True}, status=202)


async def slurm_event(request: web.Request) -> web.Response:
    """A callback from slurmctld's hooks: signed with the hook secret (not a bearer
    token), idempotent by its key (controller/slurm/callbacks.py)."""
    c = _controller(request)
    timestamp = request.headers.get(callbacks.TIMESTAMP_HEADER)
    signed = request.headers.get(callbacks.SIGNATURE_HEADER)
    if not timestamp or not signed:  # unsigned: refused whatever this daemon runs
        raise Unauthorized(
            f"Slurm callback refused: missing {callbacks.TIMESTAMP_HEADER} or "
            f"{callbacks.SIGNATURE_HEADER}"
        )
    if c.executor is None or c.executor.name != "slurm":
        raise Conflict('this daemon does not run the Slurm executor ([executor] name = "slurm")')
    body = await request.read()
    try:
        callbacks.verify(
            c.hook_secret,
            timestamp,
            signed,
            body,
            c.clock.now(),
            c.config.slurm.callback_window_s,
        )
    except callbacks.CallbackRejected as exc:
        raise Unauthorized(f"Slurm callback refused: {exc}") from None
    try:
        event = callbacks.SlurmEvent.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in exc.errors()
        )
        raise ApiError(f"malformed Slurm event: {problems}", code="invalid_event") from None
    key = event.key
    if c.executor.seen(key) or await c.store.callback_seen(key):
        return _json({"key": key, "duplicate": True, "applied": False})
    applied = await c.take_slurm_event(event)
    return _json({"key": key, "duplicate": False, "applied": applied})


# --- the route table ---------------------------------------------------------------

# --- accounts and the ledger --------------------------------------------------------

ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _account_name(request: web.Request) -> str:
    """The path's account, which must exist and be the caller's to use."""
    name = request.match_info["account"]
    _require_account(request, name)
    if (
        not ACCOUNT_NAME.match(name)
        or name not in _controller(request).scheduler.accounts.unlimited
    ):
        raise NotFound(f"account {name!r} does not exist", code="unknown_account")
    return name


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        data = _decode_json(await request.read())
    except ValueError as exc:
        raise ApiError(f"(body): not valid JSON ({exc})", code="invalid_body") from None
    if not isinstance(data, dict):
        raise ApiError("(body): must be a JSON object", code="invalid_body")
    return data


def _cpu_hours(data: dict[str, Any], name: str, default: float | None = None) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e15:
        raise ApiError(
            f"{name}: must be a number of CPU-hours, 0 or more, not {value!r}",
            code="invalid_body",
            detail={"errors": [{"field": name, "message": "a non-negative number"}]},
        )
    return float(value)


def _note(data: dict[str, Any]) -> str:
    note = data.get("note", "")
    if not isinstance(note, str) or len(note) > 1000:
        raise ApiError("note: must be text of at most 1000 characters", code="invalid_body")
    return note


async def list_accounts(request: web.Request) -> web.Response:
    c = _controller(request)
    principal = _principal(request)
    names = [a["name"] for a in await c.store.list_accounts() if principal.may_use(a["name"])]
    return _json({"accounts": [c.scheduler.accounts.view(name) for name in names]})


async def create_account(request: web.Request) -> web.Response:
    c = _controller(request)
    data = await _json_body(request)
    name = data.get("name")
    if not isinstance(name, str) or not ACCOUNT_NAME.match(name):
        raise ApiError(
            f"name: must be 1-64 letters, digits, '_', '.' or '-', not {name!r}",
            code="invalid_body",
        )
    unlimited = data.get("unlimited", False)
    if not isinstance(unlimited, bool):
        raise ApiError("unlimited: must be true or false", code="invalid_body")
    cpu_h = _cpu_hours(data, "cpu_hours", 0.0)
    accounts = c.scheduler.accounts
    if name in accounts.unlimited:
        raise Conflict(f"account {name!r} exists already", code="account_exists")
    now = c.clock.now()
    row, entries = accounts.create(name, unlimited, cpu_h, now, _note(data))
    rows = [(now, e.account, e.kind, e.cpu_h, e.key, "account created") for e in entries]
    try:
        created = await c.store.create_account(row, rows)
    except BaseException:
        accounts.forget(name)
        raise
    if not created:
        raise Conflict(f"account {name!r} exists already", code="account_exists")
    c.scheduler.credited()
    return _json(accounts.view(name), status=201)


async def credit_account(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    accounts = c.scheduler.accounts
    data = await _json_body(request)
    cpu_h = _cpu_hours(data, "cpu_hours")
    entry = accounts.credit(name, cpu_h)
    try:
        await c.store.append_ledger([(c.clock.now(), name, "credit", cpu_h, "", _note(data))])
    except BaseException:
        accounts.uncredit(entry)
        raise
    c.scheduler.credited()
    return _json(accounts.view(name))


async def get_account(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    return _json(c.scheduler.accounts.view(name))


async def account_ledger(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    after = _int_param(request, LEDGER_AFTER)
    limit = _int_param(request, LEDGER_LIMIT)
    fmt = _enum_query(request, "format", ["json", "csv"]) or "json"
    entries = await c.store.ledger_entries(name, after, limit)
    next_after = entries[-1]["id"] if len(entries) == limit else None
    if fmt == "csv":
        lines = ["id,at,account,kind,cpu_hours,reservation,note"]
        for e in entries:
            note = '"' + e["note"].replace('"', '""') + '"'
            lines.append(
                f"{e['id']},{e['at']:.3f},{e['account']},{e['kind']},{e['cpu_h']!r},{e['key']},{note}"
            )
        headers = {"X-Spotbag-Next-After": str(next_after)} if next_after is not None else {}
        return web.Response(text="\n".join(lines) + "\n", content_type="text/csv", headers=headers)
    return _json({"entries": entries, "next_after": next_after})


async def get_report(request: web.Request) -> web.Response:
    c = _controller(request)
    bag_id, account = request.query.get("bag"), request.query.get("account")
    if (bag_id is None) == (account is None):
        raise ApiError("give one of bag=<bag id> or account=<name>", code="invalid_query")
    fmt = _enum_query(request, "format", ["json", "csv", "html"]) or "json"
    if bag_id is not None:
        if not BAG_ID.match(bag_id):
            raise NotFound(f"bag {bag_id} does not exist")
        await _visible_bag(request, bag_id)
    else:
        _require_account(request, account)
    cost = c.config.cost
    try:
        report = await build_report(
            c.store,
            bag_id=bag_id,
            account=account,
            now=c.clock.now(),
            weights=Weights(cost.cpu_weight, cost.memory_weight, cost.gpu_weight),
            idle_timeout_s=c.config.scheduler.idle_timeout_s,
            gpu_weight=c.config.ledger.gpu_weight,
        )
    except ReportScopeEmpty as exc:
        raise NotFound(str(exc)) from None
    if fmt == "csv":
        return web.Response(text=report_render.to_csv(report), content_type="text/csv")
    if fmt == "html":
        page = await asyncio.to_thread(report_render.to_html, report)
        return web.Response(text=page, content_type="text/html")
    return _json(report)


async def create_token(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    data = await _json_body(request) if request.can_read_body else {}
    row, token = c.tokens.issue(name, c.clock.now(), _note(data))
    await c.store.create_token(row)
    c.tokens.added(row)
    view = token_view({**row, "revoked_at": None})
    return _json({**view, "token": token}, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    rows = [token_view(row) for row in await c.store.tokens() if row["account"] == name]
    return _json({"tokens": rows})


async def revoke_token(request: web.Request) -> web.Response:
    c = _controller(request)
    name = _account_name(request)
    token_id = request.match_info["token_id"]
    if c.tokens.account_of(token_id) != name:
        raise NotFound(f"account {name!r} has no token {token_id!r}")
    if not await c.store.revoke_token(token_id, c.clock.now()):
        raise Conflict(f"token {token_id} was revoked already")
    c.tokens.revoked(token_id)
    return _json({"id": token_id, "account": name, "revoked": True})


_ERR = "Error"
ACCOUNT_PATH = Param("account", "path", "Account name.", required=True)
BAG_PATH = Param("bag_id", "path", "Bag id, e.g. b3f9a0c21d7.", required=True)
JOB_PATH = Param("job_id", "path", "Job id: <bag id>-<index>, e.g. b3f9a0c21d7-42.", required=True)


def _bounded(name: str, description: str, low: int, high: int, default: int | None) -> Param:
    """An integer query parameter; its bounds are both documented and enforced."""
    schema: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
    if default is not None:
        schema["default"] = default
    return Param(name, "query", description, schema)


BAGS_LIMIT = _bounded("limit", "At most this many bags.", 1, 1000, 50)
BAGS_OFFSET = _bounded("offset", "Skip this many bags.", 0, 10**9, 0)
JOBS_LIMIT = _bounded("limit", "At most this many jobs.", 1, 1000, 100)
JOBS_AFTER = _bounded("after", "Only jobs with a larger index (pagination).", -1, 10**12, -1)
LOG_ATTEMPT = _bounded("attempt", "Attempt number (default: the latest).", 1, 10**6, None)
LOG_OFFSET = _bounded("offset", "Start at this byte (to follow a growing log).", 0, 10**15, 0)
LOG_LIMIT = _bounded("limit", "At most this many bytes (default 1 MiB).", 1, 16 << 20, 1 << 20)
VMS_LIMIT = _bounded("limit", "At most this many VMs.", 1, 10_000, 200)
HOPPING_LIMIT = _bounded("limit", "At most this many migrations.", 1, 10_000, 200)
LEDGER_AFTER = _bounded("after", "Entries after this id (paging).", 0, 10**15, 0)
LEDGER_LIMIT = _bounded("limit", "At most this many entries.", 1, 100_000, 1000)
BOOLEAN = {
    "type": "string",
    "enum": ["true", "false", "1", "0", "yes", "no"],
    "description": "Also accepted in any letter case.",
}
# RFC 8941 sf-string-like: printable ASCII, no spaces at either end (HTTP trims them).
IDEMPOTENCY_KEY = re.compile(r"[!-~](?:[ -~]{0,198}[!-~])?")
IDEMPOTENCY_KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "pattern": r"^[!-~]([ -~]{0,198}[!-~])?$",
}

ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/healthz",
        healthz,
        "Liveness check (no token needed).",
        auth=False,
        responses={
            200: ("The daemon works.", "Health"),
            503: ("It cannot work now (its database cannot be written, ...): problems.", "Health"),
        },
    ),
    Route(
        "GET",
        "/openapi.json",
        openapi_document,
        "This OpenAPI document.",
        auth=False,
        responses={200: ("OpenAPI 3.1 document.", None)},
    ),
    Route(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics in the text format.",
        auth=False,
        responses={200: ("Metrics.", None)},
    ),
    Route(
        "POST",
        "/v1/bags",
        create_bag,
        "Submit a bag of jobs.",
        body="BagSpec",
        params=(
            Param(
                "Idempotency-Key",
                "header",
                "Repeat a submission safely: the same key, from the same account, returns "
                "the bag created the first time. Keys are the account's own (another account "
                "may use the same key for its own bag). 1-200 printable ASCII characters.",
                IDEMPOTENCY_KEY_SCHEMA,
            ),
        ),
        responses={
            201: ("The bag was admitted; all its jobs are queued.", "Bag"),
            200: ("This account's bag with this Idempotency-Key exists already.", "Bag"),
            400: ("The spec or the Idempotency-Key is malformed; the message names it.", _ERR),
            402: ("The account cannot reserve the CPU-hours; says needed and available.", _ERR),
            403: ("An account token may not submit for another account.", _ERR),
            404: ("The account does not exist (with [ledger] new_accounts = refuse).", _ERR),
            409: (
                "The account used this Idempotency-Key for a different bag "
                "(code idempotency_key_reused; detail.bag_id is that bag).",
                _ERR,
            ),
            413: ("The request body is too large.", _ERR),
            422: ("No allowed VM type can run one job of the bag.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/bags",
        list_bags,
        "List bags, newest first.",
        params=(
            Param(
                "state", "query", "Only bags in this state.", {"enum": [s.value for s in BagState]}
            ),
            Param("account", "query", "Only bags of this account."),
            BAGS_LIMIT,
            BAGS_OFFSET,
        ),
        responses={
            200: ("Bags.", "BagList"),
            403: ("An account token may not list another account's bags.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/bags/{bag_id}",
        get_bag,
        "A bag: job counts per state, progress, usage and cost.",
        params=(BAG_PATH,),
        responses={200: ("The bag.", "Bag"), 404: ("No such bag.", _ERR)},
    ),
    Route(
        "POST",
        "/v1/bags/{bag_id}/cancel",
        cancel_bag,
        "Cancel a bag: queued jobs are cancelled, running ones stopped.",
        params=(BAG_PATH,),
        responses={
            202: ("Cancellation under way.", "Bag"),
            404: ("No such bag.", _ERR),
            409: ("The bag already finished.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/bags/{bag_id}/jobs",
        list_jobs,
        "A bag's jobs in index order, optionally by state.",
        params=(
            BAG_PATH,
            Param(
                "state", "query", "Only jobs in this state.", {"enum": [s.value for s in JobState]}
            ),
            JOBS_AFTER,
            JOBS_LIMIT,
        ),
        responses={
            200: ("Jobs; next_after is the cursor for the next page.", "JobList"),
            404: ("No such bag.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}",
        get_job,
        "A job with its attempts, VMs, exit codes and log paths.",
        params=(JOB_PATH,),
        responses={200: ("The job.", "Job"), 404: ("No such job.", _ERR)},
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/log",
        get_job_log,
        "The output of a job's attempt (latest by default).",
        params=(
            JOB_PATH,
            LOG_ATTEMPT,
            LOG_OFFSET,
            LOG_LIMIT,
        ),
        responses={
            200: ("Log text; X-Spotbag-Next-Offset gives the next offset.", None),
            404: ("No such job, attempt or log.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/vms",
        list_vms,
        "VMs (live ones unless state or all=true) and fleet usage.",
        admin_only=True,
        params=(
            Param(
                "state", "query", "Only VMs in this state.", {"enum": [s.value for s in VmState]}
            ),
            Param("all", "query", "true: include ended VMs (default false).", BOOLEAN),
            VMS_LIMIT,
        ),
        responses={200: ("VMs and usage totals.", "VmList")},
    ),
    Route(
        "GET",
        "/v1/models",
        list_models,
        "Preemption models: configured, learned (sample counts and fit quality) and in use per VM.",
        admin_only=True,
        params=(Param("history", "query", "Present: also the learned models since replaced."),),
        responses={200: ("Models.", "Models")},
    ),
    Route(
        "GET",
        "/v1/hopping",
        hopping,
        "Spot hopping: the policy, the live market per VM type, and every migration with its reason.",
        admin_only=True,
        params=(HOPPING_LIMIT,),
        responses={200: ("Market and migrations.", "Hopping")},
    ),
    Route(
        "POST",
        "/v1/vms/{vm_id}/preempt",
        preempt_vm,
        "Preempt a VM now (fault injection; local driver only).",
        admin_only=True,
        params=(Param("vm_id", "path", "VM id (vm-...).", required=True),),
        responses={
            202: ("The VM was preempted.", None),
            404: ("No such live VM.", _ERR),
            409: ("The driver cannot inject preemptions.", _ERR),
        },
    ),
    Route(
        "POST",
        "/v1/slurm/events",
        slurm_event,
        "A callback from slurmctld's hooks (slurm_hooks/): HMAC-signed with the hook secret "
        "(X-Spotbag-Timestamp, X-Spotbag-Signature), no bearer token; a repeat changes nothing.",
        auth=False,
        body="SlurmEvent",
        params=(
            Param(
                "X-Spotbag-Timestamp",
                "header",
                "Epoch seconds the hook signed at.",
                {"type": "string", "pattern": "^[0-9]{1,12}$"},
                required=True,
            ),
            Param(
                "X-Spotbag-Signature",
                "header",
                'sha256=HMAC-SHA256(hook secret, timestamp + "." + body), in hex.',
                {"type": "string", "pattern": "^sha256=[0-9a-f]{64}$"},
                required=True,
            ),
        ),
        responses={
            200: ("Taken (or a duplicate: duplicate = true).", None),
            400: ("A malformed event.", _ERR),
            401: ("A bad signature or a timestamp outside the window.", _ERR),
            409: ("The daemon does not run the Slurm executor.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/accounts",
        list_accounts,
        "Accounts and their CPU-hour balances.",
        responses={200: ("Accounts.", None)},
    ),
    Route(
        "POST",
        "/v1/accounts",
        create_account,
        "Create an account: {name, cpu_hours (its first credit), unlimited, note}.",
        admin_only=True,
        body="AccountCreate",
        responses={
            201: ("The account, with its balance.", None),
            400: ("A bad field; the message names it.", _ERR),
            409: ("The account exists already.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/accounts/{account}",
        get_account,
        "An account's balance: allocation, charged, reserved and available CPU-hours.",
        params=(ACCOUNT_PATH,),
        responses={200: ("The balance.", None), 404: ("No such account.", _ERR)},
    ),
    Route(
        "POST",
        "/v1/accounts/{account}/credit",
        credit_account,
        "Add CPU-hours to an account's allocation: {cpu_hours, note}. Held jobs may run.",
        admin_only=True,
        body="Credit",
        params=(ACCOUNT_PATH,),
        responses={
            200: ("The new balance.", None),
            400: ("A bad field.", _ERR),
            404: ("No such account.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/accounts/{account}/ledger",
        account_ledger,
        "The account's ledger entries, oldest first (JSON, or CSV with format=csv).",
        params=(
            ACCOUNT_PATH,
            LEDGER_AFTER,
            LEDGER_LIMIT,
            Param(
                "format",
                "query",
                "json (default) or csv.",
                {"type": "string", "enum": ["json", "csv"], "default": "json"},
            ),
        ),
        responses={
            200: ("Entries.", None),
            403: ("An account token may not read another account.", _ERR),
            404: ("No such account.", _ERR),
        },
    ),
    Route(
        "GET",
        "/v1/reports",
        get_report,
        "Cost report of a bag or an account: VM-hours, cost, on-demand cost, savings, idle "
        "and spare time, preemptions, hours lost and checkpointing, per VM type and per bag.",
        params=(
            Param("bag", "query", "The bag to report on."),
            Param("account", "query", "The account to report on (all its bags)."),
            Param(
                "format",
                "query",
                "json (default), csv or html.",
                {"type": "string", "enum": ["json", "csv", "html"], "default": "json"},
            ),
        ),
        responses={
            200: ("The report.", None),
            403: ("An account token may not report on another account.", _ERR),
            404: ("No such bag, or no bags.", _ERR),
        },
    ),
    Route(
        "POST",
        "/v1/accounts/{account}/tokens",
        create_token,
        "Issue a token that can only see and spend this account: {note}. The token is shown once.",
        admin_only=True,
        body="TokenCreate",
        body_required=False,
        params=(ACCOUNT_PATH,),
        responses={201: ("The token.", None), 404: ("No such account.", _ERR)},
    ),
    Route(
        "GET",
        "/v1/accounts/{account}/tokens",
        list_tokens,
        "The account's tokens (ids, notes, revocation; never the secrets).",
        params=(ACCOUNT_PATH,),
        responses={200: ("Tokens.", None), 404: ("No such account.", _ERR)},
    ),
    Route(
        "DELETE",
        "/v1/accounts/{account}/tokens/{token_id}",
        revoke_token,
        "Revoke one of the account's tokens.",
        admin_only=True,
        params=(ACCOUNT_PATH, Param("token_id", "path", "Token id.", required=True)),
        responses={
            200: ("Revoked.", None),
            404: ("No such token.", _ERR),
            409: ("Revoked already.", _ERR),
        },
    ),
)


# --- middlewares and the app ----------------------------------------------------------


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    response = _json(error.body(), status=error.status)
    response.headers.update(headers or {})
    return response


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == 404:
            message = f"no route {request.method} {request.path}"
        elif exc.status == 413:
            message = f"request body too large: {exc.text}"
        response = _error_response(
            ApiError(message, status=exc.status, code=_HTTP_CODES.get(exc.status, "http_error"))
        )
        if exc.status == 405:  # RFC 9110 §15.5.6: say which methods the resource has
            response.headers["Allow"] = exc.headers.get("Allow", "")
        return response
    except StoreUnavailable as exc:
        log.error("%s %s: %s", request.method, request.path, exc)
        return _error_response(
            ApiError(
                f"the daemon cannot use its database now ({exc}); nothing was changed, "
                "try again later",
                status=503,
                code="store_unavailable",
            ),
            headers={"Retry-After": "30"},
        )
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(
            ApiError("internal error; see the daemon log", status=500, code="internal_error")
        )


def _route_name(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def auth_middleware(controller: Controller) -> Callable:
    open_paths = {r.path for r in ROUTES if not r.auth}
    admin_routes = {(r.method, r.path) for r in ROUTES if r.admin_only}

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = _route_name(request)
        # A wrong method on an open path matches no route, yet is that path's 405.
        if route not in open_paths and request.path not in open_paths:
            given = request.headers.get("Authorization", "")
            principal = controller.tokens.authenticate(given)
            if principal is None:
                problem = "missing" if not given else "wrong"
                error = Unauthorized(
                    f"{problem} bearer token: send 'Authorization: Bearer <token>' "
                    "(see api.token / SPOTBAG_TOKEN / STATE_DIR/token)"
                )
                response = _error_response(error)
                response.headers["WWW-Authenticate"] = 'Bearer realm="spotbag"'
                return response
            method = "GET" if request.method == "HEAD" else request.method
            if not principal.is_admin and (method, route) in admin_routes:
                return _error_response(
                    Forbidden(
                        f"{request.method} {route} needs the admin token; this token belongs "
                        f"to account {principal.account!r}"
                    )
                )
            request["principal"] = principal
        return await handler(request)

    return check


def counting_middleware(controller: Controller) -> Callable:
    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        controller.metrics.http_requests.labels(
            route=_route_name(request), status=str(response.status)
        ).inc()
        return response

    return count


class _ServerLogger(logging.LoggerAdapter):
    """aiohttp's server logger, except that a request aiohttp itself cannot parse (a
    NUL or a control character in a header, ...; it answers 400 on its own) is one
    DEBUG line rather than an ERROR with a traceback: any client could fill the log."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            first_line = (str(exc.message).strip().splitlines() or [""])[0]
            self.debug(f"{msg}: %s", *args, first_line)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def server_logger() -> Any:
    return _ServerLogger(logging.getLogger("aiohttp.server"), {})


def build_app(controller: Controller) -> web.Application:
    app = web.Application(
        client_max_size=int(controller.config.api.max_body_mb * 1024 * 1024),
        middlewares=[
            counting_middleware(controller),
            error_middleware,
            auth_middleware(controller),
        ],
    )
    app[CONTROLLER] = controller
    for route in ROUTES:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)  # answers HEAD too
        else:
            app.router.add_route(route.method, route.path, route.handler)
    return app
