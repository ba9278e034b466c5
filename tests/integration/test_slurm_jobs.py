"""End to end through real Slurm: the daemon (local driver with VM hosts, Slurm
executor) launches VMs that join the test cluster as nodes, and every attempt runs as
a Slurm job on its VM's node. Preemptions injected through the API reach Slurm as
downed nodes; checkpointable jobs resume from their last checkpoint on new VMs and
compute what an uninterrupted run computes; every attempt's Slurm job id is recorded;
the ledger charges exactly the attempts' time.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for_bag, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

PROGRAM = REPO / "examples" / "programs" / "logistic.py"
ARGS = "--iterations 300000 --chunks 300 --seconds 8 --progress"
RATES = [3.6, 3.7, 3.8, 3.9]


def clean_result(r: float) -> dict:
    run = subprocess.run(
        [
            sys.executable,
            str(PROGRAM),
            "--r",
            str(r),
            *ARGS.replace("--seconds 8", "--seconds 0").split(),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
        env={"SPOTBAG_CHECKPOINT_DIR": "/nonexistent"},
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_checkpointable_bag_runs_on_the_vms_through_slurm_across_preemptions(
    make_slurm_daemon, slurm_cluster
):
    # One real second is one model hour; checkpoints every few seconds.
    daemon = make_slurm_daemon(model="exponential", mttf_h=200.0, time_scale=3600.0, max_vms=2)
    client = daemon.start()
    bag = client.submit(
        {
            "account": "physics",
            "command": f"hostname; {sys.executable} {PROGRAM} --r {{r}} {ARGS}",
            "parameters": {"r": RATES},
            "resources": {"cpus": 1, "memory_gb": 1.0},
            "max_runtime_s": 120,
            "estimated_runtime_s": 8,
            "checkpointable": True,
            "checkpoint_cost_s": 0.01,
            "max_attempts": 10,
            "workdir": str(REPO),
        }
    )

    def a_job_with_a_checkpoint() -> dict | None:
        for idx in range(len(RATES)):
            job = client.job(f"{bag['id']}-{idx}")
            mine = [
                c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == job["attempts"]
            ]
            if job["state"] == "running" and mine:
                return job
        return None

    job = wait_until(a_job_with_a_checkpoint, 90, 0.1, "a job with a checkpoint")
    preempted_vm = job["vm_id"]
    client.preempt(preempted_vm)
    done = wait_for_bag(client, bag["id"], 180)
    assert done["state"] == "succeeded", daemon.log()[-5000:]

    charged_cpu_h = 0.0
    for idx, rate in enumerate(RATES):
        job = client.job(f"{bag['id']}-{idx}")
        last = job["attempt_list"][-1]
        log = Path(last["log_path"]).read_text()
        # It ran on its VM's host (named after the VM), as a Slurm job there.
        assert log.splitlines()[0] == last["vm_id"], log[:200]
        # The program's last line is its result (slurmstepd may add a line after it: a
        # checkpoint signal that came as the program exited, "failed signal 10").
        result = json.loads([x for x in log.splitlines() if x.startswith("{")][-1])
        assert result["lyapunov"] == clean_result(rate)["lyapunov"]
        assert result["attempt"] == job["attempts"]
        for attempt in job["attempt_list"]:
            assert re.fullmatch(r"[0-9]+", attempt["executor_ref"]), attempt
            if attempt["state"] in ("succeeded", "preempted", "failed"):
                charged_cpu_h += (attempt["ended_at"] - attempt["started_at"]) / 3600.0

    moved = [
        a
        for idx in range(len(RATES))
        for a in client.job(f"{bag['id']}-{idx}")["attempt_list"]
        if a["vm_id"] == preempted_vm
    ]
    assert any(a["state"] == "preempted" for a in moved)
    resumed = [
        idx
        for idx in range(len(RATES))
        if "resuming from iteration"
        in Path(client.job(f"{bag['id']}-{idx}")["attempt_list"][-1]["log_path"]).read_text()
    ]
    assert resumed, "no job resumed from a checkpoint"

    # The ledger charged exactly the attempts' time (1 CPU each), and holds nothing.
    entries = client.ledger("physics")["entries"]
    charges = sum(e["cpu_h"] for e in entries if e["kind"] == "charge")
    assert charges == pytest.approx(charged_cpu_h, abs=1e-9)
    balance = client.account("physics")
    assert balance["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-9)

    # Slurm saw every attempt as a job on a spotbag node, and none is left running. The
    # bag ends with its programs' exit markers; slurmctld hears of the batch scripts'
    # ends a moment later (seconds on a busy host).
    def slurm_jobs(settled: bool) -> list[list[str]] | None:
        listed = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%j|%N|%T")
        names = [line.split("|") for line in listed.splitlines() if bag["id"] in line]
        live = [n for n in names if n[2] in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING")]
        return names if not (settled and live) else None

    try:
        wait_until(lambda: slurm_jobs(settled=True), 60, 0.5, "Slurm to see every job end")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: {slurm_jobs(settled=False)}") from None
    names = slurm_jobs(settled=False)
    assert names is not None
    total_attempts = sum(client.job(f"{bag['id']}-{i}")["attempts"] for i in range(len(RATES)))
    assert len(names) == total_attempts
    assert all(node.startswith("sb-vm-") for _, node, _ in names if node)
    # No node: a job queued on the preempted VM, cancelled before it ran.
    assert all(state == "CANCELLED" for _, node, state in names if not node), names
    assert not [n for n in names if n[2] in ("RUNNING", "PENDING")]
    # Each job's last attempt, which succeeded, completed in Slurm's records too: its VM
    # was kept until Slurm heard the batch script end. Only a VM the model preempted in
    # that moment (its program had exited; slurmctld had not heard yet) leaves NODE_FAIL.
    state_of = {name.rsplit(":", 1)[-1]: state for name, _, state in names}
    vm_state = {vm["id"]: vm["state"] for vm in client.vms(include_ended=True)["vms"]}
    for idx in range(len(RATES)):
        job = client.job(f"{bag['id']}-{idx}")
        slurm_state = state_of[f"{bag['id']}-{idx}.{job['attempts']}"]
        last_vm = job["attempt_list"][-1]["vm_id"]
        if slurm_state == "NODE_FAIL" and vm_state.get(last_vm) == "preempted":
            continue
        assert slurm_state == "COMPLETED", (names, last_vm, vm_state)


def test_a_bag_runs_each_job_exactly_once_across_a_slurmctld_restart(
    make_slurm_daemon, slurm_cluster, tmp_path
):
    """slurmctld stops for 8 s mid-bag (as when it dies and systemd restarts it,
    docs/slurm.md) and starts again on its saved state: the daemon's Slurm calls fail
    meanwhile and are made again; every job succeeds, each program ran exactly once
    (a line per execution, written first), and the bag's account holds nothing."""
    daemon = make_slurm_daemon(max_vms=2)
    client = daemon.start()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    executions = shared / "executions"
    bag = client.submit(
        {
            "account": "physics",
            "command": f'echo "$SPOTBAG_JOB_ID $SPOTBAG_ATTEMPT" >> {executions}; sleep 2',
            "parameters": {"i": {"range": [0, 16]}},
            "resources": {"cpus": 1, "memory_gb": 1.0},
            "max_runtime_s": 60,
            "max_attempts": 5,
            "workdir": str(shared),
        }
    )

    def ran() -> list[str]:
        return executions.read_text().splitlines() if executions.exists() else []

    wait_until(lambda: len(ran()) >= 4, 120, 0.2, "the first executions")
    slurm_cluster.stop_slurmctld()
    time.sleep(8)
    slurm_cluster.start_slurmctld()
    done = wait_for_bag(client, bag["id"], 240)
    assert done["state"] == "succeeded", daemon.log()[-5000:]
    jobs = [line.split()[0] for line in ran()]
    assert sorted(set(jobs)) == sorted(f"{bag['id']}-{i}" for i in range(16))
    twice = [job for job in set(jobs) if jobs.count(job) > 1]
    assert not twice, (twice, daemon.log()[-3000:])
    account = client.account("physics")
    assert account["reserved_cpu_h"] == pytest.approx(0, abs=1e-9)
    assert account["charged_cpu_h"] > 0
