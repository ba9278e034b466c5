"""The delivery worker (docs/notifications.md#delivery): an asyncio task of the daemon
that POSTs due deliveries to their webhooks, never on the scheduler's path.

Each POST carries the event as JSON and:

- `X-Spotbag-Timestamp` (epoch seconds) and `X-Spotbag-Signature: sha256=<HMAC-SHA256(
  secret, timestamp + "." + body)>`: the scheme of the Slurm hooks' callbacks, by the
  same function (controller/slurm/callbacks.py, `signature`; a receiver checks it with
  `verify`), keyed by the notify secret (`[notify] secret_file`);
- `X-Spotbag-Event-Id` (and `Idempotency-Key`, the same value): the event's id, the
  same on every attempt and to every webhook, so a receiver de-duplicates;
- `X-Spotbag-Event` (the kind) and `X-Spotbag-Delivery-Attempt` (1, 2, ...).

A 2xx answer delivers it. Anything else (another status, a refused connection, no
answer within `[notify] timeout_s`) is retried after backoff_s × 2^(n-1) seconds (n: the
attempts made), at most `max_backoff_s`, until `max_attempts` have failed (the
delivery is then `failed`). Every attempt is recorded (delivery_attempts) with its
status or error. Deliveries are rows in the store: one pending when the daemon stops
is sent after its next start (perhaps again, if it was in flight: hence the id).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from controller import __version__
from controller.config import NotifyConfig
from controller.slurm.callbacks import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from controller.store import Store, StoreUnavailable

log = logging.getLogger("spotbag.notify")

EVENT_ID_HEADER = "X-Spotbag-Event-Id"
EVENT_KIND_HEADER = "X-Spotbag-Event"
ATTEMPT_HEADER = "X-Spotbag-Delivery-Attempt"
# A receiver's answer is not used: read at most this much of it (the connection is then
# reusable) and keep its start with a failure.
MAX_ANSWER_BYTES = 64 * 1024
# An event is written with the scheduler's batch just after it is raised: when woken,
# look for it once that write had time to land (else the next poll finds it).
WAKE_DELAY_S = 0.05


def retry_delay_s(attempts: int, base_s: float, cap_s: float) -> float:
    """Wait after `attempts` failed attempts: base_s × 2^(attempts-1), at most cap_s."""
    return min(cap_s, base_s * 2.0 ** max(0, attempts - 1))


def event_body(delivery: dict[str, Any]) -> bytes:
    """The JSON POSTed: the event (its payload decoded)."""
    return json.dumps(
        {
            "id": delivery["id"],
            "kind": delivery["kind"],
            "created_at": delivery["created_at"],
            "bag_id": delivery["bag_id"],
            "account": delivery["account"],
            "payload": json.loads(delivery["payload"]),
        },
        separators=(",", ":"),
    ).encode()


class Deliverer:
    """POSTs due deliveries, records each attempt (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        settings: NotifyConfig,
        secret: bytes,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.secret = secret
        self.now = now
        self._wake = asyncio.Event()
        self._in_flight: dict[int, asyncio.Task[None]] = {}  # delivery id -> its POST
        self._slots = asyncio.Semaphore(settings.concurrency)

    def wake(self) -> None:
        """An event was raised: look for due deliveries soon."""
        self._wake.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                while True:
                    try:
                        await self._send_due(session)
                    except StoreUnavailable as exc:  # the disk: try again at the next poll
                        log.warning("cannot read the deliveries due: %s", exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
                    if self._wake.is_set():
                        self._wake.clear()
                        await asyncio.sleep(WAKE_DELAY_S)
            finally:
                for task in list(self._in_flight.values()):
                    task.cancel()
                await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def _send_due(self, session: aiohttp.ClientSession) -> None:
        due = await self.store.due_deliveries(self.now(), self.settings.concurrency * 4)
        for delivery in due:
            delivery_id = delivery["delivery_id"]
            if delivery_id in self._in_flight:
                continue
            task = asyncio.create_task(self._deliver(session, delivery), name="notify-delivery")
            self._in_flight[delivery_id] = task
            task.add_done_callback(functools.partial(self._done, delivery_id))

    def _done(self, delivery_id: int, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(delivery_id, None)

    async def _deliver(self, session: aiohttp.ClientSession, delivery: dict[str, Any]) -> None:
        async with self._slots:
            attempt = delivery["attempts"] + 1
            body = event_body(delivery)
            timestamp = str(int(self.now()))
            headers = {
                "Content-Type": "application/json",
                "User-Agent": f"spotbag/{__version__}",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: signature(self.secret, timestamp, body),
                EVENT_ID_HEADER: delivery["id"],
                "Idempotency-Key": delivery["id"],
                EVENT_KIND_HEADER: delivery["kind"],
                ATTEMPT_HEADER: str(attempt),
            }
            started = time.perf_counter()
            status: int | None = None
            error = ""
            try:
                async with session.post(
                    delivery["url"], data=body, headers=headers, allow_redirects=False
                ) as answer:
                    status = answer.status
                    text = await answer.content.read(MAX_ANSWER_BYTES)
                    if not 200 <= status < 300:
                        error = f"HTTP {status}: {text[:200].decode('utf-8', 'replace')}"
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
            await self._record(delivery, attempt, status, error, time.perf_counter() - started)

    async def _record(
        self,
        delivery: dict[str, Any],
        attempt: int,
        status: int | None,
        error: str,
        duration_s: float,
    ) -> None:
        now = self.now()
        settings = self.settings
        if status is not None and 200 <= status < 300:
            state, next_try_at = "delivered", now
        elif attempt >= settings.max_attempts:
            state, next_try_at = "failed", now
            log.warning(
                "event %s (%s) to %s given up after %d attempts: %s",
                delivery["id"],
                delivery["kind"],
                delivery["url"],
                attempt,
                error,
            )
        else:
            state = "pending"
            next_try_at = now + retry_delay_s(attempt, settings.backoff_s, settings.max_backoff_s)
        try:
            await self.store.delivery_tried(
                delivery["delivery_id"],
                at=now,
                status=status,
                error=error,
                duration_s=duration_s,
                state=state,
                next_try_at=next_try_at,
            )
        except StoreUnavailable as exc:
            # Left pending as it was: sent again later, the same id (receivers de-duplicate).
            log.warning("cannot record a delivery of event %s: %s", delivery["id"], exc)
