"""Slurm users' own jobs on spot VMs (power saving): a plain user's `sbatch -p spot`
makes slurmctld resume a CLOUD node of the pool; its ResumeProgram hook asks the
daemon, which launches a VM for that node (local driver, VM hosts); the VM's slurmd
joins under the node's name and the job runs there. Each run is reserved for at its
start and charged at its end to the account named like its Slurm account, and shows
in the account's cost report; a preempted pool VM is powered down by force, so Slurm
requeues the job, which resumes on a new VM; a job its account cannot pay for is
cancelled with the reason; an idle node is suspended and its VM terminated.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

POOL = """
[[slurm.pools]]
partition = "spot"
nodes = "spot-[0-3]"
vm_types = ["local-2"]
reserve_hours = 2.0
suspend_time_s = 5
"""


@pytest.fixture
def pool_daemon(make_slurm_daemon):
    daemon = make_slurm_daemon(max_vms=2)
    daemon.config_path.write_text(daemon.config_path.read_text() + POOL)
    return daemon


def submit_as_user(cluster, out_dir: Path, *args: str) -> str:
    """sbatch as a plain user ("nobody"), not as root."""
    line = cluster.run(
        "runuser",
        "-u",
        "nobody",
        "--",
        "env",
        f"SLURM_CONF={cluster.conf}",
        "sbatch",
        "--parsable",
        "-p",
        "spot",
        f"--output={out_dir}/%j.out",
        *args,
    )
    return line.strip().split(";")[0]


def job_field(cluster, job_id: str, fmt: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", fmt, check=False).strip()


def runs(daemon) -> list[dict]:
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM slurm_runs ORDER BY started_at")]


def test_slurm_users_jobs_run_on_spot_vms_and_are_charged(pool_daemon, slurm_cluster):
    client = pool_daemon.start()
    out_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-pool-"))
    out_dir.chmod(0o777)

    # 1. A plain user's job resumes a pool node; spotbag backs it with a spot VM.
    began = time.monotonic()
    first = submit_as_user(slurm_cluster, out_dir, "-A", "chem", "--wrap", "hostname; sleep 1")
    wait_until(lambda: job_field(slurm_cluster, first, "%T") == "COMPLETED", 90, 0.2, "the job")
    took_s = time.monotonic() - began
    host = (out_dir / f"{first}.out").read_text().split()[0]
    vms = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
    assert host in vms and vms[host]["pool_node"].startswith("spot-"), (host, vms)
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
        slurm_cluster, out_dir, "-A", "chem", "--wrap", "hostname; sleep 6; echo survived"
    )
    wait_until(lambda: job_field(slurm_cluster, second, "%T") == "RUNNING", 90, 0.2, "it to run")
    wait_until(lambda: (out_dir / f"{second}.out").exists(), 30, 0.1)
    victim = wait_until(lambda: (out_dir / f"{second}.out").read_text().split(), 30, 0.1)[0]
    client.preempt(victim)
    wait_until(
        lambda: job_field(slurm_cluster, second, "%T") == "COMPLETED", 150, 0.5, "the requeued job"
    )
    output = (out_dir / f"{second}.out").read_text().split()
    assert output[-1] == "survived" and output[-2] != victim  # ran again, elsewhere

    def ended_runs() -> list[dict]:
        return [r for r in runs(pool_daemon) if r["job_id"] == second and r["state"] != "running"]

    mine = wait_until(lambda: len(ended_runs()) == 2 and ended_runs(), 30, 0.1, "both runs")
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
    def no_pool_vm_alive() -> bool:
        return not [v for v in client.vms()["vms"] if v["pool_node"]]

    wait_until(no_pool_vm_alive, 90, 0.5, "the pool's VMs to be released")
    ended = [v for v in client.vms(include_ended=True)["vms"] if v["pool_node"]]
    assert any("powered node" in v["reason"] for v in ended), [v["reason"] for v in ended]
    assert any(v["state"] == "preempted" for v in ended)
    print(f"first job on a fresh spot VM in {took_s:.1f} s")
    os.system(f"rm -rf {out_dir}")


def test_an_idle_pool_vm_the_reuse_policy_distrusts_is_handed_back(
    make_slurm_daemon, slurm_cluster
):
    """VMs live 24 model hours (1 real second = 1 model hour here) and the pool's jobs
    take 20: from about 4 h on, a fresh VM does such a job sooner than a warm one (SPEC.md
    §3). When its job ends, the warm VM is handed back at once (Slurm would have kept it
    for SuspendTime), and the next job resumes the node on a fresh VM."""
    daemon = make_slurm_daemon(max_vms=2, model="exponential", mttf_h=1e6, time_scale=3600)
    text = daemon.config_path.read_text().replace(
        "mttf_h = 1000000.0\n", "mttf_h = 1000000.0\nmax_lifetime_h = 24.0\n"
    )
    assert "max_lifetime_h" in text
    daemon.config_path.write_text(text + POOL + "job_hours = 20.0\n")
    client = daemon.start()
    out_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-pool-"))
    out_dir.chmod(0o777)
    try:
        first = submit_as_user(slurm_cluster, out_dir, "--wrap", "hostname; sleep 5")
        wait_until(lambda: job_field(slurm_cluster, first, "%T") == "COMPLETED", 90, 0.2, "job 1")
        warm = (out_dir / f"{first}.out").read_text().split()[0]

        def ended(vm_id: str) -> dict | None:
            vms = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
            return vms[vm_id] if vms[vm_id]["state"] in ("terminated", "preempted") else None

        gone = wait_until(lambda: ended(warm), 20, 0.2, "the warm VM to be handed back")
        assert gone["state"] == "terminated", gone
        assert "at spotbag's request" in gone["reason"], gone["reason"]
        assert "preemption model" in gone["reason"], gone["reason"]

        # The node was drained for its power-down; the next job still gets it, fresh.
        second = submit_as_user(slurm_cluster, out_dir, "--wrap", "hostname")
        wait_until(lambda: job_field(slurm_cluster, second, "%T") == "COMPLETED", 90, 0.2, "job 2")
        fresh = (out_dir / f"{second}.out").read_text().split()[0]
        assert fresh != warm
    finally:
        os.system(f"rm -rf {out_dir}")
