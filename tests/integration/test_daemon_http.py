"""The real daemon in a subprocess, driven over HTTP with the real client."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.cli.client import ClientError
from tests.conftest import wait_for_bag, wait_until

pytestmark = pytest.mark.integration


def job_bag(out_dir: Path, n: int, seconds: float, **extra) -> dict:
    """A bag whose jobs sleep, then append their id to a per-job file (to count completions)."""
    return {
        "name": "sleepers",
        "account": "test",
        "command": f"sleep {seconds} && echo $SPOTBAG_ATTEMPT >> {out_dir}/done.{{i}}",
        "parameters": {"i": {"range": [0, n]}},
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "max_runtime_s": 60,
        "max_attempts": 20,
        **extra,
    }


def store_rows(state_dir: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(state_dir / "spotbag.db") as conn:
        return conn.execute(sql).fetchall()


def assert_exactly_once(state_dir: Path, bag_id: str, n: int) -> None:
    """Every job succeeded, each with exactly one SUCCEEDED attempt, and the maintained
    per-state counts equal the jobs table."""
    per_job = store_rows(
        state_dir,
        f"SELECT idx, sum(state = 'succeeded') FROM attempts WHERE bag_id = '{bag_id}' GROUP BY idx",
    )
    assert sorted(per_job) == [(i, 1) for i in range(n)]
    counted = dict(
        store_rows(
            state_dir, f"SELECT state, count(*) FROM jobs WHERE bag_id = '{bag_id}' GROUP BY state"
        )
    )
    kept = {
        s: k
        for s, k in store_rows(
            state_dir, f"SELECT state, n FROM bag_job_counts WHERE bag_id = '{bag_id}'"
        )
        if k
    }
    assert counted == kept == {"succeeded": n}


def test_bag_completes_through_injected_and_sampled_preemptions(make_daemon, tmp_path):
    # Exponential lifetimes with a mean of 4 real seconds, plus preemptions injected over the API.
    daemon = make_daemon(model="exponential", mttf_h=1.0, time_scale=900.0, max_vms=3)
    client = daemon.start()
    out = tmp_path / "out"
    out.mkdir()
    bag = client.submit(job_bag(out, 12, 0.8))
    assert bag["state"] == "active" and bag["job_count"] == 12

    # Preempt a VM while it runs jobs; its jobs must come back and finish.
    def busy_vm() -> str | None:
        # One whose jobs run: those only handed to it (waiting to start there) never ran.
        running = store_rows(
            daemon.state_dir, "SELECT DISTINCT vm_id FROM attempts WHERE state = 'running'"
        )
        vms = {v["id"] for v in client.vms()["vms"] if v["state"] == "running"}
        return next((vm for (vm,) in running if vm in vms), None)

    def preempt_a_busy_vm() -> str | None:
        vm_id = busy_vm()
        if vm_id is None:
            return None
        try:  # it may have been preempted (sampled) or gone idle since we looked
            client.preempt(vm_id)
        except ClientError:
            return None
        return vm_id

    vm_id = wait_until(preempt_a_busy_vm, 30, what="a VM running jobs to preempt")
    final = wait_for_bag(client, bag["id"])

    assert final["state"] == "succeeded", final
    assert final["counts"]["succeeded"] == 12
    assert final["usage"]["interrupted_attempts"] >= 1
    preempted = store_rows(
        daemon.state_dir, "SELECT count(*) FROM attempts WHERE state = 'preempted'"
    )[0][0]
    assert preempted >= 1
    assert_exactly_once(daemon.state_dir, bag["id"], 12)
    injected = store_rows(daemon.state_dir, f"SELECT state, reason FROM vms WHERE id = '{vm_id}'")
    assert injected == [("preempted", "preempted: injected through the API")]
    # Its attempts name the VM and its state once, then the driver's detail.
    on_it = store_rows(
        daemon.state_dir,
        f"SELECT DISTINCT reason FROM attempts WHERE vm_id = '{vm_id}' AND state = 'preempted'",
    )
    assert on_it == [(f"VM {vm_id} preempted: injected through the API",)]
    # The API shows the retry: a job with more than one attempt lists them all.
    retried = store_rows(
        daemon.state_dir, f"SELECT idx FROM jobs WHERE bag_id = '{bag['id']}' AND attempts > 1"
    )
    job = client.job(f"{bag['id']}-{retried[0][0]}")
    assert [a["state"] for a in job["attempt_list"]][-1] == "succeeded"
    assert "preempted" in [a["state"] for a in job["attempt_list"]]
    # Lifetimes drawn from the model ended VMs too, not only the injected preemption.
    sampled = store_rows(
        daemon.state_dir,
        "SELECT count(*) FROM vms WHERE reason LIKE 'preempted: sampled lifetime%'",
    )
    assert sampled[0][0] >= 1

    # /metrics tells the same story, series by series.
    metrics = scrape(client)
    assert (
        metrics["spotbag_preemptions_total", ()]
        == store_rows(daemon.state_dir, "SELECT count(*) FROM vms WHERE state = 'preempted'")[0][0]
    )
    assert metrics["spotbag_attempts_total", (("state", "succeeded"),)] == 12
    assert metrics["spotbag_attempts_total", (("state", "preempted"),)] == preempted
    assert metrics["spotbag_jobs_finished_total", (("state", "succeeded"),)] == 12
    assert metrics["spotbag_jobs", (("state", "queued"),)] == 0
    assert metrics["spotbag_jobs", (("state", "running"),)] == 0
    assert metrics["spotbag_scheduler_loop_seconds_count", ()] > 10
    # The event loop's stall monitor wakes every 20 ms while the daemon runs.
    assert metrics["spotbag_event_loop_lag_seconds_count", ()] > 10
    assert 0.0 <= metrics["spotbag_event_loop_lag_max_seconds", ()] < 5.0
    live = store_rows(
        daemon.state_dir, "SELECT count(*) FROM vms WHERE state IN ('pending', 'running')"
    )[0][0]
    assert (
        metrics["spotbag_vms", (("state", "pending"),)]
        + metrics["spotbag_vms", (("state", "running"),)]
        == live
    )
    assert metrics["spotbag_vm_launches_total", (("result", "ok"), ("vm_type", "local-2"))] >= 4

    models = client.request("GET", "/v1/models")
    assert (
        models["configured"]["model"] == "exponential"
        and models["configured"]["reuse_policy"] == "model"
    )
    assert models["learned"] == []  # fewer lifetimes than min_samples so far
    for vm in models["in_use"]:
        assert vm["model"] == "exponential" and vm["source"] == "config" and vm["age_h"] >= 0
    assert daemon.stop() == 0


def scrape(client) -> dict[tuple[str, tuple], float]:
    """The daemon's /metrics as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(client.url + "/metrics") as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_malformed_bag_is_400_naming_the_field(make_daemon):
    client = make_daemon().start()
    cases = [
        ({"account": "a", "command": "x", "max_runtime_s": "soon"}, "max_runtime_s"),
        (
            {"account": "a", "command": "x", "max_runtime_s": 5, "resources": {"cpus": 0}},
            "resources.cpus",
        ),
        (
            {"account": "a", "command": "x {y}", "max_runtime_s": 5, "parameters": {"z": [1]}},
            "command",
        ),
        (
            {
                "account": "a",
                "command": "x",
                "max_runtime_s": 5,
                "parameters": {"z": {"range": [0, 5, 0]}},
            },
            "parameters.z.range",
        ),
        ({"command": "x", "max_runtime_s": 5}, "account"),
        ({"account": "a", "command": "x", "max_runtime_s": 5, "colour": "red"}, "colour"),
    ]
    for body, field in cases:
        with pytest.raises(ClientError) as caught:
            client.submit(body)
        assert caught.value.status == 400, body
        assert caught.value.code == "invalid_bag"
        assert caught.value.message.startswith(field + ":"), caught.value.message
        assert caught.value.detail["errors"][0]["field"] == field
    # Not JSON at all: still a JSON 400, not a 500.
    request = urllib.request.Request(
        client.url + "/v1/bags",
        data=b"{nope",
        method="POST",
        headers={"Authorization": f"Bearer {client.token}"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request)
    assert caught.value.code == 400
    assert json.loads(caught.value.read())["error"]["code"] == "invalid_bag"
    assert client.bags() == []  # nothing was admitted


def test_bag_no_vm_type_fits_is_422_with_needed_and_available(make_daemon):
    client = make_daemon().start()
    with pytest.raises(ClientError) as caught:
        client.submit(
            {
                "account": "a",
                "command": "x",
                "max_runtime_s": 5,
                "resources": {"cpus": 16, "memory_gb": 64},
            }
        )
    error = caught.value
    assert error.status == 422 and error.code == "no_vm_type_fits"
    assert "cpus=16" in error.message and "local-4" in error.message
    assert error.detail["needed"] == {"cpus": 16, "gpus": 0, "memory_gb": 64.0}
    assert {t["name"] for t in error.detail["available"]} == {"local-2", "local-4"}
    with pytest.raises(ClientError) as caught:
        client.submit(
            {
                "account": "a",
                "command": "x",
                "max_runtime_s": 5,
                "resources": {"vm_types": ["local-2", "huge-1"]},
            }
        )
    assert caught.value.status == 400
    assert caught.value.message.startswith("resources.vm_types[1]: unknown VM type 'huge-1'")


def test_token_is_required_except_for_open_routes(make_daemon):
    daemon = make_daemon(token="s3cret")
    client = daemon.start()
    assert client.bags() == []
    for bad in (daemon.client(token="wrong"), daemon.client(token="")):
        with pytest.raises(ClientError) as caught:
            bad.bags()
        assert caught.value.status == 401 and caught.value.code == "unauthorized"
        with pytest.raises(ClientError) as caught:
            bad.submit({"account": "a", "command": "true", "max_runtime_s": 5})
        assert caught.value.status == 401
    anonymous = daemon.client(token="")
    assert anonymous.health()["ok"] is True
    with urllib.request.urlopen(client.url + "/metrics") as response:
        assert b"spotbag_jobs" in response.read()
    assert client.bags() == []  # the refused submissions admitted nothing


def test_kill_9_mid_bag_then_restart_completes_every_job_exactly_once(make_daemon, tmp_path):
    daemon = make_daemon(max_vms=2)
    client = daemon.start()
    out = tmp_path / "out"
    out.mkdir()
    n = 16
    bag = client.submit(job_bag(out, n, 1.5))

    def some_done_some_running() -> bool:
        counts = client.bag(bag["id"])["counts"]
        return counts["succeeded"] >= 2 and counts["running"] >= 2

    wait_until(some_done_some_running, 60, what="progress with jobs running")
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    # Down for longer than a job runs: the orphaned jobs finish while nobody watches.
    time.sleep(2.5)
    client = daemon.start()
    final = wait_for_bag(client, bag["id"])
    assert final["state"] == "succeeded"
    assert_exactly_once(daemon.state_dir, bag["id"], n)
    # No program ran to completion twice: each job appended exactly one line.
    assert [len((out / f"done.{i}").read_text().splitlines()) for i in range(n)] == [1] * n
    finished_while_down = store_rows(
        daemon.state_dir,
        f"SELECT count(*) FROM attempts WHERE bag_id = '{bag['id']}' AND state = 'succeeded' "
        "AND reason = 'finished while the controller was down'",
    )
    assert finished_while_down[0][0] >= 2
    assert daemon.stop() == 0


def test_orphans_still_running_at_a_restart_are_stopped_before_serving(make_daemon, tmp_path):
    daemon = make_daemon(max_vms=1)
    client = daemon.start()
    bag = client.submit(
        {"account": "a", "command": "sleep 30", "max_runtime_s": 60, "parameters": {"i": [0, 1]}}
    )
    wait_until(lambda: client.bag(bag["id"])["counts"]["running"] == 2, 30, what="two running jobs")

    # "running" is recorded just before the processes start: wait for the processes.
    def both_jobs_processes() -> dict[int, str] | None:
        found = _job_processes(daemon.state_dir)
        return found if len(set(found.values())) == 2 else None

    orphans = wait_until(both_jobs_processes, 30, what="both jobs' processes")
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    assert _job_processes(daemon.state_dir).keys() >= orphans.keys()  # they outlive the daemon
    client = daemon.start()  # returns once the API listens, i.e. after recovery
    survivors = set(orphans) & set(_job_processes(daemon.state_dir))
    assert survivors == set(), "the crashed daemon's jobs must not run beside their retries"
    lost = store_rows(
        daemon.state_dir,
        f"SELECT count(*) FROM attempts WHERE bag_id = '{bag['id']}' AND state = 'lost'",
    )
    assert lost == [(2,)]
    client.cancel(bag["id"])
    assert daemon.stop() == 0


def _job_processes(state_dir: Path) -> dict[int, str]:
    """pid -> attempt id of the processes that carry this daemon's run key."""
    controller_id = store_rows(state_dir, "SELECT value FROM meta WHERE key = 'controller_id'")[0][
        0
    ]
    marker = f"SPOTBAG_RUN_KEY={controller_id}:".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for variable in environ:
            if variable.startswith(marker):
                found[int(proc.name)] = variable[len(marker) :].decode()
    return found


def test_job_details_logs_pagination_and_cancel(make_daemon, tmp_path):
    daemon = make_daemon(max_vms=1)
    client = daemon.start()
    bag = client.submit(
        {
            "account": "a",
            "name": "echoes",
            "max_runtime_s": 30,
            "command": "echo value={v} job=$SPOTBAG_JOB_ID attempt=$SPOTBAG_ATTEMPT p=$SPOTBAG_PARAM_V",
            "parameters": {"v": ["x y", "z"]},
        }
    )
    final = wait_for_bag(client, bag["id"])
    assert final["state"] == "succeeded"
    job = client.job(f"{bag['id']}-0")
    assert job["params"] == {"v": "x y"} and job["state"] == "succeeded" and job["exit_code"] == 0
    assert job["attempt_list"][0]["vm_type"] == "local-2"
    assert [t["to_state"] for t in job["transitions"]] == ["running", "succeeded"]
    text, headers = client.log(job["id"])
    assert text.decode().strip() == f"value=x y job={job['id']} attempt=1 p=x y"
    assert headers["X-Spotbag-Attempt"] == "1"

    # Pagination over a bigger bag, filtered by state.
    many = client.submit(
        {
            "account": "a",
            "command": "sleep 30",
            "max_runtime_s": 60,
            "parameters": {"i": {"range": [0, 250]}},
        }
    )
    page = client.jobs(many["id"], state="queued", limit=100)
    seen = [j["index"] for j in page["jobs"]]
    while page["next_after"] is not None:
        page = client.jobs(many["id"], state="queued", after=page["next_after"], limit=100)
        seen += [j["index"] for j in page["jobs"]]
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(250)) and len(seen) >= 240

    wait_until(lambda: client.bag(many["id"])["counts"]["running"] >= 1, 30, what="a running job")
    cancelled = client.cancel(many["id"])
    assert cancelled["cancel_requested"] is True
    final = wait_for_bag(client, many["id"], timeout_s=30)
    assert final["state"] == "cancelled"
    assert final["counts"]["cancelled"] == 250
    with pytest.raises(ClientError) as caught:
        client.cancel(many["id"])
    assert caught.value.status == 409
    # The running attempts were stopped, not left behind.
    assert store_rows(
        daemon.state_dir, f"SELECT DISTINCT state FROM attempts WHERE bag_id = '{many['id']}'"
    ) == [("cancelled",)]
    for missing in (
        "/v1/bags/b0000000000",
        "/v1/jobs/b0000000000-3",
        "/v1/jobs/nonsense",
        "/v1/nowhere",
    ):
        with pytest.raises(ClientError) as caught:
            client.request("GET", missing)
        assert caught.value.status == 404 and caught.value.code == "not_found"


def test_idempotency_key_returns_the_first_bag(make_daemon):
    client = make_daemon().start()
    spec = {"account": "a", "command": "true", "max_runtime_s": 5}
    first = client.submit(spec, idempotency_key="retry-me")
    again = client.submit(spec, idempotency_key="retry-me")
    assert again["id"] == first["id"]
    assert len(client.bags()) == 1


def test_openapi_document_matches_the_routes(make_daemon):
    from controller.api.app import ROUTES

    client = make_daemon().start()
    document = client.request("GET", "/openapi.json")
    served = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert served == {(r.method, r.path) for r in ROUTES}
    assert document["components"]["schemas"]["BagSpec"]["required"] == [
        "account",
        "command",
        "max_runtime_s",
    ]
    # Every declared route answers (not 404/405) on the real server.
    for method, path in served:
        concrete = (
            path.replace("{bag_id}", "b0000000000")
            .replace("{job_id}", "b0000000000-0")
            .replace("{vm_id}", "vm-000000000000")
            .replace("{account}", "nobody")
            .replace("{token_id}", "0123456789ab")
        )
        try:
            client.request(method, concrete, body={} if method == "POST" else None, raw=True)
        except ClientError as exc:
            assert exc.code != "method_not_allowed" and not exc.message.startswith("no route"), (
                method,
                path,
            )


def test_learned_models_are_loaded_at_start_and_shown(make_daemon):
    import asyncio

    from controller.store import Store
    from policies.preemption import Bathtub

    daemon = make_daemon(model="exponential", mttf_h=2.0, time_scale=3600.0)
    client = daemon.start()
    assert client.request("GET", "/v1/models")["learned"] == []
    assert daemon.stop() == 0

    async def learn_offline() -> None:  # as the learner would have stored them
        store = Store(daemon.state_dir / "spotbag.db")
        await store.open()
        model = Bathtub(A=0.3, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
        await store.save_models(
            [
                {
                    "key": "local/local-2/local/*/*",
                    "model": "bathtub",
                    "parameters": model.parameters,
                    "L": 24.0,
                    "n": 120,
                    "censored": 40,
                    "stats": {"ks": 0.04, "r2": 0.98, "aic": 300.0},
                    "fitted_at": 1.0e9,
                }
            ],
            "first fit on 120 lifetimes",
        )
        await store.close()

    asyncio.run(learn_offline())
    client = daemon.start()
    models = client.request("GET", "/v1/models")
    (learned,) = models["learned"]
    assert (learned["key"], learned["n"], learned["stats"]["ks"], learned["reason"]) == (
        "local/local-2/local/*/*",
        120,
        0.04,
        "first fit on 120 lifetimes",
    )
    bag = client.submit({"account": "a", "command": "sleep 2", "max_runtime_s": 30})
    wait_until(lambda: client.request("GET", "/v1/models")["in_use"], 20, what="a live VM")
    (vm,) = client.request("GET", "/v1/models")["in_use"]
    assert (
        vm["source"] == "learned"
        and vm["model"] == "bathtub"
        and vm["key"] == "local/local-2/local/*/*"
    )
    client.cancel(bag["id"])
    assert daemon.stop() == 0


def test_a_vms_preemption_notice_is_kept_across_a_restart(make_daemon, tmp_path):
    """notice_until is stored with the VM: GET /v1/vms shows it while the VM lives, once
    it has ended, and after the daemon restarted. The notice is long (a busy host once
    took 20 s to list the VMs); the bag is cancelled once they are listed, and the VM,
    drained by its notice, ends as soon as it is empty."""
    daemon = make_daemon(max_vms=1)
    client = daemon.start()
    bag = client.submit(job_bag(tmp_path, 1, 300, max_runtime_s=600))

    def running() -> dict | None:
        # Its program running, not only its attempt handed to the executor: a notice
        # moves an attempt still waiting there elsewhere at once, and its VM, empty,
        # ends (a CI run met this).
        job = client.job(f"{bag['id']}-0")
        attempts = job.get("attempt_list") or []
        ran = attempts and attempts[-1]["state"] == "running" and attempts[-1]["ran_at"]
        return job if job["state"] == "running" and ran else None

    job = wait_until(running, 30, 0.1, "a run")
    noticed_at = time.time()
    client.preempt(job["vm_id"], notice_s=240)

    def view() -> dict:
        return {v["id"]: v for v in client.vms(include_ended=True)["vms"]}[job["vm_id"]]

    def shown() -> float | None:
        return view()["notice_until"]

    until = wait_until(shown, 10, 0.05, "the notice")
    assert until == pytest.approx(noticed_at + 240, abs=1.0)
    # `spotbag vms` in this process: the same command, without a new Python's start.
    listed = CliRunner().invoke(
        cli, ["--url", client.url, "--token", client.token, "vms"], terminal_width=200
    )
    assert listed.exit_code == 0, listed.output
    assert view()["ended_at"] is None, "the VM ended before `spotbag vms` listed it"
    ends_by = time.strftime("%H:%M:%S", time.localtime(until))
    assert f"notice: ends by {ends_by}" in listed.output, listed.output
    client.cancel(bag["id"])
    ended_at = wait_until(lambda: view()["ended_at"], 60, 0.1, "the VM's end")
    assert ended_at < until
    assert shown() == until  # ended: read from the store
    assert daemon.stop() == 0
    client = daemon.start()
    assert shown() == until
    assert daemon.stop() == 0
