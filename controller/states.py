"""States of bags, jobs, attempts and VMs, and the one table of legal transitions.

Every state change the scheduler makes goes through `check_transition`, so an
illegal change is a bug that fails loudly instead of a silent corruption.
Values are the lowercase strings stored in SQLite and shown by the API.
"""

from __future__ import annotations

from enum import StrEnum

from controller.errors import SpotbagError
from drivers.base import VmState


class BagState(StrEnum):
    ACTIVE = "active"  # at least one job is not finished
    SUCCEEDED = "succeeded"  # every job succeeded
    FAILED = "failed"  # every job finished and at least one failed
    CANCELLED = "cancelled"  # cancelled by a user before every job finished

    @classmethod
    def terminal(cls) -> frozenset[BagState]:
        return _BAG_TERMINAL


class JobState(StrEnum):
    QUEUED = "queued"  # waiting for a slot on a VM (also after a preemption)
    HELD = "held"  # admitted but waiting (e.g. for credit); not schedulable yet
    RUNNING = "running"  # an attempt is starting or running on a VM
    SUCCEEDED = "succeeded"  # an attempt exited 0
    FAILED = "failed"  # exited non-zero, timed out, or ran out of attempts
    CANCELLED = "cancelled"  # cancelled by a user

    @classmethod
    def terminal(cls) -> frozenset[JobState]:
        return _JOB_TERMINAL


class AttemptState(StrEnum):
    STARTING = "starting"  # recorded, being handed to the executor
    RUNNING = "running"  # the program is running
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # exited non-zero, timed out, or could not start
    PREEMPTED = "preempted"  # its VM was preempted (or vanished) under it
    CANCELLED = "cancelled"  # stopped because its job was cancelled
    LOST = "lost"  # the controller stopped or crashed while it ran; not counted

    @classmethod
    def terminal(cls) -> frozenset[AttemptState]:
        return _ATTEMPT_TERMINAL

    @classmethod
    def counted(cls) -> frozenset[AttemptState]:
        """Attempts that count toward a job's max_attempts (LOST ones do not)."""
        return _ATTEMPT_COUNTED


_BAG_TERMINAL = frozenset({BagState.SUCCEEDED, BagState.FAILED, BagState.CANCELLED})
_JOB_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
_ATTEMPT_COUNTED = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.PREEMPTED, AttemptState.CANCELLED}
)
_ATTEMPT_TERMINAL = _ATTEMPT_COUNTED | {AttemptState.LOST}
_VM_TERMINAL = frozenset({VmState.TERMINATED, VmState.PREEMPTED, VmState.FAILED})


def vm_terminal_states() -> frozenset[VmState]:
    return _VM_TERMINAL


# The transition table: entity -> {from_state: allowed to_states}.
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    "job": {
        # QUEUED -> FAILED: no VM type can hold the job any more (the catalog changed).
        JobState.QUEUED: frozenset(
            {JobState.RUNNING, JobState.HELD, JobState.CANCELLED, JobState.FAILED}
        ),
        JobState.HELD: frozenset({JobState.QUEUED, JobState.CANCELLED}),
        # RUNNING -> HELD: a retry the account has no CPU-hours left to reserve for.
        JobState.RUNNING: frozenset(
            {
                JobState.SUCCEEDED,
                JobState.FAILED,
                JobState.CANCELLED,
                JobState.QUEUED,
                JobState.HELD,
            }
        ),
    },
    "attempt": {
        AttemptState.STARTING: frozenset(AttemptState.terminal() | {AttemptState.RUNNING}),
        AttemptState.RUNNING: AttemptState.terminal(),
    },
    "vm": {
        VmState.PENDING: frozenset({VmState.RUNNING} | vm_terminal_states()),
        VmState.RUNNING: vm_terminal_states(),
    },
    "bag": {
        BagState.ACTIVE: BagState.terminal(),
    },
}


class IllegalTransition(SpotbagError, RuntimeError):
    """A state change the transition table does not allow: a controller bug."""


_NONE_ALLOWED: frozenset[str] = frozenset()


def check_transition(entity: str, from_state: str, to_state: str) -> None:
    allowed = TRANSITIONS[entity].get(from_state, _NONE_ALLOWED)
    if to_state not in allowed:
        raise IllegalTransition(f"{entity}: {from_state} -> {to_state} is not allowed")
