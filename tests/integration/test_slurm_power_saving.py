"""Slurm users' own jobs on spot VMs (power saving): a plain user's `sbatch -p spot`
makes slurmctld resume a CLOUD node of the pool; its ResumeProgram hook asks the
daemon, which launches a VM for that node (local driver, VM hosts); the VM's slurmd
joins under the node's name and the job runs there. Each run is reserved for at its
start and charged at its end to the account named like its Slurm account (its user's
when Slurm gives "(null)", as it does without slurmdbd), and shows in the account's
cost report; a preempted pool VM is powered down by force, so Slurm requeues the job,
which resumes on a new VM; a job its account cannot pay for, or whose account spotbag
does not know, is cancelled with the reason; an idle node is suspended and its VM
terminated.

Jobs run as plain users in a world-writable directory of their own under /tmp, given
with --chdir: wherever this checkout sits (CI's clone may be under a 0700 directory),
their working directory is one they can enter. Each job prints `host=<its host>`, and
the tests read that line, not the first word of the output.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.cli.client import ClientError
from tests.conftest import SAY_HOST, Daemon, plain_user, pool_vms_alive, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture
def pool_daemon(pool_daemons) -> Daemon:
    return pool_daemons(max_vms=2)


@pytest.fixture
def out_dir() -> Iterator[Path]:
    """Where the users' jobs run and write their output: a directory anyone may enter
    and write, so that the job's user can, whatever the mode of this checkout's
    parents."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-pool-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def submit_as_user(cluster, out_dir: Path, *args: str, user: str = "nobody") -> str:
    """sbatch as a plain user, not as root, running in `out_dir`."""
    line = cluster.run(
        "runuser",
        "-u",
        user,
        "--",
        "env",
        f"SLURM_CONF={cluster.conf}",
        "sbatch",
        "--parsable",
        "-p",
        "spot",
        f"--chdir={out_dir}",
        f"--output={out_dir}/%j.out",
        *args,
    )
    return line.strip().split(";")[0]


def job_field(cluster, job_id: str, fmt: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", fmt, check=False).strip()


def job_hosts(out_dir: Path, job_id: str) -> list[str]:
    """The hosts the job said it ran on (its `host=` lines; one per run when requeued
    into the same file), from its output file."""
    path = out_dir / f"{job_id}.out"
    text = path.read_text() if path.exists() else ""
    return [line[len("host=") :] for line in text.splitlines() if line.startswith("host=")]


def vm_record(client, vm_id: str) -> dict:
    """The VM as GET /v1/vms lists it, waited for rather than indexed (issue 22 saw a
    KeyError there at load ~8): a VM that never shows fails naming what was awaited."""

    def listed() -> dict | None:
        return {v["id"]: v for v in client.vms(include_ended=True)["vms"]}.get(vm_id)

    return wait_until(listed, 30, 0.2, f"VM {vm_id!r} in GET /v1/vms")  # type: ignore[return-value]


def runs(daemon) -> list[dict]:
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM slurm_runs ORDER BY started_at")]


def ended_runs(daemon, job_id: str) -> list[dict]:
    return [r for r in runs(daemon) if r["job_id"] == job_id and r["state"] != "running"]


def preempted(client, vm_id: str) -> bool:
    try:
        client.preempt(vm_id)
    except ClientError as exc:
        if "still being launched" not in exc.message:
            raise
        return False
    return True


def test_slurm_users_jobs_run_on_spot_vms_and_are_charged(pool_daemon, slurm_cluster, out_dir):
    client = pool_daemon.start()
    client.create_account("chem", cpu_hours=1000)

    # 1. A plain user's job resumes a pool node; spotbag backs it with a spot VM.
    began = time.monotonic()
    first = submit_as_user(slurm_cluster, out_dir, "-A", "chem", "--wrap", f"{SAY_HOST}; sleep 1")
    wait_until(lambda: job_field(slurm_cluster, first, "%T") == "COMPLETED", 90, 0.2, "the job")
    took_s = time.monotonic() - began
    (host,) = job_hosts(out_dir, first)
    assert vm_record(client, host)["pool_node"].startswith("spot-")
    # Its end reaches the daemon with the jobcomp hook, which runs after Slurm's own.
    (run,) = wait_until(
        lambda: [r for r in runs(pool_daemon) if r["state"] != "running"], 30, 0.1, "its end"
    )
    assert (run["job_id"], run["account"], run["state"], run["vm_id"]) == (
        first,
        "chem",
        "succeeded",
        host,
    )
    assert 1.0 <= run["ended_at"] - run["started_at"] <= 15.0
    entries = [e for e in client.ledger("chem")["entries"] if e["key"] == run["key"]]
    kinds = {e["kind"]: e["cpu_h"] for e in entries}
    assert set(kinds) == {"reserve", "charge", "release"}
    assert kinds["charge"] == pytest.approx(
        run["cpus"] * (run["ended_at"] - run["started_at"]) / 3600
    )
    assert kinds["reserve"] == pytest.approx(run["cpus"] * 2.0)  # no limit: reserve_hours
    assert kinds["charge"] + kinds["release"] == pytest.approx(kinds["reserve"])
    report = client.request("GET", "/v1/reports", query={"account": "chem"})
    (row,) = [b for b in report["by_bag"] if b["bag_id"] == run["key"]]
    assert (
        row["vm_h"] > 0
        and row["spot_cost_usd"] > 0
        and row["cpu_h"] == pytest.approx(kinds["charge"])
    )

    # 2. A preempted pool VM: the node is powered down, Slurm requeues the job, it
    # resumes on a new VM and finishes.
    second = submit_as_user(
        slurm_cluster, out_dir, "-A", "chem", "--wrap", f"{SAY_HOST}; sleep 6; echo survived"
    )
    wait_until(lambda: job_field(slurm_cluster, second, "%T") == "RUNNING", 90, 0.2, "it to run")
    victim = wait_until(lambda: job_hosts(out_dir, second), 30, 0.1, "its host")[0]
    # The job may run before the daemon has recorded its VM's launch (its provider id):
    # the API says so (409, "still being launched") until it has.
    wait_until(lambda: preempted(client, victim), 30, 0.2, f"{victim} to be preempted")
    wait_until(
        lambda: job_field(slurm_cluster, second, "%T") == "COMPLETED", 150, 0.5, "the requeued job"
    )
    output = (out_dir / f"{second}.out").read_text().split()
    assert output[-1] == "survived" and job_hosts(out_dir, second)[-1] != victim  # ran again

    mine = wait_until(
        lambda: len(ended_runs(pool_daemon, second)) == 2 and ended_runs(pool_daemon, second),
        30,
        0.1,
        "both runs",
    )
    assert [r["state"] for r in mine] == ["preempted", "succeeded"]
    assert [r["restart"] for r in mine] == [0, 1]
    charged = [
        e
        for e in client.ledger("chem")["entries"]
        if e["kind"] == "charge" and f":{second}:" in e["key"]
    ]
    assert len(charged) == 2  # both runs, each once

    # 3. An account that cannot pay: its job is cancelled, and says why.
    client.create_account("poor", cpu_hours=0.01)
    refused = submit_as_user(slurm_cluster, out_dir, "-A", "poor", "--time=60", "--wrap", "sleep 5")
    wait_until(
        lambda: job_field(slurm_cluster, refused, "%T") == "CANCELLED", 90, 0.2, "the refusal"
    )
    assert "needs 1.00 CPU-hours" in job_field(slurm_cluster, refused, "%k")
    assert client.account("poor")["charged_cpu_h"] == 0

    # 4. Idle pool nodes are suspended by Slurm and their VMs terminated.
    wait_until(lambda: not pool_vms_alive(client), 90, 0.5, "the pool's VMs to be released")
    ended = [v for v in client.vms(include_ended=True)["vms"] if v["pool_node"]]
    assert any("powered node" in v["reason"] for v in ended), [v["reason"] for v in ended]
    assert any(v["state"] == "preempted" for v in ended)
    print(f"first job on a fresh spot VM in {took_s:.1f} s")


def test_a_job_without_an_account_pays_from_its_users_account(pool_daemon, slurm_cluster, out_dir):
    """Without slurmdbd (the test cluster has none, as deploy/README allows) Slurm gives
    a job submitted without -A the account "(null)". Such a job is charged to the
    account named like its user; a user with no account has the job cancelled, the
    reason in its comment, and no account (neither "(null)" nor the user's) is made up:
    before, one "(null)" account was created unlimited and charged for every user."""
    other = plain_user()
    client = pool_daemon.start()
    client.create_account("nobody", cpu_hours=100)

    paid = submit_as_user(slurm_cluster, out_dir, "--wrap", f"{SAY_HOST}; sleep 1")
    wait_until(lambda: job_field(slurm_cluster, paid, "%T") == "COMPLETED", 90, 0.2, "the job")
    assert job_field(slurm_cluster, paid, "%u %a") == "nobody (null)"  # what Slurm holds
    (host,) = job_hosts(out_dir, paid)
    assert vm_record(client, host)["pool_node"].startswith("spot-")
    (run,) = wait_until(lambda: ended_runs(pool_daemon, paid), 30, 0.1, "its end")
    assert (run["user"], run["account"], run["state"]) == ("nobody", "nobody", "succeeded")
    kinds = {
        e["kind"]: e["cpu_h"] for e in client.ledger("nobody")["entries"] if e["key"] == run["key"]
    }
    assert set(kinds) == {"reserve", "charge", "release"}
    assert kinds["charge"] > 0
    assert client.account("nobody")["charged_cpu_h"] == pytest.approx(kinds["charge"])

    refused = submit_as_user(slurm_cluster, out_dir, "--wrap", SAY_HOST, user=other)
    wait_until(
        lambda: job_field(slurm_cluster, refused, "%T") == "CANCELLED", 90, 0.2, "the refusal"
    )
    assert job_field(slurm_cluster, refused, "%u %a") == f"{other} (null)"
    comment = job_field(slurm_cluster, refused, "%k")
    assert (
        f"Slurm user {other} has no spotbag account (account '(null)' given, matched by user name)"
        in comment
    ), comment
    assert f"`spotbag accounts create {other} --cpu-hours N`" in comment, comment
    assert [a["account"] for a in client.accounts()["accounts"]] == ["nobody"]
    assert not ended_runs(pool_daemon, refused)
    assert not [e for e in client.ledger("nobody")["entries"] if f":{refused}:" in e["key"]]
    assert client.account("nobody")["charged_cpu_h"] == pytest.approx(kinds["charge"])


def test_unknown_accounts_create_opens_a_limited_account(pool_daemons, slurm_cluster, out_dir):
    """`[slurm] unknown_accounts = "create"`: a user with no account gets one, with the
    configured credit and never unlimited. Its first job here needs more than that
    credit: it is cancelled like any other job its account cannot cover, and the
    account stays, for an admin to credit; the next job, which fits, runs and pays."""
    daemon = pool_daemons(
        max_vms=2, slurm='unknown_accounts = "create"\nunknown_account_cpu_h = 3.0\n'
    )
    user = plain_user()
    client = daemon.start()

    # 1 CPU for 4 h: more than the 3 CPU-hours the account is created with.
    big = submit_as_user(slurm_cluster, out_dir, "--time=240", "--wrap", SAY_HOST, user=user)
    wait_until(lambda: job_field(slurm_cluster, big, "%T") == "CANCELLED", 90, 0.2, "the refusal")
    comment = job_field(slurm_cluster, big, "%k")
    assert f"account '{user}' needs 4.00 CPU-hours but has 3.00 available" in comment, comment
    assert [a["account"] for a in client.accounts()["accounts"]] == [user]
    account = client.account(user)
    assert account["unlimited"] is False and account["allocation_cpu_h"] == 3.0
    assert account["charged_cpu_h"] == 0 and account["reserved_cpu_h"] == 0

    paid = submit_as_user(
        slurm_cluster, out_dir, "--time=30", "--wrap", f"{SAY_HOST}; sleep 1", user=user
    )
    wait_until(lambda: job_field(slurm_cluster, paid, "%T") == "COMPLETED", 90, 0.2, "the job")
    assert job_hosts(out_dir, paid)
    (run,) = wait_until(lambda: ended_runs(daemon, paid), 30, 0.1, "its end")
    assert (run["user"], run["account"], run["state"]) == (user, user, "succeeded")
    account = client.account(user)
    assert account["charged_cpu_h"] > 0 and account["reserved_cpu_h"] == 0
    assert [a["account"] for a in client.accounts()["accounts"]] == [user]
    assert not ended_runs(daemon, big)


def test_an_idle_pool_vm_the_reuse_policy_distrusts_is_handed_back(
    pool_daemons, slurm_cluster, out_dir
):
    """VMs live 24 model hours (1 real second = a quarter of a model hour here: 96 s, so
    a busy host's slow boot does not let the cloud take the VM first) and the pool's
    jobs take 20: from about 4 h on, a fresh VM does such a job sooner than a warm one
    (docs/design.md#reuse). The first job runs 20 s (5 model hours). When it ends, the
    warm VM is handed back at once (Slurm would have kept it for SuspendTime), and the
    next job resumes the node on a fresh VM."""
    daemon = pool_daemons(
        max_vms=2, model="exponential", mttf_h=1e6, time_scale=900, pool="job_hours = 20.0\n"
    )
    text = daemon.config_path.read_text().replace(
        "mttf_h = 1000000.0\n", "mttf_h = 1000000.0\nmax_lifetime_h = 24.0\n"
    )
    assert "max_lifetime_h" in text
    daemon.config_path.write_text(text)
    client = daemon.start()
    client.create_account("nobody", cpu_hours=1000)  # the jobs' user's: they give no -A

    first = submit_as_user(slurm_cluster, out_dir, "--wrap", f"{SAY_HOST}; sleep 20")
    wait_until(lambda: job_field(slurm_cluster, first, "%T") == "COMPLETED", 150, 0.2, "job 1")
    (warm,) = job_hosts(out_dir, first)

    def ended(vm_id: str) -> dict | None:
        vm = vm_record(client, vm_id)
        return vm if vm["state"] in ("terminated", "preempted") else None

    gone = wait_until(lambda: ended(warm), 20, 0.2, "the warm VM to be handed back")
    assert gone["state"] == "terminated", gone
    assert "at spotbag's request" in gone["reason"], gone["reason"]
    assert "preemption model" in gone["reason"], gone["reason"]

    # The node was drained for its power-down; the next job still gets it, fresh.
    second = submit_as_user(slurm_cluster, out_dir, "--wrap", SAY_HOST)
    wait_until(lambda: job_field(slurm_cluster, second, "%T") == "COMPLETED", 90, 0.2, "job 2")
    (fresh,) = job_hosts(out_dir, second)
    assert fresh != warm


def test_a_pool_vm_lost_in_a_controller_crash_gives_its_job_back_at_once(
    pool_daemons, slurm_cluster, out_dir
):
    """The daemon is killed (SIGKILL) while the VM it launched for a resumed pool node
    boots (4 s here): that VM dies with it (the local driver's VMs live in the daemon
    until they have booted). At restart it is missing, and the daemon downs and powers
    down its node, as for a pool VM lost while it ran: Slurm requeues the job, resumes the
    node again, and the job runs on a new VM within a minute, not after ResumeTimeout
    (600 s), which it waited out before (the node left powering up)."""
    daemon = pool_daemons(max_vms=2)
    text = daemon.config_path.read_text().replace("boot_delay_s = 0.1\n", "boot_delay_s = 4.0\n")
    assert "boot_delay_s = 4.0" in text
    daemon.config_path.write_text(text)
    client = daemon.start()
    client.create_account("chem", cpu_hours=1000)
    job = submit_as_user(slurm_cluster, out_dir, "-A", "chem", "--wrap", SAY_HOST)

    def booting() -> list[dict]:
        return [v for v in pool_vms_alive(client) if v["state"] == "pending"]

    (lost,) = wait_until(booting, 60, 0.05, "a pool VM booting")
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    began = time.monotonic()
    client = daemon.start()
    record = wait_until(
        lambda: (vm := vm_record(client, lost["id"]))["state"] != "pending" and vm,
        30,
        0.1,
        "the lost VM recorded",
    )
    assert (record["state"], record["reason"]) == (
        "terminated",
        "not found after controller restart",
    ), record
    wait_until(lambda: job_field(slurm_cluster, job, "%T") == "COMPLETED", 90, 0.2, "the job")
    took_s = time.monotonic() - began
    (host,) = job_hosts(out_dir, job)
    assert host != lost["id"] and vm_record(client, host)["pool_node"]
    # Slurm had started the job on the lost VM's node (allocated it while the node
    # resumed): that run ended preempted, at the restart; the next one ran.
    lost_run, run = wait_until(
        lambda: len(ended_runs(daemon, job)) == 2 and ended_runs(daemon, job), 30, 0.1, "its end"
    )
    assert (lost_run["state"], lost_run["node"]) == ("preempted", lost["pool_node"])
    assert (run["state"], run["account"], run["vm_id"]) == ("succeeded", "chem", host)
    print(f"the job ran {took_s:.1f} s after the restart")
