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
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from controller import __version__
from controller.config import NotifyConfig
from controller.slurm.callbacks import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from controller.store import Store, StoreClosed, StoreUnavailable
from controller.store.events import DeliveryTry

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
    """POSTs due deliveries, records each attempt (see the module docstring).

    Under load it keeps `concurrency` POSTs in flight, fetching more as soon as one
    ends (not at the next poll), and records their results together: one transaction
    for all the attempts that ended meanwhile, not one (and one fsync) each. A delivery
    is `busy` from its dispatch until its result is written, so it is never sent twice
    by one daemon (a restart may send again one that was in flight: hence the id).
    """

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
        self._busy: set[int] = set()  # delivery ids dispatched and not yet recorded
        self._posts: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._tries: list[DeliveryTry] = []  # ended attempts, to record
        self._tried = asyncio.Event()

    def wake(self) -> None:
        """An event was raised: look for due deliveries soon."""
        self._wake.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        recorder = asyncio.create_task(self._record_tries(), name="notify-recorder")
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                while True:
                    try:
                        more = await self._send_due(session)
                    except StoreUnavailable as exc:  # the disk: try again at the next poll
                        log.warning("cannot read the deliveries due: %s", exc)
                        more = False
                    except StoreClosed:  # the daemon stops
                        raise
                    except Exception:  # a bug or a bad row must not end every delivery
                        log.exception("looking for the deliveries due failed; again later")
                        more = False
                    if more:  # a full page: fetch again as soon as a POST ends
                        await asyncio.wait(
                            set(self._posts) or {recorder},
                            timeout=self.settings.poll_interval_s,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                        continue
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
                    if self._wake.is_set():
                        self._wake.clear()
                        await asyncio.sleep(WAKE_DELAY_S)
            finally:
                for task in (*self._posts, recorder):
                    task.cancel()
                await asyncio.gather(*self._posts, recorder, return_exceptions=True)
                if self._tries:  # what ended before the stop is still recorded
                    with contextlib.suppress(Exception):
                        await self.store.deliveries_tried(self._tries)

    async def _send_due(self, session: aiohttp.ClientSession) -> bool:
        """Dispatch the due deliveries not busy; whether there may be more."""
        page = self.settings.concurrency * 4
        due = await self.store.due_deliveries(self.now(), page + len(self._busy))
        fresh = [d for d in due if d["delivery_id"] not in self._busy]
        for delivery in fresh[:page]:
            self._busy.add(delivery["delivery_id"])
            task = asyncio.create_task(self._deliver(session, delivery), name="notify-post")
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)
        return len(fresh) >= page

    async def _record_tries(self) -> None:
        while True:
            await self._tried.wait()
            self._tried.clear()
            tries, self._tries = self._tries, []
            try:
                await self.store.deliveries_tried(tries)
            except Exception as exc:  # the disk, or a store closing: never stop recording
                # Left pending as they were: sent again later, the same ids (receivers
                # de-duplicate).
                log.warning("cannot record %d delivery attempts: %s", len(tries), exc)
            finally:
                self._busy.difference_update(t.delivery_id for t in tries)

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
                error = f"{type(exc).__name__}: {exc}"[:500]
            self._tried_once(delivery, attempt, status, error, time.perf_counter() - started)

    def _tried_once(
        self,
        delivery: dict[str, Any],
        attempt: int,
        status: int | None,
        error: str,
        duration_s: float,
    ) -> None:
        """The delivery's state after this attempt, queued for the recorder."""
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
        self._tries.append(
            DeliveryTry(delivery["delivery_id"], now, status, error, duration_s, state, next_try_at)
        )
        self._tried.set()
