"""The Executor protocol: start, cancel and watch attempts of jobs on VMs.

Attempt specs and events are NamedTuples (immutable, cheap to create: a large
simulation makes one of each per attempt).

An executor reports what happens to attempts as `AttemptEvent`s (and the
checkpoints it was asked for as `CheckpointEvent`s) pushed to its subscribers.
It never decides retries or states: the scheduler does.

Executors differ in these ways the scheduler asks about (class attributes):

- `joins_vms`: a VM runs attempts only once it has joined the executor's cluster
  (a Slurm node registered); the executor says so with a `NodeEvent`. Until then
  the scheduler treats a running VM like a booting one.
- `queues_attempts`: `start` hands the attempt to a queue and returns; the
  executor reports with `AttemptStarted` when it really runs.
- `attempts_outlive_controller`: attempts keep running when the controller
  stops (Slurm jobs); the controller then leaves them be and re-adopts them.
- `confirms_ends`: an attempt is ended only by the executor's own AttemptEvent, sent
  once its engine confirms that the attempt's job can never run any more (Slurm: the
  job is finished or cancelled in squeue), also when its VM is gone. The scheduler
  then keeps such an attempt open (its VM gone) until that event, so that a job is
  never retried while an earlier attempt of it may still run. Executors that kill
  their attempts themselves, at once (local, sim), do not.
- `queue_ahead`: how much more than a VM's capacity (a fraction of it) may be handed
  to the executor's queue, so that the executor refills a slot the moment it frees.
- `backlog_pass_interval_s` and `backlogged()`: an executor whose queue refills its
  slots without the scheduler (the local one) lets the scheduler space its passes by
  up to this many seconds while `backlogged()` (every VM it runs on has attempts
  waiting in its queue: no slot goes idle meanwhile); the planner then queues enough
  short jobs to last that long (docs/architecture.md#local-queue). 0: passes as usual.
- `vms_settling()`: VMs where an attempt has ended (its program's exit status is in)
  but the engine has not yet said its job did (Slurm: the batch script's end reaches
  slurmctld a moment after the program's). Such a VM is not idle yet: ended now, its
  job would be recorded as NODE_FAIL instead of COMPLETED.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from enum import StrEnum
from typing import NamedTuple, Protocol, runtime_checkable

from controller.bags.job_command import ParamValue
from controller.bags.spec import SimulationHints
from controller.errors import SpotbagError
from drivers.base import VmType

# A job's exit code when its program died of the checkpoint signal (SIGUSR1): the
# wrappers report a program killed by signal N as 128 + N, as a shell does.
CHECKPOINT_SIGNAL_EXIT_CODE = 128 + signal.SIGUSR1


class Outcome(StrEnum):
    EXITED = "exited"  # the program ended by itself; exit_code says how
    TIMED_OUT = "timed_out"  # killed after max_runtime_s
    KILLED = "killed"  # killed on request (cancel, VM lost, shutdown)
    START_FAILED = "start_failed"  # could not be started at all (the job's fault: counted)
    # Never ran, through no fault of its own (the engine could not take it, or its node
    # never became available): run again, not counted against max_attempts.
    NOT_STARTED = "not_started"


class AttemptEvent(NamedTuple):
    attempt_id: str
    at: float  # epoch seconds
    outcome: Outcome
    exit_code: int | None = None
    detail: str = ""
    key: str = ""  # the callback that told (recorded with the change it causes)


class AttemptStarted(NamedTuple):
    """An attempt handed to a queue began to run (executors that queue attempts)."""

    attempt_id: str
    at: float  # when it began, epoch seconds
    key: str = ""


class NodeEvent(NamedTuple):
    """A VM joined the executor's cluster and can run attempts (`ready`), or its node
    broke (not ready any more: `detail` says how)."""

    vm_id: str
    at: float
    ready: bool
    detail: str = ""


class NodeNotice(NamedTuple):
    """The VM heard from its cloud, on the VM itself, that it is about to be taken (the
    notice watcher drained its node: docs/checkpoints.md#notices): by `ends_by` (epoch
    s), or, with `ends_by` None, only that it is at elevated risk (EC2's rebalance
    recommendation)."""

    vm_id: str
    at: float
    ends_by: float | None
    detail: str = ""


class CallbackNoted(NamedTuple):
    """A callback that changed nothing here (an allocation notice, a wake-up, an event
    for an attempt already ended): recorded so that a replay is known as one."""

    key: str
    at: float
    kind: str
    subject: str  # what it was about, e.g. the Slurm job name


class CheckpointEvent(NamedTuple):
    """A checkpoint the scheduler asked for ended: the job wrote it (`ok`), or it did
    not within the time allowed, or the attempt ended first."""

    attempt_id: str
    requested_at: float  # when the job was signalled, epoch seconds
    at: float  # when the checkpoint was seen complete (or given up on)
    ok: bool
    detail: str = ""


class AttemptSpec(NamedTuple):
    """Everything an executor needs to run one attempt of one job."""

    attempt_id: str  # "<job id>.<number>"
    bag_id: str
    job_id: str
    number: int
    vm_id: str
    command: str  # rendered, placeholders filled
    params: Mapping[str, ParamValue]
    env: Mapping[str, str]  # the bag's extra variables
    workdir: str | None
    max_runtime_s: float
    estimated_runtime_s: float | None = None
    simulation: SimulationHints | None = None
    resume_work_s: float = 0.0  # work already saved in the job's checkpoint (sim executor)
    checkpoint_cost_s: float = 0.0  # how long the job takes to write one (sim executor)
    cpus: int = 1  # what the job reserves on its VM (Slurm: -c, --mem)
    memory_gb: float = 1.0
    gpus: int = 0
    account: str = ""  # its bag's: whose user it runs as (executors/job_users.py)


class LiveAttempt(NamedTuple):
    """An attempt the store has as starting or running (for `recover`)."""

    attempt_id: str
    vm_id: str
    started_at: float
    max_runtime_s: float
    ref: str = ""  # the executor's own reference, e.g. the Slurm job id
    account: str = ""  # its bag's: whose user's files tell how it went


ExecutorEvent = (
    AttemptEvent | CheckpointEvent | AttemptStarted | NodeEvent | NodeNotice | CallbackNoted
)
AttemptListener = Callable[[ExecutorEvent], None]


class ExecutorError(SpotbagError):
    """An attempt could not be started; the message says why."""

    status = 503
    code = "executor_unavailable"


class ExecutorUnavailable(ExecutorError):
    """The executor cannot take attempts now (its cluster does not answer, the
    controller is out of descriptors or memory): the attempt did not start, through no
    fault of its own; new ones wait a while."""


# The controller's host ran out of something while starting an attempt: descriptors
# (its own or the system's), memory, processes (fork's EAGAIN), buffers, disk or quota.
# The job is not at fault: no attempt of it is counted, starts back off (issue 23).
RESOURCE_ERRNOS = frozenset(
    {
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOMEM,
        errno.EAGAIN,
        errno.ENOBUFS,
        errno.ENOSPC,
        errno.EDQUOT,
    }
)


def start_error(what: str, exc: OSError) -> ExecutorError:
    """What an OSError while starting an attempt means: the controller's resources ran
    out (ExecutorUnavailable, not counted) or the attempt cannot start (counted)."""
    if exc.errno in RESOURCE_ERRNOS:
        return ExecutorUnavailable(f"{what}: the controller's host ran out of resources: {exc}")
    return ExecutorError(f"{what}: {exc}")


class Executor(Protocol):
    name: str
    joins_vms: bool
    queues_attempts: bool
    attempts_outlive_controller: bool
    confirms_ends: bool
    queue_ahead: float
    backlog_pass_interval_s: float

    def backlogged(self) -> bool:
        """Whether every VM it runs attempts on has more waiting in its queue."""

    def subscribe(self, listener: AttemptListener) -> None: ...

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        """Where the attempt's output goes ("" when it keeps none)."""

    def bootstrap_values(
        self, vm_id: str, vm_type: VmType, pool_node: str = ""
    ) -> Mapping[str, str]:
        """What a new VM's bootstrap needs to join this executor's cluster (none: {}); a
        VM that serves a Slurm power-saving node joins as `pool_node`."""

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        """The VM runs: executors that join VMs watch for it (NodeEvent)."""

    async def start(self, spec: AttemptSpec) -> str:
        """Start the attempt; returns the executor's reference for it ("" if none).
        Raises ExecutorError if it cannot start."""

    def enqueue(self, spec: AttemptSpec) -> bool:
        """Hand the attempt to the executor's own queue without waiting, as `start` would
        with no reference to give back: True; or False, and nothing done, when it must be
        started with `start` (an executor without such a queue always says False).
        Raises ExecutorError as `start` does."""

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        """Ask a running attempt to write a checkpoint now; returns at once. Whether it
        did (within `timeout_s`) is reported as a CheckpointEvent."""

    async def cancel(self, attempt_id: str) -> None:
        """Stop the attempt; its end is reported as an event (Outcome.KILLED)."""

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        """The VM is gone (preempted, terminated, failed): its attempts are dead (the
        local executor kills them; the Slurm executor downs and removes its node, or
        powers a pool node down by force, so that Slurm requeues its users' jobs)."""

    async def recover(
        self, attempts: Sequence[LiveAttempt], live_vm_ids: Sequence[str]
    ) -> set[str]:
        """After a controller restart: which of these attempts are still running and
        watched again (or were reported ended). The rest are lost (and must not be left
        running). `live_vm_ids` are the VMs still alive."""

    async def shutdown(self) -> None:
        """Stop every attempt (the controller is stopping)."""

    def vms_settling(self) -> Collection[str]:
        """VMs whose ended attempts' jobs the engine has not yet seen end (module
        docstring); empty for executors whose ends are their engines' own."""


@runtime_checkable
class PoolExecutor(Executor, Protocol):
    """An executor that also serves Slurm power-saving pools (only the Slurm executor:
    controller/daemon.py wires pools only with it): Slurm users' jobs and nodes."""

    async def cancel_job(self, job_id: str, why: str) -> None:
        """Cancel somebody's Slurm job (a pool job its account cannot pay for)."""

    async def release_pool_node(self, node: str, reason: str) -> None:
        """Power an idle pool node down once its jobs are done."""


# --- optional capabilities, checked once when the daemon wires its executor -------------


@runtime_checkable
class AdmissionChecks(Protocol):
    """An executor that can tell at admission why a bag's jobs could not run here."""

    def job_user_problem(self, account: str) -> str | None:
        """Why jobs of `account` have no user to run as (None: they have one)."""


@runtime_checkable
class WorkdirChecks(Protocol):
    """An executor whose jobs run in a directory of this host, which must exist."""

    def workdir_problem(self, path: str) -> str | None:
        """Why jobs cannot run in `path` (None: they can)."""


@runtime_checkable
class NodeNames(Protocol):
    """An executor whose VMs are cluster nodes with names of their own."""

    def node_of(self, vm_id: str) -> str:
        """The node a VM is, or serves ("" when none)."""
