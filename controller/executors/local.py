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

Attempts queue here (`queues_attempts`, docs/architecture.md#local-queue): the
scheduler may hand a VM `queue_ahead` of its capacity more than it runs, and the
executor starts the next that fits the moment one ends, reporting `AttemptStarted`,
without waiting for a scheduler pass and its commit (the intents of queued attempts
are written already). A VM's capacity is what `vm_started` announced; an attempt for
a VM never announced starts at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import os
import queue
import select
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
    AttemptStarted,
    CheckpointEvent,
    ExecutorError,
    ExecutorEvent,
    ExecutorUnavailable,
    LiveAttempt,
    Outcome,
    start_error,
)
from controller.executors.job_users import JobUser, JobUserError, JobUsers
from drivers.base import VmType

RUN_KEY = "SPOTBAG_RUN_KEY"
# Starts handed over together go to a spawner thread together, this many a trip: a trip
# costs the daemon ~0.2 ms of CPU (a thread woken, the GIL handed over and back;
# 2,000 trivial jobs on 4 slots: 1.78-2.02 ms of daemon CPU a job with a trip each,
# 1.61-1.63 gathered, load 9-10), and a spawn waits for its child's exec, so a
# hundred at once still start on several threads (SPAWNER_THREADS).
SPAWNS_PER_TRIP = 8
SPAWNER_THREADS = 4
# But as many as this are started on the event loop itself, which then waits for their
# fork and exec (the time vfork holds the caller: 0.9 ms median, 1.5 ms p90, 3 ms at
# most over 500 spawns beside 4 running jobs on this 2-CPU host; a pass holds the loop
# ~15 ms): a slot freed by a job's end is refilled at once, and the trip to a thread
# cost the loop more than it saved. 2,000 trivial jobs on 4 slots
# (bench/local_dispatch.py, tmpfs, load 2-2.5), alternated, 3 rounds each: the
# daemon's CPU 1.09-1.15 ms a job with every start on a thread, 0.94-0.96 with up to 2
# on the loop (8.4 context switches a job -> 3.5), the ratio to xargs 2.08-2.11x ->
# 1.95-2.01x; up to 4, or every start on the loop: no better.
SPAWNS_ON_THE_LOOP = 2
# After a start failed for want of the host's resources (descriptors, memory,
# processes), starts are refused this long (ExecutorUnavailable), so that the
# scheduler backs off instead of handing over attempts that fail again at once.
UNAVAILABLE_S = 1.0
QUEUE_AHEAD = 1.0  # [executor] queue_ahead's default
# While every VM has attempts waiting here, the scheduler may space its passes by this
# much (`backlogged`): a pass records the ends and hands over more, and nothing waits
# for it meanwhile. 2,000 trivial jobs on 4 slots (bench/local_dispatch.py, state on
# tmpfs, load 1-3): a pass every 5 ms, 0.30 passes and 1.52-1.58 ms of the daemon's
# CPU a job; spaced by 50 ms with 16 VM-fulls queued, 0.03 passes and 0.98-1.11 ms.
BACKLOG_PASS_INTERVAL_S = 0.05


class _PidfdWatch:
    """The pidfds of an executor's processes in one epoll set of its own, which the event
    loop watches as one descriptor: a process is watched and forgotten with one
    epoll_ctl each, not a reader of the loop's own (asyncio's add_reader and
    remove_reader: a selector key, a handle, their bookkeeping; 5-6 % of the daemon's
    samples holding the GIL with trivial jobs, py-spy on bench/local_dispatch.py)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._epoll = select.epoll()  # close-on-exec, as Python opens all
        self._children: dict[int, _Child] = {}  # by pidfd
        loop.add_reader(self._epoll.fileno(), self._ready)

    def add(self, pidfd: int, child: _Child) -> None:
        self._children[pidfd] = child
        self._epoll.register(pidfd, select.EPOLLIN)

    def _ready(self) -> None:
        for pidfd, _ in self._epoll.poll(0):
            child = self._children[pidfd]
            if child.reap():  # a pidfd turns readable only once its process ended
                self._epoll.unregister(pidfd)
                os.close(pidfd)
                del self._children[pidfd]
                child.settle()

    def close(self) -> None:
        """Stop watching (the processes still watched are left to be reaped as zombies'
        parents are: at the daemon's exit)."""
        with contextlib.suppress(ValueError, RuntimeError):  # closed already, or the loop
            self.loop.remove_reader(self._epoll.fileno())
        for pidfd in self._children:
            os.close(pidfd)
        self._children.clear()
        self._epoll.close()


class _Deadlines:
    """When each running attempt's max_runtime_s runs out, in one heap with one timer of
    the loop's for the earliest, rather than a timer each (a TimerHandle made and
    cancelled for each attempt: 6 % of the daemon's time holding the GIL with trivial
    jobs, py-spy --gil on bench/local_dispatch.py). An attempt that ended stays in the
    heap until its time comes or the heap is rebuilt: its `_Running` says it ended."""

    def __init__(self, time_out: Callable[[_Running], None]) -> None:
        self._time_out = time_out
        self._heap: list[tuple[float, int, _Running]] = []
        self._order = itertools.count()  # ties: first watched, first timed out
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.live = 0  # attempts watched that have not ended

    def add(self, running: _Running, loop: asyncio.AbstractEventLoop) -> None:
        at = loop.time() + running.spec.max_runtime_s
        self.live += 1
        if len(self._heap) > 2 * self.live + 64:  # mostly attempts long ended: rebuild
            self._heap = [entry for entry in self._heap if not entry[2].ended]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (at, next(self._order), running))
        if self._timer is None or at < self._timer_at:
            self._arm(loop, at)

    def ended(self) -> None:
        self.live -= 1

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(at, self._due, loop), at

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            running = heapq.heappop(self._heap)[2]
            if not running.ended:
                self._time_out(running)
        if self._heap:
            self._arm(loop, self._heap[0][0])

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Child:
    """A job's wrapper process, spawned by `subprocess.Popen` (on a spawner thread, or on
    the loop for one or two at a time: SPAWNS_ON_THE_LOOP) and watched from the loop: its
    end wakes the loop through a pidfd (`_PidfdWatch`; on a thread of its own where
    there are no pidfds, or none left), and the loop reaps it. The Popen object is kept
    to the end: only it reaps this process (subprocess reaps on its own only the
    children of Popen objects that were dropped while they ran)."""

    def __init__(self, popen: subprocess.Popen[bytes], watch: Callable[[], _PidfdWatch]) -> None:
        self._popen = popen
        self.pid = popen.pid
        loop = asyncio.get_running_loop()
        # Made only for a caller of `wait` (a stop, a shutdown): most jobs just end.
        self._ended: asyncio.Future[int] | None = None
        self._settled = False
        self._on_end: list[Callable[[], None]] = []
        try:
            pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # no pidfds (old kernel, sandbox) or descriptors
            self._wait_on_a_thread(loop)
            return
        try:
            watch().add(pidfd, self)
        except OSError:  # no descriptor left for the watch's epoll set
            os.close(pidfd)
            self._wait_on_a_thread(loop)

    def _wait_on_a_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(
            target=self._wait_in_thread, args=(loop,), name=f"wait {self.pid}", daemon=True
        ).start()

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def wait(self) -> asyncio.Future[int]:
        """Its exit status (Popen's: -N when a signal N killed it), once it ended: a
        future that a caller's cancellation leaves alone."""
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
            if self._settled:
                self._ended.set_result(self._popen.returncode)
        return asyncio.shield(self._ended)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` on the loop once it ended (before those waiting in `wait`):
        from the callback that reaped it, not a turn of the loop later."""
        self._on_end.append(callback)

    def reap(self) -> bool:
        """Whether it ended (and is reaped)."""
        return self._popen.poll() is not None

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        self._popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self.settle)

    def settle(self) -> None:
        """Report its end: the callbacks of `on_end`, then those waiting in `wait`."""
        if not self._settled:
            self._settled = True
            code = self._popen.returncode
            assert code is not None
            callbacks, self._on_end = self._on_end, []
            for callback in callbacks:
                callback()
            if self._ended is not None:
                self._ended.set_result(code)


@dataclass
class _Spawn:
    """An attempt to start, on its way to a spawner thread (`LocalExecutor._spawn`)."""

    spec: AttemptSpec
    log_path: str
    checkpoint_dir: str
    env: dict[str, str]
    user: JobUser | None
    # For a start() that waits (a VM never announced): set once its process is watched,
    # or with its error. A queued attempt's error ends it (`_queued_start_failed`).
    done: asyncio.Future[None] | None = None
    host: _Host | None = None  # the VM whose room it takes, once it leaves the queue
    stop_reason: str = ""  # stopped while its process was being started


@dataclass
class _Host:
    """A VM as the executor fills it: its capacity, what its attempts use, and the
    attempts waiting for room there, first come first started."""

    cpus: int
    memory_gb: float
    gpus: int
    used_cpus: int = 0
    used_memory_gb: float = 0.0
    used_gpus: int = 0
    waiting: collections.deque[_Spawn] = field(default_factory=collections.deque)

    def fits(self, spec: AttemptSpec) -> bool:
        # A hair of slack: memory is a float summed and taken away again.
        return (
            self.used_cpus + spec.cpus <= self.cpus
            and self.used_gpus + spec.gpus <= self.gpus
            and self.used_memory_gb + spec.memory_gb <= self.memory_gb + 1e-9
        )

    def empty(self) -> bool:
        """Nothing of its runs (an attempt larger than the VM, which the planner would
        not place, still starts on it rather than wait for ever)."""
        return self.used_cpus == 0 and self.used_gpus == 0 and self.used_memory_gb < 1e-9

    def take(self, spec: AttemptSpec, sign: int = 1) -> None:
        self.used_cpus += sign * spec.cpus
        self.used_gpus += sign * spec.gpus
        self.used_memory_gb += sign * spec.memory_gb


@dataclass
class _Running:
    spec: AttemptSpec
    process: _Child
    host: _Host | None = None  # whose room it takes
    ended: bool = False  # its end reported (its max_runtime_s no longer counts)
    timed_out: bool = False
    stop_reason: str = ""  # set when we stopped it on purpose
    checkpoint: asyncio.Task | None = None  # waiting for a checkpoint it was asked for


class LocalExecutor:
    name = "local"
    joins_vms = False
    queues_attempts = True  # the next waiting attempt starts when one ends
    attempts_outlive_controller = False
    confirms_ends = False  # vm_lost kills the attempts at once
    backlog_pass_interval_s = BACKLOG_PASS_INTERVAL_S

    def __init__(
        self,
        state_dir: Path,
        *,
        controller_id: str,
        now: Callable[[], float],
        kill_grace_s: float = 5.0,
        checkpoint_poll_s: float = 0.02,
        users: JobUsers | None = None,
        queue_ahead: float = QUEUE_AHEAD,
    ) -> None:
        self.queue_ahead = queue_ahead
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
        self._to_spawn: list[_Spawn] = []  # starts gathered for one spawner-thread trip
        self._hosts: dict[str, _Host] = {}  # by VM id, as vm_started announced them
        # The host each attempt waiting for room waits on, by attempt id: a cancel finds
        # it without a look through every VM's queue (a bag's cancel: one per attempt).
        self._waiting: dict[str, _Host] = {}
        self._spawning: dict[str, _Spawn] = {}  # by attempt id: processes being started
        self._trips: set[asyncio.Future[None]] = set()  # spawner-thread trips under way
        self._pidfds: _PidfdWatch | None = None  # the running loop's, made at the first start
        self._deadlines: _Deadlines | None = None  # the running loop's, likewise
        self._deadlines_loop: asyncio.AbstractEventLoop | None = None
        self._unavailable_until = 0.0  # loop time; and why:
        self._unavailable = ""
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
        """A VM runs: attempts for it wait for room in its capacity."""
        if vm_id not in self._hosts:
            self._hosts[vm_id] = _Host(vm_type.cpus, vm_type.memory_gb, vm_type.gpus)

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
        if self.enqueue(spec):
            return ""
        # A VM never announced: at once, and its error is the start's.
        request = self._request(spec)
        request.done = asyncio.get_running_loop().create_future()
        self._gather(request)
        await asyncio.shield(request.done)
        return ""

    def enqueue(self, spec: AttemptSpec) -> bool:
        """Hand the attempt to its VM's queue without waiting: True, or False for a VM
        never announced (`start` it). Raises ExecutorError as `start` does. The
        scheduler hands its passes' starts over this way, without a task each
        (`Actions._enqueue_all`)."""
        host = self._hosts.get(spec.vm_id)
        if host is None:
            return False
        request = self._request(spec)
        host.waiting.append(request)
        self._waiting[spec.attempt_id] = host
        self._fill(host)
        return True

    def _request(self, spec: AttemptSpec) -> _Spawn:
        """What starting the attempt takes: its files' paths, environment and user."""
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
        if asyncio.get_running_loop().time() < self._unavailable_until:
            raise ExecutorUnavailable(self._unavailable)
        return _Spawn(spec, log_path, checkpoint_dir, env, user)

    def _fill(self, host: _Host) -> None:
        """Start the attempts waiting for this VM while the first fits (in order: the
        planner's, which packed them)."""
        while host.waiting and (host.fits(host.waiting[0].spec) or host.empty()):
            request = host.waiting.popleft()
            del self._waiting[request.spec.attempt_id]
            host.take(request.spec)
            request.host = host
            self._gather(request)

    def _queued_start_failed(self, request: _Spawn, exc: BaseException) -> None:
        """A queued attempt that could not start ends so (an event: its start() returned
        long ago); its room goes to the next."""
        assert request.host is not None
        request.host.take(request.spec, -1)
        if isinstance(exc, ExecutorUnavailable):
            self._unavailable_until = asyncio.get_running_loop().time() + UNAVAILABLE_S
            self._unavailable = str(exc)
            outcome = Outcome.NOT_STARTED  # the host's fault: not counted
        else:
            outcome = Outcome.START_FAILED
        self._emit(AttemptEvent(request.spec.attempt_id, self._now(), outcome, None, str(exc)))
        self._fill(request.host)

    def _gather(self, request: _Spawn) -> None:
        # The starts handed over together take one trip to a spawner thread: they are
        # gathered until the loop runs its next callbacks (`_spawn_gathered`).
        self._spawning[request.spec.attempt_id] = request
        self._to_spawn.append(request)
        if len(self._to_spawn) == 1:
            asyncio.get_running_loop().call_soon(self._spawn_gathered)

    def _spawn_gathered(self) -> None:
        gathered, self._to_spawn = self._to_spawn, []
        loop = asyncio.get_running_loop()
        if len(gathered) <= SPAWNS_ON_THE_LOOP:
            self._spawned(None, gathered, self._spawn_all(gathered))
            return
        # Each spawn waits for its child's exec: many at once (a big VM's first pass)
        # go on several threads.
        for first in range(0, len(gathered), SPAWNS_PER_TRIP):
            requests = gathered[first : first + SPAWNS_PER_TRIP]
            trip: asyncio.Future[None] = loop.create_future()
            self._trips.add(trip)
            _SPAWNERS.run(self._spawn_all, requests, loop, functools.partial(self._spawned, trip))

    def _spawn_all(self, requests: list[_Spawn]) -> list[subprocess.Popen[bytes] | BaseException]:
        """Each attempt's directories, log and process (on a spawner thread)."""
        results: list[subprocess.Popen[bytes] | BaseException] = []
        for request in requests:
            try:
                results.append(self._spawn(request))
            except BaseException as exc:  # that attempt's error, handed to its start()
                results.append(exc)
        return results

    def _spawned(
        self,
        trip: asyncio.Future[None] | None,
        requests: list[_Spawn],
        results: list[subprocess.Popen[bytes] | BaseException],
    ) -> None:
        """Watch the processes started (here, on the loop, even if a start() that waits
        for one was cancelled meanwhile: none runs unwatched), and wake their starts.
        `trip`: the spawner thread's trip that started them (None: the loop did)."""
        if trip is not None:
            self._trips.discard(trip)
            trip.set_result(None)
        for request, result in zip(requests, results, strict=True):
            self._spawning.pop(request.spec.attempt_id, None)
            if isinstance(result, BaseException):
                if request.done is not None:  # its start() waits for it
                    request.done.set_exception(result)
                elif request.host is not None:
                    self._queued_start_failed(request, result)
                continue
            running = _Running(request.spec, _Child(result, self._pidfd_watch), request.host)
            self._watch(running)
            # Before its end can be: the end comes through the loop's next poll.
            self._emit(AttemptStarted(request.spec.attempt_id, self._now()))
            if request.done is not None:
                request.done.set_result(None)
            if request.stop_reason:  # cancelled or its VM lost while it was started
                self._stop_soon(running, request.stop_reason, self._grace_s)

    def _pidfd_watch(self) -> _PidfdWatch:
        """The pidfd watch of the running loop, made at the first process it watches (a
        new one if the loop changed: tests). Raises OSError without a descriptor left."""
        loop = asyncio.get_running_loop()
        if self._pidfds is None or self._pidfds.loop is not loop:
            self._pidfds = _PidfdWatch(loop)
        return self._pidfds

    def _spawn(self, request: _Spawn) -> subprocess.Popen[bytes]:
        """Make the attempt's checkpoint directory and log and start its wrapper, which
        records the command's exit status beside the log (several syscalls, a fork and
        an exec). Directories are made when missing: the first attempt of a bag makes
        its log directory, each job's first its checkpoint directory."""
        spec, user = request.spec, request.user
        log_path, checkpoint_dir = request.log_path, request.checkpoint_dir
        exit_status = os.path.splitext(log_path)[0] + ".exit"  # exit_status_path's
        try:
            if user is None:
                _make_dir(checkpoint_dir)
            else:
                hand_over(
                    self._state_dir,
                    Path(checkpoint_dir),
                    user,
                    markers=[Path(exit_status)],
                )
            # The daemon opens the log: the job writes to it without reaching the
            # state directory.
            log = _open_log(log_path)
        except OSError as exc:
            raise start_error("cannot prepare log/checkpoint directories", exc) from exc
        try:
            return subprocess.Popen(
                ["/bin/sh", "-c", LOCAL_WRAPPER, "/bin/sh", spec.command, exit_status],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=spec.workdir or None,
                env=request.env,
                start_new_session=True,
                **self._user_arguments(user),
            )
        except OSError as exc:
            raise start_error(f"cannot start /bin/sh in workdir {spec.workdir!r}", exc) from exc
        finally:
            os.close(log)

    def _watch(self, running: _Running) -> None:
        """Its end reported once it ended; stopped past its max_runtime_s (callbacks on
        the loop, not a task an attempt)."""
        self._running[running.spec.attempt_id] = running
        loop = asyncio.get_running_loop()
        if self._deadlines is None or self._deadlines_loop is not loop:  # a new loop: tests
            self._deadlines, self._deadlines_loop = _Deadlines(self._time_out), loop
        self._deadlines.add(running, loop)
        running.process.on_end(functools.partial(self._ended, running))

    def _time_out(self, running: _Running) -> None:
        if running.process.returncode is not None:  # ended; its end is on its way
            return
        running.timed_out = True
        self._stop_soon(running, "timed out", self._grace_s)

    def _stop_soon(self, running: _Running, reason: str, grace_s: float) -> None:
        running.stop_reason = running.stop_reason or reason
        task = asyncio.create_task(self._stop(running, reason, grace_s=grace_s))
        self._stoppers.add(task)
        task.add_done_callback(self._stoppers.discard)

    def _ended(self, running: _Running) -> None:
        """Whatever happened, the scheduler hears of the end exactly once."""
        spec = running.spec
        running.ended = True
        if self._deadlines is not None:
            self._deadlines.ended()
        self._running.pop(spec.attempt_id, None)
        if running.host is not None:  # its room goes to the next waiting there
            running.host.take(spec, -1)
            running.host = None
            self._fill_later(spec.vm_id)
        self._emit(
            end_event(
                spec.attempt_id,
                spec.max_runtime_s,
                running.process.returncode,
                running.stop_reason,
                running.timed_out,
                self._now(),
            )
        )

    def _fill_later(self, vm_id: str) -> None:
        host = self._hosts.get(vm_id)
        if host is not None and host.waiting:
            self._fill(host)

    def _emit(self, event: ExecutorEvent) -> None:
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
        """SIGTERM now, SIGKILL after the grace period; returns at once (the end is an
        event). One still waiting for room ends at once; one being started is stopped
        once it is."""
        host = self._waiting.pop(attempt_id, None)
        if host is not None:
            for position, request in enumerate(host.waiting):
                if request.spec.attempt_id == attempt_id:
                    del host.waiting[position]
                    break
            self._emit(AttemptEvent(attempt_id, self._now(), Outcome.KILLED, None, "cancelled"))
            return
        starting = self._spawning.get(attempt_id)
        if starting is not None:
            starting.stop_reason = starting.stop_reason or "cancelled"
            return
        running = self._running.get(attempt_id)
        if running is not None and not running.stop_reason:
            self._stop_soon(running, "cancelled", self._grace_s)

    def _drop_waiting(self, hosts: Sequence[_Host], reason: str) -> None:
        """The attempts waiting there never ran: they end (KILLED, `reason`)."""
        for host in hosts:
            waiting, host.waiting = list(host.waiting), collections.deque()
            for request in waiting:
                del self._waiting[request.spec.attempt_id]
                event = AttemptEvent(
                    request.spec.attempt_id, self._now(), Outcome.KILLED, None, reason
                )
                self._emit(event)

    async def _starts_settled(self) -> None:
        """Wait for the processes being started: none starts after it was told to stop."""
        while self._trips:
            await asyncio.wait(list(self._trips))

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        host = self._hosts.pop(vm_id, None)
        if host is not None:
            self._drop_waiting([host], "VM lost")
        await self._starts_settled()
        for running in [r for r in self._running.values() if r.spec.vm_id == vm_id]:
            running.host = None
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
        Returns the attempts that are running, waiting here for room, or were reported."""
        await self._starts_settled()
        keep = {r.process.pid for r in self._running.values()}
        await asyncio.to_thread(kill_orphans, self._controller_id, keep_groups=keep)
        waiting = {r.spec.attempt_id for host in self._hosts.values() for r in host.waiting}
        known = {
            a.attempt_id
            for a in attempts
            if a.attempt_id in self._running or a.attempt_id in waiting
        }
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

    def vms_settling(self) -> tuple[str, ...]:
        return ()  # an attempt's end is its process's

    def backlogged(self) -> bool:
        """Every VM has attempts waiting here for room (so none is full of nothing to
        do, nor has a slot a pass could fill now)."""
        return bool(self._hosts) and all(host.waiting for host in self._hosts.values())

    async def shutdown(self) -> None:
        self._drop_waiting(list(self._hosts.values()), "controller stopping")
        await self._starts_settled()
        running = list(self._running.values())
        await asyncio.gather(
            *(self._stop(r, "controller stopping", grace_s=self._grace_s) for r in running),
            *list(self._stoppers),
        )
        # Their ends are reported before the waits on them return (`_Child.on_end`).
        await asyncio.gather(*(r.process.wait() for r in running))
        if self._pidfds is not None:
            self._pidfds.close()
            self._pidfds = None
        if self._deadlines is not None:
            self._deadlines.close()

    def running_pids(self) -> dict[str, int]:
        return {attempt_id: r.process.pid for attempt_id, r in self._running.items()}


class _Spawners:
    """Threads that run the executors' spawn trips, started as needed up to
    SPAWNER_THREADS and kept for the process's life (daemon threads, idle on a queue):
    a trip and its result take a queue and one call_soon_threadsafe, where a thread
    pool's run_in_executor also wraps a concurrent future in an asyncio one and chains
    their states (a turn of the loop more; submitting and chaining were ~10 % of the
    daemon's samples holding the GIL with trivial jobs, py-spy on
    bench/local_dispatch.py)."""

    def __init__(self) -> None:
        self._trips: queue.SimpleQueue[
            tuple[
                Callable[[list[_Spawn]], list[subprocess.Popen[bytes] | BaseException]],
                list[_Spawn],
                asyncio.AbstractEventLoop,
                Callable[[list[_Spawn], list[subprocess.Popen[bytes] | BaseException]], None],
            ]
        ] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def run(
        self,
        spawn_all: Callable[[list[_Spawn]], list[subprocess.Popen[bytes] | BaseException]],
        requests: list[_Spawn],
        loop: asyncio.AbstractEventLoop,
        done: Callable[[list[_Spawn], list[subprocess.Popen[bytes] | BaseException]], None],
    ) -> None:
        """`spawn_all(requests)` on a spawner thread, then `done(requests, results)` on
        `loop` (its results: a process or the error that kept it from starting each)."""
        with self._lock:
            if self._idle <= 0 and len(self._threads) < SPAWNER_THREADS:
                thread = threading.Thread(
                    target=self._serve, name=f"spotbag-spawner-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                self._idle += 1
                thread.start()
            self._idle -= 1  # one of them takes this trip
        self._trips.put((spawn_all, requests, loop, done))

    def _serve(self) -> None:
        while True:
            spawn_all, requests, loop, done = self._trips.get()
            try:
                results = spawn_all(requests)
            except BaseException as exc:  # spawn_all hands each attempt's error back
                results = [exc] * len(requests)
            with self._lock:
                self._idle += 1
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(done, requests, results)


_SPAWNERS = _Spawners()


def _make_dir(path: str) -> None:
    """`path` made if missing, with its parents (one mkdir when only it is missing)."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)


def _open_log(path: str) -> int:
    """A descriptor appending to the log at `path` (made, with its directory, if
    missing), as open(path, "ab") opens it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o666)


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
