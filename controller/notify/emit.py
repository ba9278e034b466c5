"""Raising events (docs/notifications.md#kinds): `Notices` records an event in the
write batch of the change that raised it (so an event is never lost nor raised for a
change that was not written), with one pending delivery per webhook that asked for its
kind: the bag's own (`notify` in its spec), its account's (`notify` of the account:
POST/PATCH /v1/accounts) and the operator's (`[notify] webhooks`).

Kinds and who raises them: `finished` and `failed` when a bag ends (cancelled bags
are `finished` with their state in the payload), `budget_reached` when a budget holds
a bag (controller/budgets.py), `preemption_storm` when at least
`[notify] storm_preemptions` VMs were preempted within `storm_window_s` (raised once
per storm: again only after the count has fallen below the threshold), and
`deadline_at_risk` by the deadline integration (`deadline_at_risk`).
"""

from __future__ import annotations

import json
import secrets
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from controller.config import NotifyConfig
from controller.store.batch import EventRecord, WriteBatch

if TYPE_CHECKING:  # the scheduler's records (it imports this module)
    from controller.scheduler.runs import BagRun


def new_event_id() -> str:
    """An event's id: unique, sent as X-Spotbag-Event-Id for receivers to de-duplicate."""
    return "ev_" + secrets.token_hex(10)


def _wants(events: Iterable[str], kind: str) -> bool:
    events = tuple(events)
    return not events or kind in events


class StormDetector:
    """At least `threshold` preemptions within `window_s`: a storm, reported once, and
    again only after the count in the window has fallen below the threshold."""

    def __init__(self, threshold: int, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self.times: deque[float] = deque()
        self.raised = False

    def preempted(self, at: float) -> int | None:
        """Note a preemption; the count in the window when a storm starts, else None."""
        self.times.append(at)
        while self.times and self.times[0] < at - self.window_s:
            self.times.popleft()
        count = len(self.times)
        if count < self.threshold:
            self.raised = False
            return None
        if self.raised:
            return None
        self.raised = True
        return count


class Notices:
    """Events into the pass's batch, each with its deliveries (see the module docstring)."""

    def __init__(
        self,
        settings: NotifyConfig | None = None,
        *,
        new_id: Callable[[], str] = new_event_id,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings or NotifyConfig()
        self.new_id = new_id
        self.wake = wake  # the delivery worker: an event is due
        self.storm = StormDetector(self.settings.storm_preemptions, self.settings.storm_window_s)
        # account -> its webhooks, (url, kinds) each (the store's accounts.notify)
        self.account_webhooks: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {}

    def set_account_webhooks(self, account: str, webhooks: Iterable[dict[str, Any]]) -> None:
        """The webhooks an account names ([{url, events}]; none: forget them)."""
        hooks = tuple((w["url"], tuple(w.get("events") or ())) for w in webhooks)
        if hooks:
            self.account_webhooks[account] = hooks
        else:
            self.account_webhooks.pop(account, None)

    def urls_for(
        self, kind: str, bags: Iterable[BagRun] = (), accounts: Iterable[str] = ()
    ) -> tuple[str, ...]:
        """The webhooks that want `kind`: the operator's, those of `bags`, and those of
        their accounts and of `accounts`."""
        bags = list(bags)
        urls = [w.url for w in self.settings.webhooks if _wants(w.events, kind)]
        for bag in bags:
            urls += [w.url for w in bag.spec.notify if _wants(w.events, kind)]
        for account in dict.fromkeys([*(bag.spec.account for bag in bags), *accounts]):
            urls += [
                url for url, kinds in self.account_webhooks.get(account, ()) if _wants(kinds, kind)
            ]
        return tuple(dict.fromkeys(urls))  # each URL once, in order

    def emit(
        self,
        batch: WriteBatch,
        kind: str,
        at: float,
        payload: dict[str, Any],
        *,
        bag: BagRun | None = None,
        account: str | None = None,
        bags: Iterable[BagRun] = (),
    ) -> EventRecord:
        """Record an event of `kind` in `batch` (written with the change that raised it)."""
        subscribers = [bag] if bag is not None else list(bags)
        record = EventRecord(
            id=self.new_id(),
            created_at=at,
            kind=kind,
            bag_id=bag.id if bag is not None else None,
            account=bag.spec.account if bag is not None else account,
            payload=json.dumps(payload, separators=(",", ":"), sort_keys=True),
            urls=self.urls_for(kind, subscribers, [account] if account else ()),
        )
        batch.event(record)
        if record.urls:
            self.wake()
        return record

    # --- the kinds ----------------------------------------------------------------------

    def bag_ended(self, bag: BagRun, state: str, at: float, batch: WriteBatch) -> None:
        kind = "failed" if state == "failed" else "finished"
        self.emit(
            batch,
            kind,
            at,
            {
                "bag_id": bag.id,
                "name": bag.spec.name,
                "state": state,
                "failed_jobs": bag.failed_jobs,
                "cancelled_jobs": bag.cancelled_jobs,
            },
            bag=bag,
        )

    def budget_reached(self, bag: BagRun, why: str, at: float, batch: WriteBatch) -> None:
        self.emit(
            batch,
            "budget_reached",
            at,
            {"bag_id": bag.id, "name": bag.spec.name, "held": f"held: budget: {why}"},
            bag=bag,
        )

    def deadline_at_risk(
        self, bag: BagRun, at: float, batch: WriteBatch, detail: dict[str, Any]
    ) -> None:
        """For the deadline policy's integration: the bag may miss its deadline
        (`detail`: the projected finish, its spread, the deadline, ...)."""
        self.emit(
            batch,
            "deadline_at_risk",
            at,
            {"bag_id": bag.id, "name": bag.spec.name, **detail},
            bag=bag,
        )

    def preempted(
        self, vm_id: str, vm_type: str, at: float, batch: WriteBatch, bags: Iterable[BagRun]
    ) -> None:
        """A VM was preempted: a storm starts when enough were within the window; the
        event goes to the operator and to every open bag that asked for storms."""
        count = self.storm.preempted(at)
        if count is None:
            return
        self.emit(
            batch,
            "preemption_storm",
            at,
            {
                "preemptions": count,
                "window_s": self.settings.storm_window_s,
                "threshold": self.settings.storm_preemptions,
                "last_vm": vm_id,
                "last_vm_type": vm_type,
            },
            bags=bags,
        )
