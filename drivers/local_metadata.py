"""The cloud's metadata server, as the local driver's VM hosts see it.

A cloud VM asks a link-local server about itself; a spot VM learns there that it is
about to be taken, before any API poll would tell its owner. The local driver models
that for its VM hosts (drivers/local_hosts.py): one HTTP server on their bridge (the
head's address there), answering each VM host by its source address, as the cloud's
server answers each VM. What it serves is what the real services serve, so the notice
watcher each VM runs (drivers/templates/notice_watch.py) reads it unchanged:

- GCE (`computeMetadata/v1`, header `Metadata-Flavor: Google` or 403):
  `instance/preempted` is FALSE, TRUE from the notice on; with `wait_for_change=true`
  the answer waits until the value differs from `last_etag` (or from the value when
  asked), at most `timeout_sec`; every answer carries the value's ETag.
- EC2 IMDSv2 (`latest`): `PUT api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  (1-21600) gives a session token, which every GET must carry (else 401);
  `meta-data/spot/instance-action` is 404 until the notice, then
  `{"action": "terminate", "time": "<ISO 8601>"}`;
  `meta-data/events/recommendations/rebalance` is 404 until a rebalance
  recommendation, then `{"noticeTime": "<ISO 8601>"}`.

Sources: cloud.google.com/compute/docs/metadata/querying-metadata (wait_for_change,
ETags), cloud.google.com/compute/docs/instances/spot#preemption-process;
docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html,
rebalance-recommendations.html, configuring-instance-metadata-service.html.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime

from aiohttp import web

log = logging.getLogger("spotbag.drivers.local")

IMDS_TOKEN_MAX_TTL_S = 21600
GCE_WAIT_MAX_S = 3600.0


def iso(epoch_s: float) -> str:
    """An instant as the clouds write it: UTC, seconds, a Z."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataServer:
    """Per-VM answers by source address (`vm_at`: address on the bridge -> VM id)."""

    def __init__(self, vm_at: Callable[[str], str | None]) -> None:
        self._vm_at = vm_at
        self._notices: dict[str, float] = {}  # VM id -> when the cloud takes it (epoch s)
        self._rebalances: dict[str, float] = {}  # VM id -> when recommended (epoch s)
        self._tokens: dict[str, tuple[str, float]] = {}  # IMDSv2 token -> (VM id, expiry)
        self._changed = asyncio.Event()  # set, and replaced, at every change
        self._runner: web.AppRunner | None = None
        self.url = ""  # http://address:port once started

    # --- what the cloud decides ------------------------------------------------------

    def notice(self, vm_id: str, ends_by: float) -> None:
        """The VM will be taken by `ends_by`: its metadata says so from now on."""
        self._notices[vm_id] = ends_by
        self._tell()

    def rebalance(self, vm_id: str, at: float) -> None:
        """EC2's rebalance recommendation: the VM is at elevated risk (not taken)."""
        self._rebalances.setdefault(vm_id, at)
        self._tell()

    def forget(self, vm_id: str) -> None:
        """The VM is gone."""
        self._notices.pop(vm_id, None)
        self._rebalances.pop(vm_id, None)

    def _tell(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- serving ---------------------------------------------------------------------

    async def start(self, host: str, port: int = 0) -> str:
        """Serve on host:port (0: a free port, or the port given if it is free); the URL."""
        app = web.Application()
        app.router.add_get("/computeMetadata/v1/instance/preempted", self._gce_preempted)
        app.router.add_put("/latest/api/token", self._imds_token)
        app.router.add_get("/latest/meta-data/spot/instance-action", self._imds_action)
        app.router.add_get(
            "/latest/meta-data/events/recommendations/rebalance", self._imds_rebalance
        )
        # Waits (wait_for_change) are cut at close: no answer is owed to a VM whose
        # cloud stops serving it.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError:
            if not port:
                raise
            site = web.TCPSite(self._runner, host, 0)  # taken: any other
            await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{host}:{bound}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _caller(self, request: web.Request) -> str:
        vm_id = self._vm_at(request.remote or "")
        if vm_id is None:  # a cloud's server answers its own VMs only
            raise web.HTTPForbidden(text="not a VM of this cloud")
        return vm_id

    # GCE ---------------------------------------------------------------------------

    def _preempted(self, vm_id: str) -> str:
        return "TRUE" if vm_id in self._notices else "FALSE"

    async def _gce_preempted(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            raise web.HTTPForbidden(text="Missing Metadata-Flavor:Google header.")
        vm_id = self._caller(request)
        if request.query.get("wait_for_change") == "true":
            try:
                timeout_s = min(float(request.query.get("timeout_sec", GCE_WAIT_MAX_S)), 3600)
            except ValueError:
                raise web.HTTPBadRequest(text="timeout_sec must be a number") from None
            last = request.query.get("last_etag") or _etag(self._preempted(vm_id))
            deadline = time.monotonic() + max(0.0, timeout_s)
            while _etag(self._preempted(vm_id)) == last:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
        value = self._preempted(vm_id)
        return web.Response(
            text=value,
            content_type="application/text",
            headers={"ETag": _etag(value), "Metadata-Flavor": "Google"},
        )

    # EC2 IMDSv2 ----------------------------------------------------------------------

    async def _imds_token(self, request: web.Request) -> web.Response:
        vm_id = self._caller(request)
        try:
            ttl_s = int(request.headers["X-aws-ec2-metadata-token-ttl-seconds"])
        except (KeyError, ValueError):
            raise web.HTTPBadRequest() from None
        if not 1 <= ttl_s <= IMDS_TOKEN_MAX_TTL_S:
            raise web.HTTPBadRequest()
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (vm_id, time.monotonic() + ttl_s)
        return web.Response(
            text=token, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(ttl_s)}
        )

    def _imds_caller(self, request: web.Request) -> str:
        vm_id = self._caller(request)
        held = self._tokens.get(request.headers.get("X-aws-ec2-metadata-token", ""))
        if held is None or held[0] != vm_id or held[1] < time.monotonic():
            raise web.HTTPUnauthorized()
        return vm_id

    async def _imds_action(self, request: web.Request) -> web.Response:
        vm_id = self._imds_caller(request)
        if vm_id not in self._notices:
            raise web.HTTPNotFound()
        body = {"action": "terminate", "time": iso(self._notices[vm_id])}
        return web.Response(text=json.dumps(body), content_type="text/plain")

    async def _imds_rebalance(self, request: web.Request) -> web.Response:
        vm_id = self._imds_caller(request)
        if vm_id not in self._rebalances:
            raise web.HTTPNotFound()
        body = {"noticeTime": iso(self._rebalances[vm_id])}
        return web.Response(text=json.dumps(body), content_type="text/plain")


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]
