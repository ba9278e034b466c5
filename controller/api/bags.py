"""Bags: submit (POST /v1/bags), list, show and cancel.

A submission is decoded here and handed to admission (controller/bags/admission.py), which
validates the spec (controller/bags/spec.py), reserves CPU-hours and writes the bag and
its jobs; what it raises (InvalidBag, InsufficientBalance, ...) is already an ApiError.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from controller.api.base import (
    BAG_PATH,
    ERR,
    Param,
    Route,
    bag_id_of,
    bounded,
    controller_of,
    decode_json,
    enum_query,
    int_param,
    json_body,
    json_response,
    principal_of,
    require_account,
    visible_bag,
)
from controller.api.schemas import Bag, BagList, BudgetChange, Timeline, parse_body
from controller.bags.admission import admit
from controller.bags.spec import BagSpec
from controller.costs.summary import bag_view
from controller.errors import ApiError, Conflict, InvalidBag
from controller.scheduler.waiting import bag_pace
from controller.states import BagState
from controller.store import job_id_of

# RFC 8941 sf-string-like: printable ASCII, no spaces at either end (HTTP trims them).
IDEMPOTENCY_KEY = re.compile(r"[!-~](?:[ -~]{0,198}[!-~])?")
IDEMPOTENCY_KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "pattern": r"^[!-~]([ -~]{0,198}[!-~])?$",
}
BAGS_LIMIT = bounded("limit", "At most this many bags.", 1, 1000, 50)
BAGS_OFFSET = bounded("offset", "Skip this many bags.", 0, 10**9, 0)
TIMELINE_SINCE = bounded(
    "since",
    "Only attempts live at or after this time (epoch seconds): still running, or ended "
    "then or later. A page following a bag passes the previous answer's `now`, less a "
    "margin.",
    0,
    10**11,
    0,
)
TIMELINE_LIMIT = bounded(
    "limit", "At most this many attempts: the newest by start.", 1, 10_000, 2000
)


async def create_bag(request: web.Request) -> web.Response:
    c = controller_of(request)
    body = await request.read()
    try:
        # Parsing megabytes of JSON takes long enough to stall the event loop.
        data = await asyncio.to_thread(decode_json, body)
    except ValueError as exc:
        raise InvalidBag(
            f"(body): not valid JSON ({exc})",
            detail={"errors": [{"field": "(body)", "message": str(exc)}]},
        ) from None
    principal = principal_of(request)
    if not principal.is_admin and isinstance(data, dict):
        # An account token's bags are charged to its account, which may go unsaid.
        account = data.setdefault("account", principal.account)
        if isinstance(account, str):
            require_account(request, account)
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
        scheduler=c.running_scheduler,
        catalog=c.catalog,
        bag_id=c.ids.new_bag_id(),
        now=c.clock.now(),
        max_jobs=c.config.api.max_jobs_per_bag,
        idempotency_key=key,
        workdir_problem=c.workdir_checks.workdir_problem if c.workdir_checks else None,
        job_user_problem=c.admission_checks.job_user_problem if c.admission_checks else None,
    )
    view = await _view(request, bag["id"])
    return json_response(view, status=201 if created else 200)


async def list_bags(request: web.Request) -> web.Response:
    c = controller_of(request)
    state = enum_query(request, "state", [s.value for s in BagState])
    limit = int_param(request, BAGS_LIMIT)
    offset = int_param(request, BAGS_OFFSET)
    account = request.query.get("account")
    principal = principal_of(request)
    if account is not None:
        require_account(request, account)
    elif not principal.is_admin:
        account = principal.account
    bags = await c.store.list_bags(state=state, account=account, limit=limit, offset=offset)
    costs = await c.bag_costs.of([b["id"] for b in bags])
    now = c.clock.now()
    views = [bag_view(b, now, costs[b["id"]]) for b in bags]
    scheduler = getattr(c, "scheduler", None)  # None while the daemon starts
    for row, view in zip(bags, views, strict=True):
        del view["spec"]
        if scheduler is not None and view["id"] in scheduler.world.bags:
            # The scheduler's book, in memory: a page of bags marks those a budget holds.
            view["budget"] = scheduler.budgets.bag_view(view["id"], view["account"])
            # And its deadline's projection, to mark those at risk.
            if row.get("deadline_at") is not None:
                view["deadline"] = await _deadline(c, row, scheduler, now)
    return json_response({"bags": views, "limit": limit, "offset": offset})


async def _view(request: web.Request, bag_id: str) -> dict:
    """The bag as the API shows it, its cost from the split-cost report (bag_cost.py)."""
    c = controller_of(request)
    bag = await visible_bag(request, bag_id)
    costs = await c.bag_costs.of([bag_id])
    now = c.clock.now()
    view = bag_view(bag, now, costs[bag_id])
    scheduler = getattr(c, "scheduler", None)  # None while the daemon starts
    view["pace"] = bag_pace(scheduler, bag_id, now) if scheduler is not None else None
    view["budget"] = await _budget(c, bag, scheduler)
    view["deadline"] = await _deadline(c, bag, scheduler, now)
    return view


async def _deadline(c: Any, bag: Any, scheduler: Any, now: float) -> dict[str, Any] | None:
    """The bag's deadline (docs/bags.md#options): the deadline policy's projection while
    the scheduler runs the bag (controller/scheduler/deadlines.py), with the store's
    deadline and on-demand share; null without a deadline."""
    if bag.get("deadline_at") is None:
        return None
    projected = None
    if scheduler is not None and bag["id"] in scheduler.world.bags:
        projected = scheduler.deadlines.view(bag["id"])
    projected = projected or {}
    return {
        "at": bag["deadline_at"],
        "confidence": bag.get("deadline_confidence", 0.95),
        "p_meet": projected.get("p_meet"),
        "finish": projected.get("finish", {}),
        "at_risk": projected.get("at_risk", False),
        "on_demand_slots": projected.get("on_demand_slots", 0),
        "on_demand_share": await c.store.on_demand_share(bag["id"], now),
    }


async def _budget(c: Any, bag: Any, scheduler: Any) -> dict[str, Any]:
    """The bag's dollars against its budgets: the scheduler's book while it runs the
    bag, else the store's sums (an ended bag)."""
    if scheduler is not None and bag["id"] in scheduler.world.bags:
        return scheduler.budgets.bag_view(bag["id"], bag["account"])
    charged, reserved = await c.store.bag_budget_sums(bag["id"])
    return {
        "budget_usd": bag["budget_usd"],
        "charged_usd": charged,
        "reserved_usd": reserved,
        "held": None,
    }


async def set_bag(request: web.Request) -> web.Response:
    """Change a bag's budget: written first, then the scheduler's book; a bag a budget
    held goes on at the next pass if the new one has room."""
    c = controller_of(request)
    bag_id = bag_id_of(request)
    bag = await visible_bag(request, bag_id)
    body = parse_body(BudgetChange, await json_body(request))
    if bag["state"] != BagState.ACTIVE:
        raise Conflict(
            f"bag {bag_id} already finished ({bag['state']})", detail={"state": bag["state"]}
        )
    await c.store.set_bag_budget(bag_id, body.budget_usd, c.clock.now())
    scheduler = c.running_scheduler
    scheduler.budgets.set_bag_cap(bag_id, body.budget_usd)
    scheduler.credited()  # wake it: held bags may go on
    return json_response(await _view(request, bag_id))


async def get_bag(request: web.Request) -> web.Response:
    return json_response(await _view(request, bag_id_of(request)))


async def bag_timeline(request: web.Request) -> web.Response:
    """The bag's attempts per VM over time, with their checkpoints and VMs: what the web
    UI's timeline draws (preemptions, retries, checkpoints; where work was lost)."""
    c = controller_of(request)
    bag_id = bag_id_of(request)
    since = int_param(request, TIMELINE_SINCE)
    limit = int_param(request, TIMELINE_LIMIT)
    await visible_bag(request, bag_id)
    now = c.clock.now()
    found = await c.store.bag_timeline(bag_id, float(since), limit)
    attempts = [
        {"job": job_id_of(bag_id, a["idx"]), "index": a["idx"], **a} for a in found["attempts"]
    ]
    for a in attempts:
        del a["idx"]
    checkpoints = [
        {
            "id": k["id"],
            "job": job_id_of(bag_id, k["idx"]),
            "attempt": k["attempt"],
            "requested_at": k["requested_at"],
            "at": k["at"],
            "ok": bool(k["ok"]),
            "work_s": k["work_s"],
        }
        for k in found["checkpoints"]
    ]
    vms = [{**vm, "spot": bool(vm["spot"])} for vm in found["vms"]]
    return json_response(
        {
            "bag_id": bag_id,
            "now": now,
            "since": since,
            "truncated": found["truncated"],
            "attempts": attempts,
            "checkpoints": checkpoints,
            "vms": vms,
        }
    )


async def cancel_bag(request: web.Request) -> web.Response:
    c = controller_of(request)
    bag_id = bag_id_of(request)
    bag = await visible_bag(request, bag_id)
    if bag["state"] != BagState.ACTIVE:
        raise Conflict(
            f"bag {bag_id} already finished ({bag['state']})", detail={"state": bag["state"]}
        )
    await c.store.request_cancel(bag_id, c.clock.now())
    c.running_scheduler.cancel_requested(bag_id)
    return json_response(await _view(request, bag_id), status=202)


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/bags",
        create_bag,
        "Submit a bag of jobs.",
        body=BagSpec,
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
            201: ("The bag was admitted; all its jobs are queued.", Bag),
            200: ("This account's bag with this Idempotency-Key exists already.", Bag),
            400: ("The spec or the Idempotency-Key is malformed; the message names it.", ERR),
            402: ("The account cannot reserve the CPU-hours; says needed and available.", ERR),
            403: ("An account token may not submit for another account.", ERR),
            404: ("The account does not exist (with [ledger] new_accounts = refuse).", ERR),
            409: (
                "The account used this Idempotency-Key for a different bag "
                "(code idempotency_key_reused; detail.bag_id is that bag).",
                ERR,
            ),
            413: ("The request body is too large.", ERR),
            422: (
                "No allowed VM type can run one job of the bag (code no_vm_type_fits), or its "
                "account has no user its jobs may run as (code no_job_user; [executor] run_as).",
                ERR,
            ),
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
            200: ("Bags.", BagList),
            403: ("An account token may not list another account's bags.", ERR),
        },
    ),
    Route(
        "GET",
        "/v1/bags/{bag_id}",
        get_bag,
        "A bag: job counts per state, progress, usage and cost.",
        params=(BAG_PATH,),
        responses={200: ("The bag.", Bag), 404: ("No such bag.", ERR)},
    ),
    Route(
        "PATCH",
        "/v1/bags/{bag_id}",
        set_bag,
        "Change a bag's budget: {budget_usd} (US dollars, or null for none). A bag its "
        "budget held goes on if the new one leaves room.",
        params=(BAG_PATH,),
        body=BudgetChange,
        responses={
            200: ("The bag, with its budget now.", Bag),
            400: ("A bad field; the message names it.", ERR),
            404: ("No such bag.", ERR),
            409: ("The bag already finished.", ERR),
        },
    ),
    Route(
        "GET",
        "/v1/bags/{bag_id}/timeline",
        bag_timeline,
        "A bag's attempts per VM over time, with their checkpoints and VMs (bounded: the "
        "newest `limit` attempts live since `since`).",
        params=(BAG_PATH, TIMELINE_SINCE, TIMELINE_LIMIT),
        responses={200: ("The timeline.", Timeline), 404: ("No such bag.", ERR)},
    ),
    Route(
        "POST",
        "/v1/bags/{bag_id}/cancel",
        cancel_bag,
        "Cancel a bag: queued jobs are cancelled, running ones stopped.",
        params=(BAG_PATH,),
        responses={
            202: ("Cancellation under way.", Bag),
            404: ("No such bag.", ERR),
            409: ("The bag already finished.", ERR),
        },
    ),
)
