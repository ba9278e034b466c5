"""Every route of the HTTP API, in process: the daemon's own `Controller` with the sim
driver and the sim executor (a configuration users can run: `[driver] name = "sim"`,
`[executor] name = "sim"`), its real SQLite store in a temporary directory, and the
app `build_app` makes, served by aiohttp's test server on a real socket.

These run in `make test-fast`; tests/integration/ drives the same API through a daemon
subprocess and the CLI, with real programs."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controller.api import ROUTES, build_app
from controller.config import load_config
from controller.daemon import Controller

TOKEN = "in-process-t0ken"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}

CONFIG = """
state_dir = "{state}"

[api]
host = "127.0.0.1"
port = 0
token = "{token}"
max_body_mb = 1

[scheduler]
max_vms = 4
idle_timeout_s = 30.0
poll_interval_s = 0.05

[driver]
name = "sim"
boot_delay_s = 0.05
seed = 3

[executor]
name = "sim"

[preemption]
model = "none"

[[vm_types]]
name = "sim-2"
cpus = 2
memory_gb = 4.0
spot_price_per_hour = 0.02
on_demand_price_per_hour = 0.08
zone = "sim-a"
"""


def bag(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "routes",
        "account": "lab",
        "command": "run {i}",
        "parameters": {"i": {"range": [0, 4, 1]}},
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "max_runtime_s": 60,
        "simulation": {"runtime_s": 1},
    }
    spec.update(changes)
    return spec


@dataclass
class Api:
    client: TestClient
    controller: Controller

    async def call(
        self, method: str, path: str, *, token: str | None = TOKEN, **kwargs: Any
    ) -> tuple[int, Any]:
        """(status, decoded JSON or text) of one request."""
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = await self.client.request(method, path, headers=headers, **kwargs)
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()

    async def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        got, body = await self.call(method, path, **kwargs)
        assert got == status, (method, path, got, body)
        return body

    async def wait_bag(self, bag_id: str, states: tuple[str, ...], timeout_s: float = 30) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            view = await self.ok("GET", f"/v1/bags/{bag_id}")
            if view["state"] in states:
                return view
            assert time.monotonic() < deadline, f"bag {bag_id} still {view['state']}: {view}"
            await asyncio.sleep(0.05)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    config_file = tmp_path / "spotbag.toml"
    config_file.write_text(CONFIG.format(state=tmp_path / "state", token=TOKEN))
    controller = Controller(load_config(config_file))
    await controller.start()
    client = TestClient(TestServer(build_app(controller)))
    await client.start_server()
    try:
        yield Api(client, controller)
    finally:
        await client.close()
        await controller.stop()


async def test_health_openapi_and_metrics(api: Api) -> None:
    health = await api.ok("GET", "/healthz", token=None)
    assert health["ok"] is True and health["driver"] == "sim"
    document = await api.ok("GET", "/openapi.json", token=None)
    for route in ROUTES:
        assert route.method.lower() in document["paths"][route.path], route.path
    await api.ok("GET", "/v1/bags")
    metrics = await api.ok("GET", "/metrics")
    assert "spotbag_http_requests_total{" in metrics and 'status="200"' in metrics


async def test_requests_without_the_token_are_refused(api: Api) -> None:
    for token in (None, "wrong"):
        status, body = await api.call("GET", "/v1/bags", token=token)
        assert status == 401 and body["error"]["code"] == "unauthorized", body
    response = await api.client.get("/v1/bags")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    status, _ = await api.call("POST", "/v1/bags/b0123456789/cancel", token=None)
    assert status == 401


async def test_accounts_are_created_credited_and_keep_a_ledger(api: Api) -> None:
    created = await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 10})
    assert created["account"] == "lab" and created["available_cpu_h"] == 10
    status, body = await api.call("POST", "/v1/accounts", json={"name": "lab", "cpu_hours": 1})
    assert status == 409 and body["error"]["code"] == "account_exists"
    status, body = await api.call("POST", "/v1/accounts", json={"name": "lab\n", "cpu_hours": 1})
    assert status == 400 and "name" in body["error"]["message"], body
    credited = await api.ok("POST", "/v1/accounts/lab/credit", json={"cpu_hours": 5.5})
    assert credited["allocation_cpu_h"] == 15.5
    listed = await api.ok("GET", "/v1/accounts")
    assert [a["account"] for a in listed["accounts"]] == ["lab"]
    assert (await api.ok("GET", "/v1/accounts/lab"))["available_cpu_h"] == 15.5
    ledger = await api.ok("GET", "/v1/accounts/lab/ledger")
    assert [e["kind"] for e in ledger["entries"]] == ["credit", "credit"]
    assert [e["cpu_h"] for e in ledger["entries"]] == [10, 5.5]
    as_csv = await api.ok("GET", "/v1/accounts/lab/ledger?format=csv")
    rows = list(csv.DictReader(io.StringIO(as_csv)))
    assert [float(r["cpu_hours"]) for r in rows] == [10, 5.5]
    status, body = await api.call("GET", "/v1/accounts/nobody")
    assert status == 404 and body["error"]["code"] == "unknown_account"
    status, body = await api.call("GET", "/v1/accounts/lab/ledger?format=xml")
    assert status == 400, body


async def test_account_tokens_see_their_own_account_only(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 10})
    await api.ok("POST", "/v1/accounts", 201, json={"name": "other", "cpu_hours": 10})
    issued = await api.ok("POST", "/v1/accounts/lab/tokens", 201, json={"note": "ci"})
    token, token_id = issued["token"], issued["id"]
    assert [t["id"] for t in (await api.ok("GET", "/v1/accounts/lab/tokens"))["tokens"]] == [
        token_id
    ]
    theirs = await api.ok("POST", "/v1/bags", 201, json=bag(), token=token)
    assert theirs["account"] == "lab"
    status, body = await api.call("POST", "/v1/bags", json=bag(account="other"), token=token)
    assert status == 403, body
    status, _ = await api.call("GET", "/v1/accounts/other", token=token)
    assert status == 403
    status, _ = await api.call("GET", "/v1/vms", token=token)  # admin only
    assert status == 403
    mine = await api.ok("GET", "/v1/accounts", token=token)
    assert [a["account"] for a in mine["accounts"]] == ["lab"]
    await api.ok("DELETE", f"/v1/accounts/lab/tokens/{token_id}")
    status, body = await api.call("DELETE", f"/v1/accounts/lab/tokens/{token_id}")
    assert status == 409, body
    status, _ = await api.call("GET", "/v1/bags", token=token)
    assert status == 401
    status, _ = await api.call("DELETE", "/v1/accounts/lab/tokens/nosuchtoken")
    assert status == 404


async def test_a_bag_runs_to_the_end_and_its_views_agree(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 100})
    submitted = await api.ok("POST", "/v1/bags", 201, json=bag())
    bag_id = submitted["id"]
    done = await api.wait_bag(bag_id, ("succeeded", "failed", "cancelled"))
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 4, done
    listed = await api.ok("GET", "/v1/bags")
    assert [b["id"] for b in listed["bags"]] == [bag_id]
    assert (await api.ok("GET", "/v1/bags?state=succeeded&account=lab"))["bags"]
    assert not (await api.ok("GET", "/v1/bags?state=active"))["bags"]
    jobs = await api.ok("GET", f"/v1/bags/{bag_id}/jobs")
    assert [j["state"] for j in jobs["jobs"]] == ["succeeded"] * 4
    picked = await api.ok("GET", f"/v1/bags/{bag_id}/jobs?param=i=2")
    assert [j["params"] for j in picked["jobs"]] == [{"i": 2}]
    job = await api.ok("GET", f"/v1/jobs/{bag_id}-2")
    assert job["state"] == "succeeded" and job["attempts"] == 1
    status, body = await api.call("GET", f"/v1/jobs/{bag_id}-2/log")
    assert status == 404 and "sim executor keeps no log" in body["error"]["message"]
    status, _ = await api.call("GET", f"/v1/jobs/{bag_id}-99")
    assert status == 404
    timeline = await api.ok("GET", f"/v1/bags/{bag_id}/timeline")
    assert len(timeline["attempts"]) == 4 and timeline["vms"]
    vms = await api.ok("GET", "/v1/vms?all=true")
    assert {v["id"] for v in vms["vms"]} == {a["vm_id"] for a in timeline["attempts"]}
    report = await api.ok("GET", f"/v1/reports?bag={bag_id}")
    assert report["totals"]["vm_h"] > 0 and report["totals"]["spot_cost_usd"] > 0
    as_csv = await api.ok("GET", f"/v1/reports?bag={bag_id}&format=csv")
    assert as_csv.splitlines()[0].count(",") > 3
    page = await api.ok("GET", "/v1/reports?account=lab&format=html")
    assert "<html" in page.lower() and bag_id in page
    # Charged for what ran: each attempt's run time at 1 CPU (the sim's 1 s, on a real clock).
    ran_s = 0.0
    for idx in range(4):
        (attempt,) = (await api.ok("GET", f"/v1/jobs/{bag_id}-{idx}"))["attempt_list"]
        assert 1.0 <= attempt["ended_at"] - attempt["ran_at"] < 5.0, attempt
        ran_s += attempt["ended_at"] - attempt["ran_at"]
    ledger = await api.ok("GET", "/v1/accounts/lab/ledger")
    charged_cpu_h = sum(e["cpu_h"] for e in ledger["entries"] if e["kind"] == "charge")
    assert charged_cpu_h == pytest.approx(ran_s / 3600, rel=1e-6)


async def test_malformed_and_impossible_bags_say_why(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 100})
    status, body = await api.call("POST", "/v1/bags", json=bag(resources={"cpus": 0}))
    assert status == 400 and body["error"]["detail"]["errors"][0]["field"] == "resources.cpus"
    status, body = await api.call("POST", "/v1/bags", data=b"{not json")
    assert status == 400, body
    status, body = await api.call("POST", "/v1/bags", json=bag(resources={"cpus": 64}))
    assert status == 422, body
    status, body = await api.call("POST", "/v1/bags", json=bag(max_runtime_s=1e-300))
    assert status == 400 and "max_runtime_s" in body["error"]["message"], body
    status, body = await api.call(
        "POST", "/v1/bags", json=bag(max_runtime_s=10**9, on_insufficient_balance="reject")
    )
    assert status in (400, 402, 422), body
    status, body = await api.call(
        "POST", "/v1/bags", json=bag(), headers={"Idempotency-Key": "bad\tkey"}
    )
    assert status == 400 and "Idempotency-Key" in body["error"]["message"]
    assert (await api.ok("GET", "/v1/bags"))["bags"] == []  # nothing admitted half-way


async def test_an_idempotency_key_submits_once(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 100})
    key = {"Idempotency-Key": "run-42"}
    first = await api.ok("POST", "/v1/bags", 201, json=bag(), headers=key)
    again = await api.ok("POST", "/v1/bags", 200, json=bag(), headers=key)
    assert again["id"] == first["id"]
    status, body = await api.call("POST", "/v1/bags", json=bag(name="else"), headers=key)
    assert status == 409, body


async def test_a_cancelled_bag_ends_and_a_held_one_waits_for_credit(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 0.002})
    slow = bag(simulation={"runtime_s": 3600}, max_runtime_s=7200, parameters={"i": [1, 2]})
    slow["on_insufficient_balance"] = "hold"
    held = await api.ok("POST", "/v1/bags", 201, json=slow)
    view = await api.ok("GET", f"/v1/bags/{held['id']}")
    assert view["counts"]["held"] == 2, view
    cancelled = await api.ok("POST", f"/v1/bags/{held['id']}/cancel", 202)
    assert cancelled["id"] == held["id"]
    done = await api.wait_bag(held["id"], ("cancelled",))
    assert done["counts"]["cancelled"] == 2
    status, _ = await api.call("POST", "/v1/bags/b0123456789/cancel")
    assert status == 404


async def test_vms_models_and_an_injected_preemption(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 100})
    long = bag(simulation={"runtime_s": 3600}, max_runtime_s=7200, parameters={"i": [1]})
    submitted = await api.ok("POST", "/v1/bags", 201, json=long)

    async def running_vm() -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            vms = (await api.ok("GET", "/v1/vms?state=running"))["vms"]
            if vms and (await api.ok("GET", f"/v1/bags/{submitted['id']}"))["counts"]["running"]:
                return vms[0]
            await asyncio.sleep(0.05)
        raise AssertionError("no running VM")

    vm = await running_vm()
    models = await api.ok("GET", "/v1/models")
    assert "configured" in models and "in_use" in models
    # Before its launch's answer is recorded a VM has no provider id: not preemptible
    # yet, and not "not alive" either (a job may run on it already).
    tracked = api.controller.running_scheduler.world.vms[vm["id"]]
    provider_id, tracked.provider_id = tracked.provider_id, ""
    status, body = await api.call("POST", f"/v1/vms/{vm['id']}/preempt")
    tracked.provider_id = provider_id
    assert status == 409 and "still being launched" in body["error"]["message"], body
    assert (await api.ok("POST", f"/v1/vms/{vm['id']}/preempt", 202))["preempted"] is True
    status, _ = await api.call("POST", "/v1/vms/vm-nosuchvm/preempt")
    assert status == 404
    deadline = time.monotonic() + 30
    while True:
        job = await api.ok("GET", f"/v1/jobs/{submitted['id']}-0")
        if job["attempts"] >= 2 and job["attempt_list"][0]["state"] != "running":
            break
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.05)
    assert "preempted" in job["attempt_list"][0]["reason"], job["attempt_list"][0]
    ended = await api.ok("GET", "/v1/vms?state=preempted")
    assert [v["id"] for v in ended["vms"]] == [vm["id"]]


async def test_market_routes_show_the_catalog_prices(api: Api) -> None:
    deadline = time.monotonic() + 30
    while not (hopping := await api.ok("GET", "/v1/hopping"))["market"]:
        assert time.monotonic() < deadline, "the hopper never priced the catalog"
        await asyncio.sleep(0.05)
    assert hopping["configured"]["enabled"] is True and hopping["migrations"] == []
    assert [m["vm_type"] for m in hopping["market"]] == ["sim-2"]
    assert hopping["market"][0]["price_now"] == 0.02
    prices = await api.ok("GET", "/v1/hopping/prices?limit=10")
    assert prices["enabled"] is True and prices["truncated"] is False
    status, body = await api.call("GET", "/v1/hopping?limit=0")
    assert status == 400, body


async def test_slurm_events_need_a_signature_and_the_slurm_executor(api: Api) -> None:
    status, body = await api.call("POST", "/v1/slurm/events", token=None, json={"kind": "x"})
    assert status == 401 and "X-Spotbag-Signature" in body["error"]["message"], body
    signed = {"X-Spotbag-Timestamp": str(int(time.time())), "X-Spotbag-Signature": "00" * 32}
    status, body = await api.call(
        "POST", "/v1/slurm/events", token=None, json={"kind": "x"}, headers=signed
    )
    assert status == 409 and "Slurm executor" in body["error"]["message"], body


async def test_http_errors_are_json_that_say_what_went_wrong(api: Api) -> None:
    status, body = await api.call("GET", "/v1/nothing-here")
    assert status == 404 and body["error"]["message"] == "no route GET /v1/nothing-here"
    response = await api.client.request("DELETE", "/v1/bags", headers=ADMIN)
    assert response.status == 405 and "POST" in response.headers["Allow"]
    assert (await response.json())["error"]["code"]
    too_big = b'{"name": "' + b"x" * (1 << 20) + b'"}'
    status, body = await api.call("POST", "/v1/bags", data=too_big)
    assert status == 413 and "too large" in body["error"]["message"], body


async def test_query_parameters_are_checked(api: Api) -> None:
    for path in (
        "/v1/bags?state=nope",
        "/v1/bags?limit=-1",
        "/v1/vms?state=nope",
        "/v1/reports",
        "/v1/reports?bag=b0123456789&account=lab",
        "/v1/bags/b0123456789/jobs?param=nonsense",
    ):
        status, body = await api.call("GET", path)
        assert status in (400, 404), (path, status, body)
    status, body = await api.call("GET", "/v1/reports?bag=b0123456789")
    assert status == 404, body


async def test_a_preemption_notice_drains_the_vm_then_it_is_preempted(api: Api) -> None:
    await api.ok("POST", "/v1/accounts", 201, json={"name": "lab", "cpu_hours": 100})
    long = bag(simulation={"runtime_s": 3600}, max_runtime_s=7200, parameters={"i": [1]})
    submitted = await api.ok("POST", "/v1/bags", 201, json=long)
    deadline = time.monotonic() + 30
    while not (await api.ok("GET", f"/v1/bags/{submitted['id']}"))["counts"]["running"]:
        assert time.monotonic() < deadline, "the job never ran"
        await asyncio.sleep(0.05)
    (vm,) = (await api.ok("GET", "/v1/vms?state=running"))["vms"]
    assert vm["notice_until"] is None
    asked = time.time()
    await api.ok("POST", f"/v1/vms/{vm['id']}/preempt?notice_s=2", 202)
    deadline = time.monotonic() + 10
    while True:  # the scheduler takes the notice at its next pass
        (noticed,) = [v for v in (await api.ok("GET", "/v1/vms"))["vms"] if v["id"] == vm["id"]]
        if noticed["notice_until"] is not None:
            break
        assert time.monotonic() < deadline, noticed
        await asyncio.sleep(0.02)
    assert asked + 1.5 <= noticed["notice_until"] <= time.time() + 2.5, noticed
    status, body = await api.call("POST", f"/v1/vms/{vm['id']}/preempt?notice_s=9999")
    assert status == 400 and "notice_s" in body["error"]["message"], body
    # Rebalance recommendations: only a VM's metadata server tells them (VM hosts).
    status, body = await api.call("POST", f"/v1/vms/{vm['id']}/rebalance")
    assert status == 409 and "metadata server" in body["error"]["message"], body
    status, body = await api.call("POST", "/v1/vms/vm-000000000000/rebalance")
    assert status == 404, body
    deadline = time.monotonic() + 30
    while (await api.ok("GET", f"/v1/jobs/{submitted['id']}-0"))["attempts"] < 2:
        assert time.monotonic() < deadline, "no retry after the preemption"
        await asyncio.sleep(0.05)
    (ended,) = (await api.ok("GET", "/v1/vms?state=preempted"))["vms"]
    assert ended["id"] == vm["id"] and ended["ended_at"] >= noticed["notice_until"] - 0.1


async def test_budgets_hold_a_bag_until_raised_and_events_tell_its_story(api: Api) -> None:
    created = await api.ok(
        "POST", "/v1/accounts", 201, json={"name": "lab", "unlimited": True, "budget_usd": 50.0}
    )
    assert created["budget"]["budget_usd"] == 50.0 and created["budget"]["month_charged_usd"] == 0
    changed = await api.ok("PATCH", "/v1/accounts/lab", json={"budget_usd": 60.0})
    assert changed["budget"]["budget_usd"] == 60.0
    status, body = await api.call("PATCH", "/v1/accounts/lab", json={"budget_usd": -1})
    assert status == 400 and body["error"]["message"].startswith("budget_usd: "), body
    status, _ = await api.call("PATCH", "/v1/accounts/nobody", json={"budget_usd": 1.0})
    assert status == 404
    # Half a sim-2 VM ($0.02/h) for max_runtime_s of 2 h reserves $0.02: past $0.01.
    spec = bag(parameters={"i": [1, 2]}, max_runtime_s=7200, budget_usd=0.01)
    submitted = await api.ok("POST", "/v1/bags", 201, json=spec)
    bag_id = submitted["id"]
    assert submitted["options"] == {
        "deadline": None,
        "deadline_at": None,
        "on_demand": "never",
        "deadline_confidence": 0.95,
        "budget_usd": 0.01,
        "notify": [],
    }
    deadline = time.monotonic() + 20
    while not (view := await api.ok("GET", f"/v1/bags/{bag_id}"))["budget"]["held"]:
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.05)
    assert view["budget"]["held"].startswith(f"held: budget: bag {bag_id}: spent $0.00")
    assert view["counts"]["queued"] == 2 and view["budget"]["reserved_usd"] == 0.0
    jobs = await api.ok("GET", f"/v1/bags/{bag_id}/jobs")
    assert all(j["waiting"].startswith("held: budget: ") for j in jobs["jobs"])
    # The hold is seen in memory at once; its event is written with the pass's batch.
    while not (events := await api.ok("GET", f"/v1/events?bag={bag_id}"))["events"]:
        assert time.monotonic() < deadline, events
        await asyncio.sleep(0.05)
    assert [e["kind"] for e in events["events"]] == ["budget_reached"]
    assert events["events"][0]["payload"]["held"] == view["budget"]["held"]
    assert events["events"][0]["deliveries"] == []  # no webhook asked for it
    status, body = await api.call("PATCH", f"/v1/bags/{bag_id}", json={"budget_usd": "1"})
    assert status == 400 and "budget_usd" in body["error"]["message"], body
    raised = await api.ok("PATCH", f"/v1/bags/{bag_id}", json={"budget_usd": 1.0})
    assert raised["options"]["budget_usd"] == 1.0
    done = await api.wait_bag(bag_id, ("succeeded",))
    assert done["budget"]["reserved_usd"] == 0.0 and 0 < done["budget"]["charged_usd"] <= 0.04
    after = events["next_after"]
    later = await api.ok("GET", f"/v1/events?after={after}&kind=finished")
    assert [(e["kind"], e["bag_id"]) for e in later["events"]] == [("finished", bag_id)]
    status, _ = await api.call("PATCH", f"/v1/bags/{bag_id}", json={"budget_usd": 2.0})
    assert status == 409  # finished
    status, _ = await api.call("GET", "/v1/events?kind=exploded")
    assert status == 400
    status, _ = await api.call("GET", "/v1/events?bag=b0123456789")
    assert status == 404
    issued = await api.ok("POST", "/v1/accounts/lab/tokens", 201, json={})
    mine = await api.ok("GET", "/v1/events", token=issued["token"])
    assert {e["bag_id"] for e in mine["events"]} == {bag_id}


async def test_an_accounts_webhooks_are_told_of_its_bags_events(api: Api) -> None:
    """An account names webhooks (POST, PATCH): each event of its bags is delivered to
    them too (finished only where asked), a restart's recovery keeps them, [] removes
    them, and a bad one is a 400 naming the field. (tests/integration/test_notifications.py:
    a receiver gets them, signed.)"""
    everything, finished_only = "http://127.0.0.1:9/all", "http://127.0.0.1:9/finished"
    created = await api.ok(
        "POST",
        "/v1/accounts",
        201,
        json={"name": "lab", "unlimited": True, "notify": [{"url": everything}]},
    )
    assert [h["url"] for h in created["notify"]] == [everything]
    assert len(created["notify"][0]["events"]) == 5  # every kind by default
    changed = await api.ok(
        "PATCH",
        "/v1/accounts/lab",
        json={"notify": [{"url": everything}, {"url": finished_only, "events": ["finished"]}]},
    )
    assert changed["notify"][1] == {"url": finished_only, "events": ["finished"]}
    assert changed["budget"]["budget_usd"] is None  # a field left out is not changed
    status, body = await api.call(
        "PATCH", "/v1/accounts/lab", json={"notify": [{"url": "ftp://x/y"}]}
    )
    assert status == 400 and body["error"]["message"].startswith("notify: "), body
    status, body = await api.call("PATCH", "/v1/accounts/lab", json={})
    assert status == 400 and "budget_usd, notify" in body["error"]["message"], body

    await api.controller.running_scheduler.recover()  # as after a restart: from the store
    assert (await api.ok("GET", "/v1/accounts/lab"))["notify"] == changed["notify"]
    first = await api.ok("POST", "/v1/bags", 201, json=bag(parameters={"i": [1]}))
    await api.wait_bag(first["id"], ("succeeded",))
    (event,) = (await api.ok("GET", f"/v1/events?bag={first['id']}"))["events"]
    assert event["kind"] == "finished"
    assert [d["url"] for d in event["deliveries"]] == [everything, finished_only]

    removed = await api.ok("PATCH", "/v1/accounts/lab", json={"notify": []})
    assert removed["notify"] == []
    notices = api.controller.running_scheduler.world.notices
    assert notices.urls_for("finished", accounts=["lab"]) == ()  # none told from now on
