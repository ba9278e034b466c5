"""Webhooks and budgets end to end: a real daemon (`spotbag serve`, local driver), its HTTP
API and CLI, and a real aiohttp receiver in the test. The receiver gets signed events
(checked with the Slurm callbacks' own `verify`), fails twice and gets the event on the
third try after growing waits, and tells duplicates by their id; a bag held by its
budget says why and goes on when the budget is raised; a restart keeps undelivered
events and budgets."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from controller.slurm.callbacks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from tests.conftest import wait_for_bag, wait_until
from tests.integration.test_cli import spotbag

pytestmark = pytest.mark.processes

FAST_NOTIFY = """
[notify]
backoff_s = 0.5
max_backoff_s = 4.0
poll_interval_s = 0.1
timeout_s = 5.0
"""


class Receiver:
    """A webhook receiver on its own thread and event loop: records every POST (when,
    headers, body) and answers 500 to the first `fail_first` POSTs of each event id."""

    def __init__(self, fail_first: int = 0, port: int = 0) -> None:
        self.fail_first = fail_first
        self.port = port
        self.posts: list[tuple[float, dict[str, str], bytes, int]] = []
        self.tries: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        event_id = request.headers["X-Spotbag-Event-Id"]
        self.tries[event_id] += 1
        status = 500 if self.tries[event_id] <= self.fail_first else 200
        self.posts.append((time.time(), dict(request.headers), body, status))
        return web.Response(status=status, text="ok" if status == 200 else "try again")

    def delivered(self) -> dict[str, dict]:
        """Event id -> the event of every POST answered 200."""
        return {h["X-Spotbag-Event-Id"]: json.loads(b) for _, h, b, s in self.posts if s == 200}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notify_daemon(make_daemon, **kwargs):
    daemon = make_daemon(**kwargs)
    with daemon.config_path.open("a") as f:
        f.write(FAST_NOTIFY)
    return daemon


def secret_of(state_dir: Path) -> bytes:
    return (state_dir / "notify.secret").read_bytes().strip()


def test_a_receiver_gets_signed_events_retried_with_back_off_and_tells_duplicates(make_daemon):
    daemon = notify_daemon(make_daemon)
    client = daemon.start()
    receiver = Receiver(fail_first=2).start()
    try:
        hook = {"url": receiver.url, "events": ["finished", "failed"]}
        ok = client.submit(
            {"account": "lab", "command": "true", "max_runtime_s": 60, "notify": [hook]}
        )
        bad = client.submit(
            {
                "account": "lab",
                "command": "exit 3",
                "max_runtime_s": 60,
                "max_attempts": 1,
                "notify": [hook],
            }
        )
        assert wait_for_bag(client, ok["id"])["state"] == "succeeded"
        assert wait_for_bag(client, bad["id"])["state"] == "failed"
        wait_until(lambda: len(receiver.delivered()) == 2, 60, 0.1, "both events delivered")
    finally:
        receiver.stop()
    secret = secret_of(daemon.state_dir)
    by_id: dict[str, list] = {}
    for at, headers, body, status in receiver.posts:
        # Signed as the Slurm hooks sign their callbacks; the same check accepts it.
        verify(secret, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], body, time.time(), 300)
        assert headers["Idempotency-Key"] == headers["X-Spotbag-Event-Id"]
        by_id.setdefault(headers["X-Spotbag-Event-Id"], []).append((at, headers, body, status))
    assert len(by_id) == 2  # two events, each POSTed three times under one id
    for posts in by_id.values():
        assert [p[3] for p in posts] == [500, 500, 200]
        assert [p[1]["X-Spotbag-Delivery-Attempt"] for p in posts] == ["1", "2", "3"]
        assert len({p[2] for p in posts}) == 1  # the same event every time
        first, second, third = (p[0] for p in posts)
        assert second - first >= 0.5 * 0.9 and third - second >= 1.0 * 0.9  # 0.5 s, then 1 s
    events = {e["bag_id"]: e for e in receiver.delivered().values()}
    assert events[ok["id"]]["kind"] == "finished"
    assert events[ok["id"]]["payload"]["state"] == "succeeded"
    assert events[bad["id"]]["kind"] == "failed"
    assert events[bad["id"]]["payload"]["failed_jobs"] == 1

    listed = client.events(bag=ok["id"])["events"]
    assert [e["kind"] for e in listed] == ["finished"]
    assert listed[0]["id"] == events[ok["id"]]["id"]
    delivery = listed[0]["deliveries"][0]
    assert (delivery["state"], delivery["attempts"], delivery["last_status"]) == (
        "delivered",
        3,
        200,
    )
    shown = spotbag("events", "--bag", ok["id"], state_dir=daemon.state_dir).stdout
    assert "finished" in shown and "delivered (3)" in shown and listed[0]["id"] in shown
    as_json = spotbag("events", "--kind", "failed", "--json", state_dir=daemon.state_dir).stdout
    assert [json.loads(line)["bag_id"] for line in as_json.splitlines()] == [bad["id"]]


def test_a_budget_holds_a_bag_that_says_why_and_goes_on_when_raised(make_daemon):
    # One real second is a model hour: a job takes half of a local-2 VM ($0.02/h), so each
    # second it runs costs $0.01, and an attempt reserves its max_runtime_s of 10: $0.10.
    daemon = notify_daemon(make_daemon, time_scale=3600.0)
    client = daemon.start()
    spec = {
        "account": "lab",
        "command": "sleep 1",
        "parameters": {"i": list(range(8))},
        "max_runtime_s": 10,
        "resources": {"cpus": 1, "memory_gb": 1.0},
        "budget_usd": 0.15,
    }
    bag = client.submit(spec)
    assert bag["options"]["budget_usd"] == 0.15 and bag["options"]["on_demand"] == "never"

    def held_and_idle() -> dict | None:
        view = client.bag(bag["id"])
        stopped = view["budget"]["held"] and view["counts"]["running"] == 0
        return view if stopped and view["counts"]["queued"] else None

    view = wait_until(held_and_idle, 90, 0.2, "the budget to hold the bag")
    assert isinstance(view, dict)
    budget = view["budget"]
    assert budget["held"].startswith("held: budget: bag ")
    assert budget["charged_usd"] + budget["reserved_usd"] <= 0.15 + 1e-9
    assert budget["charged_usd"] + 0.10 > 0.15  # the next attempt would pass it
    assert 0 < view["counts"]["succeeded"] < 8
    waiting = client.jobs(bag["id"], state="queued")["jobs"][0]["waiting"]
    assert waiting.startswith("held: budget: bag ") and "spotbag bags set" in waiting
    status = spotbag("status", bag["id"], state_dir=daemon.state_dir).stdout
    assert "held: budget" in status and "budget " in status
    reached = client.events(bag=bag["id"], kind="budget_reached")["events"]
    assert len(reached) == 1 and reached[0]["payload"]["held"].startswith("held: budget")

    shown = spotbag("bags", "set", bag["id"], "--budget", "5", state_dir=daemon.state_dir)
    assert "budget $5.00" in shown.stdout
    done = wait_for_bag(client, bag["id"], 90)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 8
    assert done["budget"]["charged_usd"] <= 5.0 and done["budget"]["reserved_usd"] == 0.0
    kinds = [e["kind"] for e in client.events(bag=bag["id"])["events"]]
    assert kinds == ["budget_reached", "finished"]


def test_a_restart_keeps_undelivered_events_and_budgets(make_daemon):
    daemon = notify_daemon(make_daemon)
    client = daemon.start()
    port = free_port()  # nothing listens there yet: every POST is refused
    spotbag(
        "accounts", "create", "lab", "--unlimited", "--budget-usd", "7", state_dir=daemon.state_dir
    )
    bag = client.submit(
        {
            "account": "lab",
            "command": "true",
            "max_runtime_s": 7200,  # half a local-2 VM for 2 h: $0.02 reserved
            "budget_usd": 0.01,  # less than one attempt: held at once
            "notify": [{"url": f"http://127.0.0.1:{port}/hook"}],
        }
    )

    def tried() -> list:
        events = client.events(bag=bag["id"])["events"]
        return [e for e in events if e["deliveries"][0]["attempts"] >= 1]

    (event,) = wait_until(tried, 30, 0.1, "a refused delivery")
    assert event["kind"] == "budget_reached" and event["deliveries"][0]["state"] == "pending"
    assert event["deliveries"][0]["last_status"] is None  # refused: no answer
    assert daemon.stop() == 0

    receiver = Receiver(port=port).start()
    try:
        client = daemon.start()
        wait_until(lambda: event["id"] in receiver.delivered(), 30, 0.1, "delivery after restart")
        assert client.account("lab")["budget"]["budget_usd"] == 7.0
        view = client.bag(bag["id"])
        assert view["options"]["budget_usd"] == 0.01
        assert view["budget"]["held"].startswith("held: budget") and view["counts"]["queued"] == 1
        assert receiver.delivered()[event["id"]]["kind"] == "budget_reached"
        # The undelivered event was sent once more after the restart, with the same id.
        assert event["id"] in receiver.tries

        client.request("PATCH", f"/v1/bags/{bag['id']}", body={"budget_usd": 1.0})
        assert wait_for_bag(client, bag["id"])["state"] == "succeeded"
        wait_until(lambda: len(receiver.delivered()) == 2, 30, 0.1, "the finished event")
    finally:
        receiver.stop()
    kinds = sorted(e["kind"] for e in receiver.delivered().values())
    assert kinds == ["budget_reached", "finished"]


def test_an_accounts_webhook_named_on_the_command_line_gets_its_bags_events(make_daemon):
    """`spotbag accounts create --notify URL=finished`: the account's webhook receives its
    bags' finished events, signed, and nothing else; it is kept across a restart, and
    `accounts set --no-notify` removes it."""
    daemon = notify_daemon(make_daemon)
    client = daemon.start()
    receiver = Receiver().start()
    try:
        shown = spotbag(
            "accounts",
            "create",
            "lab",
            "--unlimited",
            "--notify",
            f"{receiver.url}=finished",
            state_dir=daemon.state_dir,
        )
        assert f"webhook {receiver.url}: finished" in shown.stdout
        wrong = spotbag(
            "accounts", "set", "lab", "--notify", "http://x/=exploded",
            state_dir=daemon.state_dir, check=False,
        )  # fmt: skip
        assert wrong.returncode != 0 and "exploded: not an event kind" in wrong.stderr
        assert daemon.stop() == 0
        client = daemon.start()
        assert client.account("lab")["notify"] == [{"url": receiver.url, "events": ["finished"]}]
        bag = client.submit({"account": "lab", "command": "true", "max_runtime_s": 60})
        assert wait_for_bag(client, bag["id"])["state"] == "succeeded"
        (event,) = wait_until(lambda: list(receiver.delivered().values()), 30, 0.1, "the event")
        assert (event["kind"], event["bag_id"], event["account"]) == ("finished", bag["id"], "lab")
        _, headers, body, _ = receiver.posts[0]
        secret = secret_of(daemon.state_dir)  # signed as every event is (raises if not)
        verify(secret, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], body, time.time(), 300)
        removed = spotbag("accounts", "set", "lab", "--no-notify", state_dir=daemon.state_dir)
        assert "webhook" not in removed.stdout
        assert client.account("lab")["notify"] == []
    finally:
        receiver.stop()
