"""The Slurm executor against a real cluster (tests/slurm_cluster.py), without the
daemon: VM hosts boot the real boot script and join as dynamic nodes; attempts are
real Slurm jobs on them.

Checked: a node is reported ready only once it is up in Slurm; a job runs on its VM
with the job's variables and none of the daemon's; exit statuses, a missing workdir
(START_FAILED), cancels, time limits; a checkpoint signal reaches the program only
once it started; a lost VM's node is downed at once (its jobs end in well under a
second), the jobs queued there are cancelled and never run anywhere, and the node is
deleted once they are over; a poll judges only the jobs it asked about; a job that
pends on a dead node is given up (NOT_STARTED); a new
executor after a restart re-adopts running jobs and reports those that ended
meanwhile; a submission whose answer is lost is found again by its name; Slurm that
does not answer makes starts fail as unavailable, not as the job's fault.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from controller.executors.base import (
    AttemptEvent,
    AttemptSpec,
    AttemptStarted,
    CheckpointEvent,
    ExecutorUnavailable,
    LiveAttempt,
    NodeEvent,
    Outcome,
)
from controller.slurm.commands import SlurmTools
from controller.slurm.executor import SlurmExecutor, SlurmExecutorSettings
from controller.slurm.executor.nodes import limit_h
from drivers.base import VmType
from drivers.bootstrap import render
from tests.slurm_cluster import async_wait_for

pytestmark = pytest.mark.slurm

VM_TYPE = VmType("local-2", 2, 4.0)
CHECKPOINTER = """
import os, signal, sys, time
from pathlib import Path
flag = []
signal.signal(signal.SIGUSR1, lambda *a: flag.append(1))
print("ready", flush=True)
for _ in range(400):
    if flag:
        path = Path(os.environ["SPOTBAG_CHECKPOINT_DIR"]) / "state"
        path.with_suffix(".tmp").write_text("saved")
        path.with_suffix(".tmp").rename(path)
        print("checkpointed", flush=True)
        flag.clear()
    time.sleep(0.05)
"""


class Rig:
    """An executor on the session cluster, VM hosts to boot, and the events it emits."""

    def __init__(self, cluster, tmp_path: Path, controller_id: str, **settings) -> None:
        self.cluster = cluster
        self.tmp_path = tmp_path
        self.controller_id = controller_id
        self.settings = SlurmExecutorSettings(
            conf_server=cluster.conf_server,
            munge_key=f"file:{cluster.munge_key}",
            munge_socket=str(cluster.munge_socket),
            shared_dir=tmp_path / "shared",
            poll_interval_s=0.3,
            file_poll_s=0.05,
            **settings,
        )
        self.hosts = cluster.hosts(tmp_path / "consoles")
        self.events: list = []
        self.executor = self.new_executor()

    def new_executor(self, tools: SlurmTools | None = None) -> SlurmExecutor:
        executor = SlurmExecutor(
            self.settings,
            tools=tools or SlurmTools(slurm_conf=str(self.cluster.conf), timeout_s=10),
            controller_id=self.controller_id,
            now=time.time,
            kill_grace_s=0.5,
        )
        executor.subscribe(self.events.append)
        return executor

    async def boot(self, vm_id: str) -> None:
        values = self.executor.bootstrap_values(vm_id, VM_TYPE)
        values |= {"SPOTBAG_VM_ID": vm_id, "SPOTBAG_SLURMD_REPORT_BOOT": "1"}
        await self.hosts.boot(vm_id, render(None, values), hostname=vm_id)
        await self.executor.vm_started(vm_id, VM_TYPE)
        await self.wait(lambda: self.node_event(vm_id), 30, f"{vm_id} to join")

    def node_event(self, vm_id: str) -> NodeEvent | None:
        found = [e for e in self.events if isinstance(e, NodeEvent) and e.vm_id == vm_id]
        return found[-1] if found else None

    def end_of(self, attempt_id: str) -> AttemptEvent | None:
        found = [
            e for e in self.events if isinstance(e, AttemptEvent) and e.attempt_id == attempt_id
        ]
        assert len(found) <= 1, found  # an end is reported once
        return found[0] if found else None

    def started(self, attempt_id: str) -> AttemptStarted | None:
        found = [
            e for e in self.events if isinstance(e, AttemptStarted) and e.attempt_id == attempt_id
        ]
        return found[0] if found else None

    async def wait(self, predicate, timeout_s: float = 30.0, what: str = ""):
        return await async_wait_for(predicate, timeout_s, 0.02, what)

    def spec(self, vm_id: str, n: int, command: str, **changes) -> AttemptSpec:
        bag = "b" + self.controller_id[-10:].rjust(10, "0")
        fields = dict(
            attempt_id=f"{bag}-{n}.1",
            bag_id=bag,
            job_id=f"{bag}-{n}",
            number=1,
            vm_id=vm_id,
            command=command,
            params={"n": n},
            env={"EXTRA": "yes"},
            workdir=None,
            max_runtime_s=60.0,
            cpus=1,
            memory_gb=1.0,
        )
        fields.update(changes)
        return AttemptSpec(**fields)

    async def close(self) -> None:
        await self.executor.shutdown()
        await self.hosts.halt_all()


@pytest.fixture
async def rig(slurm_cluster, tmp_path, request):
    made = Rig(slurm_cluster, tmp_path, f"t{abs(hash(request.node.name)) % 10**10:010d}")
    yield made
    await made.close()


async def test_jobs_run_on_their_vm_with_their_variables_and_exit_statuses(rig, monkeypatch):
    # The daemon's secrets must not reach a job.
    monkeypatch.setenv("SPOTBAG_TOKEN", "daemon-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "daemon-cloud-secret")
    await rig.boot("vm-ex0000000001")
    assert rig.node_event("vm-ex0000000001").ready
    spec = rig.spec("vm-ex0000000001", 0, "hostname; env; exit 3")
    job_id = await rig.executor.start(spec)
    assert job_id.isdigit()
    end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30, "the end")
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 3)
    assert rig.started(spec.attempt_id) is not None
    log = Path(rig.executor.log_path(spec.bag_id, spec.job_id, 1)).read_text()
    assert log.splitlines()[0] == "vm-ex0000000001"  # the VM host's name
    env = dict(line.split("=", 1) for line in log.splitlines()[1:] if "=" in line)
    assert env["SLURMD_NODENAME"] == "sb-vm-ex0000000001"
    assert env["SPOTBAG_JOB_ID"] == spec.job_id and env["SPOTBAG_PARAM_N"] == "0"
    assert env["EXTRA"] == "yes"
    assert "daemon-secret" not in log and "daemon-cloud-secret" not in log
    assert "SPOTBAG_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["SLURM_JOB_NAME"] == f"sb:{rig.controller_id}:{spec.attempt_id}"

    ok = rig.spec("vm-ex0000000001", 1, "echo fine")
    await rig.executor.start(ok)
    end = await rig.wait(lambda: rig.end_of(ok.attempt_id), 30)
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 0)

    missing = rig.spec("vm-ex0000000001", 2, "echo never", workdir="/nonexistent/dir")
    await rig.executor.start(missing)
    end = await rig.wait(lambda: rig.end_of(missing.attempt_id), 30)
    assert end.outcome is Outcome.START_FAILED, end
    log = Path(rig.executor.log_path(missing.bag_id, missing.job_id, 1)).read_text()
    assert "cannot enter workdir /nonexistent/dir" in log


async def test_a_vm_stays_settling_until_slurm_sees_its_job_end(rig):
    """An attempt ends when its program's exit status is in; its VM is reported
    settling until squeue (or jobcomp) says the batch script ended too, so that the
    scheduler does not end the VM under a job Slurm still runs (NODE_FAIL)."""
    vm = "vm-ex0000000009"
    await rig.boot(vm)
    spec = rig.spec(vm, 0, "echo fine")
    job_id = await rig.executor.start(spec)
    end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30, "the end")
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 0)
    # Either still settling, or Slurm had already said so (checked in that order: a
    # VM leaves the set only after Slurm's word).
    settling = vm in rig.executor.vms_settling()
    state = rig.cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").strip()
    assert settling or state not in ("RUNNING", "CONFIGURING", "SIGNALING"), state
    await rig.wait(lambda: not rig.executor.vms_settling(), 30, "Slurm's word")
    state = rig.cluster.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").strip()
    assert state in ("COMPLETED", "COMPLETING", ""), state


async def test_cancel_time_limit_and_a_checkpoint_signal_after_the_start(rig):
    await rig.boot("vm-ex0000000002")
    slow = rig.spec("vm-ex0000000002", 0, "sleep 60")
    await rig.executor.start(slow)
    await rig.wait(lambda: rig.started(slow.attempt_id), 30, "it to start")
    await rig.executor.cancel(slow.attempt_id)
    end = await rig.wait(lambda: rig.end_of(slow.attempt_id), 30, "the cancel")
    assert (end.outcome, end.detail) == (Outcome.KILLED, "cancelled")

    limited = rig.spec("vm-ex0000000002", 1, "sleep 60", max_runtime_s=1.0)
    await rig.executor.start(limited)
    end = await rig.wait(lambda: rig.end_of(limited.attempt_id), 30, "the time limit")
    assert end.outcome is Outcome.TIMED_OUT, end

    program = rig.tmp_path / "checkpointer.py"
    program.write_text(CHECKPOINTER)
    spec = rig.spec("vm-ex0000000002", 2, f"{sys.executable} {program}")
    await rig.executor.start(spec)
    # Asked at once, before the program can have started: the signal waits for it.
    await rig.executor.signal_checkpoint(spec.attempt_id, 20.0)
    done = await rig.wait(
        lambda: [e for e in rig.events if isinstance(e, CheckpointEvent)], 30, "the checkpoint"
    )
    assert done[0].ok, done
    checkpoint = rig.executor.checkpoint_dir(spec.bag_id, spec.job_id) / "state"
    assert checkpoint.read_text() == "saved"
    await rig.executor.cancel(spec.attempt_id)
    await rig.wait(lambda: rig.end_of(spec.attempt_id), 30)


async def test_a_lost_vms_jobs_end_at_once_and_none_queued_there_runs_anywhere(
    rig, slurm_cluster, tmp_path
):
    """A lost VM's jobs are cancelled and its node downed at once (its running job ends
    in well under a second); the job queued behind it there is reported as never
    started, and never runs, not even on another node once the lost one is deleted
    (Slurm runs a job pinned to a deleted node anywhere in the partition). Each end is
    reported once Slurm says the job is over, the node deleted only after that."""
    await rig.boot("vm-ex0000000003")
    await rig.boot("vm-ex0000000013")  # room elsewhere for a job that should not run
    ran = tmp_path / "ran"
    running = rig.spec("vm-ex0000000003", 0, "sleep 60", cpus=2)  # fills the VM
    queued = rig.spec("vm-ex0000000003", 1, f"echo ran >> {ran}", cpus=2)
    job_id = await rig.executor.start(running)
    queued_id = await rig.executor.start(queued)
    await rig.wait(lambda: rig.started(running.attempt_id), 30)

    def state(job: str) -> str:
        return slurm_cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").strip()

    assert state(queued_id) == "PENDING"
    await rig.hosts.halt("vm-ex0000000003")  # the VM is gone, and then the driver says so
    began = time.monotonic()
    await rig.executor.vm_lost("vm-ex0000000003")
    await rig.wait(lambda: state(job_id) in ("NODE_FAIL", "CANCELLED"), 5, "its end in Slurm")
    assert time.monotonic() - began < 1.0
    end = await rig.wait(lambda: rig.end_of(running.attempt_id), 10, "the running job's end")
    assert end.outcome is Outcome.KILLED and "is gone" in end.detail, end
    never = await rig.wait(lambda: rig.end_of(queued.attempt_id), 10, "the queued job's end")
    assert never.outcome is Outcome.NOT_STARTED, never
    assert rig.started(queued.attempt_id) is None
    assert state(queued_id) == "CANCELLED"
    listed = lambda: slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N")  # noqa: E731
    await rig.wait(lambda: "sb-vm-ex0000000003" not in listed(), 20, "the node deleted")
    await asyncio.sleep(3)  # a scheduling pass or two after the deletion
    assert state(queued_id) == "CANCELLED" and not ran.exists()


async def test_a_job_submitted_while_squeue_runs_is_not_taken_for_one_slurm_forgot(rig, tmp_path):
    """A poll judges only the jobs it asked squeue about: an attempt whose sbatch
    answers while squeue runs is absent from the answer, and is not therefore over."""
    await rig.boot("vm-ex0000000014")
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    for tool in ("sinfo", "scontrol", "scancel"):
        (bin_dir / tool).symlink_to(os.popen(f"command -v {tool}").read().strip())
    for tool, script in (
        ("sbatch", '{real} "$@"; code=$?; sleep 0.5; exit $code'),  # answers late
        ("squeue", 'sleep 1.5; exec {real} "$@"'),  # slow
    ):
        real = os.popen(f"command -v {tool}").read().strip()
        (bin_dir / tool).write_text("#!/bin/sh\n" + script.format(real=real) + "\n")
        (bin_dir / tool).chmod(0o755)
    rig.executor = rig.new_executor(
        SlurmTools(slurm_conf=str(rig.cluster.conf), bin_dir=str(bin_dir), timeout_s=10)
    )
    await rig.executor.vm_started("vm-ex0000000014", VM_TYPE)
    await rig.wait(lambda: rig.executor._nodes["vm-ex0000000014"].ready, 20)
    first = rig.spec("vm-ex0000000014", 0, "sleep 30")
    await rig.executor.start(first)  # a job with an id: the poll asks squeue about it
    second = rig.spec("vm-ex0000000014", 1, "sleep 2; exit 0")

    async def poll_while_it_is_submitted() -> None:
        await asyncio.sleep(0.2)  # its sbatch is on its way
        await rig.executor.poll()

    await asyncio.gather(rig.executor.start(second), poll_while_it_is_submitted())
    end = await rig.wait(lambda: rig.end_of(second.attempt_id), 30, "its end")
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 0), end
    assert rig.started(second.attempt_id) is not None
    await rig.executor.cancel(first.attempt_id)
    await rig.wait(lambda: rig.end_of(first.attempt_id), 30)


async def test_a_job_pending_on_a_dead_node_is_given_up_as_not_started(slurm_cluster, tmp_path):
    rig = Rig(slurm_cluster, tmp_path, "tpending001", pending_timeout_s=1.0)
    try:
        await rig.boot("vm-ex0000000004")
        # The node dies without anyone telling Slurm: the job pends on it.
        slurm_cluster.run(
            "scontrol", "update", "nodename=sb-vm-ex0000000004", "state=DRAIN", "reason=test"
        )
        spec = rig.spec("vm-ex0000000004", 0, "echo never")
        await rig.executor.start(spec)
        end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30, "giving up")
        assert end.outcome is Outcome.NOT_STARTED, end
        assert "pending in Slurm" in end.detail
        broken = await rig.wait(
            lambda: [e for e in rig.events if isinstance(e, NodeEvent) and not e.ready], 10
        )
        assert "drain" in broken[0].detail
    finally:
        await rig.close()


async def test_a_new_executor_readopts_running_jobs_and_reports_ended_ones(rig):
    await rig.boot("vm-ex0000000005")
    running = rig.spec("vm-ex0000000005", 0, "sleep 3; exit 4")
    quick = rig.spec("vm-ex0000000005", 1, "exit 5")
    refs = {s.attempt_id: await rig.executor.start(s) for s in (running, quick)}
    await rig.wait(lambda: rig.started(running.attempt_id), 30)
    await rig.wait(lambda: rig.end_of(quick.attempt_id), 30)
    await rig.executor.shutdown()  # the controller stops; Slurm runs on

    rig.events.clear()
    rig.executor = rig.new_executor()
    live = [
        LiveAttempt(s.attempt_id, s.vm_id, time.time(), 60.0, refs[s.attempt_id])
        for s in (running, quick)
    ]
    live.append(LiveAttempt(f"{running.bag_id}-9.1", running.vm_id, time.time(), 60.0, ""))
    kept = await rig.executor.recover(live, ["vm-ex0000000005"])
    assert kept == {running.attempt_id, quick.attempt_id}  # the unknown one is lost
    # Ended while "down": reported (at once, or once Slurm has finished completing it).
    ended = await rig.wait(lambda: rig.end_of(quick.attempt_id), 10, "the end seen on recovery")
    assert ended.exit_code == 5
    end = await rig.wait(lambda: rig.end_of(running.attempt_id), 30, "the re-adopted end")
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 4)


async def test_a_submission_whose_answer_is_lost_is_found_by_its_name(rig, tmp_path):
    await rig.boot("vm-ex0000000006")
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sinfo", "scontrol", "scancel"):
        (bin_dir / tool).symlink_to(os.popen(f"command -v {tool}").read().strip())
    real = os.popen("command -v sbatch").read().strip()
    # sbatch that submits, then hangs past the executor's timeout.
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\n{real} "$@"\nsleep 30\n')
    (bin_dir / "sbatch").chmod(0o755)
    rig.executor = rig.new_executor(
        SlurmTools(slurm_conf=str(rig.cluster.conf), bin_dir=str(bin_dir), timeout_s=1.5)
    )
    await rig.executor.vm_started("vm-ex0000000006", VM_TYPE)
    await rig.wait(lambda: rig.executor._nodes["vm-ex0000000006"].ready, 10)
    spec = rig.spec("vm-ex0000000006", 0, "exit 7")
    job_id = await rig.executor.start(spec)
    assert job_id.isdigit()  # found by its name after the timeout
    end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30)
    assert end.exit_code == 7
    jobs = rig.cluster.run(
        "squeue", "-h", "-t", "all", "-n", f"sb:{rig.controller_id}:{spec.attempt_id}", "-o", "%i"
    )
    assert jobs.split() == [job_id]  # one job, not two


async def test_slurm_that_does_not_answer_makes_starts_unavailable(rig, tmp_path):
    await rig.boot("vm-ex0000000007")
    bin_dir = tmp_path / "down-bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "squeue", "sinfo", "scontrol", "scancel"):
        (bin_dir / tool).write_text(
            "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller "
            "(connect failure)' >&2\nexit 1\n"
        )
        (bin_dir / tool).chmod(0o755)
    down = rig.new_executor(SlurmTools(bin_dir=str(bin_dir), timeout_s=2))
    await down.vm_started("vm-ex0000000007", VM_TYPE)
    down._nodes["vm-ex0000000007"].ready = True  # it joined; then Slurm went away
    with pytest.raises(ExecutorUnavailable, match="Unable to contact"):
        await down.start(rig.spec("vm-ex0000000007", 0, "echo hi"))
    await down.poll()
    assert "Unable to contact" in down.unavailable
    with pytest.raises(ExecutorUnavailable):
        await down.start(rig.spec("vm-ex0000000007", 1, "echo hi"))
    await down.shutdown()
    await asyncio.sleep(0)


async def test_a_node_left_idle_is_not_powered_down_by_slurm(rig, slurm_cluster):
    """Power saving is on for the pool partition (SuspendTime 5 s in the test cluster);
    spotbag's dynamic nodes are never suspended by Slurm (22.05 applies SuspendExcParts
    only to nodes it knew at start: its partition sets SuspendTime=INFINITE instead)."""
    await rig.boot("vm-ex0000000008")
    await asyncio.sleep(17)  # SuspendTime (5 s) and the power-saving thread's 10 s pass
    state = slurm_cluster.run("sinfo", "-h", "-N", "-n", "sb-vm-ex0000000008", "-o", "%T")
    assert state.strip() == "idle", state
    spec = rig.spec("vm-ex0000000008", 0, "exit 0")
    await rig.executor.start(spec)
    end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30)
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 0)


async def test_a_second_recovery_while_watching_keeps_the_attempts_it_watches(rig, tmp_path):
    """The scheduler recovers again after a failed pass, while the executor watches: an
    attempt it already tracks stays the one it watches (its end, seen while recovery
    asks Slurm, is reported once), not a second copy."""
    await rig.boot("vm-ex0000000015")
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "sinfo", "scontrol", "scancel"):
        (bin_dir / tool).symlink_to(os.popen(f"command -v {tool}").read().strip())
    real = os.popen("command -v squeue").read().strip()
    (bin_dir / "squeue").write_text(f'#!/bin/sh\nsleep 1.5; exec {real} "$@"\n')
    (bin_dir / "squeue").chmod(0o755)
    rig.executor = rig.new_executor(
        SlurmTools(slurm_conf=str(rig.cluster.conf), bin_dir=str(bin_dir), timeout_s=10)
    )
    await rig.executor.vm_started("vm-ex0000000015", VM_TYPE)
    await rig.wait(lambda: rig.executor._nodes["vm-ex0000000015"].ready, 20)
    spec = rig.spec("vm-ex0000000015", 0, "sleep 1; exit 0")
    job_id = await rig.executor.start(spec)
    await rig.wait(lambda: rig.started(spec.attempt_id), 30, "it to start")
    live = [LiveAttempt(spec.attempt_id, spec.vm_id, time.time(), 60.0, job_id)]
    # It ends while recovery's squeue runs.
    kept = await rig.executor.recover(live, [spec.vm_id])
    assert kept == {spec.attempt_id}
    end = await rig.wait(lambda: rig.end_of(spec.attempt_id), 30, "its end")
    assert (end.outcome, end.exit_code) == (Outcome.EXITED, 0)
    await asyncio.sleep(2)
    assert rig.end_of(spec.attempt_id) == end  # once


@pytest.mark.parametrize(
    ("text", "hours"),
    [
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("30", 0.5),
        ("2:30:00", 2.5),
        ("1-00:00:00", 24.0),
        ("364-00:00:00", 364 * 24.0),
        # What backfill shows for a job without a limit (seen: a pool job refused for
        # "8,760.00 CPU-hours" when backfill, not the main scheduler, started it).
        ("365-00:00:00", None),
    ],
)
def test_a_slurm_time_limit_in_hours_and_a_year_is_none(text, hours):
    assert limit_h(text) == hours
