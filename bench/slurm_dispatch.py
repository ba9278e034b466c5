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
   --chdir --output, and spotbag's job script on stdin: its wrapper around `true`, as
   SLURM.md's reference figure did), 4 submitters at once, round-robin over the same 4
   nodes, timed from the first submission until every job's exit status is written: jobs/s.
   Both run ROUNDS times, alternating (this 2-core host is saturated by Slurm itself:
   one run of either varies by ±20 %), and the medians are compared. The CPU time the
   host spent per job (all processes) and the daemon's share of it are printed too.
3. Preemption to retry: a running job's VM is preempted (the local driver's fault
   injection through the API) while the other warm VMs have room; the time until
   Slurm has ended its job, and until its retry's program runs.
4. A Slurm user's job on the power-saving pool (`sbatch -p spot` as a plain user):
   its first start on a fresh VM, and, its VM preempted, the time until Slurm runs
   it again on a new VM, with the settings `spotbag slurm conf` emits (cred_expire).

Targets (issues 13, 22): spotbag at >= 80 % of Slurm's own rate; the retry running
<= 2 s after the preemption; the requeued pool job running <= 40 s after it. Needs
root, Slurm and munge (as the Slurm tests do).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import against
from tee import Tee

from controller.executors.base import AttemptSpec
from controller.slurm.commands import SlurmTools
from controller.slurm.executor import SlurmExecutor, SlurmExecutorSettings
from controller.slurm.executor.submission import job_script as submitted_script
from tests.conftest import FAST_CONFIG, POOL, SLURM_CONFIG, SLURM_DRIVER, SLURM_POOL, Daemon
from tests.slurm_cluster import SlurmCluster, missing

N_JOBS = 1000
ROUNDS = 5
N_VMS = 4
CPUS = 4
TARGET = 0.8


def config(cluster: SlurmCluster, state: Path, shared: Path, secret: Path) -> str:
    text = FAST_CONFIG.format(
        token="bench", model="none", mttf_h=24.0, time_scale=1.0, max_vms=N_VMS
    )
    text = text.replace("\n[executor]\nkill_grace_s = 1.0\n", "\n")
    text = text.replace("idle_timeout_s = 2.0", "idle_timeout_s = 600.0")
    text = text.replace(
        "[driver]\n",
        "[driver]\n" + SLURM_DRIVER.format(bridge=cluster.bridge, subnet=cluster.subnet),
        1,
    )
    text = text.replace('name = "local-4"\ncpus = 4', f'name = "local-4"\ncpus = {CPUS}')
    slurm = SLURM_CONFIG.format(
        conf=cluster.conf,
        munge_key=cluster.munge_key,
        munge_socket=cluster.munge_socket,
        shared=shared,
        secret=secret,
    )
    # The executor's own defaults for how often it looks (the tests look faster).
    slurm = re.sub(r"\n(poll_interval_s|file_poll_s|pending_timeout_s) = .*", "", slurm)
    return text + slurm + POOL


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


def job_script(work: Path, i: int, node: str) -> bytes:
    """The script spotbag's Slurm executor submits for an attempt of `true`."""
    executor = SlurmExecutor(
        SlurmExecutorSettings(shared_dir=work / "plain"),
        tools=SlurmTools(),
        controller_id="plain",
        now=time.time,
    )
    spec = AttemptSpec(
        f"bplain00000-{i}.1", "bplain00000", f"bplain00000-{i}", 1, "vm", "true", {}, {}, None, 60.0
    )
    log_path = Path(executor.log_path(spec.bag_id, spec.job_id, 1))
    return submitted_script(
        spec, node, log_path, executor.checkpoint_dir(spec.bag_id, spec.job_id)
    ).encode()


def slurm_rate(cluster: SlurmCluster, nodes: list[str], work: Path) -> float:
    shutil.rmtree(work / "plain", ignore_errors=True)
    (work / "plain" / "logs" / "bplain00000").mkdir(parents=True, exist_ok=True)
    scripts = [job_script(work, i, nodes[i % len(nodes)]) for i in range(N_JOBS)]

    def submit(i: int) -> None:
        node = nodes[i % len(nodes)]
        script = scripts[i]
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

    # Done when every job's script wrote its exit status (the same moment spotbag's
    # executor learns of an end); squeue is not polled: with thousands of jobs in
    # slurmctld's memory each call costs ~45 ms of CPU on this saturated host.
    logs = work / "plain" / "logs" / "bplain00000"

    def drained() -> bool:
        return sum(1 for name in os.listdir(logs) if name.endswith(".exit")) >= N_JOBS

    wait(drained, 900, "Slurm's own jobs", 0.05)
    return N_JOBS / (time.monotonic() - began)


def busy_cpu_s() -> float:
    """CPU seconds this host has spent busy (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measured(daemon, run) -> tuple[float, float, float]:
    """(jobs/s, host CPU ms per job, the daemon's CPU ms per job) of one run."""
    host, own = busy_cpu_s(), process_cpu_s(daemon.process.pid)
    rate = run()
    host, own = busy_cpu_s() - host, process_cpu_s(daemon.process.pid) - own
    return rate, host * 1000 / N_JOBS, own * 1000 / N_JOBS


def preemption_to_retry(client, cluster: SlurmCluster) -> tuple[float, float, str]:
    """A running job's VM is preempted while the other warm VMs have room: how long
    until Slurm has ended its job, and until its retry's program runs (its start marker
    seen: spotbag records it running), and where."""
    running_before = {vm["id"] for vm in client.vms()["vms"] if vm["state"] == "running"}
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
        lambda: (
            (j := client.job(job_id))["attempt_list"]
            and j["attempt_list"][-1]["state"] == "running"
            and j
        ),
        60,
        "the job to run",
    )
    ref = job["attempt_list"][-1]["executor_ref"]
    signalled = time.monotonic()
    client.preempt(job["vm_id"])
    wait(
        lambda: (
            cluster.run("squeue", "-h", "-t", "all", "-j", ref, "-o", "%T").strip()
            in ("NODE_FAIL", "CANCELLED")
        ),
        30,
        "its job to end in Slurm",
        0.01,
    )
    ended_s = time.monotonic() - signalled
    retry = wait(
        lambda: (
            len(a := client.job(job_id)["attempt_list"]) >= 2 and a[-1]["state"] == "running" and a
        ),
        120,
        "the retry to run",
        0.02,
    )[-1]
    retry_s = time.monotonic() - signalled
    client.cancel(bag["id"])
    where = "a warm VM" if retry["vm_id"] in running_before else "a new VM"
    return ended_s, retry_s, where


def pool_requeue(client, cluster: SlurmCluster, work: Path) -> tuple[float, float]:
    """A Slurm user's job on the pool (`sbatch -p spot` as a plain user) has its VM
    preempted: how long until Slurm runs it again (its program's second run began),
    on a VM spotbag launches for the node Slurm resumes: Slurm's hold of a requeued
    job (cred_expire + 1 s, from `spotbag slurm conf`), the resume, the new VM's boot
    and join. Also: its first start, from submission, on a fresh pool VM."""
    # The user's directory: one anyone may enter (the bench's own is 0700).
    out = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-bench-pool-"))
    out.chmod(0o777)
    runs = out / "runs"
    submitted = time.monotonic()
    line = cluster.run(
        "runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={cluster.conf}",
        "sbatch", "--parsable", "-p", "spot", f"--chdir={out}", f"--output={out}/%j.out",
        "--wrap", f"echo run >> {runs}; sleep 120",
    )  # fmt: skip
    slurm_job = line.strip().split(";")[0]

    def run_count() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    wait(lambda: run_count() >= 1, 180, "the pool job's first run", 0.05)
    first_s = time.monotonic() - submitted

    def pool_vm() -> str | None:
        vms = [v for v in client.vms()["vms"] if v["pool_node"] and v["state"] == "running"]
        return vms[0]["id"] if len(vms) == 1 else None

    victim = wait(pool_vm, 30, "the pool job's VM")
    preempted = time.monotonic()
    client.preempt(victim)
    wait(lambda: run_count() >= 2, 180, "the pool job's second run", 0.05)
    requeue_s = time.monotonic() - preempted
    cluster.run("scancel", slurm_job)
    shutil.rmtree(out, ignore_errors=True)
    return first_s, requeue_s


def main() -> None:
    reason = missing()
    if reason:  # a benchmark, not a test: say why and leave the others to run
        print(f"bench/slurm_dispatch.py: skipped: {reason}")
        return
    out = Tee(sys.stdout)
    # The rounds' 10,000 jobs stay in slurmctld for MinJobAge: past Slurm's default
    # MaxJobCount (10,000) it refuses submissions for a while, in whichever round that
    # falls (a cluster this busy raises it too).
    cluster = SlurmCluster(spotbag_config=SLURM_POOL, extra_conf="MaxJobCount=100000\n").start()
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
        client.create_account("nobody", cpu_hours=100.0)  # the pool job's user
        # First, while no VM of the bags holds the VM budget (max_vms): the pool.
        first_s, requeue_s = pool_requeue(client, cluster, work)
        hold_s = cluster.config.slurm.cred_expire_s + 1
        print(
            f"Slurm user's pool job: first run {first_s:.1f} s after sbatch (a fresh VM); "
            f"preemption -> requeued job running on a new VM: {requeue_s:.1f} s "
            f"{against(requeue_s, 40, 's')} (Slurm holds a requeued job {hold_s} s: "
            "cred_expire + 1)",
            file=out,
        )
        wait(
            lambda: not [v for v in client.vms()["vms"] if v["pool_node"]],
            120,
            "the pool VM released",
        )
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
        print(
            f"cluster: {len(nodes)} VMs of {CPUS} CPUs joined as nodes: {', '.join(nodes)}",
            file=out,
        )
        ours, theirs = [], []
        for round_ in range(1, ROUNDS + 1):
            rate, cpu_ms, daemon_ms = measured(daemon, lambda: spotbag_rate(client))
            ours.append(rate)
            print(
                f"round {round_}: spotbag's Slurm executor, {N_JOBS} jobs of `true`: {rate:.1f} "
                f"jobs/s ({cpu_ms:.0f} ms CPU per job, {daemon_ms:.0f} of it the daemon's)",
                file=out,
            )
            rate, cpu_ms, daemon_ms = measured(daemon, lambda: slurm_rate(cluster, nodes, work))
            theirs.append(rate)
            print(
                f"round {round_}: plain pinned sbatch, same nodes:  {rate:.1f} jobs/s "
                f"({cpu_ms:.0f} ms CPU per job)",
                file=out,
            )
        ours_m, theirs_m = statistics.median(ours), statistics.median(theirs)
        print(f"median: spotbag {ours_m:.1f} jobs/s, Slurm alone {theirs_m:.1f} jobs/s", file=out)
        ratio = ours_m / theirs_m
        verdict = "meets" if ratio >= TARGET else "MISSES"
        print(
            f"spotbag at {ratio:.0%} of Slurm's own rate ({verdict} the target of {TARGET:.0%})",
            file=out,
        )
        ended_s, retry_s, where = preemption_to_retry(client, cluster)
        print(
            f"preemption (API fault injection) -> Slurm ended the job: {ended_s:.2f} s "
            f"{against(ended_s, 1, 's')}; -> its retry running on {where} with room: "
            f"{retry_s:.2f} s {against(retry_s, 2, 's')}",
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
