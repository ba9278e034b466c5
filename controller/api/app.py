"""The HTTP API's application: the route table, the middlewares and `build_app`.

The routes live with their resource (bags.py, jobs.py, vms.py, market.py,
accounts.py, account_tokens.py, reports.py, events.py, health.py; Slurm's callback route
with the Slurm package, controller/slurm/routes.py); `ROUTES` joins them, and builds both
the router and the OpenAPI document (openapi.py), so the two cannot drift apart.
Middlewares turn every error into
`{"error": {"code", "message", "detail"}}` with a fitting status, check the bearer
token, and count requests. The web UI's routes (controller/web/) are added beside them; the API
also takes the UI's session cookie instead of the bearer header, with a CSRF token for
state-changing requests (controller/web/session.py).

Two kinds of token (controller/tokens.py): the admin's (the daemon's token) may do
everything; an account token only sees and spends its own account. Routes marked
`admin_only` refuse account tokens with 403; the others check the account of what
they touch (a bag of another account is "not found", as if it did not exist).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controller.api import (
    account_tokens,
    accounts,
    bags,
    events,
    health,
    jobs,
    market,
    reports,
    vms,
)
from controller.api.base import CONTROLLER, PRINCIPAL, Handler, Route, json_response
from controller.api.limits import request_limits
from controller.errors import ApiError, Forbidden, SpotbagError, Unauthorized
from controller.slurm import routes as slurm_routes
from controller.store import StoreUnavailable
from controller.web import pages as ui_pages
from controller.web import session as ui_session

if TYPE_CHECKING:
    from controller.daemon import Controller

log = logging.getLogger("spotbag.api")

ROUTES: tuple[Route, ...] = (
    *health.ROUTES,
    *bags.ROUTES,
    *jobs.ROUTES,
    *vms.ROUTES,
    *market.ROUTES,
    *slurm_routes.ROUTES,
    *accounts.ROUTES,
    *reports.ROUTES,
    *events.ROUTES,
    *account_tokens.ROUTES,
)


# --- middlewares and the app ----------------------------------------------------------


def _error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    response = json_response(error.body(), status=error.status)
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
    except SpotbagError as exc:
        # One of ours that no handler turned into an answer: its status says what the
        # caller did wrong (4xx) or that a part is down (503); anything else is a bug.
        if exc.status < 500 or exc.status == 503:
            log.warning("%s %s: %s", request.method, request.path, exc)
            return _error_response(ApiError(str(exc), status=exc.status, code=exc.code))
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(
            ApiError("internal error; see the daemon log", status=500, code="internal_error")
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if _client_went_away(request, exc):
            # A client that closes its connection in the middle of its request (a POST
            # cut short while its body was read): nobody hears an answer, and it is no
            # fault of ours. One DEBUG line, not an ERROR with a traceback: any client
            # could fill the log with them.
            log.debug(
                "%s %s: the client closed the connection before the end of its request",
                request.method,
                request.path,
            )
            return _error_response(ApiError("the request was cut short", code="incomplete_request"))
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(
            ApiError("internal error; see the daemon log", status=500, code="internal_error")
        )


def _client_went_away(request: web.Request, exc: Exception) -> bool:
    """Whether `exc` is this request's client disconnecting (aiohttp's ConnectionResetError
    on reading the body once the connection is lost), not a connection of ours failing."""
    transport = request.transport
    return isinstance(exc, ConnectionResetError) and (transport is None or transport.is_closing())


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
        if (
            route not in open_paths
            and request.path not in open_paths
            and not ui_pages.is_ui_path(request.path)
        ):
            given = request.headers.get("Authorization", "")
            principal = controller.tokens.authenticate(given)
            by_cookie = False
            if principal is None and not given:
                # The web UI's session cookie (controller/web/session.py) stands for the
                # same principal; a state-changing request by cookie needs its CSRF token.
                principal = ui_session.cookie_principal(request, controller.tokens)
                by_cookie = principal is not None
            if by_cookie:
                problem = ui_session.csrf_problem(request, controller.token)
                if problem is not None:
                    return _error_response(Forbidden(problem, code="csrf_failed"))
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
            request[PRINCIPAL] = principal
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
            # After the token check: an unauthenticated body is never read, only
            # discarded by aiohttp (for lingering_time at most).
            request_limits(controller.config.api.body_timeout_s),
        ],
    )
    app[CONTROLLER] = controller
    app[health.ROUTE_TABLE] = ROUTES
    for route in ROUTES:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)  # answers HEAD too
        else:
            app.router.add_route(route.method, route.path, route.handler)
    ui_pages.add_routes(app)  # the web UI: not in ROUTES, so not in /openapi.json
    return app
