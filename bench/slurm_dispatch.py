#!/usr/bin/env python3
"""Benchmark: dispatching short jobs through spotbag's Slurm executor, against plain
pinned `sbatch` on the same cluster, and how fast a preempted job runs again.

One real Slurm cluster on this host (tests/slurm_cluster.py: munged, slurmctld, the
spotbag slurm.conf fragment and hooks), and one real daemon (local driver with VM
hosts, Slurm executor). The daemon first brings up 4 VMs of 4 CPUs (the note's 4 ×
4 CPUs), which join as dynamic nodes; then, with the VMs warm:

1. spotbag: a bag of N jobs of `true` (1 CPU each), timed from the submission until
   the bag is done (every end seen, recorded and charged): jobs/s.
2. Slurm alone: N pinned `sbatch` in the pattern spotbag uses (-w NODE --no-requeue
   --chdir --output, the script on stdin; 4 submitters at once, round-robin over the
   same 4 nodes), timed from the first submission until squeue shows none left: jobs/s.
3. Preemption to retry: a running job's VM is preempted (the local driver's fault
   injection through the API); the time until Slurm has ended its job (NODE_FAIL),
   and until its retry runs on a new VM (VM launch, boot, join and start included).

Target (issue 13): spotbag at >= 80 % of Slurm's own rate. Needs root, Slurm and munge
(as the Slurm tests do).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tee import Tee

from tests.conftest import FAST_CONFIG, SLURM_CONFIG, SLURM_DRIVER, Daemon
from tests.slurm_cluster import SlurmCluster, missing

N_JOBS = 1000
N_VMS = 4
CPUS = 4
TARGET = 0.8


def config(cluster: SlurmCluster, state: Path, shared: Path, secret: Path) -> str:
    text = FAST_CONFIG.format(token="bench", model="none", mttf_h=24.0, time_scale=1.0, max_vms=N_VMS)
    text = text.replace("\n[executor]\nkill_grace_s = 1.0\n", "\n")
    text = text.replace("idle_timeout_s = 2.0", "idle_timeout_s = 600.0")
    text = text.replace(
        "[driver]\n", "[driver]\n" + SLURM_DRIVER.format(bridge=cluster.bridge, subnet=cluster.subnet), 1
    )
    text = text.replace('name = "local-4"\ncpus = 4', f'name = "local-4"\ncpus = {CPUS}')
    return text + SLURM_CONFIG.format(
        conf=cluster.conf,
        munge_key=cluster.munge_key,
        munge_socket=cluster.munge_socket,
        shared=shared,
        secret=secret,
    )


def wait(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise SystemExit(f"timed out waiting for {what}")


def spotbag_rate(client) -> float:
    began = time.monotonic()
    bag = client.submit(
        {
            "account": "bench",
            "command": "true",
            "parameters": {"i": {"range": [0, N_JOBS]}},
            "resources": {"cpus": 1, "memory_gb": 0.5, "vm_types": ["local-4"]},
            "max_runtime_s": 60,
        }
    )
    wait(lambda: client.bag(bag["id"])["state"] != "active", 900, "the bag", 0.2)
    took = time.monotonic() - began
    done = client.bag(bag["id"])
    assert done["state"] == "succeeded", done
    return N_JOBS / took


def slurm_rate(cluster: SlurmCluster, nodes: list[str], work: Path) -> float:
    script = b"#!/bin/sh\ntrue\n"

    def submit(i: int) -> None:
        node = nodes[i % len(nodes)]
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--no-requeue",
                "-p",
                "spotbag",
                "-w",
                node,
                f"--job-name=plain{i}",
                "-c",
                "1",
                f"--chdir={work}",
                f"--output={work}/plain-{i}.log",
            ],
            input=script,
            env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)},
            check=True,
            capture_output=True,
        )

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(submit, range(N_JOBS)))

    def drained() -> bool:
        out = cluster.run("squeue", "-h", "-t", "PD,CF,R,CG", "-o", "%j")
        return not [line for line in out.splitlines() if line.startswith("plain")]

    wait(drained, 900, "Slurm's own jobs", 0.05)
    return N_JOBS / (time.monotonic() - began)


def preemption_to_retry(client, cluster: SlurmCluster) -> tuple[float, float]:
    bag = client.submit(
        {
            "account": "bench",
            "command": "sleep 60",
            "resources": {"cpus": 1, "memory_gb": 0.5, "vm_types": ["local-4"]},
            "max_runtime_s": 300,
        }
    )
    job_id = f"{bag['id']}-0"
    job = wait(
        lambda: (j := client.job(job_id))["attempt_list"]
        and j["attempt_list"][-1]["state"] == "running"
        and j,
        60,
        "the job to run",
    )
    ref = job["attempt_list"][-1]["executor_ref"]
    signalled = time.monotonic()
    client.preempt(job["vm_id"])
    wait(
        lambda: cluster.run("squeue", "-h", "-t", "all", "-j", ref, "-o", "%T").strip() == "NODE_FAIL",
        30,
        "NODE_FAIL",
        0.01,
    )
    ended_s = time.monotonic() - signalled
    wait(
        lambda: len(a := client.job(job_id)["attempt_list"]) >= 2 and a[-1]["state"] == "running",
        120,
        "the retry to run",
        0.02,
    )
    retry_s = time.monotonic() - signalled
    client.cancel(bag["id"])
    return ended_s, retry_s


def main() -> None:
    reason = missing()
    if reason:
        raise SystemExit(f"bench/slurm_dispatch.py: {reason}")
    out = Tee(sys.stdout)
    cluster = SlurmCluster().start()
    work = Path(tempfile.mkdtemp(prefix="spotbag-bench-"))
    state = work / "state"
    state.mkdir()
    secret = state / "slurm-hook.secret"
    secret.write_bytes(cluster.hook_secret + b"\n")
    (state / "spotbag.toml").write_text(config(cluster, state, work / "shared", secret))
    daemon = Daemon(state, state / "spotbag.toml", "bench")
    try:
        client = daemon.start()
        cluster.point_hooks(client.url)
        # Warm up: four VMs of 4 CPUs join as nodes.
        warm = client.submit(
            {
                "account": "bench",
                "command": "sleep 2",
                "parameters": {"i": {"range": [0, N_VMS * CPUS]}},
                "resources": {"cpus": 1, "memory_gb": 0.5, "vm_types": ["local-4"]},
                "max_runtime_s": 60,
            }
        )
        wait(lambda: client.bag(warm["id"])["state"] == "succeeded", 120, "the warm-up")
        nodes = [f"sb-{vm['id']}" for vm in client.vms()["vms"] if vm["state"] == "running"]
        print(f"cluster: {len(nodes)} VMs of {CPUS} CPUs joined as nodes: {', '.join(nodes)}", file=out)
        ours = spotbag_rate(client)
        print(f"spotbag's Slurm executor: {N_JOBS} jobs of `true`: {ours:.1f} jobs/s", file=out)
        theirs = slurm_rate(cluster, nodes, work)
        print(f"plain pinned sbatch, same nodes:  {N_JOBS} jobs of `true`: {theirs:.1f} jobs/s", file=out)
        ratio = ours / theirs
        verdict = "meets" if ratio >= TARGET else "MISSES"
        print(f"spotbag at {ratio:.0%} of Slurm's own rate ({verdict} the target of {TARGET:.0%})", file=out)
        ended_s, retry_s = preemption_to_retry(client, cluster)
        print(
            f"preemption (API fault injection) -> Slurm ended the job (NODE_FAIL): {ended_s:.2f} s; "
            f"-> its retry running on a new VM: {retry_s:.2f} s",
            file=out,
        )
    finally:
        daemon.stop()
        cluster.stop()
        subprocess.run(["rm", "-rf", str(work)])
    results = Path(__file__).resolve().parent / "results" / "slurm_dispatch.txt"
    results.write_text("".join(out.parts))


if __name__ == "__main__":
    main()
