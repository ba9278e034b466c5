"""The local executor with real subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from controller.executors.base import AttemptEvent, AttemptSpec, ExecutorError, Outcome
from controller.executors.local import LocalExecutor, kill_orphans


def spec(
    command: str,
    *,
    attempt_id="b0000000001-0.1",
    vm_id="vm-1",
    max_runtime_s=30.0,
    workdir=None,
    params=None,
) -> AttemptSpec:
    job_id, number = attempt_id.rsplit(".", 1)
    return AttemptSpec(
        attempt_id=attempt_id,
        bag_id=job_id.split("-")[0],
        job_id=job_id,
        number=int(number),
        vm_id=vm_id,
        command=command,
        params=params or {"x": 1.5},
        env={"EXTRA": "yes"},
        workdir=workdir,
        max_runtime_s=max_runtime_s,
    )


async def run(
    executor: LocalExecutor, events: list[AttemptEvent], n: int = 1, timeout_s: float = 20
) -> None:
    deadline = time.monotonic() + timeout_s
    while len(events) < n:
        assert time.monotonic() < deadline, "no attempt event"
        await asyncio.sleep(0.02)


@pytest.fixture
def executor(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTBAG_TOKEN", "must-not-leak")
    ex = LocalExecutor(tmp_path, controller_id="ctl1", now=time.time, kill_grace_s=1.0)
    events: list[AttemptEvent] = []
    ex.subscribe(events.append)
    ex.events = events  # type: ignore[attr-defined]
    return ex


async def test_runs_the_command_with_its_environment_and_log(executor, tmp_path):
    await executor.start(
        spec("env | grep -E '^(SPOTBAG|EXTRA)' | sort; exit 7", workdir=str(tmp_path))
    )
    await run(executor, executor.events)
    event = executor.events[0]
    assert (event.outcome, event.exit_code) == (Outcome.EXITED, 7)
    log = Path(executor.log_path("b0000000001", "b0000000001-0", 1)).read_text().splitlines()
    assert log == [
        "EXTRA=yes",
        "SPOTBAG_ATTEMPT=1",
        "SPOTBAG_BAG_ID=b0000000001",
        f"SPOTBAG_CHECKPOINT_DIR={tmp_path}/checkpoints/b0000000001/b0000000001-0",
        "SPOTBAG_JOB_ID=b0000000001-0",
        "SPOTBAG_PARAM_X=1.5",
        "SPOTBAG_RUN_KEY=ctl1:b0000000001-0.1",
    ]  # the daemon's own SPOTBAG_TOKEN is not passed on
    assert (tmp_path / "checkpoints" / "b0000000001" / "b0000000001-0").is_dir()


async def test_max_runtime_kills_the_whole_process_group(executor, tmp_path):
    marker = tmp_path / "child.pid"
    await executor.start(spec(f"sleep 60 & echo $! > {marker}; wait", max_runtime_s=0.5))
    await run(executor, executor.events)
    assert executor.events[0].outcome is Outcome.TIMED_OUT
    child = int(marker.read_text())
    await asyncio.sleep(0.2)
    assert not _alive(child), "the background child must die with its job"


async def test_cancel_and_vm_loss_stop_attempts(executor):
    await executor.start(
        spec("trap 'exit 0' TERM; sleep 60 & wait", attempt_id="b0000000001-0.1", vm_id="vm-a")
    )
    await executor.start(spec("sleep 60", attempt_id="b0000000001-1.1", vm_id="vm-b"))
    await asyncio.sleep(0.3)
    await executor.cancel("b0000000001-0.1")
    await executor.vm_lost("vm-b")
    await run(executor, executor.events, 2)
    by_id = {e.attempt_id: e for e in executor.events}
    assert (
        by_id["b0000000001-0.1"].outcome is Outcome.KILLED
        and by_id["b0000000001-0.1"].detail == "cancelled"
    )
    assert (
        by_id["b0000000001-1.1"].outcome is Outcome.KILLED
        and by_id["b0000000001-1.1"].detail == "VM lost"
    )
    assert executor.running_pids() == {}


async def test_a_missing_workdir_is_a_start_error(executor, tmp_path):
    with pytest.raises(ExecutorError, match="workdir"):
        await executor.start(spec("true", workdir=str(tmp_path / "nope")))


def test_kill_orphans_finds_processes_by_their_run_key(tmp_path):
    env = dict(os.environ, SPOTBAG_RUN_KEY="ctl9:b0000000001-0.1")
    mine = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    other = subprocess.Popen(
        ["sleep", "60"],
        env=dict(env, SPOTBAG_RUN_KEY="ctlX:b0000000001-0.1"),
        start_new_session=True,
    )
    try:
        time.sleep(0.1)
        assert kill_orphans("ctl9") == [mine.pid]
        assert mine.wait(5) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        other.kill()
        mine.kill()
        other.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
