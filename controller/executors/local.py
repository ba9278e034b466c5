"""The local executor: each attempt is a real subprocess on this host.

The command runs under /bin/sh in a new session (its own process group), with
stdout and stderr appended to a log file under the state directory, the
SPOTBAG_* variables set, and the daemon's own SPOTBAG_* variables (the API
token among them) removed. Stopping an attempt signals its whole process group:
SIGTERM, then SIGKILL after `kill_grace_s`. A VM preemption kills at once.

Every process carries SPOTBAG_RUN_KEY=<controller id>:<attempt id>. After a
crash of the daemon its jobs are orphans; `recover()` finds them by that key in
/proc and kills their process groups, so a lost attempt never keeps running
beside its retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.bags.job_command import job_environment
from controller.executors.attempt_files import (
    LOCAL_WRAPPER,
    checkpoint_fingerprint,
    end_event,
    exit_status_path,
    hand_over,
    read_exit_status,
)
from controller.executors.base import (
    AttemptEvent,
    AttemptListener,
    AttemptSpec,
    CheckpointEvent,
    ExecutorError,
    LiveAttempt,
    Outcome,
    start_error,
)
from controller.executors.job_users import JobUser, JobUserError, JobUsers
from drivers.base import VmType

RUN_KEY = "SPOTBAG_RUN_KEY"


class _Child:
    """A job's wrapper process, spawned by `subprocess.Popen` on a worker thread (the
    event loop never waits for a fork and an exec) and watched from the loop: its
    end wakes the loop through a pidfd (on a thread of its own where there are no
    pidfds, or none left), and the loop reaps it. The Popen object is kept to the end:
    only it reaps this process (subprocess reaps on its own only the children of
    Popen objects that were dropped while they ran)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[int] = loop.create_future()
        try:
            pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no pidfds (old kernel, sandbox) or descriptors
            threading.Thread(
                target=self._wait_in_thread, args=(loop,), name=f"wait {popen.pid}", daemon=True
            ).start()
        else:
            loop.add_reader(pidfd, self._reap, loop, pidfd)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def wait(self) -> asyncio.Future[int]:
        """Its exit status (Popen's: -N when a signal N killed it), once it ended: a
        future that a caller's cancellation leaves alone."""
        return asyncio.shield(self._ended)

    def _reap(self, loop: asyncio.AbstractEventLoop, pidfd: int) -> None:
        if self._popen.poll() is None:  # a pidfd turns readable only once it ended
            return
        loop.remove_reader(pidfd)
        os.close(pidfd)
        self._settle()

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        self._popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if not self._ended.done():
            code = self._popen.returncode
            assert code is not None
            self._ended.set_result(code)


@dataclass
class _Running:
    spec: AttemptSpec
    process: _Child
    watcher: asyncio.Task | None = None
    stop_reason: str = ""  # set when we stopped it on purpose
    killed: asyncio.Event = field(default_factory=asyncio.Event)
    checkpoint: asyncio.Task | None = None  # waiting for a checkpoint it was asked for


class LocalExecutor:
    name = "local"
    joins_vms = False
    queues_attempts = False
    attempts_outlive_controller = False
    confirms_ends = False  # vm_lost kills the attempts at once
    queue_ahead = 0.0

    def __init__(
        self,
        state_dir: Path,
        *,
        controller_id: str,
        now: Callable[[], float],
        kill_grace_s: float = 5.0,
        checkpoint_poll_s: float = 0.02,
        users: JobUsers | None = None,
    ) -> None:
        self._state_dir = state_dir
        self._logs_dir = str(state_dir / "logs")
        self._checkpoints = state_dir / "checkpoints"
        self._checkpoints_dir = str(self._checkpoints)
        self._users = users or JobUsers()
        self._controller_id = controller_id
        self._now = now
        self._grace_s = kill_grace_s
        self._checkpoint_poll_s = checkpoint_poll_s
        self._running: dict[str, _Running] = {}
        self._stoppers: set[asyncio.Task] = set()
        self._listeners: list[AttemptListener] = []
        # Jobs inherit the daemon's environment minus its own settings (the API token
        # among them) and systemd's notification socket (jobs are not the service).
        self._base_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SPOTBAG_") and k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")
        }

    def subscribe(self, listener: AttemptListener) -> None:
        self._listeners.append(listener)

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        # Strings, not pathlib: this runs on the event loop for every attempt.
        return os.path.join(self._logs_dir, bag_id, f"{job_id}.{number}.log")

    def bootstrap_values(self, vm_id: str, vm_type: VmType, pool_node: str = "") -> dict[str, str]:
        return {}

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        return None

    def workdir_problem(self, path: str) -> str | None:
        """Why jobs could not run in `path` on this host (None when they can)."""
        if not os.path.isdir(path):
            return f"{path} is not a directory on the daemon's host"
        if not os.access(path, os.X_OK):
            return f"the daemon's user cannot enter {path}"
        return None

    def job_user_problem(self, account: str) -> str | None:
        """Why `account`'s jobs could not run here (no user they may run as), or None."""
        return self._users.problem(account)

    @staticmethod
    def _user_arguments(user: JobUser | None) -> dict[str, Any]:
        if user is None:
            return {}
        return {"user": user.uid, "group": user.gid, "extra_groups": []}

    def checkpoint_dir(self, bag_id: str, job_id: str) -> Path:
        return self._checkpoints / bag_id / job_id

    async def start(self, spec: AttemptSpec) -> str:
        log_path = self.log_path(spec.bag_id, spec.job_id, spec.number)
        checkpoint_dir = os.path.join(self._checkpoints_dir, spec.bag_id, spec.job_id)
        env = dict(self._base_env)
        env.update(
            job_environment(
                bag_id=spec.bag_id,
                job_id=spec.job_id,
                attempt=spec.number,
                checkpoint_dir=checkpoint_dir,
                params=spec.params,
                extra=spec.env,
            )
        )
        env[RUN_KEY] = f"{self._controller_id}:{spec.attempt_id}"
        try:
            user = self._users.for_account(spec.account)
        except JobUserError as exc:
            raise ExecutorError(str(exc)) from None
        if user is not None:  # its own identity, not the daemon's
            env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        # Directories, the log and the process in one trip to a worker thread.
        popen = await asyncio.to_thread(
            self._spawn, spec, Path(log_path), Path(checkpoint_dir), env, user
        )
        process = _Child(popen)
        running = _Running(spec, process)
        self._running[spec.attempt_id] = running
        running.watcher = asyncio.create_task(self._watch(running), name=f"watch {spec.attempt_id}")
        return ""

    def _spawn(
        self,
        spec: AttemptSpec,
        log_path: Path,
        checkpoint_dir: Path,
        env: dict[str, str],
        user: JobUser | None,
    ) -> subprocess.Popen[bytes]:
        """Make the attempt's directories and log and start its wrapper, which records the
        command's exit status beside the log (on a worker thread: several syscalls, a
        fork and an exec)."""
        try:
            _prepare_dirs(log_path.parent, checkpoint_dir)
            if user is not None:
                hand_over(
                    self._state_dir, checkpoint_dir, user, markers=[exit_status_path(log_path)]
                )
            # The daemon opens the log: the job writes to it without reaching the
            # state directory.
            log = open(log_path, "ab")  # noqa: SIM115  (closed below, once the child has it)
        except OSError as exc:
            raise start_error("cannot prepare log/checkpoint directories", exc) from exc
        exit_status = str(exit_status_path(log_path))
        try:
            return subprocess.Popen(
                ["/bin/sh", "-c", LOCAL_WRAPPER, "spotbag-job", spec.command, exit_status],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=spec.workdir or None,
                env=env,
                start_new_session=True,
                **self._user_arguments(user),
            )
        except OSError as exc:
            raise start_error(f"cannot start /bin/sh in workdir {spec.workdir!r}", exc) from exc
        finally:
            log.close()

    async def _watch(self, running: _Running) -> None:
        spec, process = running.spec, running.process
        timed_out = False
        try:
            try:
                await asyncio.wait_for(process.wait(), timeout=spec.max_runtime_s)
            except TimeoutError:
                timed_out = True
                await self._stop(running, "timed out", grace_s=self._grace_s)
                await process.wait()
        finally:
            # Whatever happened, the scheduler hears of the end exactly once.
            self._running.pop(spec.attempt_id, None)
            self._emit(
                end_event(
                    spec.attempt_id,
                    spec.max_runtime_s,
                    process.returncode,
                    running.stop_reason,
                    timed_out,
                    self._now(),
                )
            )

    def _emit(self, event: AttemptEvent | CheckpointEvent) -> None:
        for listener in self._listeners:
            listener(event)

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        """SIGUSR1 to the attempt's process group, then watch its checkpoint directory:
        the checkpoint is written when a file in it appears or is replaced (temporary
        names, starting with '.' or ending in '.tmp', do not count: write to one and
        rename it into place)."""
        running = self._running.get(attempt_id)
        if running is None or running.stop_reason or running.checkpoint is not None:
            return
        spec = running.spec
        directory = self.checkpoint_dir(spec.bag_id, spec.job_id)
        before = await asyncio.to_thread(checkpoint_fingerprint, directory)
        requested_at = self._now()
        _signal_group(running.process.pid, signal.SIGUSR1)
        running.checkpoint = asyncio.create_task(
            self._await_checkpoint(running, directory, before, requested_at, timeout_s),
            name=f"checkpoint {attempt_id}",
        )

    async def _await_checkpoint(
        self,
        running: _Running,
        directory: Path,
        before: tuple,
        requested_at: float,
        timeout_s: float,
    ) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        ok, detail = False, f"no checkpoint written within {timeout_s:g} s"
        try:
            while True:
                ended = running.process.returncode is not None
                if await asyncio.to_thread(checkpoint_fingerprint, directory) != before:
                    ok, detail = True, ""
                    break
                if ended:
                    detail = "the attempt ended before it wrote the checkpoint"
                    break
                if asyncio.get_running_loop().time() >= deadline:
                    break
                await asyncio.sleep(self._checkpoint_poll_s)
        finally:
            running.checkpoint = None
            self._emit(
                CheckpointEvent(running.spec.attempt_id, requested_at, self._now(), ok, detail)
            )

    async def _stop(self, running: _Running, reason: str, *, grace_s: float) -> None:
        running.stop_reason = running.stop_reason or reason
        pgid = running.process.pid
        if grace_s > 0:
            _signal_group(pgid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.process.wait(), timeout=grace_s)
        # SIGKILL the group even when the leader is gone: its children may linger.
        _signal_group(pgid, signal.SIGKILL)

    async def cancel(self, attempt_id: str) -> None:
        """SIGTERM now, SIGKILL after the grace period; returns at once (the end is an event)."""
        running = self._running.get(attempt_id)
        if running is not None and not running.stop_reason:
            running.stop_reason = "cancelled"
            task = asyncio.create_task(self._stop(running, "cancelled", grace_s=self._grace_s))
            self._stoppers.add(task)
            task.add_done_callback(self._stoppers.discard)

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        for running in [r for r in self._running.values() if r.spec.vm_id == vm_id]:
            await self._stop(running, "VM lost", grace_s=0)

    async def recover(
        self, attempts: Sequence[LiveAttempt], live_vm_ids: Sequence[str] = ()
    ) -> set[str]:
        """After a restart (or a rebuild of the scheduler's memory):

        - attempts this executor still runs are watched on;
        - every other process left by this controller is killed (the daemon crashed);
        - attempts that finished meanwhile (their exit status was recorded, in a file
          of the attempt's job user that nobody else may write) are reported as ended,
          with that status, instead of being lost and run again.
        Returns the attempts that are running or were reported."""
        keep = {r.process.pid for r in self._running.values()}
        await asyncio.to_thread(kill_orphans, self._controller_id, keep_groups=keep)
        known = {a.attempt_id for a in attempts if a.attempt_id in self._running}
        for live in attempts:
            attempt_id = live.attempt_id
            if attempt_id in known:
                continue
            job_id, _, number = attempt_id.rpartition(".")
            log_path = Path(self.log_path(job_id.rpartition("-")[0], job_id, int(number)))
            finished = await asyncio.to_thread(
                read_exit_status, exit_status_path(log_path), self._users.owner(live.account)
            )
            if finished is not None:
                code, at = finished
                self._emit(
                    AttemptEvent(
                        attempt_id,
                        at,
                        Outcome.EXITED,
                        code,
                        "finished while the controller was down",
                    )
                )
                known.add(attempt_id)
        return known

    async def shutdown(self) -> None:
        running = list(self._running.values())
        await asyncio.gather(
            *(self._stop(r, "controller stopping", grace_s=self._grace_s) for r in running),
            *list(self._stoppers),
        )
        watchers = [r.watcher for r in running if r.watcher is not None]
        if watchers:
            await asyncio.gather(*watchers, return_exceptions=True)

    def running_pids(self) -> dict[str, int]:
        return {attempt_id: r.process.pid for attempt_id, r in self._running.items()}


def _prepare_dirs(*paths: Path) -> None:
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_orphans(
    controller_id: str,
    proc: Path = Path("/proc"),
    keep_groups: frozenset[int] | set[int] = frozenset(),
) -> list[int]:
    """SIGKILL the process groups of processes started by this controller (found by
    their SPOTBAG_RUN_KEY), except the groups in `keep_groups`. Returns the process
    ids killed."""
    marker = f"{RUN_KEY}={controller_id}:".encode()
    me = os.getpid()
    found: list[int] = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(var.startswith(marker) for var in environ.split(b"\0")):
            pid = int(entry.name)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group not in keep_groups:
                    found.append(pid)
                    os.killpg(group, signal.SIGKILL)
    return found
