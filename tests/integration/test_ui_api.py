"""The API routes the web UI's timeline, market and job search stand on (issue 16), against
a real daemon: a bag's timeline (attempts per VM, an injected preemption, its retry,
bounded and incremental by `since`, scoped to the account), jobs found by parameter
value, and the price samples beside the cloud index."""

from __future__ import annotations

import math
import time
import urllib.parse

import pytest

from controller.api.jobs import MAX_PARAM_VALUE_CHARS
from controller.cli.client import ClientError
from tests.conftest import FAST_CONFIG, Daemon, wait_for_bag, wait_until

pytestmark = pytest.mark.integration

TOKEN = "ui-api-t0ken"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    state = tmp_path_factory.mktemp("ui-api")
    (state / "spotbag.toml").write_text(
        FAST_CONFIG.format(token=TOKEN, model="none", mttf_h=24, time_scale=1, max_vms=2)
    )
    daemon = Daemon(state, state / "spotbag.toml", TOKEN)
    yield daemon.start()
    daemon.stop()


def spec(account: str, command: str, **extra):
    return {
        "name": "ui-api",
        "account": account,
        "command": command,
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "max_runtime_s": 120,
        **extra,
    }


def timeline(client, bag_id: str, **query):
    return client.request("GET", f"/v1/bags/{bag_id}/timeline", query=query)


def test_the_timeline_shows_a_preempted_attempt_its_vm_and_the_retry(client):
    bag = client.submit(spec("tl", "sleep 4", parameters={"i": [0, 1]}))
    job_id = f"{bag['id']}-0"

    def running_on() -> str | None:
        # Its program runs (`ran_at`): preempted before that, an attempt handed to the
        # VM's queue never started and ends lost, not preempted.
        job = client.job(job_id)
        ran = job["attempt_list"] and job["attempt_list"][-1]["ran_at"]
        return job["vm_id"] if job["state"] == "running" and ran else None

    vm_id = str(wait_until(running_on, 30, what="the job to run"))
    before = timeline(client, bag["id"])
    live = [a for a in before["attempts"] if a["job"] == job_id]
    assert live and live[0]["state"] in ("starting", "running") and live[0]["ended_at"] is None
    assert live[0]["vm_id"] == vm_id and live[0]["vm_type"] == "local-2"
    assert vm_id in {vm["id"] for vm in before["vms"]}
    preempted_at = time.time()
    client.preempt(vm_id)
    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded"

    answer = timeline(client, bag["id"])
    assert answer["bag_id"] == bag["id"] and answer["truncated"] is False
    starts = [a["started_at"] for a in answer["attempts"]]
    assert starts == sorted(starts)  # oldest first
    mine = [a for a in answer["attempts"] if a["job"] == job_id]
    first, retry = mine[0], mine[-1]
    assert first["number"] == 1 and first["state"] == "preempted"
    assert first["ended_at"] == pytest.approx(preempted_at, abs=5)
    assert retry["number"] == 2 and retry["state"] == "succeeded"
    assert retry["vm_id"] != vm_id and retry["started_at"] >= first["ended_at"]
    vms = {vm["id"]: vm for vm in answer["vms"]}
    assert vms[vm_id]["state"] == "preempted" and vms[vm_id]["ended_at"] is not None
    assert set(vms) == {a["vm_id"] for a in answer["attempts"]}
    # What the bag's job view says, the timeline says too.
    job = client.job(job_id)
    assert [(a["number"], a["state"]) for a in job["attempt_list"]] == [
        (a["number"], a["state"]) for a in mine
    ]

    # Incremental: since the retry ended, only attempts that ended then or later.
    since = math.ceil(retry["ended_at"])
    later = timeline(client, bag["id"], since=since)
    assert all(a["ended_at"] >= since for a in later["attempts"])
    assert first not in later["attempts"] and later["since"] == since
    # Bounded: the newest by start, and it says that older ones were left out.
    one = timeline(client, bag["id"], limit=1)
    assert one["truncated"] is True and len(one["attempts"]) == 1
    assert one["attempts"][0]["started_at"] == max(starts)


def test_the_timeline_is_the_accounts_own_and_checks_its_query(client):
    client.create_account("tl-a", cpu_hours=1)
    client.create_account("tl-b", cpu_hours=1)
    theirs = client.submit(spec("tl-b", "true"))
    token = client.create_token("tl-a")["token"]
    other = type(client)(client.url, token, timeout_s=30)
    with pytest.raises(ClientError) as refused:
        timeline(other, theirs["id"])
    assert refused.value.status == 404
    for query in ({"limit": 0}, {"limit": 10_001}, {"since": -1}, {"since": "soon"}):
        with pytest.raises(ClientError) as bad:
            timeline(client, theirs["id"], **query)
        assert bad.value.status == 400 and bad.value.code == "invalid_query"
    with pytest.raises(ClientError) as missing:
        timeline(client, "b0000000000")
    assert missing.value.status == 404


def test_jobs_are_found_by_parameter_value(client):
    bag = client.submit(
        spec(
            "search",
            "true",
            parameters={"r": {"range": [0, 1, 0.25]}, "seed": [1, 2, 3], "tag": ["a", "3"]},
        )
    )
    wait_for_bag(client, bag["id"], 60)

    def found(*terms: str, **extra) -> list[dict]:
        query = urllib.parse.urlencode([("param", t) for t in terms] + list(extra.items()))
        return client.request("GET", f"/v1/bags/{bag['id']}/jobs?{query}")["jobs"]

    every = client.request("GET", f"/v1/bags/{bag['id']}/jobs", query={"limit": 1000})["jobs"]
    assert len(every) == 4 * 3 * 2

    def expected(**want) -> list[str]:
        return [j["id"] for j in every if all(j["params"][k] == v for k, v in want.items())]

    assert [j["id"] for j in found("seed=2")] == expected(seed=2)
    assert [j["id"] for j in found("r=0.5", "seed=3")] == expected(r=0.5, seed=3)
    assert [j["id"] for j in found("seed=2.0")] == expected(seed=2)  # numbers by value
    assert [j["id"] for j in found("tag=3")] == expected(tag="3")  # text by text
    assert [j["id"] for j in found("tag=a", "seed=1")] == expected(tag="a", seed=1)
    assert found("seed=7") == [] and found("nothere=1") == []
    # With state and paging: the cursor runs over the matches.
    page = client.request(
        "GET", f"/v1/bags/{bag['id']}/jobs?param=seed%3D1&state=succeeded&limit=3"
    )
    assert [j["id"] for j in page["jobs"]] == expected(seed=1)[:3]
    assert page["next_after"] == page["jobs"][-1]["index"]
    for bad in ("seed", "=3", "1x=2", "se ed=1"):
        with pytest.raises(ClientError) as refused:
            found(bad)
        assert refused.value.status == 400 and "param" in refused.value.message
    with pytest.raises(ClientError) as too_many:
        found(*["seed=1"] * 9)
    assert too_many.value.status == 400
    # The longest query the schema documents (8 terms of a 64-character name and 200
    # four-byte characters: a ~20 KB request line) is answered by the API, in JSON, and
    # one character more is the API's own 400 (make fuzz found aiohttp's text/plain 400).
    longest = [f"{'n' * 63}{k}=" + "\U0001d11e" * MAX_PARAM_VALUE_CHARS for k in range(8)]
    assert len(urllib.parse.urlencode([("param", t) for t in longest])) > 2 * 8190
    assert found(*longest) == []
    with pytest.raises(ClientError) as too_long:
        found(longest[0] + "x")
    assert too_long.value.status == 400 and too_long.value.code == "invalid_query"


def test_price_samples_are_served_beside_the_index(client):
    def sampled() -> dict | None:
        answer = client.request("GET", "/v1/hopping/prices")
        return answer if answer["index"]["at"] else None

    answer = wait_until(sampled, 30, what="the hopper's first samples")
    assert answer["enabled"] is True and answer["truncated"] is False  # type: ignore[index]
    types = {t["vm_type"]: t for t in answer["types"]}  # type: ignore[index]
    assert set(types) == {"local-2", "local-4"}
    # The local driver's prices are its catalog's.
    assert types["local-2"]["price"][-1] == pytest.approx(0.02)
    assert types["local-4"]["size"] == pytest.approx(math.sqrt(4 * 8))
    assert types["local-4"]["normalized"][-1] == pytest.approx(0.05 / math.sqrt(32))
    index = answer["index"]["value"][-1]  # type: ignore[index]
    assert index == pytest.approx((0.02 / math.sqrt(8) + 0.05 / math.sqrt(32)) / 2)
    # Before the first sample there is nothing; an account token may not see the market.
    empty = client.request("GET", "/v1/hopping/prices", query={"since": 10**11})
    assert empty["index"] == {"at": [], "value": []} and all(not t["at"] for t in empty["types"])
    client.create_account("market-a", cpu_hours=1)
    other = type(client)(client.url, client.create_token("market-a")["token"], timeout_s=30)
    with pytest.raises(ClientError) as refused:
        other.request("GET", "/v1/hopping/prices")
    assert refused.value.status == 403
