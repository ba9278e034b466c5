"""Deadlines end to end: a real daemon (`spotbag serve`, local driver), its HTTP API.
A bag with a tight deadline on spot VMs that die within the hour runs on on-demand VMs
(GET /v1/vms says on_demand, and jobs ran there), meets its deadline, and GET
/v1/bags/{id} shows the deadline and its projection; an on-demand VM refuses an
injected preemption; a restart keeps the deadline and the VMs' on_demand flag. A bag
whose deadline leaves spot ample slack never launches an on-demand VM."""

from __future__ import annotations

import pytest

from controller.cli.client import ClientError
from tests.conftest import wait_for_bag, wait_until

pytestmark = pytest.mark.processes

DEADLINE_KEYS = {
    "at",
    "confidence",
    "p_meet",
    "finish",
    "at_risk",
    "on_demand_slots",
    "on_demand_share",
}


def eight_one_hour_jobs(**options) -> dict:
    """Eight jobs of one real second (a model hour at the tests' time scale)."""
    return {
        "account": "lab",
        "command": "sleep 1",
        "parameters": {"i": list(range(8))},
        "max_runtime_s": 20,
        "estimated_runtime_s": 1,
        "resources": {"cpus": 1, "memory_gb": 1.0},
        **options,
    }


def test_a_tight_deadline_escalates_to_on_demand_vms_and_is_met(make_daemon):
    # One real second is a model hour; spot VMs live 0.7 model hours on average, so a
    # one-hour job that cannot checkpoint rarely finishes on one (1 in 4). Eight jobs on
    # four slots take two hours on on-demand; the policy stays on spot until the latest
    # safe switch, so the deadline must leave spot too little time to finish all eight
    # by luck (at 8 h it sometimes did, and no on-demand VM was needed).
    daemon = make_daemon(model="exponential", mttf_h=0.7, time_scale=3600.0, max_vms=2)
    client = daemon.start()
    bag = client.submit(eight_one_hour_jobs(deadline="5s"))
    assert bag["options"]["on_demand"] == "when_needed"

    projected: list[dict] = []
    views: list[dict | None] = []

    def watch_deadline() -> dict:
        now = client.bag(bag["id"])
        view = now["deadline"]
        if view is not None and view["p_meet"] is not None:
            projected.append(view)
        elif not views or views[-1] != view:
            views.append(view)
        return now

    def on_demand_vm() -> dict | None:
        watch_deadline()
        live = [vm for vm in client.vms()["vms"] if vm["on_demand"]]
        return live[0] if live else None

    vm = wait_until(on_demand_vm, 30, 0.05, "an on-demand VM")
    # While it runs, the policy's projection: the finish's spread before the deadline.
    wait_until(
        lambda: projected or watch_deadline()["state"] != "active",
        30,
        0.05,
        "a projection or the bag's end",
    )
    assert projected, f"no projection while the bag ran: {views}\n{daemon.log()[-3000:]}"
    view = projected[-1]
    assert set(view) == DEADLINE_KEYS and 0.0 <= view["p_meet"] <= 1.0
    assert set(view["finish"]) <= {"p50", "p90", "p95"}
    assert list(view["finish"].values()) == sorted(view["finish"].values())
    assert isinstance(vm, dict) and vm["spot"] == 0
    # The provider never takes an on-demand VM back: an injected preemption is refused.
    with pytest.raises(ClientError) as refused:
        client.preempt(vm["id"])
    assert refused.value.status == 409

    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded"
    deadline = done["deadline"]
    assert set(deadline) == DEADLINE_KEYS
    assert deadline["at"] == pytest.approx(done["created_at"] + 5, abs=0.5)
    assert done["finished_at"] <= deadline["at"]
    assert deadline["confidence"] == 0.95
    assert 0.0 < deadline["on_demand_share"] < 1.0  # spot first, on-demand when needed

    vms = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
    assert any(v["on_demand"] for v in vms.values())
    assert all(v["on_demand"] == (not v["spot"]) for v in vms.values())
    jobs = client.jobs(bag["id"])["jobs"]
    assert len(jobs) == 8
    # Jobs succeeded on the on-demand VMs (spot ones kept being preempted).
    assert any(vms[job["vm_id"]]["on_demand"] for job in jobs)

    # A restart keeps the deadline and which VMs were on-demand (both are stored).
    daemon.stop()
    client = daemon.start()
    again = client.bag(bag["id"])
    assert again["deadline"]["at"] == deadline["at"]
    assert again["deadline"]["on_demand_share"] == pytest.approx(deadline["on_demand_share"])
    after = {v["id"]: v["on_demand"] for v in client.vms(include_ended=True)["vms"]}
    assert after == {vm_id: v["on_demand"] for vm_id, v in vms.items()}


def test_a_bag_without_a_deadline_has_none_and_runs_on_spot(make_daemon):
    daemon = make_daemon(time_scale=3600.0, max_vms=2)
    client = daemon.start()
    bag = client.submit(
        {"account": "lab", "command": "true", "parameters": {"i": [1, 2]}, "max_runtime_s": 20}
    )
    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded" and done["deadline"] is None
    vms = client.vms(include_ended=True)["vms"]
    assert vms and not any(v["on_demand"] for v in vms)


def test_a_deadline_with_ample_slack_never_escalates(make_daemon):
    """The same bag (eight one-hour jobs, one real second a model hour) on spot VMs
    that live 5 model hours on average, with a deadline at 60 model hours: spot alone
    finishes it with room to spare, so no on-demand VM is ever launched, and the bag
    ends before its deadline."""
    daemon = make_daemon(model="exponential", mttf_h=5.0, time_scale=3600.0, max_vms=2)
    client = daemon.start()
    bag = client.submit(eight_one_hour_jobs(deadline="60s", max_attempts=20))
    assert bag["options"]["on_demand"] == "when_needed"
    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded"
    assert done["deadline"] is not None and done["finished_at"] < done["deadline"]["at"]
    vms = client.vms(include_ended=True)["vms"]
    assert vms and not any(v["on_demand"] for v in vms), vms
