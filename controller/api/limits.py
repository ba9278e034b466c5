"""The HTTP server's resource limits: what a client may hold of the daemon (issue 23).

1,100 clients that each sent a header byte every 5 s took every file descriptor of a
daemon under the usual limit of 1,024: /healthz stopped answering, jobs failed to start
with EMFILE, and asyncio logged megabytes of accept() errors. What bounds them:

- aiohttp's own settings, passed by the daemon (controller/service.py):
  `keepalive_timeout` (`[api] header_timeout_s`) closes a connection that has not sent
  a complete request's line and headers within it of connecting (aiohttp ≥ 3.14.4;
  before, only once it had an answer) or of its previous answer; `client_max_size` and
  `max_line_size` bound what a request may carry.
- `ConnectionGate` (here): aiohttp has no cap on connections, so the daemon's listening
  socket makes its connections through this protocol factory, which wraps aiohttp's
  (the runner's `web.Server`) and decides when a connection is made, before reading
  anything: at `max_connections_per_client` from the client's address it is answered
  503 and closed; at the total cap (`max_connections`, lowered so that `reserved_fds`
  descriptors stay free for the daemon's own work) the oldest connection that is not in
  a request makes room for it (policies/connections.py), else it is refused. Admitted
  connections go to aiohttp unchanged.
- `request_limits` (here), a middleware: marks the connection as in a request (the gate
  does not close it to make room) and waits for the request's body (reads it) for
  `[api] body_timeout_s` at most, else answers 408, before the handler runs.
- `quiet_accept_errors`: should accept() still run out of descriptors, asyncio logs an
  ERROR with a traceback for each of up to `backlog` tries per readiness, and re-arms
  itself as often (CPython gh-151615; Python 3.11 has it): thousands of lines a second.
  One line per burst instead.

Refusals and closings are logged once per burst (controller/plumbing/burst_log.py) and counted
in /metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from controller.api.base import Handler, json_response
from controller.plumbing.burst_log import BurstLog
from policies.connections import client_key, make_room

log = logging.getLogger("spotbag.api")

ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"  # asyncio's message


def _refusal(message: str) -> bytes:
    """The whole answer to a refused connection: a 503 in the API's error shape."""
    body = json.dumps(
        {"error": {"code": "too_many_connections", "message": message, "detail": {}}}
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


PER_CLIENT_REFUSAL = _refusal("too many connections from your address; close some and try again")
TOTAL_REFUSAL = _refusal("the daemon holds as many connections as it may; try again")


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's request handler once the gate admits it,
    nothing before (a refused connection never reaches aiohttp)."""

    __slots__ = ("_gate", "client", "handler", "requests", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate
        self.client = ""
        self.handler: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.requests = 0  # requests of this connection in the app (request_limits)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._gate.arrived(self)

    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._gate.left(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()


class ConnectionGate:
    """The protocol factory of the API's listening socket (see the module docstring):
    `loop.create_server(gate, ...)` with `gate = ConnectionGate(runner.server, ...)`."""

    def __init__(
        self,
        handlers: Callable[[], asyncio.Protocol],
        *,
        cap: int,
        per_client: int,
        count: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._handlers = handlers
        self.cap = cap
        self.per_client = per_client
        self._count = count
        self._open: dict[_Connection, None] = {}  # oldest first
        self._per_client: Counter[str] = Counter()
        self._refused = BurstLog.on_loop(log)
        self._made_room = BurstLog.on_loop(log)

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def serve_with(self, handlers: Callable[[], asyncio.Protocol]) -> None:
        """Hand the connections admitted from now on to `handlers`: the daemon's API once
        it has loaded, its start-up answers until then (controller/service.py)."""
        self._handlers = handlers

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def arrived(self, conn: _Connection) -> None:
        transport = conn.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        conn.client = client_key(str(peer[0]) if isinstance(peer, tuple) and peer else "")
        if self._per_client[conn.client] >= self.per_client:
            self._refuse(
                conn,
                PER_CLIENT_REFUSAL,
                "per_client_cap",
                f"{self.per_client} already open from there ([api] max_connections_per_client)",
            )
            return
        if len(self._open) >= self.cap:
            victim = make_room((c, c.requests > 0) for c in self._open)
            if victim is None:
                self._refuse(
                    conn,
                    TOTAL_REFUSAL,
                    "total_cap",
                    f"all {self.cap} connections are in requests ([api] max_connections, "
                    "reserved_fds and the descriptor limit)",
                )
                return
            self._made_room.event(
                "closed a connection from %s that was not in a request, to make room for one "
                "from %s: %d connections are open ([api] max_connections, reserved_fds "
                "and the descriptor limit)",
                victim.client,
                conn.client,
                self.cap,
            )
            self._count("made_room")
            self._forget(victim)
            if victim.transport is not None:
                victim.transport.abort()
        self._open[conn] = None
        self._per_client[conn.client] += 1
        conn.handler = self._handlers()
        conn.handler.connection_made(transport)

    def left(self, conn: _Connection) -> None:
        self._forget(conn)

    def _forget(self, conn: _Connection) -> None:
        if conn in self._open:
            del self._open[conn]
            self._per_client[conn.client] -= 1
            if not self._per_client[conn.client]:
                del self._per_client[conn.client]

    def _refuse(self, conn: _Connection, answer: bytes, reason: str, why: str) -> None:
        self._refused.event("refused a connection from %s: %s", conn.client, why)
        self._count(reason)
        assert conn.transport is not None
        conn.transport.write(answer)
        conn.transport.close()


def _connection_of(request: web.Request) -> _Connection | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, _Connection) else None


async def _arrived(request: web.Request) -> None:
    """Until the request's body has arrived. Read whole (aiohttp keeps it: handlers read
    it again), except a multipart body, which aiohttp's form parser reads only from the
    stream (the login form may come so): that one is waited for as it arrives, which
    aiohttp's flow control bounds to its read buffer (no route takes big multipart
    bodies)."""
    if request.content_type.startswith("multipart/"):
        await request.content.wait_eof()
    else:
        await request.read()


def request_limits(body_timeout_s: float) -> Callable:
    """The middleware of the module docstring: the request holds its connection, and
    its body arrives within `body_timeout_s` (408 otherwise) before the handler runs."""

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = _connection_of(request)
        if conn is not None:
            conn.requests += 1
        try:
            if request.body_exists:
                try:
                    async with asyncio.timeout(body_timeout_s):
                        await _arrived(request)
                except TimeoutError:
                    response = json_response(
                        {
                            "error": {
                                "code": "request_timeout",
                                "message": f"the request's body did not arrive within "
                                f"{body_timeout_s:g} s ([api] body_timeout_s)",
                                "detail": {},
                            }
                        },
                        status=408,
                    )
                    response.force_close()
                    return response
                except (ConnectionError, RequestPayloadError) as exc:
                    # The client went away mid-body: nobody is left to answer.
                    log.debug(
                        "%s %s: the client closed the connection before the end of its "
                        "request (%s)",
                        request.method,
                        request.path,
                        exc,
                    )
                    response = json_response(
                        {"error": {"code": "bad_request", "message": str(exc), "detail": {}}},
                        status=400,
                    )
                    response.force_close()
                    return response
            return await handler(request)
        finally:
            if conn is not None:
                conn.requests -= 1

    return limit


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's "socket.accept() out of system resource" errors as one line per burst;
    every other error of the loop as before."""
    burst = BurstLog(log, level=logging.ERROR, call_later=loop.call_later)
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_OUT_OF_RESOURCES:
            burst.event(
                "cannot accept connections: %s (the descriptor limit is reached: raise "
                "LimitNOFILE, or [api] reserved_fds if the daemon's own work needs more)",
                context.get("exception"),
            )
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
