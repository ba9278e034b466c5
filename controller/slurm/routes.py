"""Callbacks from slurmctld's hooks (slurm_hooks/): signed with the hook secret rather
than a bearer token, idempotent by their key (controller/slurm/callbacks.py)."""

from __future__ import annotations

from aiohttp import web
from pydantic import ValidationError

from controller.api.base import ERR, Param, Route, controller_of, json_response
from controller.api.schemas import SlurmEventTaken
from controller.errors import ApiError, Conflict, Unauthorized
from controller.slurm import callbacks


async def slurm_event(request: web.Request) -> web.Response:
    """A callback from slurmctld's hooks: signed with the hook secret (not a bearer
    token), idempotent by its key (controller/slurm/callbacks.py)."""
    c = controller_of(request)
    timestamp = request.headers.get(callbacks.TIMESTAMP_HEADER)
    signed = request.headers.get(callbacks.SIGNATURE_HEADER)
    if not timestamp or not signed:  # unsigned: refused whatever this daemon runs
        raise Unauthorized(
            f"Slurm callback refused: missing {callbacks.TIMESTAMP_HEADER} or "
            f"{callbacks.SIGNATURE_HEADER}"
        )
    slurm = c.slurm
    if slurm is None:
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
    if slurm.seen(key):
        await slurm.repeat_written(key)  # a pool run's end answered 503: once written
        return json_response({"key": key, "duplicate": True, "applied": False})
    # Taken from here on: a copy sent while the store is asked (a hook that gave up
    # waiting spools and sends it again) is a duplicate too.
    slurm.remember(key)
    if await c.store.callback_seen(key):
        return json_response({"key": key, "duplicate": True, "applied": False})
    applied = await slurm.take(event)
    return json_response({"key": key, "duplicate": False, "applied": applied})


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/slurm/events",
        slurm_event,
        "A callback from slurmctld's hooks (slurm_hooks/): HMAC-signed with the hook secret "
        "(X-Spotbag-Timestamp, X-Spotbag-Signature), no bearer token; a repeat changes nothing.",
        auth=False,
        body=callbacks.SlurmEvent,
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
            200: ("Taken (or a duplicate: duplicate = true).", SlurmEventTaken),
            400: (
                "A malformed event, or a power-saving event naming more nodes than the pools "
                "declare (not expanded).",
                ERR,
            ),
            401: ("A bad signature or a timestamp outside the window.", ERR),
            409: ("The daemon does not run the Slurm executor.", ERR),
            503: (
                f"The end of a pool job's run, not written within "
                f"{callbacks.POOL_VERDICT_WAIT_S:g} s: send it again (the hook spools it); "
                "the copy is answered once it is written.",
                ERR,
            ),
        },
    ),
)
