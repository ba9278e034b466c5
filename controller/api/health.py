"""What needs no token: /healthz for load balancers and monitors, /metrics for
Prometheus, and /openapi.json, built from the route table the app serves."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from controller.api.base import Route, controller_of, json_response
from controller.api.schemas import Health
from controller.plumbing.metrics import CONTENT_TYPE

# The app's route table, for /openapi.json (app.py sets it; it is built from this module).
ROUTE_TABLE: web.AppKey[tuple[Route, ...]] = web.AppKey("routes")


async def healthz(request: web.Request) -> web.Response:
    """200 when the daemon works; 503 with the problems when it cannot (its database
    cannot be written, its scheduler keeps failing), for load balancers and monitors.
    (While it starts, controller/service.py answers 503 "starting" in its place.)"""
    c = controller_of(request)
    problems = c.problems()
    body: dict[str, Any] = {
        "ok": not problems,
        "status": "failing" if problems else "ok",
        "driver": c.driver.name,
        "schema_version": c.store.schema_version,
    }
    if problems:
        body["problems"] = problems
        return json_response(body, status=503)
    return json_response(body)


async def openapi_document(request: web.Request) -> web.Response:
    from controller.api.openapi import build_openapi

    routes = request.app[ROUTE_TABLE]
    return json_response(build_openapi(routes))


async def metrics(request: web.Request) -> web.Response:
    body = controller_of(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/healthz",
        healthz,
        "Liveness check (no token needed).",
        auth=False,
        responses={
            200: ("The daemon is ready and works (status ok).", Health),
            503: (
                "It is starting (status starting, Retry-After), or cannot work now (status "
                "failing: its database cannot be written, ...; problems).",
                Health,
            ),
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
)
