"""End to end: a checkpointable job under the daemon (local driver, real processes) is
signalled on its schedule, preempted, and resumes from its last checkpoint on a new
VM, redoing less than one checkpoint interval of work and computing exactly what an
uninterrupted run computes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import REPO, wait_for_bag, wait_until

PROGRAM = REPO / "examples" / "programs" / "logistic.py"
ARGS = "--r 3.7 --iterations 400000 --chunks 400 --seconds 16 --progress"


def test_a_preempted_job_resumes_from_its_checkpoint_on_a_new_vm(make_daemon):
    # One real second is one model hour; VMs live 200 model hours on average, so the
    # optimal period for a checkpoint of 36 model seconds is about 2 model hours (2 s).
    daemon = make_daemon(model="exponential", mttf_h=200.0, time_scale=3600.0, max_vms=2)
    client = daemon.start()
    bag = client.submit(
        {
            "account": "lab",
            "command": f"{sys.executable} {PROGRAM} {ARGS}",
            "max_runtime_s": 120,
            "estimated_runtime_s": 16,
            "checkpointable": True,
            "checkpoint_cost_s": 0.01,
            "max_attempts": 10,
            "workdir": str(REPO),
        }
    )
    job_id = f"{bag['id']}-0"

    def checkpointed_twice() -> dict | None:
        job = client.job(job_id)
        if job["state"] != "running":
            return None
        number = job["attempts"]
        written = [c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == number]
        return job if len(written) >= 2 else None

    job = wait_until(checkpointed_twice, 60, 0.05, "two checkpoints")
    preempted_attempt = job["attempts"]
    client.preempt(job["vm_id"])
    done = wait_for_bag(client, bag["id"], 90)
    assert done["state"] == "succeeded", daemon.log()

    job = client.job(job_id)
    attempts = job["attempt_list"]
    assert attempts[preempted_attempt - 1]["state"] == "preempted"
    resumed = attempts[preempted_attempt]
    assert resumed["vm_id"] != attempts[preempted_attempt - 1]["vm_id"]  # a new VM

    before = (REPO / attempts[preempted_attempt - 1]["log_path"]).read_text()
    after = (REPO / resumed["log_path"]).read_text()
    saved = [int(n) for n in re.findall(r"checkpoint at iteration (\d+)", before)]
    reached = max(int(n) for n in re.findall(r"^iteration (\d+)$", before, re.M))
    (resumed_from,) = [int(n) for n in re.findall(r"resuming from iteration (\d+)", after)]
    assert len(saved) >= 2
    assert resumed_from == saved[-1]  # the last checkpoint, not an earlier one or zero
    redone = reached - resumed_from
    interval = saved[-1] - saved[-2]
    assert 0 <= redone < interval, (redone, interval)

    # The store agrees: what the preemption lost is less than one interval of work.
    usage = client.bag(bag["id"])["usage"]
    ok = [c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == preempted_attempt]
    interval_s = ok[-1]["requested_at"] - ok[-2]["at"]
    assert usage["checkpoints"] >= 2
    assert 0 < usage["lost_hours"] * 3600 < interval_s
    assert job["work_saved_s"] > 0 and job["checkpoints"] == usage["checkpoints"]

    # Resuming computed exactly what an uninterrupted run computes.
    result = json.loads(after.strip().splitlines()[-1])
    clean = subprocess.run(
        [sys.executable, str(PROGRAM), *ARGS.replace("--seconds 16", "--seconds 0").split()],
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
        env={"SPOTBAG_CHECKPOINT_DIR": "/nonexistent"},
    )
    expected = json.loads(clean.stdout.strip().splitlines()[-1])
    assert result["lyapunov"] == expected["lyapunov"]
    assert result["attempt"] == preempted_attempt + 1
