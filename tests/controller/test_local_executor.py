"""The local executor with real subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from controller.executors.attempt_files import checkpoint_fingerprint
from controller.executors.base import (
    AttemptEvent,
    AttemptSpec,
    AttemptStarted,
    CheckpointEvent,
    ExecutorError,
    ExecutorUnavailable,
    LiveAttempt,
    Outcome,
)
from controller.executors.local import LocalExecutor, kill_orphans
from drivers.base import VmType

pytestmark = pytest.mark.processes  # real processes: left out of make test-fast


# The executor's controller id, one per test process: a recovery kills every process of
# its controller id on the host (kill_orphans), and the other xdist worker runs these
# tests too, its jobs under its own id.
CONTROLLER_ID = f"ctl{os.getpid()}"


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
    ex = LocalExecutor(tmp_path, controller_id=CONTROLLER_ID, now=time.time, kill_grace_s=1.0)
    events: list[AttemptEvent] = []
    started: list[AttemptStarted] = []
    ex.subscribe(lambda e: (started if isinstance(e, AttemptStarted) else events).append(e))
    ex.events = events  # type: ignore[attr-defined]
    ex.started = started  # type: ignore[attr-defined]
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
        f"SPOTBAG_RUN_KEY={CONTROLLER_ID}:b0000000001-0.1",
    ]  # the daemon's own SPOTBAG_TOKEN is not passed on
    assert (tmp_path / "checkpoints" / "b0000000001" / "b0000000001-0").is_dir()


@pytest.mark.parametrize("pidfds", [True, False])
async def test_the_end_and_exit_status_are_seen_with_or_without_pidfds(
    executor, tmp_path, monkeypatch, pidfds
):
    if not pidfds:  # an old kernel or a sandbox: a thread waits for each attempt
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    await executor.start(spec("sleep 0.2; exit 3", attempt_id="b0000000001-0.1"))
    await executor.start(spec("kill -KILL $$", attempt_id="b0000000001-1.1"))
    await run(executor, executor.events, 2)
    by_id = {e.attempt_id: e for e in executor.events}
    assert (by_id["b0000000001-0.1"].outcome, by_id["b0000000001-0.1"].exit_code) == (
        Outcome.EXITED,
        3,
    )
    killed = by_id["b0000000001-1.1"]
    assert (killed.outcome, killed.exit_code) == (Outcome.EXITED, 137)
    assert "signal 9" in killed.detail
    # The wrapper wrote each status in place, whole, where a restart reads it.
    log = Path(executor.log_path("b0000000001", "b0000000001-0", 1))
    assert log.with_suffix(".exit").read_text() == "3\n"
    assert executor.running_pids() == {}


async def test_max_runtime_kills_the_whole_process_group(executor, tmp_path):
    marker = tmp_path / "child.pid"
    await executor.start(spec(f"sleep 60 & echo $! > {marker}; wait", max_runtime_s=0.5))
    await run(executor, executor.events)
    assert executor.events[0].outcome is Outcome.TIMED_OUT
    child = int(marker.read_text())
    await asyncio.sleep(0.2)
    assert not _alive(child), "the background child must die with its job"


async def test_each_attempt_times_out_at_its_own_max_runtime(executor):
    """One timer serves every attempt's limit: a later attempt with a shorter limit is
    stopped first, one that ended is left alone, and one with a long limit runs on."""
    await executor.start(spec("sleep 60", attempt_id="b0000000001-0.1", max_runtime_s=1.2))
    await executor.start(spec("exit 4", attempt_id="b0000000001-1.1", max_runtime_s=0.2))
    await executor.start(spec("sleep 60", attempt_id="b0000000001-2.1", max_runtime_s=0.4))
    await executor.start(spec("sleep 2.5", attempt_id="b0000000001-3.1", max_runtime_s=30))
    await run(executor, executor.events, 4, timeout_s=10)
    assert [(e.attempt_id, e.outcome) for e in executor.events] == [
        ("b0000000001-1.1", Outcome.EXITED),
        ("b0000000001-2.1", Outcome.TIMED_OUT),
        ("b0000000001-0.1", Outcome.TIMED_OUT),
        ("b0000000001-3.1", Outcome.EXITED),
    ]
    assert executor.events[0].exit_code == 4


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
    with pytest.raises(ExecutorError, match="workdir") as raised:
        await executor.start(spec("true", workdir=str(tmp_path / "nope")))
    assert not isinstance(raised.value, ExecutorUnavailable)  # the job's fault: counted


@contextlib.contextmanager
def descriptors_left(n: int):
    """This process with only `n` descriptors free (its soft RLIMIT_NOFILE lowered, and
    filled up to it), as a daemon whose clients took the rest (issue 23)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 16, hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        for fd in fillers[len(fillers) - n :] if n else ():
            os.close(fd)
        del fillers[len(fillers) - n :]
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# 0 free: the job's log cannot be opened; 1 free: the log opens, the process cannot be
# spawned (its /dev/null stdin, its exec pipe).
@pytest.mark.parametrize("free", [0, 1])
async def test_out_of_descriptors_is_the_controllers_fault_not_the_jobs(executor, tmp_path, free):
    await asyncio.to_thread(lambda: None)  # the thread pool's thread, made beforehand
    with descriptors_left(free), pytest.raises(ExecutorUnavailable) as raised:
        await executor.start(spec("true", workdir=str(tmp_path)))
    assert "Too many open files" in str(raised.value)
    assert "ran out of resources" in str(raised.value)
    assert executor.running_pids() == {}
    # With descriptors back, the same attempt starts.
    await executor.start(spec("true", workdir=str(tmp_path)))
    await run(executor, executor.events)
    assert (executor.events[0].outcome, executor.events[0].exit_code) == (Outcome.EXITED, 0)


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


# --- checkpoints -------------------------------------------------------------------------

CHECKPOINTER = r"""
import os, signal, sys, time
from pathlib import Path
asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
out = Path(os.environ["SPOTBAG_CHECKPOINT_DIR"]) / "state"
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if asked:
        asked.clear()
        tmp = out.with_name(".state.tmp")
        tmp.write_text(str(time.time()))
        time.sleep(0.2)  # a slow write: only the rename completes it
        os.replace(tmp, out)
        print("checkpointed", flush=True)
    time.sleep(0.01)
"""


async def _checkpoint_events(executor, n: int, timeout_s: float = 20.0) -> list[CheckpointEvent]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e for e in executor.events if isinstance(e, CheckpointEvent)]
        if len(found) >= n:
            return found
        assert time.monotonic() < deadline, "no checkpoint event"
        await asyncio.sleep(0.02)


async def _wait_for_line(path: Path, text: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("shell", ["direct", "compound"])
async def test_a_job_that_handles_sigusr1_checkpoints_and_goes_on(executor, tmp_path, shell):
    program = tmp_path / "checkpointer.py"
    program.write_text(CHECKPOINTER)
    command = f"python3 {program} 3"
    if shell == "compound":  # shells in between must survive the signal
        command = f"cd {tmp_path} && {command} && echo done"
    attempt = spec(command)
    await executor.start(attempt)
    log = Path(executor.log_path(attempt.bag_id, attempt.job_id, 1))
    await _wait_for_line(log, "ready")
    asked_at = time.time()
    await executor.signal_checkpoint(attempt.attempt_id, timeout_s=10)
    (event,) = await _checkpoint_events(executor, 1)
    assert event.ok and event.detail == ""
    # Complete only once renamed into place, i.e. after the 0.2 s write.
    assert event.requested_at >= asked_at and event.at - event.requested_at >= 0.2
    assert (executor.checkpoint_dir(attempt.bag_id, attempt.job_id) / "state").exists()
    await executor.signal_checkpoint(attempt.attempt_id, timeout_s=10)
    await _checkpoint_events(executor, 2)
    while not any(isinstance(e, AttemptEvent) for e in executor.events):
        await asyncio.sleep(0.05)
    (end,) = [e for e in executor.events if isinstance(e, AttemptEvent)]
    assert end.outcome is Outcome.EXITED and end.exit_code == 0
    assert log.read_text().count("checkpointed") == 2
    if shell == "compound":
        assert log.read_text().endswith("done\n")


async def test_a_job_that_ignores_the_signal_is_not_killed_by_it(executor):
    attempt = spec("sleep 1.5; echo survived")
    await executor.start(attempt)
    await asyncio.sleep(0.2)
    await executor.signal_checkpoint(attempt.attempt_id, timeout_s=0.5)
    (event,) = await _checkpoint_events(executor, 1)
    assert not event.ok and "no checkpoint written within 0.5 s" in event.detail
    while not any(isinstance(e, AttemptEvent) for e in executor.events):
        await asyncio.sleep(0.05)
    (end,) = [e for e in executor.events if isinstance(e, AttemptEvent)]
    assert end.outcome is Outcome.EXITED and end.exit_code == 0
    log = Path(executor.log_path(attempt.bag_id, attempt.job_id, 1))
    assert log.read_text() == "survived\n"


async def test_a_job_that_ends_before_checkpointing_reports_it(executor):
    attempt = spec("sleep 0.3")
    await executor.start(attempt)
    await executor.signal_checkpoint(attempt.attempt_id, timeout_s=30)
    (event,) = await _checkpoint_events(executor, 1, timeout_s=10)
    assert not event.ok and "ended before" in event.detail
    # Signalling an attempt that is not running does nothing.
    await executor.signal_checkpoint("b0000000001-9.1", timeout_s=1)
    await asyncio.sleep(0.1)
    assert len([e for e in executor.events if isinstance(e, CheckpointEvent)]) == 1


def test_temporary_files_do_not_count_as_a_checkpoint(tmp_path):
    empty = checkpoint_fingerprint(tmp_path / "missing")
    assert empty == ()
    (tmp_path / ".state.tmp").write_text("half")
    (tmp_path / "state.json.tmp").write_text("half")
    assert checkpoint_fingerprint(tmp_path) == ()
    (tmp_path / ".state.tmp").replace(tmp_path / "state.json")
    first = checkpoint_fingerprint(tmp_path)
    assert [name for name, *_ in first] == ["state.json"]
    (tmp_path / "next.tmp").write_text("again")
    (tmp_path / "next.tmp").replace(tmp_path / "state.json")
    assert checkpoint_fingerprint(tmp_path) != first


# --- what a job's shell sees (attempt_files.LOCAL_WRAPPER, docs/architecture.md#job-shell) --


async def _ended(executor, attempt: AttemptSpec) -> tuple[AttemptEvent, str, str]:
    """The attempt's end event, its log and its exit-status file, once it ended."""
    while not any(
        isinstance(e, AttemptEvent) and e.attempt_id == attempt.attempt_id for e in executor.events
    ):
        await asyncio.sleep(0.02)
    (end,) = [
        e
        for e in executor.events
        if isinstance(e, AttemptEvent) and e.attempt_id == attempt.attempt_id
    ]
    log = Path(executor.log_path(attempt.bag_id, attempt.job_id, attempt.number))
    return end, log.read_text(), log.with_suffix(".exit").read_text()


async def test_a_job_sees_sh_c_without_arguments_and_its_exit_is_recorded(executor):
    attempt = spec('echo "$0 $# [$1] [$2] [$*]"; exit 5')
    await executor.start(attempt)
    end, log, status = await asyncio.wait_for(_ended(executor, attempt), 20)
    assert log == "/bin/sh 0 [] [] []\n"
    assert (end.outcome, end.exit_code, status) == (Outcome.EXITED, 5, "5\n")


@pytest.mark.parametrize(
    ("command", "code", "output"),
    [
        ("exec sh -c 'exit 9'", 9, ""),  # exec replaces the job's shell: its status counts
        ("echo before; if", 2, "Syntax error"),  # a command that does not parse
        ("f() { return 4; }; f", 4, ""),  # functions, `return`
        ("sh -c 'kill -TERM $$'", 143, ""),  # a program killed by a signal: 128 + N
    ],
)
async def test_exit_statuses_of_job_shells(executor, command, code, output):
    attempt = spec(command)
    await executor.start(attempt)
    end, log, status = await asyncio.wait_for(_ended(executor, attempt), 20)
    assert (end.exit_code, status) == (code, f"{code}\n")
    assert output in log


@pytest.mark.parametrize("in_workdir", [True, False])
async def test_a_job_starts_with_stdin_null_its_log_and_nothing_else_of_the_daemons(
    tmp_path, in_workdir
):
    """A job's process starts with /dev/null as stdin, its log as stdout and stderr and no
    other descriptor of the daemon's (not even one it inherited, as from a supervisor),
    in its own session, with SIGPIPE and SIGXFSZ at their defaults (Python ignores
    SIGPIPE), and no signal blocked, in the directory it was given (the daemon's own
    without one). A guard for whoever changes how jobs are spawned: posix_spawn, for
    one, would pass inherited descriptors on and, under glibc 2.36, leave glibc's
    internal signals 32 and 33 ignored in the job."""
    here = tmp_path / "here"
    here.mkdir()
    inherited = os.open(tmp_path / "from-a-supervisor", os.O_WRONLY | os.O_CREAT)
    os.set_inheritable(inherited, True)
    executor = LocalExecutor(tmp_path, controller_id=CONTROLLER_ID, now=time.time)
    executor.events = []  # type: ignore[attr-defined]
    executor.subscribe(executor.events.append)  # type: ignore[attr-defined]
    marker = tmp_path / "seen"
    command = (
        f"ls /proc/$$/fd | sort -n | tr '\\n' ' ' > {marker}; echo >> {marker}; "
        f"readlink /proc/$$/fd/0 /proc/$$/fd/1 >> {marker}; pwd >> {marker}; "
        f"ps -o sid= -p $$ >> {marker}; grep -E '^Sig(Ign|Blk)' /proc/self/status >> {marker}"
    )
    attempt = spec(command, workdir=str(here) if in_workdir else None)
    try:
        await executor.start(attempt)
        pid = executor.running_pids()[attempt.attempt_id]
        end, log, _ = await asyncio.wait_for(_ended(executor, attempt), 20)
        os.fstat(inherited)  # still the daemon's
    finally:
        os.close(inherited)
    fds, stdin, stdout, cwd, sid, blocked, ignored = marker.read_text().splitlines()
    assert (end.exit_code, log) == (0, "")
    assert fds.split() == ["0", "1", "2"]
    assert (stdin, stdout) == (os.devnull, executor.log_path(attempt.bag_id, attempt.job_id, 1))
    assert cwd == (str(here) if in_workdir else os.getcwd())
    assert int(sid) == pid  # its own session, as its own process group
    # What the job runs ignores SIGUSR1 (the wrapper's checkpoint signal), and SIGINT and
    # SIGQUIT (a shell's background command: the wrapper's sub-shell), not SIGPIPE or
    # SIGXFSZ (which Python ignores in the daemon), nor SIGTERM; nothing is blocked. A
    # disposition the daemon itself was started with (nohup's SIGHUP) is inherited: not
    # checked here.
    ignored_mask = int(ignored.split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
        assert ignored_mask & (1 << (sig - 1)), (sig, hex(ignored_mask))
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGUSR2):
        assert not ignored_mask & (1 << (sig - 1)), (sig, hex(ignored_mask))
    assert int(blocked.split()[1], 16) == 0


async def test_dollar_dollar_is_the_jobs_process_group(executor, tmp_path):
    """$$ is the wrapper's process id: the job's process group and session (`kill -- -$$`
    reaches every process of the job), and the id `running_pids` gives."""
    marker = tmp_path / "pid"
    attempt = spec(f"echo $$ $(ps -o pgid= -o sid= -p $$) > {marker}; sleep 0.5")
    await executor.start(attempt)
    pid = executor.running_pids()[attempt.attempt_id]
    await asyncio.wait_for(_ended(executor, attempt), 20)
    assert marker.read_text().split() == [str(pid)] * 3


async def test_a_handled_term_gets_its_grace_under_a_compound_command(executor, tmp_path):
    """Cancelled: TERM to the job's process group. The program that handles it finishes
    within kill_grace_s (1 s here) instead of being killed with the shell around it;
    the job then ends with 143 (the rest of its command line does not run)."""
    program = tmp_path / "graceful.py"
    program.write_text(
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(0.3)\n"
        "    print('saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    attempt = spec(f"cd {tmp_path} && python3 {program}; echo after")
    await executor.start(attempt)
    log_path = Path(executor.log_path(attempt.bag_id, attempt.job_id, 1))
    await _wait_for_line(log_path, "ready")
    await executor.cancel(attempt.attempt_id)
    end, log, status = await asyncio.wait_for(_ended(executor, attempt), 20)
    assert (end.outcome, end.detail, end.exit_code) == (Outcome.KILLED, "cancelled", 143)
    assert log == "ready\nsaved\n" and status == "143\n"


async def test_a_shell_job_may_trap_the_checkpoint_signal_itself(executor):
    """The command line's shell may trap SIGUSR1 (the wrapper's sub-shell did not inherit
    it ignored). What it runs then gets the signal's default action, as under any shell
    that traps it: here a `sleep` dies of it, and the loop goes on."""
    attempt = spec(
        'trap \'echo at "$(date +%s)" > "$SPOTBAG_CHECKPOINT_DIR/state"; echo saved\' USR1; '
        "echo ready; i=0; while [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done"
    )
    await executor.start(attempt)
    log_path = Path(executor.log_path(attempt.bag_id, attempt.job_id, 1))
    await _wait_for_line(log_path, "ready")
    await executor.signal_checkpoint(attempt.attempt_id, timeout_s=10)
    (event,) = await _checkpoint_events(executor, 1)
    assert event.ok
    end, log, status = await asyncio.wait_for(_ended(executor, attempt), 20)
    assert (end.exit_code, status) == (0, "0\n")
    assert log.startswith("ready\n") and log.endswith("saved\n")


# --- attempts waiting for room on their VM (docs/architecture.md#local-queue) --------------


def _ends(executor) -> dict[str, AttemptEvent]:
    return {e.attempt_id: e for e in executor.events if isinstance(e, AttemptEvent)}


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


async def test_attempts_beyond_a_vms_capacity_start_as_others_end(executor):
    """A 2-CPU VM handed 5 one-CPU attempts: 2 run, the others start one by one as
    those end (AttemptStarted each), none before a slot is free, in the order given."""
    await executor.vm_started("vm-1", VmType("two", cpus=2, memory_gb=4.0))
    ids = [f"b0000000001-{i}.1" for i in range(5)]
    for attempt_id in ids:
        assert await executor.start(spec("sleep 0.3", attempt_id=attempt_id)) == ""
    await _until(lambda: len(executor.started) >= 2)
    await asyncio.sleep(0.1)
    assert [s.attempt_id for s in executor.started] == ids[:2]  # the rest wait
    await _until(lambda: len(_ends(executor)) == 5)
    # Taken from the queue in the order given; two slots freed at once start their
    # next two together, and which start is reported first is the spawn threads'.
    started = [s.attempt_id for s in executor.started]
    assert started[:2] == ids[:2] and sorted(started) == ids
    ends = _ends(executor)
    assert all((e.outcome, e.exit_code) == (Outcome.EXITED, 0) for e in ends.values())
    for started in executor.started[2:]:  # each took the room of one that had ended
        ended_before = [e for e in ends.values() if e.at <= started.at]
        running_then = sum(1 for s in executor.started if s.at <= started.at) - len(ended_before)
        assert running_then <= 2


async def test_a_queued_attempt_that_cannot_start_ends_so_and_frees_its_room(executor, tmp_path):
    """An attempt taken from a VM's queue whose process cannot start (its workdir is
    gone) ends START_FAILED (an event: its start() returned long ago) and the next
    waiting there takes its room."""
    await executor.vm_started("vm-1", VmType("one", cpus=1, memory_gb=2.0))
    doomed, next_one = "b0000000001-0.1", "b0000000001-1.1"
    assert executor.enqueue(spec("true", attempt_id=doomed, workdir=str(tmp_path / "gone")))
    assert executor.enqueue(spec("exit 5", attempt_id=next_one))
    await _until(lambda: len(_ends(executor)) == 2)
    ends = _ends(executor)
    assert ends[doomed].outcome is Outcome.START_FAILED
    assert "gone" in ends[doomed].detail
    assert (ends[next_one].outcome, ends[next_one].exit_code) == (Outcome.EXITED, 5)
    assert [s.attempt_id for s in executor.started] == [next_one]


async def test_waiting_attempts_end_at_once_when_cancelled_or_their_vm_is_lost(executor):
    await executor.vm_started("vm-1", VmType("one", cpus=1, memory_gb=2.0))
    running, waiting, doomed = "b0000000001-0.1", "b0000000001-1.1", "b0000000001-2.1"
    for attempt_id in (running, waiting, doomed):
        await executor.start(spec("sleep 30", attempt_id=attempt_id))
    await _until(lambda: len(executor.started) == 1)
    await executor.cancel(waiting)
    assert _ends(executor)[waiting][2:5] == (Outcome.KILLED, None, "cancelled")
    await executor.vm_lost("vm-1")
    await _until(lambda: len(_ends(executor)) == 3)
    ends = _ends(executor)
    assert (ends[doomed].outcome, ends[doomed].detail) == (Outcome.KILLED, "VM lost")
    assert (ends[running].outcome, ends[running].detail) == (Outcome.KILLED, "VM lost")
    assert [s.attempt_id for s in executor.started] == [running]  # the others never ran
    assert executor.running_pids() == {}


async def test_backlogged_while_every_vm_has_attempts_waiting_for_room(executor):
    """backlogged(): every VM it knows has attempts waiting here (the scheduler may
    then space its passes: nothing would start sooner for one); not with a VM whose
    queue ran dry, nor with no VM."""
    assert not executor.backlogged()
    await executor.vm_started("vm-1", VmType("one", cpus=1, memory_gb=2.0))
    await executor.vm_started("vm-2", VmType("one", cpus=1, memory_gb=2.0))
    for i, vm_id in enumerate(("vm-1", "vm-1", "vm-2", "vm-2")):
        await executor.start(spec("sleep 30", attempt_id=f"b0000000001-{i}.1", vm_id=vm_id))
    await _until(lambda: len(executor.started) == 2)
    assert executor.backlogged()
    await executor.cancel("b0000000001-3.1")  # vm-2's only waiting attempt
    assert not executor.backlogged()
    await executor.vm_lost("vm-2")
    assert executor.backlogged()  # vm-1 still has one waiting
    await executor.vm_lost("vm-1")
    assert not executor.backlogged()
    await _until(lambda: len(_ends(executor)) == 4)


async def test_a_rebuild_keeps_the_attempts_waiting_here(executor):
    """recover() while the daemon runs (a pass failed): attempts running or waiting for
    room are the executor's still; one it never had is not."""
    await executor.vm_started("vm-1", VmType("one", cpus=1, memory_gb=2.0))
    ids = ["b0000000001-0.1", "b0000000001-1.1"]
    for attempt_id in ids:
        await executor.start(spec("sleep 1", attempt_id=attempt_id))
    await _until(lambda: len(executor.started) == 1)
    live = [LiveAttempt(a, "vm-1", time.time(), 30.0) for a in [*ids, "b0000000001-9.1"]]
    assert await executor.recover(live, ["vm-1"]) == set(ids)
    await _until(lambda: len(_ends(executor)) == 2)
    assert [s.attempt_id for s in executor.started] == ids


async def test_an_attempt_cancelled_while_it_is_being_started_is_stopped_once_started(executor):
    """A cancel that comes while the attempt's process is being started stops it once
    it is: nothing runs that was cancelled."""
    await executor.vm_started("vm-1", VmType("one", cpus=1, memory_gb=2.0))
    attempt = spec("sleep 30")
    await executor.start(attempt)
    await executor.cancel(attempt.attempt_id)  # its spawn is on a worker thread still
    await _until(lambda: attempt.attempt_id in _ends(executor))
    end = _ends(executor)[attempt.attempt_id]
    assert (end.outcome, end.detail) == (Outcome.KILLED, "cancelled")
