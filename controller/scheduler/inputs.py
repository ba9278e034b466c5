"""What reaches the scheduler between passes: its clock and id source, the commands
that callers queue for the next pass (a bag admitted, a cancellation, and Slurm's
power-saving and job-run reports about pool nodes), and the `Inbox` they and the
driver's and executor's events wait in.

Commands are frozen values: a pass that fails puts them back unchanged, and the pass
after the recovery handles them again (see `Scheduler.run` and `Scheduler.tick`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.bags.spec import BagSpec
from controller.executors.base import (
    AttemptEvent,
    CallbackNoted,
    CheckpointEvent,
    ExecutorEvent,
)
from drivers.base import VmStatus


class Clock(Protocol):
    def now(self) -> float: ...


class IdSource(Protocol):
    def new_vm_token(self) -> str: ...


@dataclass(frozen=True)
class _Admit:
    bag_id: str
    spec: BagSpec
    params_json: Sequence[str]
    held_from: int  # jobs from this index on are held for credit


@dataclass(frozen=True)
class _Cancel:
    bag_id: str


@dataclass(frozen=True)
class PoolPower:
    """Slurm's power saving about a pool node: resume, suspend or resume_fail."""

    kind: str
    node: str


@dataclass(frozen=True)
class PoolRunEvent:
    """A run of a Slurm user's job on a pool began (the prolog) or ended (jobcomp)."""

    kind: str  # "start" or "end"
    job_id: str
    job_name: str
    partition: str
    node: str
    user: str = ""
    account: str = ""
    restart: int = 0
    cpus: float | None = None
    limit_h: float | None = None  # its time limit (None: unlimited or unknown)
    state: str = ""
    exit_code: int | None = None
    # Slurm's START and END (jobcomp); a start's: when its prolog hook was sent.
    started_at: float | None = None
    ended_at: float | None = None
    # Resolved, once the pass that took it is done (a refused job cancelled), with
    # "reserved", "refused: <why>" or "repeat": the prolog hook waits for it.
    verdict: asyncio.Future[str] | None = field(default=None, compare=False)


# What callers queue for the next pass (`Scheduler._commands`).
Command = _Admit | _Cancel | PoolPower | PoolRunEvent


class Inbox:
    """What waits for the next pass: the events the driver and the executor push (they
    are subscribed to `on_vm_status` and `on_attempt_event`) or the scheduler found
    itself (`push`), the commands callers queue, and the event that wakes the loop."""

    def __init__(self) -> None:
        self.events: list[VmStatus | ExecutorEvent] = []
        self.commands: list[Command] = []
        self.wake = asyncio.Event()

    def on_vm_status(self, status: VmStatus) -> None:
        self.events.append(status)
        self.wake.set()

    def on_attempt_event(self, event: ExecutorEvent) -> None:
        self.events.append(event)
        # A callback that changed nothing is written with the next pass (within
        # poll_interval_s); it needs no pass of its own.
        if not isinstance(event, CallbackNoted):
            self.wake.set()

    def push(self, item: VmStatus | AttemptEvent | CheckpointEvent) -> None:
        """An event the scheduler found itself (a VM's status seen on a poll or in a
        launch's answer): handled with the next pass, like a pushed one."""
        self.events.append(item)
        self.wake.set()
