"""One account's Slurm job cannot forge another account's result (issue 23), through
real Slurm: with `run_as = "spotbag-{account}"` each account's attempts are Slurm jobs
of its own user (root's `sbatch --uid`), whose files on the shared directory are made
by the daemon for that user alone; the forging job of tests/integration/forgery.py
runs beside its victim on the same VM.
"""

from __future__ import annotations

import pwd
import signal
import time

import pytest

from tests.conftest import plain_user, wait_for_bag, wait_until
from tests.integration.forgery import (
    FORGER,
    SHARED_USER,
    VICTIM,
    as_run_as,
    completions,
    forger_command,
    forger_report,
    log_of,
    user_of,
    victim_command,
    workspace,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

ONE_CPU = {"cpus": 1, "memory_gb": 1.0}


@pytest.mark.parametrize("users", ["per-account", "shared"])
def test_a_slurm_job_of_one_account_cannot_forge_the_result_of_anothers(
    make_slurm_daemon, slurm_cluster, passable_dir, users
):
    """Account B's job runs on a VM (30 s on its first attempt); account A's job, on the
    same VM, looks for B's attempt ids in /proc/*/environ and writes "0" into B's
    exit-status file on the shared directory (which the executor watches), a line into
    its start marker, files into its checkpoint directory and beside its log, and
    submits a Slurm job of its own named like B's attempt's job; then the daemon is
    killed (SIGKILL) and started again while B's program still works.

    With a user per account, A finds nothing and every write is refused; B's attempt
    stays running through the restart (its Slurm job outlives the controller) and is
    recorded succeeded once, after B's program wrote its own completion line; A's job
    named like B's is cancelled. With both
    accounts sharing one user the same job makes the executor record B's unfinished
    attempt as succeeded at once: that run shows this test catches the forgery."""
    if users == "per-account":
        victim_user, forger_user = user_of(VICTIM), user_of(FORGER)
        lines = 'run_as = "spotbag-{account}"\n'
    else:
        victim_user = forger_user = pwd.getpwnam(plain_user(SHARED_USER))
        lines = f'run_as_accounts = {{{VICTIM} = "{SHARED_USER}", {FORGER} = "{SHARED_USER}"}}\n'
    daemon = make_slurm_daemon(max_vms=1, base=passable_dir)
    daemon.config_path.write_text(as_run_as(daemon.config_path.read_text(), lines))
    shared = passable_dir / f"shared-{daemon.state_dir.name}"
    with workspace(victim_user.pw_name) as (program, out):
        client = daemon.start()
        victim = client.submit(
            {
                "account": VICTIM,
                "command": victim_command(out, 30),
                "max_runtime_s": 120,
                "resources": ONE_CPU,
            }
        )
        job = f"{victim['id']}-0"
        wait_until(lambda: "victim-running" in log_of(client, job), 90, 0.2, "B's job to run")
        forger = client.submit(
            {
                "account": FORGER,
                "command": forger_command(
                    program, victim["id"], shared, victim_user.pw_uid, "spotbag"
                ),
                "max_runtime_s": 60,
                "resources": ONE_CPU,
            }
        )
        assert wait_for_bag(client, forger["id"], 60)["state"] == "succeeded"
        forger_attempt = client.job(f"{forger['id']}-0")["attempt_list"][-1]
        said = log_of(client, f"{forger['id']}-0")
        report = forger_report(said)
        assert set(report) == {"environ", "exit", "started", "checkpoint", "logdir", "impostor"}
        impostor = report["impostor"]
        assert impostor.isdigit(), said
        victim_attempt = client.job(job)["attempt_list"][0]
        # Both ran on the one VM, each as its account's user.
        assert forger_attempt["vm_id"] == victim_attempt["vm_id"]
        for attempt, user in ((forger_attempt, forger_user), (victim_attempt, victim_user)):
            listed = slurm_cluster.run(
                "squeue", "-h", "-t", "all", "-j", attempt["executor_ref"], "-o", "%U"
            )
            assert listed.strip() == str(user.pw_uid), (attempt, listed)

        if users == "shared":
            # One user for both accounts: A read B's attempt from its environment and
            # wrote its exit status; the executor took B's unfinished attempt for a success.
            assert report["environ"].startswith("found=1 "), said
            assert report["exit"] == "written", said
            wait_until(
                lambda: client.job(job)["attempt_list"][0]["state"] == "succeeded",
                10,
                0.1,
                "the forged success",
            )
            assert f"{job}.1" not in completions(out)
            slurm_cluster.run("scancel", victim_attempt["executor_ref"], impostor, check=False)
            return

        # The executor reads B's files every 0.1 s: a forged status would be taken by now.
        time.sleep(2)
        assert client.job(job)["attempt_list"][0]["state"] == "running"
        assert completions(out) == {}
        daemon.stop(signal.SIGKILL)
        client = daemon.start()
        assert wait_for_bag(client, victim["id"], 120)["state"] == "succeeded"
        attempts = client.job(job)["attempt_list"]
        ended = completions(out)

    assert forger_user.pw_uid != victim_user.pw_uid
    # A saw B's processes but not their environment, and could write nothing of B's.
    found, denied = report["environ"].split()
    assert found == "found=0" and int(denied.partition("=")[2]) >= 1, said
    for what in ("exit", "started", "checkpoint", "logdir"):
        assert report[what] == "denied EACCES", said
    assert not (shared / "checkpoints" / victim["id"] / job / "forged").exists()
    # B's one attempt lived through the restart and was recorded succeeded only after its
    # program wrote its completion line.
    assert [a["state"] for a in attempts] == ["succeeded"], attempts
    assert list(ended) == [f"{job}.1"]
    assert attempts[0]["ended_at"] >= ended[f"{job}.1"] - 0.05, (attempts, ended)
    # A's job named like B's, though newer, was not taken for B's (B's attempt would have
    # been lost at the restart and run again): it was cancelled, as an orphan.
    impostor_state = slurm_cluster.run("squeue", "-h", "-t", "all", "-j", impostor, "-o", "%U|%T")
    assert impostor_state.strip() == f"{forger_user.pw_uid}|CANCELLED", impostor_state
    assert daemon.stop() == 0
