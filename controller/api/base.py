"""What every resource module of the API shares: the route declaration (`Route`,
`Param`), the caller and the controller of a request, access checks, and the parsing
of path, query and JSON body values into the errors controller/errors.py defines.

A resource module declares its handlers and a `ROUTES` tuple of `Route`s; app.py
joins them into the router and /openapi.json (openapi.py), so the two cannot drift
apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel

from controller.api.schemas import Error
from controller.errors import ApiError, Forbidden, NotFound
from controller.ids import BAG_ID, JOB_ID
from controller.tokens import ADMIN, Principal

if TYPE_CHECKING:
    from controller.daemon import Controller
    from controller.store.rows import BagDetail

CONTROLLER: web.AppKey[Controller] = web.AppKey("controller")
# Who a request's token belongs to, set by the auth middleware (controller/api/app.py).
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path", "query" or "header"
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
    body: type[BaseModel] | None = None  # the model of the JSON request body
    body_required: bool = True  # False: the body may be left out
    # status -> (text, the model of its JSON body; None: no JSON body documented)
    responses: dict[int, tuple[str, type[BaseModel] | None]] = field(default_factory=dict)


ERR = Error  # the body of every error answer


def controller_of(request: web.Request) -> Controller:
    return request.app[CONTROLLER]


def principal_of(request: web.Request) -> Principal:
    return request.get(PRINCIPAL, ADMIN)


def require_account(request: web.Request, account: str) -> None:
    """403 unless the caller may use `account`."""
    principal = principal_of(request)
    if not principal.may_use(account):
        raise Forbidden(
            f"this token belongs to account {principal.account!r} and may not use "
            f"account {account!r}",
            detail={"token_account": principal.account, "account": account},
        )


async def visible_bag(request: web.Request, bag_id: str) -> BagDetail:
    """The bag, if it exists and the caller may see it (404 otherwise: an account token
    cannot tell another account's bags from ones that do not exist)."""
    bag = await controller_of(request).store.get_bag(bag_id)
    if bag is None or not principal_of(request).may_use(bag["account"]):
        raise NotFound(f"bag {bag_id} does not exist")
    return bag


async def check_bag_visible(request: web.Request, bag_id: str) -> None:
    if not principal_of(request).is_admin:
        await visible_bag(request, bag_id)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


# --- path and query values ---------------------------------------------------------------

_INTEGER = re.compile(r"-?[0-9]{1,18}")


def bounded(name: str, description: str, low: int, high: int, default: int | None) -> Param:
    """An integer query parameter; its bounds are both documented and enforced."""
    schema: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
    if default is not None:
        schema["default"] = default
    return Param(name, "query", description, schema)


def int_param(request: web.Request, param: Param) -> Any:
    """An integer query parameter within the bounds its documentation gives (the same
    Param object puts them into /openapi.json); its default when it is absent."""
    schema = param.schema
    raw = request.query.get(param.name)
    if raw is None:
        return schema.get("default")
    low, high = schema["minimum"], schema["maximum"]
    if not _INTEGER.fullmatch(raw):
        raise ApiError(
            f"query parameter {param.name}: {raw!r} is not an integer", code="invalid_query"
        )
    value = int(raw)
    if not low <= value <= high:
        raise ApiError(
            f"query parameter {param.name}: must be between {low} and {high}",
            code="invalid_query",
        )
    return value


def enum_query(request: web.Request, name: str, allowed: list[str]) -> str | None:
    value = request.query.get(name)
    if value is not None and value not in allowed:
        raise ApiError(
            f"query parameter {name}: {value!r} is not one of {', '.join(allowed)}",
            code="invalid_query",
        )
    return value


BOOLEAN = {
    "type": "string",
    "enum": ["true", "false", "1", "0", "yes", "no"],
    "description": "Also accepted in any letter case.",
}


def bool_query(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false")
    if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise ApiError(
            f"query parameter {name}: {raw!r} is not true or false", code="invalid_query"
        )
    return raw.lower() in ("1", "true", "yes")


BAG_PATH = Param("bag_id", "path", "Bag id, e.g. b3f9a0c21d7.", required=True)
JOB_PATH = Param("job_id", "path", "Job id: <bag id>-<index>, e.g. b3f9a0c21d7-42.", required=True)
ACCOUNT_PATH = Param("account", "path", "Account name.", required=True)


def bag_id_of(request: web.Request) -> str:
    bag_id = request.match_info["bag_id"]
    if not BAG_ID.fullmatch(bag_id):
        raise NotFound(f"bag {bag_id!r} does not exist (bag ids look like b3f9a0c21d7)")
    return bag_id


def job_key_of(request: web.Request) -> tuple[str, int]:
    job_id = request.match_info["job_id"]
    match = JOB_ID.fullmatch(job_id)
    if match is None:
        raise NotFound(f"job {job_id!r} does not exist (job ids look like b3f9a0c21d7-42)")
    return match[1], int(match[2])


# --- JSON bodies --------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(body: bytes) -> Any:
    """Strict JSON (RFC 8259: UTF-8, no NaN/Infinity); every failure is a ValueError."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, RecursionError) as exc:
        kind = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "nested too deeply"
        raise ValueError(f"the body is {kind}") from None


async def json_body(request: web.Request) -> dict[str, Any]:
    """A small JSON object body (accounts, credits, tokens); 400 invalid_body otherwise."""
    try:
        data = decode_json(await request.read())
    except ValueError as exc:
        raise ApiError(f"(body): not valid JSON ({exc})", code="invalid_body") from None
    if not isinstance(data, dict):
        raise ApiError("(body): must be a JSON object", code="invalid_body")
    return data
