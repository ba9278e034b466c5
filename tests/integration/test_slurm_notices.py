"""Preemption notices heard on the VM, through real Slurm: the local driver's VM hosts
see a cloud's metadata server (drivers/local_metadata.py), the notice watcher their
boot script starts (drivers/templates/notice_watch.py) drains the node with "spot
notice: ends by T", and the controller's node poll turns that into the notice the
scheduler acts on. The driver's API path is off (`api_notices = false`): what happens
here happens because the VM heard it.

Checked from what the programs did (their own trace files): the running job
checkpoints after the notice, and its retry resumes from that checkpoint on the VM
launched at the notice, starting within 5 s of the old VM's end. A rebalance
recommendation only drains the VM: its job finishes there, nothing new goes there, and
the VM is released, losing nothing.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for_bag, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

LEAD_S = 20  # the notice's lead; GCE gives 30 s, EC2 120 s
STEP_S = 0.1

# A checkpointable job that writes down what it does, with the time and the host (a VM
# host's name is its VM's id): where it started from, each checkpoint, its end.
PROGRAM = """\
import json, os, signal, socket, sys, time
from pathlib import Path

trace, steps, step_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
state = Path(os.environ["SPOTBAG_CHECKPOINT_DIR"]) / "state.json"
wanted = False


def note(event, step):
    with trace.open("a") as out:
        line = {"t": time.time(), "host": socket.gethostname(), "event": event, "step": step}
        out.write(json.dumps(line) + "\\n")


def want(signum, frame):
    global wanted
    wanted = True


signal.signal(signal.SIGUSR1, want)
step = json.loads(state.read_text())["step"] if state.exists() else 0
note("start", step)
while step < steps:
    time.sleep(step_s)
    step += 1
    if wanted:
        wanted = False
        tmp = state.with_name(".state.json.tmp")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, state)
        note("checkpoint", step)
note("done", step)
"""


def logged_at(log: str, text: str) -> float:
    """Epoch seconds of the daemon's first log line holding `text` (its asctime, local
    time, as the daemon logs: "2026-11-27 08:52:35,123 INFO ...")."""
    for line in log.splitlines():
        if text in line:
            stamp, millis = line[:23].split(",")
            return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    raise AssertionError(f"no log line with {text!r}")


def notice_daemon(make_slurm_daemon, metadata: str, **kwargs):
    """A daemon whose VM hosts see `metadata`'s server, and whose driver tells no notice
    through its API."""
    daemon = make_slurm_daemon(**kwargs)
    text = daemon.config_path.read_text()
    driver = (
        f'[driver]\nmetadata_server = "{metadata}"\napi_notices = false\nnotice_lead_s = {LEAD_S}\n'
    )
    daemon.config_path.write_text(text.replace("[driver]\n", driver, 1))
    return daemon


def trace_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def vm_story(daemon, vm_id: str) -> str:
    """What a VM host said (its console, its notice watcher's log, read through a
    process of its namespace) and the daemon's last lines: the message of a wait that
    timed out."""
    told = [f"--- daemon log (end) ---\n{daemon.log()[-4000:]}"]
    for record in (daemon.state_dir / "vms" / "hosts").glob("*.json"):
        host = json.loads(record.read_text())
        if host.get("vm_id") != vm_id:
            continue
        console = Path(host["console"])
        told.append(f"--- console ---\n{console.read_text(errors='replace')[-3000:]}")
        pids = subprocess.run(
            ["ip", "netns", "pids", host["namespace"]], capture_output=True, text=True
        ).stdout.split()
        for pid in pids[:1]:
            watch_log = Path(f"/proc/{pid}/root/var/log/spotbag-notice-watch.log")
            with contextlib.suppress(OSError):
                told.append(f"--- notice watcher ---\n{watch_log.read_text()[-3000:]}")
    return "\n".join(told)


def views(client) -> dict[str, dict]:
    return {v["id"]: v for v in client.vms(include_ended=True)["vms"]}


@pytest.mark.parametrize("metadata", ["gce", "aws"])
def test_a_notice_heard_on_the_vm_moves_the_job_to_a_vm_launched_at_the_notice(
    make_slurm_daemon, tmp_path, metadata
):
    daemon = notice_daemon(make_slurm_daemon, metadata, max_vms=3)
    client = daemon.start()
    program = tmp_path / "steps.py"
    program.write_text(PROGRAM)
    trace = tmp_path / "trace.jsonl"
    steps = int(20 / STEP_S)  # 20 s of work
    bag = client.submit(
        {
            "account": "lab",
            "command": f"{sys.executable} {program} {trace} {steps} {STEP_S}",
            "resources": {"cpus": 1, "memory_gb": 1.0},
            "max_runtime_s": 300,
            "estimated_runtime_s": 20,
            "checkpointable": True,
            "checkpoint_cost_s": 1.0,
            "max_attempts": 5,
        }
    )
    job_id = f"{bag['id']}-0"
    wait_until(
        lambda: trace.exists() and time.time() - trace_of(trace)[0]["t"] > 3,
        90,
        0.1,
        "the job running for 3 s",
    )
    old_vm = client.job(job_id)["vm_id"]
    noticed_at = time.time()
    client.preempt(old_vm, notice_s=LEAD_S)

    # Heard on the VM (the watcher: at once on GCE, within 2 s on EC2), then by the
    # node poll (every 5 s).
    try:
        seen = wait_until(
            lambda: views(client)[old_vm]["notice_until"] or None, 15, 0.1, "the notice heard"
        )
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{vm_story(daemon, old_vm)}") from None
    heard_s = time.time() - noticed_at
    assert seen == pytest.approx(noticed_at + LEAD_S, abs=2.0)
    assert "spot notice: ends by " in daemon.log()

    done = wait_for_bag(client, bag["id"], 180)
    assert done["state"] == "succeeded", daemon.log()[-5000:]
    job = client.job(job_id)
    first, *rest = job["attempt_list"]
    assert first["vm_id"] == old_vm
    assert first["state"] == "lost" and first["reason"].startswith("migrated: spot notice on ")
    (retry,) = rest
    assert retry["state"] == "succeeded" and retry["vm_id"] != old_vm
    assert client.bag(bag["id"])["usage"]["lost_hours"] == 0

    # What the program did: started on the old VM, checkpointed once, after the
    # notice; started again on the replacement from exactly that checkpoint.
    lines = trace_of(trace)
    starts = [x for x in lines if x["event"] == "start"]
    checkpoints = [x for x in lines if x["event"] == "checkpoint"]
    assert [x["host"] for x in starts] == [old_vm, retry["vm_id"]], lines
    assert starts[0]["step"] == 0
    (checkpoint,) = checkpoints
    assert checkpoint["host"] == old_vm and checkpoint["t"] >= noticed_at
    assert starts[1]["step"] == checkpoint["step"] > 0
    assert lines[-1]["event"] == "done" and lines[-1]["host"] == retry["vm_id"]

    # The replacement was launched when the notice was heard, and the retry started on
    # it within 5 s of the old VM's end (drained, it is ended as soon as its job has
    # moved, or taken by the cloud LEAD_S after the notice), or of the replacement
    # joining Slurm if that was later: a test VM host (a namespace and its slurmd) can
    # take LEAD_S and more to join on a machine the rest of the suite keeps busy.
    fleet = views(client)
    replacement, old = fleet[retry["vm_id"]], fleet[old_vm]
    assert noticed_at <= replacement["requested_at"] <= noticed_at + heard_s + 1.0, replacement
    assert old["ended_at"] is not None and old["ended_at"] <= noticed_at + LEAD_S + 1.0
    joined_at = logged_at(daemon.log(), f"VM {retry['vm_id']} joined")
    usable_at = max(old["ended_at"], joined_at)
    assert starts[1]["t"] - usable_at <= 5.0, (starts[1], old, joined_at)
    daemon.stop()


def test_a_rebalance_recommendation_drains_the_vm_which_is_released_losing_nothing(
    make_slurm_daemon, tmp_path
):
    daemon = notice_daemon(make_slurm_daemon, "aws", max_vms=3)
    client = daemon.start()
    first = client.submit(
        {
            "account": "lab",
            "command": "sleep 12; hostname",
            "resources": {"cpus": 1, "memory_gb": 1.0},
            "max_runtime_s": 120,
            "max_attempts": 3,
        }
    )
    job_id = f"{first['id']}-0"

    def program_running() -> dict | None:
        job = client.job(job_id)
        return job if any(a["ran_at"] for a in job["attempt_list"]) else None

    job = wait_until(program_running, 90, 0.1, "the job's program running")
    vm_id = job["vm_id"]
    client.rebalance(vm_id)
    # Heard on the VM (IMDS, polled every 2 s), then by the node poll (every 5 s).
    wait_until(
        lambda: f"VM {vm_id}: spot rebalance: recommended at " in daemon.log(),
        15,
        0.1,
        "the recommendation heard",
    )
    # A job that would fit beside the first one goes elsewhere: the VM is drained.
    second = client.submit(
        {
            "account": "lab",
            "command": "hostname",
            "resources": {"cpus": 1, "memory_gb": 1.0},
            "max_runtime_s": 120,
        }
    )
    for bag in (first, second):
        assert wait_for_bag(client, bag["id"], 120)["state"] == "succeeded", daemon.log()[-5000:]
    (attempt,) = client.job(job_id)["attempt_list"]  # not moved: it finished there
    assert attempt["state"] == "succeeded" and attempt["vm_id"] == vm_id
    assert Path(attempt["log_path"]).read_text().split() == [vm_id]
    (other,) = client.job(f"{second['id']}-0")["attempt_list"]
    assert other["vm_id"] != vm_id
    # Released once empty (not preempted: a recommendation is no notice), losing nothing;
    # empty once Slurm has seen its job end (Executor.vms_settling: seconds on a busy host).
    ended = wait_until(
        lambda: views(client)[vm_id]["ended_at"] and views(client)[vm_id], 60, 0.2, "the VM ended"
    )
    assert ended["state"] == "terminated" and "spot rebalance" in ended["reason"], ended
    assert ended["notice_until"] is None
    assert client.bag(first["id"])["usage"]["lost_hours"] == 0
    daemon.stop()
