"""A mocked EC2 for the aws driver: moto's server on loopback, behind a small WSGI layer
that adds what moto lacks and what the tests inject.

moto (5.x) runs instances, tags, filters and terminations faithfully enough, but:
- it ignores ClientToken (every run_instances makes new instances), so this layer
  keeps EC2's documented idempotency: a repeated RunInstances with the same
  ClientToken and the same parameters answers with the first call's response; with
  other parameters it is IdempotentParameterMismatch;
- it answers describe_spot_price_history with one fixed price; `set_spot_prices`
  makes this layer serve a price history instead, paginated by MaxResults/NextToken;
- it has no failure modes: `fail_next`, `fail_calls_server_side`, `no_capacity_for`
  and `lose_next_responses` make calls fail as EC2 does (same codes, HTTP statuses
  and XML), including a call that succeeds but whose answer is lost.

Spot interruptions are made in moto's backend (same process): the instance ends
`terminated` with state reason Server.SpotInstanceTermination, as EC2 reports one.
The server's state lives in moto's process-wide backends; `close` resets it.
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

import boto3
import requests
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

from drivers.aws import AwsDriver, AwsSettings
from drivers.base import LaunchRequest, PriceSample, VmState, VmStatus, VmType

REGION = "us-east-1"
IMAGE_ID = "ami-0abcdef1234567890"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

# code -> HTTP status line, as EC2 answers them
STATUS_OF_CODE = {
    "RequestLimitExceeded": "503 Service Unavailable",
    "InternalError": "500 Internal Server Error",
    "InsufficientInstanceCapacity": "500 Internal Server Error",
    "MaxSpotInstanceCountExceeded": "400 Bad Request",
    "VcpuLimitExceeded": "400 Bad Request",
    "InvalidParameterValue": "400 Bad Request",
    "UnauthorizedOperation": "403 Forbidden",
}
LAUNCH_ONLY_CODES = frozenset(
    {"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded"}
)
CODE_OF_KIND = {
    "capacity": "InsufficientInstanceCapacity",
    "quota": "MaxSpotInstanceCountExceeded",
    "permanent": "InvalidParameterValue",
    "throttle": "RequestLimitExceeded",
}

logging.getLogger("werkzeug").setLevel(logging.ERROR)


def _error_response(start_response, code: str, message: str = "") -> list[bytes]:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message or code)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()
    status = STATUS_OF_CODE.get(code, "400 Bad Request")
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


class Ec2Layer:
    """WSGI middleware in front of moto: ClientToken idempotency, spot price history,
    injected failures, and a count of calls per action."""

    def __init__(self, app) -> None:
        self.app = app
        self.lock = threading.RLock()
        self.calls: collections.Counter[str] = collections.Counter()
        self._launches: dict[str, tuple[bytes, tuple[str, list, bytes]]] = {}
        self._fail_next: dict[str, collections.deque[str]] = collections.defaultdict(
            collections.deque
        )
        self._lose_next = 0
        self._fraction = 0.0
        self._fraction_codes: list[str] = []
        self._rng = random.Random(0)
        self._no_capacity: set[str] = set()
        self.spot_prices: list[PriceSample] | None = None
        # Interruption notices given (instance id -> when, epoch s), as the spot requests
        # of those instances report them (moto keeps no request for a RunInstances).
        self.notices: dict[str, float] = {}

    # --- configuration (from the test) ----------------------------------------------------

    def fail_next(self, action: str, code: str, n: int = 1) -> None:
        with self.lock:
            self._fail_next[action].extend([code] * n)

    def fail_fraction(self, fraction: float, codes: Sequence[str], seed: int = 0) -> None:
        with self.lock:
            self._fraction, self._fraction_codes = fraction, list(codes)
            self._rng = random.Random(seed)

    def no_capacity_for(self, instance_type: str) -> None:
        with self.lock:
            self._no_capacity.add(instance_type)

    def lose_next_responses(self, n: int = 1) -> None:
        with self.lock:
            self._lose_next += n

    # --- WSGI -----------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        params = {
            k: v[0] for k, v in urllib.parse.parse_qs(body.decode("utf-8", "replace")).items()
        }
        action = params.get("Action", "")
        if not action or environ.get("PATH_INFO", "/").startswith("/moto-api"):
            return self.app(environ, start_response)
        with self.lock:
            self.calls[action] += 1
            injected = self._injected(action, params)
        if injected:
            return _error_response(start_response, injected, f"{injected} (injected by the test)")
        if action == "DescribeSpotPriceHistory" and self.spot_prices is not None:
            return self._price_history(params, start_response)
        if action == "DescribeSpotInstanceRequests":
            return self._spot_requests(params, start_response)
        if action == "RunInstances" and params.get("ClientToken"):
            status, headers, payload = self._idempotent_launch(environ, params, body)
        else:
            status, headers, payload = self._through(environ)
        with self.lock:
            lose = self._lose_next > 0 and status.startswith("200")
            if lose:
                self._lose_next -= 1
        if lose:  # the call took effect; its answer never arrives
            return _error_response(start_response, "InternalError", "response lost (injected)")
        start_response(status, headers)
        return [payload]

    def _injected(self, action: str, params: dict[str, str]) -> str | None:
        queued = self._fail_next.get(action)
        if queued:
            return queued.popleft()
        if action == "RunInstances" and params.get("InstanceType") in self._no_capacity:
            return "InsufficientInstanceCapacity"
        if self._fraction and self._rng.random() < self._fraction:
            codes = [
                c
                for c in self._fraction_codes
                if action == "RunInstances" or c not in LAUNCH_ONLY_CODES
            ]
            if codes:
                return self._rng.choice(codes)
        return None

    def _through(self, environ) -> tuple[str, list, bytes]:
        captured: dict[str, Any] = {}

        def start(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        payload = b"".join(self.app(environ, start))
        return captured["status"], captured["headers"], payload

    def _idempotent_launch(self, environ, params, body: bytes) -> tuple[str, list, bytes]:
        """EC2's ClientToken: the same token and parameters return the first answer."""
        token = params["ClientToken"]
        with self.lock:  # serialises launches: two racing repeats still make one instance
            known = self._launches.get(token)
            if known is not None:
                first_body, response = known
                if first_body != body:
                    message = f"the ClientToken {token} was used with other parameters"
                    payload = b"".join(
                        _error_response(lambda *a: None, "IdempotentParameterMismatch", message)
                    )
                    return "400 Bad Request", [("Content-Type", "text/xml")], payload
                return response
            response = self._through(environ)
            if response[0].startswith("200"):
                self._launches[token] = (body, response)
            return response

    def _spot_requests(self, params: dict[str, str], start_response):
        """The spot requests of noticed instances, status marked-for-termination, as EC2
        lists them once it has issued an interruption notice (filters: instance-id,
        status-code)."""
        wanted: dict[str, set[str]] = {}
        for key, name in params.items():
            if key.startswith("Filter.") and key.endswith(".Name"):
                prefix = key.removesuffix("Name")
                wanted[name] = {v for k, v in params.items() if k.startswith(f"{prefix}Value.")}
        with self.lock:
            notices = dict(self.notices)
        rows = "".join(
            "<item>"
            f"<spotInstanceRequestId>sir-{instance_id.removeprefix('i-')[:8]}</spotInstanceRequestId>"
            "<state>active</state><type>one-time</type>"
            "<status><code>marked-for-termination</code>"
            f"<updateTime>{datetime.fromtimestamp(at, UTC).strftime('%Y-%m-%dT%H:%M:%S.000Z')}"
            "</updateTime><message>Your Spot Instance is marked for termination.</message>"
            "</status>"
            f"<instanceId>{escape(instance_id)}</instanceId>"
            "</item>"
            for instance_id, at in notices.items()
            if instance_id in wanted.get("instance-id", {instance_id})
            and "marked-for-termination" in wanted.get("status-code", {"marked-for-termination"})
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<DescribeSpotInstanceRequestsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>{uuid.uuid4()}</requestId>"
            f"<spotInstanceRequestSet>{rows}</spotInstanceRequestSet>"
            "</DescribeSpotInstanceRequestsResponse>"
        ).encode()
        start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def _price_history(self, params: dict[str, str], start_response):
        types = {v for k, v in params.items() if k.startswith("InstanceType.")}
        items = [p for p in self.spot_prices or () if not types or p.vm_type in types]
        page_size = int(params.get("MaxResults", 1000))
        start = int(params.get("NextToken", 0) or 0)
        page = items[start : start + page_size]
        rows = "".join(
            "<item>"
            f"<instanceType>{escape(p.vm_type)}</instanceType>"
            "<productDescription>Linux/UNIX</productDescription>"
            f"<spotPrice>{p.price_per_hour:.6f}</spotPrice>"
            f"<timestamp>{datetime.fromtimestamp(p.at, UTC).strftime('%Y-%m-%dT%H:%M:%S.000Z')}</timestamp>"
            f"<availabilityZone>{escape(p.zone)}</availabilityZone>"
            "</item>"
            for p in page
        )
        more = start + page_size < len(items)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>{uuid.uuid4()}</requestId>"
            f"<spotPriceHistorySet>{rows}</spotPriceHistorySet>"
            + (f"<nextToken>{start + page_size}</nextToken>" if more else "")
            + "</DescribeSpotPriceHistoryResponse>"
        ).encode()
        start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
        return [body]


class _LayeredMotoServer(ThreadedMotoServer):
    def _server_entry(self) -> None:
        self.layer = Ec2Layer(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, self.layer, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        # Polled every 50 ms, not 0.5 s: stop() waits for the poll, once per test.
        self._server.serve_forever(poll_interval=0.05)


class MotoCloud:
    """A moto EC2 server on a free loopback port, with the layer above."""

    def __init__(self, region: str = REGION, host: str = "127.0.0.1") -> None:
        self.region = region
        # VM hosts in network namespaces reach it at the bridge's address (its Secrets
        # Manager holds their munge key).
        self._server = _LayeredMotoServer(ip_address=host, port=0, verbose=False)
        self._interruptions: list[threading.Timer] = []  # notices' interruptions to come
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        self.layer: Ec2Layer = self._server.layer
        self.client = boto3.client(
            "ec2", region_name=region, endpoint_url=self.endpoint_url, **CREDENTIALS
        )

    # --- for the driver and the daemon ------------------------------------------------------

    def settings(self, controller_id: str, **overrides: Any) -> AwsSettings:
        values: dict[str, Any] = {
            "region": self.region,
            "controller_id": controller_id,
            "endpoint_url": self.endpoint_url,
            "image_id": IMAGE_ID,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
        }
        values.update(overrides)
        return AwsSettings(**values)

    def session(self) -> boto3.session.Session:
        return boto3.session.Session(region_name=self.region, **CREDENTIALS)

    def driver(self, types: Sequence[VmType], controller_id: str, **overrides: Any) -> AwsDriver:
        price_source = overrides.pop("price_source", None)
        return AwsDriver(
            types,
            self.settings(controller_id, **overrides),
            session=self.session(),
            price_source=price_source,
        )

    def env(self) -> dict[str, str]:
        """Environment for a process whose boto3 should find these dummy credentials."""
        return {
            "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    # --- what the cloud does ------------------------------------------------------------------

    def _instance(self, instance_id: str):
        return ec2_backends[DEFAULT_ACCOUNT_ID][self.region].get_instance(instance_id)

    def notice(self, instance_id: str, lead_s: float | None = 120.0) -> None:
        """An interruption notice, as EC2 gives one two minutes ahead: the instance's spot
        request is marked for termination now, and the instance is interrupted `lead_s`
        later (a timer thread; None: never, a notice not followed by an interruption)."""
        with self.layer.lock:
            self.layer.notices[instance_id] = time.time()
        if lead_s is None:
            return
        timer = threading.Timer(lead_s, self.interrupt, args=(instance_id,))
        timer.daemon = True
        self._interruptions.append(timer)
        timer.start()

    def interrupt(self, instance_id: str) -> None:
        """A Spot interruption: EC2 terminates the instance and says why."""
        instance = self._instance(instance_id)
        instance.terminate()
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        instance._reason = f"Service initiated ({stamp} GMT)"
        instance.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination",
            "Server.SpotInstanceTermination",
        )

    def live_instances(self) -> list[str]:
        pages = self.client.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        )
        return [
            i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]
        ]

    def tags_of(self, instance_id: str) -> dict[str, str]:
        reservations = self.client.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return {t["Key"]: t["Value"] for t in reservations[0]["Instances"][0].get("Tags", ())}

    def fail_next(self, action: str, code: str, n: int = 1) -> None:
        self.layer.fail_next(action, code, n)

    def fail_calls_server_side(self, fraction: float, codes: Iterable[str], seed: int = 0) -> None:
        """Every EC2 call fails with probability `fraction`, with one of `codes` (capacity
        and quota codes only on RunInstances)."""
        self.layer.fail_fraction(fraction, list(codes), seed)

    def no_capacity_for(self, instance_type: str) -> None:
        self.layer.no_capacity_for(instance_type)

    def set_spot_prices(self, samples: Sequence[PriceSample]) -> None:
        self.layer.spot_prices = list(samples)

    def close(self) -> None:
        for timer in self._interruptions:  # the cloud goes away with its instances
            timer.cancel()
        try:
            requests.post(f"{self.endpoint_url}/moto-api/reset", timeout=10)
        finally:
            self._server.stop()


class AwsHarness:
    """The contract suite's view of the aws driver on moto."""

    missing_id = "i-0000000000000dead"

    def __init__(self) -> None:
        self.cloud = MotoCloud()
        self.types = [
            VmType("m5.large", 2, 8.0, 0, 0.035, 0.096, f"{REGION}a"),
            VmType("m5.xlarge", 4, 16.0, 0, 0.07, 0.192, f"{REGION}a"),
        ]
        self.driver = self.cloud.driver(self.types, f"contract-{uuid.uuid4().hex[:8]}")

    async def wait_running(self, vm_id: str, timeout_s: float = 10) -> VmStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = (await self.driver.describe([vm_id]))[vm_id]
            if status.state is VmState.RUNNING:
                return status
            await asyncio.sleep(0.02)
        raise TimeoutError(vm_id)

    def preempt(self, vm_id: str) -> None:
        self.cloud.interrupt(vm_id)

    async def foreign_vm(self) -> str:
        other = self.cloud.driver(self.types, "someone-else")
        return (await other.launch(LaunchRequest("someone-else", self.types[0]))).vm_id

    def fail_next(self, kind: str, n: int = 1) -> None:
        self.cloud.fail_next("RunInstances", CODE_OF_KIND[kind], n)

    def close(self) -> None:
        self.cloud.close()
