"""The daemon on mocked clouds: the aws driver against a moto server and the gce driver
against the fake Compute API (tests/fakes), both in this process; the daemon is a real
`spotbag serve` subprocess talking to them over loopback. Jobs run as local processes
on the VMs the controller launched; when the controller sees a VM preempted it stops
the jobs on it, records the lifetime and requeues them.

Checked: spot interruptions injected in the mocked cloud are noticed within one
describe poll, the lifetime is recorded, the jobs are retried on new VMs and the bag
completes with no VM left behind; with 20% of the cloud calls failing (throttling,
capacity) the bag still completes; a type without capacity makes the controller use
the next allowed type.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, Daemon, wait_for_bag, wait_until

pytestmark = pytest.mark.integration

TOKEN = "cloud-test"
BASE_CONFIG = """
[api]
host = "127.0.0.1"
port = 0
token = "{token}"

[scheduler]
max_vms = 3
idle_timeout_s = 1.0
poll_interval_s = 0.2
describe_interval_s = {describe_s}
launch_backoff_s = 0.5
launch_backoff_max_s = 2.0

[driver]
name = "{driver}"

[executor]
kill_grace_s = 0.5

[ledger]
new_accounts = "unlimited"
"""
DESCRIBE_S = 0.5


class GceCloud:
    """The fake Compute API and the [gce] config that points the daemon at it."""

    name = "gce"
    cheap, roomy = "e2-standard-2", "e2-standard-4"
    project, zone = "spotbag-it", "us-central1-a"

    def __init__(self, host: str = "127.0.0.1") -> None:
        from tests.fakes.gce_api import FakeGceApi

        self.api = FakeGceApi(boot_s=0.3, stop_s=0.1, zones=(self.zone,), host=host).start()
        self.env: dict[str, str] = {}  # no credentials: [gce] anonymous_credentials

    def config(self) -> str:
        return f"""
[gce]
project = "{self.project}"
zones = ["{self.zone}"]
api_endpoint = "{self.api.endpoint}"
anonymous_credentials = true
max_retries = 4
operation_timeout_s = 20.0

[[vm_types]]
name = "{self.cheap}"
cpus = 2
memory_gb = 8.0
spot_price_per_hour = 0.02
on_demand_price_per_hour = 0.067
zone = "{self.zone}"

[[vm_types]]
name = "{self.roomy}"
cpus = 4
memory_gb = 16.0
spot_price_per_hour = 0.05
on_demand_price_per_hour = 0.134
zone = "{self.zone}"
"""

    def preempt(self, provider_id: str) -> None:
        zone, _, name = provider_id.partition("/")
        assert self.api.preempt(self.project, zone, name), provider_id

    def notice(self, provider_id: str, lead_s: float) -> None:
        """GCE's preemption notice: the operation runs, the instance stops `lead_s` later."""
        zone, _, name = provider_id.partition("/")
        assert self.api.preempt(self.project, zone, name, notice_s=lead_s), provider_id

    def live_instances(self) -> list[str]:
        return [
            i["name"]
            for i in self.api.instances(self.project)
            if i["status"] in ("PROVISIONING", "STAGING", "RUNNING")
        ]

    def flaky(self, fraction: float) -> None:
        self.api.fail_fraction(fraction, "throttle", seed=1)
        self.api.fail_fraction(fraction, "capacity", seed=2, route="instances.insert")

    def no_capacity_for(self, vm_type: str) -> None:
        self.api.exhaust(self.zone, vm_type)

    def close(self) -> None:
        self.api.close()


class AwsCloud:
    """A moto server and the [aws] config that points the daemon at it."""

    name = "aws"
    cheap, roomy = "m5.large", "m5.xlarge"

    def __init__(self, host: str = "127.0.0.1") -> None:
        from drivers.base import PriceSample
        from tests.fakes.aws import MotoCloud

        self.cloud = MotoCloud(host=host)
        # The spot price history the daemon's hopper reads: the cheap type is cheaper.
        now = time.time()
        self.cloud.set_spot_prices(
            [
                PriceSample(self.cheap, f"{self.cloud.region}a", 0.035, now),
                PriceSample(self.roomy, f"{self.cloud.region}a", 0.07, now),
            ]
        )
        self.settings = self.cloud.settings(controller_id="unused")
        self.env = self.cloud.env()

    def config(self) -> str:
        s = self.settings
        return f"""
[aws]
region = "{s.region}"
endpoint_url = "{s.endpoint_url}"
image_id = "{s.image_id}"
max_retries = 4

[[vm_types]]
name = "{self.cheap}"
cpus = 2
memory_gb = 8.0
spot_price_per_hour = 0.035
on_demand_price_per_hour = 0.096
zone = "{s.region}a"

[[vm_types]]
name = "{self.roomy}"
cpus = 4
memory_gb = 16.0
spot_price_per_hour = 0.07
on_demand_price_per_hour = 0.192
zone = "{s.region}a"
"""

    def preempt(self, provider_id: str) -> None:
        self.cloud.interrupt(provider_id)

    def notice(self, provider_id: str, lead_s: float) -> None:
        """EC2's interruption notice: the spot request is marked, the instance interrupted
        `lead_s` later."""
        self.cloud.notice(provider_id, lead_s)

    def live_instances(self) -> list[str]:
        return self.cloud.live_instances()

    def flaky(self, fraction: float) -> None:
        self.cloud.fail_calls_server_side(
            fraction, ["RequestLimitExceeded", "InsufficientInstanceCapacity"], seed=1
        )

    def no_capacity_for(self, vm_type: str) -> None:
        self.cloud.no_capacity_for(vm_type)

    def close(self) -> None:
        self.cloud.close()


@pytest.fixture(params=["aws", "gce"])
def cloud(request):
    made = AwsCloud() if request.param == "aws" else GceCloud()
    yield made
    made.close()


@pytest.fixture
def start_daemon(tmp_path: Path):
    """start_daemon(cloud) -> (daemon, client); the daemon is killed if the test fails."""
    started: list[Daemon] = []

    def start(cloud) -> tuple[Daemon, object]:
        state = tmp_path / "state"
        state.mkdir()
        config = state / "spotbag.toml"
        config.write_text(
            BASE_CONFIG.format(token=TOKEN, driver=cloud.name, describe_s=DESCRIBE_S)
            + cloud.config()
        )
        daemon = Daemon(state, config, TOKEN)
        started.append(daemon)
        return daemon, daemon.start(extra_env=cloud.env)

    yield start
    for daemon in started:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


def rows(daemon: Daemon, sql: str) -> list[tuple]:
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        return conn.execute(sql).fetchall()


def nothing_left_behind(daemon, client, cloud) -> None:
    wait_until(lambda: not client.vms()["vms"], 30, 0.2, "the controller to end its VMs")
    wait_until(lambda: not cloud.live_instances(), 30, 0.2, "the cloud to have no VM left")


def test_spot_interruptions_are_noticed_requeued_and_the_bag_completes(start_daemon, cloud):
    daemon, client = start_daemon(cloud)
    bag = client.submit(
        {
            "account": "lab",
            "command": "sleep 2.5; echo done {i}",
            "parameters": {"i": list(range(6))},
            "resources": {"cpus": 2, "memory_gb": 4},
            "max_runtime_s": 120,
            "max_attempts": 5,
        }
    )

    def running_vms() -> list[dict]:
        vms = [vm for vm in client.vms()["vms"] if vm["state"] == "running" and vm["jobs"]]
        return vms if len(vms) >= 2 else []

    victims = wait_until(running_vms, 60, 0.1, "jobs running on two VMs")[:2]
    preempted_at = time.time()
    for vm in victims:
        cloud.preempt(vm["provider_id"])

    def noticed() -> bool:
        ended = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
        return all(ended[vm["id"]]["state"] == "preempted" for vm in victims)

    wait_until(noticed, 10, 0.05, "the controller to notice the preemptions")
    took_s = time.time() - preempted_at
    assert took_s <= DESCRIBE_S + 1.5, f"noticed after {took_s:.2f} s"

    done = wait_for_bag(client, bag["id"], 120)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 6
    ids = ", ".join(f"'{vm['id']}'" for vm in victims)
    # The lifetimes are recorded (ended, preempted, with the cloud's reason) ...
    recorded = rows(
        daemon,
        f"SELECT state, reason, ended_at > running_at FROM vms WHERE id IN ({ids})",
    )
    assert len(recorded) == 2 and all(s == "preempted" and r and ok for s, r, ok in recorded)
    # ... the jobs on them were cut short and ran again elsewhere.
    cut = rows(
        daemon,
        f"SELECT bag_id, idx FROM attempts WHERE state = 'preempted' AND vm_id IN ({ids})",
    )
    assert cut
    for bag_id, idx in cut:
        again = rows(
            daemon,
            f"SELECT vm_id FROM attempts WHERE bag_id = '{bag_id}' AND idx = {idx} "
            "AND state = 'succeeded'",
        )
        assert len(again) == 1 and again[0][0] not in {vm["id"] for vm in victims}
    nothing_left_behind(daemon, client, cloud)
    daemon.stop()


def test_flaky_cloud_calls_and_a_type_without_capacity(start_daemon, cloud):
    cloud.flaky(0.2)
    cloud.no_capacity_for(cloud.cheap)
    daemon, client = start_daemon(cloud)
    bag = client.submit(
        {
            "account": "lab",
            "command": "sleep 0.5; echo {i}",
            "parameters": {"i": list(range(8))},
            "resources": {"cpus": 2, "memory_gb": 4, "vm_types": [cloud.cheap, cloud.roomy]},
            "max_runtime_s": 120,
        }
    )
    done = wait_for_bag(client, bag["id"], 120)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 8
    used = rows(daemon, "SELECT DISTINCT vm_type FROM vms WHERE running_at IS NOT NULL")
    assert used == [(cloud.roomy,)]
    refused = rows(daemon, f"SELECT count(*) FROM vms WHERE vm_type = '{cloud.cheap}'")[0][0]
    assert refused > 0  # it was tried first (cheaper), refused, and not used
    nothing_left_behind(daemon, client, cloud)
    daemon.stop()


def test_a_preemption_notice_moves_a_checkpointable_job_losing_nothing(start_daemon, cloud):
    """The notice is read from the cloud's API alone (GCE: the running preemption
    operation; EC2: the spot request marked for termination): the VM takes no new job,
    its job checkpoints at once and resumes on a VM the controller launched at the
    notice, from the checkpoint written after it."""
    daemon, client = start_daemon(cloud)
    program = REPO / "examples" / "programs" / "logistic.py"
    args = "--r 3.7 --iterations 400000 --chunks 400 --seconds 12 --progress"
    bag = client.submit(
        {
            "account": "lab",
            "command": f"{sys.executable} {program} {args}",
            "resources": {"cpus": 2, "memory_gb": 4},
            "max_runtime_s": 120,
            "estimated_runtime_s": 12,
            "checkpointable": True,
            "checkpoint_cost_s": 0.5,
            "max_attempts": 5,
            "workdir": str(REPO),
        }
    )
    job_id = f"{bag['id']}-0"

    def running_for_a_while() -> dict | None:
        job = client.job(job_id)
        if job["state"] != "running" or not job["started_at"]:
            return None
        return job if time.time() - job["started_at"] > 3 else None

    job = wait_until(running_for_a_while, 60, 0.1, "the job running for 3 s")
    (vm,) = [v for v in client.vms()["vms"] if v["id"] == job["vm_id"]]
    noticed_at = time.time()
    cloud.notice(vm["provider_id"], lead_s=5.0)

    def notice_seen() -> dict | None:
        views = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
        return views[vm["id"]] if views[vm["id"]].get("notice_until") else None

    seen = wait_until(notice_seen, 10, 0.05, "the controller to read the notice")
    assert seen["notice_until"] >= noticed_at + 25  # GCE's 30 s, EC2's 120 s
    done = wait_for_bag(client, bag["id"], 90)
    assert done["state"] == "succeeded", daemon.log()
    job = client.job(job_id)
    first, *rest = job["attempt_list"]
    assert first["state"] == "lost" and first["reason"].startswith("migrated: spot notice on "), (
        first
    )
    assert rest and rest[-1]["state"] == "succeeded" and rest[0]["vm_id"] != vm["id"]
    # The checkpoint it moved with was asked for at the notice, and the retry
    # resumed from it: nothing was lost.
    written = [c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == 1]
    assert written and written[-1]["requested_at"] >= noticed_at
    before = (REPO / first["log_path"]).read_text()
    after = (REPO / rest[0]["log_path"]).read_text()
    saved = [int(n) for n in re.findall(r"checkpoint at iteration (\d+)", before)]
    (resumed_from,) = [int(n) for n in re.findall(r"resuming from iteration (\d+)", after)]
    assert resumed_from == saved[-1] > 0
    assert client.bag(bag["id"])["usage"]["lost_hours"] == 0
    # Its replacement was asked for after the notice and before the cloud would have
    # taken the old VM (5 s later): the retry did not wait for the preemption. (The old
    # VM may end sooner: once its job has moved, it is drained and ended.)
    views = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
    replacement = views[rest[0]["vm_id"]]
    assert noticed_at <= replacement["requested_at"] < noticed_at + 5.0, replacement
    nothing_left_behind(daemon, client, cloud)
    daemon.stop()


def test_a_vm_noticed_but_not_interrupted_drains_and_is_released_losing_nothing(start_daemon):
    """A notice the cloud does not follow with an interruption (EC2 marked the spot
    request, then let the instance live): the VM takes no new job, the job it runs
    (not checkpointable: it is not moved) finishes there, and then the VM is ended."""
    cloud = AwsCloud()
    try:
        daemon, client = start_daemon(cloud)
        bag = client.submit(
            {
                "account": "lab",
                "command": "sleep {s}; echo done {s}",
                "parameters": {"s": [6, 1, 1]},
                "resources": {"cpus": 2, "memory_gb": 4},
                "max_runtime_s": 120,
                "max_attempts": 5,
            }
        )
        first = f"{bag['id']}-0"
        job = wait_until(
            lambda: (j := client.job(first))["state"] == "running" and j, 60, 0.1, "job 0 running"
        )
        noticed_at = time.time()
        cloud.cloud.notice(_provider(client, job["vm_id"]), lead_s=None)
        done = wait_for_bag(client, bag["id"], 90)
        assert done["state"] == "succeeded"
        job = client.job(first)
        assert job["attempts"] == 1 and job["attempt_list"][0]["vm_id"] == job["vm_id"]

        def ended() -> dict | None:
            views = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
            return views[job["vm_id"]] if views[job["vm_id"]]["ended_at"] else None

        noticed = wait_until(ended, 10, 0.1, "the noticed VM to be released")
        assert noticed["state"] == "terminated" and "spot notice" in noticed["reason"], noticed
        # No job was placed on it after the notice (reading it takes one describe).
        for i in (1, 2):
            for attempt in client.job(f"{bag['id']}-{i}")["attempt_list"]:
                on_it = attempt["vm_id"] == job["vm_id"]
                assert not on_it or attempt["started_at"] < noticed_at + DESCRIBE_S + 1
        nothing_left_behind(daemon, client, cloud)
        daemon.stop()
    finally:
        cloud.close()


def _provider(client, vm_id: str) -> str:
    (vm,) = [v for v in client.vms()["vms"] if v["id"] == vm_id]
    return vm["provider_id"]
