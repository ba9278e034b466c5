"""Cost reports of a bag or an account (controller/costs/report.py), as JSON, CSV or an
HTML page (controller/costs/report_render.py)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controller.api.base import (
    ERR,
    Param,
    Route,
    controller_of,
    enum_query,
    json_response,
    require_account,
    visible_bag,
)
from controller.costs import report_render
from controller.costs.report import CostRule, ReportScopeEmpty, build_report
from controller.errors import ApiError, NotFound
from controller.ids import BAG_ID


async def get_report(request: web.Request) -> web.Response:
    c = controller_of(request)
    bag_id, account = request.query.get("bag"), request.query.get("account")
    if (bag_id is None) == (account is None):
        raise ApiError("give one of bag=<bag id> or account=<name>", code="invalid_query")
    fmt = enum_query(request, "format", ["json", "csv", "html"]) or "json"
    if bag_id is not None:
        if not BAG_ID.fullmatch(bag_id):
            raise NotFound(f"bag {bag_id} does not exist")
        await visible_bag(request, bag_id)
    elif account is not None:  # one of the two, checked above
        require_account(request, account)
    try:
        report = await build_report(
            c.store,
            bag_id=bag_id,
            account=account,
            now=c.clock.now(),
            rule=CostRule.of(c.config),
        )
    except ReportScopeEmpty as exc:
        raise NotFound(str(exc)) from None
    if fmt == "csv":
        return web.Response(text=report_render.to_csv(report), content_type="text/csv")
    if fmt == "html":
        page = await asyncio.to_thread(report_render.to_html, report)
        return web.Response(text=page, content_type="text/html")
    return json_response(report)


ROUTES: tuple[Route, ...] = (
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
            403: ("An account token may not report on another account.", ERR),
            404: ("No such bag, or no bags.", ERR),
        },
    ),
)
