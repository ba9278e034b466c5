"""What reaches the scheduler between passes: its clock and id source, and the
commands that callers queue for the next pass (a bag admitted, a cancellation, and
Slurm's power-saving and job-run reports about pool nodes).

Commands are frozen values: a pass that fails puts them back unchanged, and the pass
after the recovery handles them again (see `Scheduler.run` and `Scheduler.tick`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.bags.spec import BagSpec


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
    started_at: float | None = None  # Slurm's START and END (jobcomp)
    ended_at: float | None = None
    # Resolved, once the pass that took it is done (a refused job cancelled), with
    # "reserved", "refused: <why>" or "repeat": the prolog hook waits for it.
    verdict: asyncio.Future[str] | None = field(default=None, compare=False)


# What callers queue for the next pass (`Scheduler._commands`).
Command = _Admit | _Cancel | PoolPower | PoolRunEvent
