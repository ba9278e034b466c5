"""Callbacks from the real cluster's hooks to a real daemon, and the daemon's restarts
with jobs running in Slurm.

Checked: a callback with a bad signature (or an old timestamp) gets 401 and changes
nothing; a replayed callback is a duplicate and changes nothing (no second
transition, no second charge); events that arrive after the end they belong before
(out of order) are noted, not applied; while the controller is down the hooks spool
their events, and they arrive once it is back; after a graceful stop or a kill -9,
the jobs Slurm still runs are re-adopted: none is run again, none is lost, and the
ledger charges each attempt once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controller.slurm.callbacks import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from tests.conftest import wait_for_bag, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def post_event(
    url: str, secret: bytes, event: dict, *, timestamp: int | None = None, sign_with=None
):
    body = json.dumps(event).encode()
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    request = urllib.request.Request(
        url + "/v1/slurm/events",
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: signature(sign_with or secret, stamp, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def db_counts(daemon) -> dict[str, int]:
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("callbacks", "transitions", "ledger", "attempts")
        }


def job_names(client, bag_id: str, n: int) -> list[tuple[str, str]]:
    out = []
    for idx in range(n):
        for attempt in client.job(f"{bag_id}-{idx}")["attempt_list"]:
            out.append((f"{bag_id}-{idx}.{attempt['number']}", attempt["executor_ref"]))
    return out


def test_callbacks_are_signed_idempotent_and_move_only_forward(make_slurm_daemon, slurm_cluster):
    daemon = make_slurm_daemon(max_vms=1)
    client = daemon.start()
    bag = client.submit(
        {
            "account": "lab",
            "command": "sleep 0.5; exit {code}",
            "parameters": {"code": [0, 3]},
            "max_runtime_s": 60,
            "max_attempts": 1,
        }
    )
    assert wait_for_bag(client, bag["id"], 60)["state"] == "failed"
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        (controller_id,) = conn.execute(
            "SELECT value FROM meta WHERE key = 'controller_id'"
        ).fetchone()
    attempt_id, job_id = job_names(client, bag["id"], 1)[0]
    name = f"sb:{controller_id}:{attempt_id}"
    # The hooks' jobcomp events arrive (the attempts may have ended from their exit files).
    wait_until(lambda: db_counts(daemon)["callbacks"] >= 2, 30, 0.1, "the jobcomp callbacks")
    time.sleep(0.5)
    before = db_counts(daemon)
    ended = client.job(f"{bag['id']}-0")

    lie = {"event": "jobcomp", "job_name": name, "job_id": job_id, "state": "FAILED",
           "exit_code": "9:0", "submit": 1, "end": 2}  # fmt: skip
    secret = slurm_cluster.hook_secret
    status, answer = post_event(client.url, secret, lie, sign_with=b"not the hook secret at all")
    assert status == 401 and "signature" in answer["error"]["message"]
    status, answer = post_event(client.url, secret, lie, timestamp=int(time.time()) - 3600)
    assert status == 401 and "window" in answer["error"]["message"]
    status, answer = post_event(client.url, secret, {"event": "jobcomp", "job_id": "x"})
    assert status == 400
    time.sleep(0.3)
    assert db_counts(daemon) == before  # nothing was recorded or changed

    # A jobcomp that contradicts the recorded end is noted, never applied (forward only).
    status, answer = post_event(client.url, secret, lie)
    assert (status, answer["duplicate"], answer["applied"]) == (200, False, False)
    # Out of order: the prolog and epilog of that job, after its end.
    for event in ("prolog_slurmctld", "epilog_slurmctld"):
        late = {"event": event, "job_name": name, "job_id": job_id, "restart_count": 0}
        status, answer = post_event(client.url, secret, late)
        assert (status, answer["applied"]) == (200, False)
    # A replay of one of them is a duplicate.
    status, answer = post_event(client.url, secret, late)
    assert (status, answer["duplicate"]) == (200, True)
    status, answer = post_event(client.url, secret, lie)
    assert (status, answer["duplicate"]) == (200, True)
    wait_until(lambda: db_counts(daemon)["callbacks"] == before["callbacks"] + 3, 10, 0.1)
    after = db_counts(daemon)
    assert {k: after[k] for k in ("transitions", "ledger", "attempts")} == {
        k: before[k] for k in ("transitions", "ledger", "attempts")
    }
    assert client.job(f"{bag['id']}-0") == ended
    assert client.job(f"{bag['id']}-1")["exit_code"] == 3


def start_sleepers(client, n: int, seconds: float) -> dict:
    return client.submit(
        {
            "account": "lab",
            "command": f"sleep {seconds}; echo done {{i}}",
            "parameters": {"i": list(range(n))},
            "max_runtime_s": 120,
            "max_attempts": 3,
        }
    )


def all_running(client, bag_id: str, n: int) -> bool:
    jobs = [client.job(f"{bag_id}-{i}") for i in range(n)]
    return all(j["attempt_list"] and j["attempt_list"][-1]["state"] == "running" for j in jobs)


def check_ran_once(client, bag_id: str, n: int) -> float:
    """Every job succeeded with one attempt whose log says it ran once; the CPU-hours
    those attempts held."""
    cpu_h = 0.0
    for i in range(n):
        job = client.job(f"{bag_id}-{i}")
        assert job["state"] == "succeeded" and job["attempts"] == 1, job
        (attempt,) = job["attempt_list"]
        assert Path(attempt["log_path"]).read_text() == f"done {i}\n"
        cpu_h += (attempt["ended_at"] - attempt["started_at"]) / 3600.0
    return cpu_h


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_jobs_running_in_slurm_survive_a_controller_restart(make_slurm_daemon, slurm_cluster, how):
    daemon = make_slurm_daemon(max_vms=2)
    client = daemon.start()
    n = 4
    bag = start_sleepers(client, n, 4)
    wait_until(lambda: all_running(client, bag["id"], n), 60, 0.1, "every job running")
    spool = slurm_cluster.spool_dir
    spooled_before = set(spool.glob("*.json"))
    daemon.stop(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)

    # Down: the jobs end in Slurm, and their jobcomp events wait in the hooks' spool.
    try:
        wait_until(
            lambda: len(set(spool.glob("*.json")) - spooled_before) >= n, 60, 0.2, "spooled events"
        )
    except AssertionError as exc:
        jobs = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%N")
        log = (slurm_cluster.base / "log" / "slurmctld.log").read_text()[-3000:]
        raise AssertionError(
            f"{exc}\nspool: {sorted(p.name for p in spool.glob('*'))}\n"
            f"jobs: {[j for j in jobs.splitlines() if bag['id'] in j]}\nslurmctld: {log}"
        ) from None
    client = daemon.start()
    done = wait_for_bag(client, bag["id"], 60)
    assert done["state"] == "succeeded", daemon.log()[-4000:]
    cpu_h = check_ran_once(client, bag["id"], n)
    listed = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%j")
    assert sum(1 for line in listed.splitlines() if bag["id"] in line) == n  # none rerun

    # The next hook run delivers the spool: another job's end.
    second = start_sleepers(client, 1, 0.1)
    wait_for_bag(client, second["id"], 60)
    wait_until(lambda: not list(spool.glob("*.json")), 30, 0.2, "the spool drained")

    def jobcomp_keys() -> list[str]:
        with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
            rows = conn.execute("SELECT key FROM callbacks WHERE kind = 'jobcomp'").fetchall()
        return [key for (key,) in rows if bag["id"] in key]

    # Each late end is noted once (with the scheduler's next pass).
    assert len(wait_until(lambda: len(jobcomp_keys()) >= n and jobcomp_keys(), 10, 0.1)) == n

    entries = client.ledger("lab")["entries"]
    charges = [e for e in entries if e["kind"] == "charge" and e["key"].startswith(bag["id"])]
    assert len(charges) == n  # one charge per attempt, none twice
    assert sum(e["cpu_h"] for e in charges) == pytest.approx(cpu_h, abs=1e-9)
