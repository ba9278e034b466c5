"""Jobs on spot VMs of the mocked clouds, through Slurm: the daemon launches VMs with
the aws driver (moto) or the gce driver (the fake Compute API); each VM "boots" by
running the user data / startup script the driver rendered for it in a VM host on
the test cluster's bridge (tests/fakes/cloud_vm_hosts.py). The boot script fetches
the munge key from the cloud's secret store (moto's Secrets Manager; the fake's
metadata token and Secret Manager) and starts a slurmd that joins as the VM's node.

Checked: the job runs on the VM's node; an injected spot interruption reaches Slurm
as a downed node at once; the job resumes from its checkpoint on a new VM and
computes what an uninterrupted run computes; the munge key is in no user data.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from tests.conftest import REPO, Daemon, wait_for_bag, wait_until
from tests.fakes.cloud_vm_hosts import CloudVmHosts, gce_listing, moto_listing
from tests.integration.test_mocked_clouds import BASE_CONFIG, DESCRIBE_S, TOKEN, AwsCloud, GceCloud

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

PROGRAM = REPO / "examples" / "programs" / "logistic.py"
ARGS = "--r 3.7 --iterations 300000 --chunks 300 --seconds 20 --progress"
SLURM = """
[executor]
name = "slurm"
kill_grace_s = 0.5

[slurm]
slurm_conf = "{conf}"
munge_key = "{munge_key}"
munge_socket = "{munge_socket}"
shared_dir = "{shared}"
hook_secret_file = "{secret}"
poll_interval_s = 0.5
file_poll_s = 0.1

[preemption]
# What the scheduler assumes: VMs live about 7 s, so Young-Daly checkpoints every second.
model = "exponential"
mttf_h = 0.002
reuse_policy = "always"

[checkpoint]
policy = "young-daly"
"""


def spotbag_lines(log: str, last: int = 80) -> str:
    """The daemon's own log lines (the cloud clients' debug output left out)."""
    return "\n".join([line for line in log.splitlines() if " spotbag." in line][-last:])


@pytest.fixture(params=["aws", "gce"])
def cloud_with_hosts(request, slurm_cluster, tmp_path):
    """A mocked cloud reachable from the VM hosts, the munge key in its secret store,
    and the hypervisor that boots its VMs."""
    key = slurm_cluster.munge_key.read_bytes()
    if request.param == "aws":
        cloud = AwsCloud(host=slurm_cluster.head)
        moto = cloud.cloud
        boto3.client(
            "secretsmanager",
            region_name=moto.region,
            endpoint_url=moto.endpoint_url,
            aws_access_key_id=cloud.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=cloud.env["AWS_SECRET_ACCESS_KEY"],
        ).create_secret(Name="spotbag/munge-key", SecretBinary=key)
        munge_key = "aws-secretsmanager:spotbag/munge-key"
        listing, vm_env = moto_listing(moto), cloud.env  # the VM's role: moto's credentials
    else:
        cloud = GceCloud(host=slurm_cluster.head)
        cloud.api.put_secret(f"projects/{cloud.project}/secrets/munge-key", key)
        munge_key = f"gcp-secretmanager:projects/{cloud.project}/secrets/munge-key/versions/latest"
        listing, vm_env = gce_listing(cloud.api, cloud.project), {}
    hosts = CloudVmHosts(slurm_cluster, tmp_path / "consoles", listing, env=vm_env).start()
    yield cloud, hosts, munge_key, key
    hosts.stop()
    cloud.close()


def test_a_spot_interruption_reaches_slurm_and_the_job_resumes_on_a_new_vm(
    cloud_with_hosts, slurm_cluster, tmp_path
):
    cloud, hosts, munge_key, key = cloud_with_hosts
    state = tmp_path / "state"
    state.mkdir()
    secret = state / "slurm-hook.secret"
    secret.write_bytes(slurm_cluster.hook_secret + b"\n")
    base = BASE_CONFIG.format(token=TOKEN, driver=cloud.name, describe_s=DESCRIBE_S)
    base = base.replace("\n[executor]\nkill_grace_s = 0.5\n", "\n")
    config = state / "spotbag.toml"
    config.write_text(
        base
        + cloud.config()
        + SLURM.format(
            conf=slurm_cluster.conf,
            munge_key=munge_key,
            munge_socket=slurm_cluster.munge_socket,
            shared=tmp_path / "shared",
            secret=secret,
        )
    )
    daemon = Daemon(state, config, TOKEN)
    try:
        client = daemon.start(extra_env=cloud.env)
        slurm_cluster.point_hooks(client.url)
        bag = client.submit(
            {
                "account": "lab",
                "command": f"hostname; {sys.executable} {PROGRAM} {ARGS}",
                "resources": {"cpus": 2, "memory_gb": 4},
                "max_runtime_s": 300,
                "estimated_runtime_s": 10,
                "checkpointable": True,
                "checkpoint_cost_s": 0.01,
                "max_attempts": 5,
                "workdir": str(REPO),
            }
        )
        job_id = f"{bag['id']}-0"

        def checkpointed() -> dict | None:
            job = client.job(job_id)
            mine = [
                c for c in job["checkpoint_list"] if c["ok"] and c["attempt"] == job["attempts"]
            ]
            return job if job["state"] == "running" and len(mine) >= 2 else None

        try:
            job = wait_until(checkpointed, 120, 0.1, "two checkpoints on the first VM")
        except AssertionError as timed_out:  # what the daemon and the VM said
            seen = client.job(job_id)
            consoles = "\n".join(
                f"--- {vm_id} ---\n{hosts.console(vm_id)[-2000:]}" for vm_id in hosts.booted
            )
            raise AssertionError(
                f"{timed_out}\njob: {seen['state']}, attempts {seen['attempt_list']}, "
                f"checkpoints {seen['checkpoint_list']}, host errors {hosts.errors}\n"
                f"{consoles}\n--- daemon (its own lines) ---\n{spotbag_lines(daemon.log())}"
            ) from None
        victim = next(v for v in client.vms()["vms"] if v["id"] == job["vm_id"])
        node = f"sb-{victim['id']}"
        assert "idle" in slurm_cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%T") or (
            "alloc" in slurm_cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%T")
        )
        interrupted_at = time.time()
        cloud.preempt(victim["provider_id"])

        def node_down_or_gone() -> bool:
            out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N|%T")
            states = dict(line.split("|") for line in out.splitlines())
            return node not in states or states[node].startswith("down")

        wait_until(node_down_or_gone, 15, 0.05, "Slurm to down the interrupted VM's node")
        down_s = time.time() - interrupted_at
        assert down_s <= DESCRIBE_S + 2.0, down_s

        done = wait_for_bag(client, bag["id"], 180)
        assert done["state"] == "succeeded", (
            [(a["state"], a["reason"]) for a in client.job(job_id)["attempt_list"]],
            spotbag_lines(daemon.log()),
        )
        job = client.job(job_id)
        first, last = job["attempt_list"][0], job["attempt_list"][-1]
        assert first["state"] == "preempted" and last["vm_id"] != first["vm_id"]
        assert all(re.fullmatch(r"[0-9]+", a["executor_ref"]) for a in job["attempt_list"])
        # The attempt before the last saved what the last resumed from: the preempted
        # one, or one the checkpoint signal killed as it exited (run again, not counted).
        before = Path(job["attempt_list"][-2]["log_path"]).read_text()
        after = Path(last["log_path"]).read_text()
        # It ran on its VM's host (named as the cloud names the VM).
        assert after.splitlines()[0] == last_vm_provider(client, last).rsplit("/", 1)[-1]
        saved = [int(n) for n in re.findall(r"checkpoint at iteration (\d+)", before)]
        (resumed_from,) = [int(n) for n in re.findall(r"resuming from iteration (\d+)", after)]
        assert resumed_from == saved[-1]
        # The program's last line is its result (slurmstepd may add a line after it: a
        # checkpoint signal that came as the program exited, "failed signal 10").
        result = json.loads([x for x in after.splitlines() if x.startswith("{")][-1])
        clean = subprocess.run(
            [sys.executable, str(PROGRAM), *ARGS.replace("--seconds 20", "--seconds 0").split()],
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
            env={"SPOTBAG_CHECKPOINT_DIR": "/nonexistent"},
        )
        clean = json.loads(clean.stdout.strip().splitlines()[-1])
        assert result["lyapunov"] == clean["lyapunov"]

        # The VMs joined with the key from the secret store; no boot script carries it.
        assert len(hosts.booted) >= 2 and not hosts.errors, hosts.errors
        for script in hosts.booted.values():
            assert munge_key in script
            for form in (key, base64.b64encode(key), key.hex().encode()):
                assert form not in script.encode()
        if cloud.name == "gce":
            assert cloud.api.calls["secretmanager.access"] >= 2
    finally:
        daemon.stop(signal.SIGTERM)


def last_vm_provider(client, attempt: dict) -> str:
    vms = {v["id"]: v for v in client.vms(include_ended=True)["vms"]}
    return vms[attempt["vm_id"]]["provider_id"]
