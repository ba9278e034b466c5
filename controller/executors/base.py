"""The Executor protocol: start, cancel and watch attempts of jobs on VMs.

Attempt specs and events are NamedTuples (immutable, cheap to create: a large
simulation makes one of each per attempt).

An executor reports what happens to attempts as `AttemptEvent`s (and the
checkpoints it was asked for as `CheckpointEvent`s) pushed to its subscribers.
It never decides retries or states: the scheduler does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import NamedTuple, Protocol

from controller.bagspec import ParamValue, SimulationHints


class Outcome(StrEnum):
    EXITED = "exited"  # the program ended by itself; exit_code says how
    TIMED_OUT = "timed_out"  # killed after max_runtime_s
    KILLED = "killed"  # killed on request (cancel, VM lost, shutdown)
    START_FAILED = "start_failed"  # could not be started at all


class AttemptEvent(NamedTuple):
    attempt_id: str
    at: float  # epoch seconds
    outcome: Outcome
    exit_code: int | None = None
    detail: str = ""


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


AttemptListener = Callable[[AttemptEvent | CheckpointEvent], None]


class ExecutorError(Exception):
    """An attempt could not be started; the message says why."""


class Executor(Protocol):
    name: str

    def subscribe(self, listener: AttemptListener) -> None: ...

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        """Where the attempt's output goes ("" when it keeps none)."""

    async def start(self, spec: AttemptSpec) -> None:
        """Start the attempt; raise ExecutorError if it cannot start."""

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        """Ask a running attempt to write a checkpoint now; returns at once. Whether it
        did (within `timeout_s`) is reported as a CheckpointEvent."""

    async def cancel(self, attempt_id: str) -> None:
        """Stop the attempt; its end is reported as an event (Outcome.KILLED)."""

    async def vm_lost(self, vm_id: str) -> None:
        """The VM is gone: its attempts are dead (the local executor kills them)."""

    async def recover(self, attempt_ids: Sequence[str]) -> set[str]:
        """After a controller restart: which of these attempts are still running and
        watched again. The rest are lost (and must not be left running)."""

    async def shutdown(self) -> None:
        """Stop every attempt (the controller is stopping)."""
