"""Events (docs/notifications.md): GET /v1/events lists what bags and the fleet raised,
in the order recorded, with each webhook delivery's state. An account token sees its
account's events only (not the fleet's preemption storms)."""

from __future__ import annotations

import json

from aiohttp import web

from controller.api.base import (
    ERR,
    Param,
    Route,
    bounded,
    controller_of,
    enum_query,
    int_param,
    json_response,
    principal_of,
    visible_bag,
)
from controller.api.schemas import EventList
from controller.notify.kinds import EVENT_KINDS

EVENTS_AFTER = bounded(
    "after", "Only events recorded after this one (its seq): the cursor to follow.", 0, 10**15, 0
)
EVENTS_SINCE = bounded(
    "since", "Only events created at or after this time (epoch s).", 0, 10**11, 0
)
EVENTS_LIMIT = bounded("limit", "At most this many events.", 1, 1000, 100)


async def list_events(request: web.Request) -> web.Response:
    c = controller_of(request)
    kind = enum_query(request, "kind", list(EVENT_KINDS))
    after = int_param(request, EVENTS_AFTER)
    since = int_param(request, EVENTS_SINCE)
    limit = int_param(request, EVENTS_LIMIT)
    bag_id = request.query.get("bag")
    if bag_id is not None:
        await visible_bag(request, bag_id)  # 404 for another account's bag
    principal = principal_of(request)
    account = None if principal.is_admin else principal.account
    events = await c.store.list_events(
        bag_id=bag_id,
        kind=kind,
        since=float(since) if since else None,
        after=after,
        account=account,
        limit=limit,
    )
    for event in events:
        event["payload"] = json.loads(event["payload"])
    next_after = events[-1]["seq"] if events else after
    return json_response({"events": events, "next_after": next_after})


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/v1/events",
        list_events,
        "Events (finished, failed, deadline_at_risk, budget_reached, preemption_storm) in "
        "the order recorded, with their webhook deliveries.",
        params=(
            Param("bag", "query", "Only this bag's events."),
            Param("kind", "query", "Only events of this kind.", {"enum": list(EVENT_KINDS)}),
            EVENTS_SINCE,
            EVENTS_AFTER,
            EVENTS_LIMIT,
        ),
        responses={200: ("Events.", EventList), 404: ("No such bag.", ERR)},
    ),
)
