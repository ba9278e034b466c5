"""What the parts of the Slurm executor share: its settings, the attempts and nodes it
tracks, where an attempt's files live, and how an attempt's start and end are
reported to the listeners (each once, whichever part sees it first).

Also the readings several parts make: Slurm's job states (squeue %T), the shared
files an attempt's wrapper leaves (its program started; it exited, and how), and an
end without an exit status read from Slurm's final state (SLURM.md's mapping).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.executors.attempt_files import (
    end_event,
    exit_status_path,
    read_exit_status,
    read_started,
    started_path,
)
from controller.executors.base import (
    AttemptEvent,
    AttemptListener,
    AttemptStarted,
    ExecutorEvent,
    Outcome,
)
from controller.executors.job_users import JobUsers
from controller.slurm.commands import SlurmTools
from controller.slurm.naming import node_name

LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
     "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "STAGE_OUT", "RESV_DEL_HOLD"}
)  # fmt: skip
RUNNING_STATES = frozenset({"CONFIGURING", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
# A job whose batch script has not ended in Slurm's eyes: its node must stay.
SCRIPT_RUNNING_STATES = frozenset({"CONFIGURING", "RUNNING", "SIGNALING", "SUSPENDED"})
SETTLE_LIMIT_S = 60.0  # longest a VM is kept for Slurm to say a job's script ended


@dataclass(frozen=True)
class SlurmExecutorSettings:
    partition: str = "spotbag"
    node_prefix: str = "sb-"
    node_feature: str = "spotbag"
    conf_server: str = ""  # host[:port] the VMs' slurmd fetch slurm.conf from
    munge_key: str = ""  # where VMs fetch the munge key (drivers/templates/node_join.sh)
    munge_socket: str = ""  # the socket the cluster's slurm.conf names; "" munge's default
    shared_dir: Path = Path("/var/lib/spotbag/shared")
    shared_mount: str = ""  # what a VM mounts at shared_dir ("head:/path", NFS)
    poll_interval_s: float = 1.0
    file_poll_s: float = 0.2
    pending_timeout_s: float = 120.0
    queue_ahead: float = 1.0  # of a VM's capacity, queued in Slurm beyond what runs


@dataclass
class Attempt:
    """An attempt the executor tracks: its Slurm job and how far it got."""

    attempt_id: str
    vm_id: str
    node: str
    log_path: Path
    checkpoint_dir: Path | None
    max_runtime_s: float
    owner: int  # the uid its job runs as: only its files, and its Slurm job, are believed
    job_id: str = ""  # Slurm's id; "" while a submission's fate is unknown
    submitting: bool = False  # its sbatch has not answered yet (no need to look for it)
    submitted_at: float = 0.0
    running_at: float | None = None  # when its program started (reported once)
    program_started: bool = False  # its script got to the program: signals reach it
    program_started_at: float | None = None  # when (the marker's time)
    slurm_running_at: float | None = None  # when Slurm says it began (no marker yet)
    pending_reason: str = ""
    stop_reason: str = ""  # we are stopping it: why
    timed_out: bool = False
    vm_lost: bool = False  # its VM is gone: it is stopped, and ends once Slurm confirms
    ended: bool = False
    stopper: asyncio.Task | None = None
    checkpoint: asyncio.Task | None = None


@dataclass
class Node:
    """The Slurm node of a VM the executor knows."""

    vm_id: str
    name: str
    memory_gb: float  # the VM type's (what the planner packs by)
    ready: bool = False
    real_memory_mb: int = 0  # what the node registered with
    lost: bool = False  # its VM is gone: down it and delete it
    notice: str = ""  # the notice watcher drained it: its reason (nodes.py)
    deleted: bool = False
    attempts: set[str] = field(default_factory=set)


class SlurmState:
    """The executor's state and its reporting, shared by its parts (one per executor).

    `wake` asks the watcher to poll Slurm now; `closing` tells every loop to stop;
    `unavailable` says why Slurm did not answer last ("" when it did); `users` who
    each account's jobs run as."""

    def __init__(
        self,
        settings: SlurmExecutorSettings,
        tools: SlurmTools,
        controller_id: str,
        now: Callable[[], float],
        users: JobUsers | None = None,
    ) -> None:
        self.settings = settings
        self.tools = tools
        self.users = users or JobUsers(daemon_uid=os.getuid())
        self._job_uids: set[str] = set()  # the users jobs run as (squeue_users)
        self.controller_id = controller_id
        self.now = now
        self.attempts: dict[str, Attempt] = {}
        # Attempts over since the executor was made (their ends reported): a recovery
        # after a failed scheduler pass, whose store still lists them live, keeps them
        # without reporting their ends again.
        self.ended_ids: OrderedDict[str, None] = OrderedDict()
        self.nodes: dict[str, Node] = {}  # vm id -> its node
        self.listeners: list[AttemptListener] = []
        self.wake = asyncio.Event()
        self.closing = False
        self.unavailable = ""
        # Jobs whose program's exit status ended their attempt before Slurm said the job
        # ended (job id -> (VM id, since when)): their VMs are not idle until it does.
        self.settling: dict[str, tuple[str, float]] = {}

    # --- paths and names ----------------------------------------------------------

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        return str(self.settings.shared_dir / "logs" / bag_id / f"{job_id}.{number}.log")

    def checkpoint_dir(self, bag_id: str, job_id: str) -> Path:
        return self.settings.shared_dir / "checkpoints" / bag_id / job_id

    def paths_of(self, attempt_id: str) -> tuple[Path, Path]:
        """An attempt's log path and its job's checkpoint directory, from its id
        ("<bag>-<index>.<number>")."""
        job, _, number = attempt_id.rpartition(".")
        bag_id = job.rpartition("-")[0]
        return Path(self.log_path(bag_id, job, int(number))), self.checkpoint_dir(bag_id, job)

    def node_of(self, vm_id: str) -> str:
        return node_name(self.settings.node_prefix, vm_id)

    # --- whose jobs ------------------------------------------------------------------

    def squeue_users(self) -> list[str]:
        """squeue's options for the jobs this executor may have made: the daemon's own
        (--me), or those of the users its jobs run as (noted for `owns`)."""
        if not self.users.configured:
            return ["--me"]
        uids = {a.owner for a in self.attempts.values() if a.owner >= 0}
        uids.update(u.uid for u in self.users.known())
        self._job_uids = {str(uid) for uid in uids}
        return ["-u", ",".join(str(uid) for uid in sorted(uids))] if uids else ["--me"]

    def owns(self, attempt_id: str, uid: str) -> bool:
        """Whether a job named after `attempt_id` and run by `uid` can be that attempt's:
        one of another user (another account's job may name itself so) is not. For an
        attempt not tracked: whether `uid` is one of the users jobs run as (as of the
        last `squeue_users`)."""
        attempt = self.attempts.get(attempt_id)
        if attempt is not None:
            return uid == str(attempt.owner)
        if not self.users.configured:
            return uid == str(self.users.daemon_uid)
        return uid in self._job_uids

    # --- attempt bookkeeping --------------------------------------------------------

    def track(self, attempt: Attempt) -> None:
        self.attempts[attempt.attempt_id] = attempt
        node = self.nodes.get(attempt.vm_id)
        if node is not None:
            node.attempts.add(attempt.attempt_id)

    def settled(self, job_id: str) -> None:
        """Slurm said the job ended (or forgot it)."""
        self.settling.pop(job_id, None)

    def vms_settling(self) -> set[str]:
        """The VMs of the settling jobs; a job Slurm has not said ended after
        SETTLE_LIMIT_S is given up (its VM is not held forever)."""
        now = self.now()
        for job_id, (_, since) in list(self.settling.items()):
            if now - since > SETTLE_LIMIT_S:
                del self.settling[job_id]
        return {vm_id for vm_id, _ in self.settling.values()}

    def untrack(self, attempt: Attempt) -> None:
        """Forget an attempt that is over (or never became a job): whatever waits on it
        (a stop, a checkpoint) sees it ended."""
        attempt.ended = True
        if self.attempts.get(attempt.attempt_id) is attempt:
            del self.attempts[attempt.attempt_id]
            self.ended_ids[attempt.attempt_id] = None
            while len(self.ended_ids) > 100_000:
                self.ended_ids.popitem(last=False)
        node = self.nodes.get(attempt.vm_id)
        if node is not None:
            node.attempts.discard(attempt.attempt_id)

    def emit(self, event: ExecutorEvent) -> None:
        for listener in self.listeners:
            listener(event)

    def end(self, attempt: Attempt, event: AttemptEvent) -> None:
        """Report an attempt's end, once; if its program started (its marker was seen,
        or it left an exit status) and that was not reported yet, its start first: an
        attempt whose program ran is never reported as one that did not."""
        if attempt.ended:
            return
        if attempt.program_started:
            self.started(attempt, attempt.program_started_at or event.at)
        attempt.ended = True
        self.untrack(attempt)
        self.emit(event)

    def started(self, attempt: Attempt, at: float, key: str = "") -> None:
        """Report that the attempt's program started (its script wrote the start marker:
        Slurm's RUNNING comes earlier, before the batch script runs)."""
        if attempt.running_at is None and not attempt.ended:
            attempt.running_at = at
            self.emit(AttemptStarted(attempt.attempt_id, at, key))

    def saw_marker(self, attempt: Attempt, started_at: float | None) -> None:
        """The attempt's start marker (when its program started), if there was one."""
        if started_at is not None:
            attempt.program_started = True
            attempt.program_started_at = attempt.program_started_at or started_at

    def finish_with_exit(
        self, attempt: Attempt, code: int, at: float, key: str = "", confirmed: bool = True
    ) -> None:
        """The attempt's wrapper wrote its exit status: its program ran, and ended.
        `confirmed`: Slurm said its job ended too (else the job settles: `settling`)."""
        if not confirmed and attempt.job_id and not attempt.ended:
            self.settling[attempt.job_id] = (attempt.vm_id, self.now())
        attempt.program_started = True
        event = end_event(
            attempt.attempt_id,
            attempt.max_runtime_s,
            code,
            # A lost VM's programs die with it, unasked: one that left an exit status
            # ended by itself, before its VM went.
            "" if attempt.vm_lost else attempt.stop_reason,
            attempt.timed_out,
            at,
        )
        self.end(attempt, event._replace(key=key))

    def slurm_end(
        self, attempt: Attempt, state: str, reason: str, code: int | None, key: str = ""
    ) -> AttemptEvent:
        """An end without an exit status file, from Slurm's final state."""
        at = self.now()
        about = f"Slurm: {state}" + (f" ({reason})" if reason and reason != "None" else "")
        if attempt.timed_out or state == "TIMEOUT":
            detail = f"exceeded max_runtime_s={attempt.max_runtime_s:g}"
            return AttemptEvent(attempt.attempt_id, at, Outcome.TIMED_OUT, code, detail, key)
        if attempt.stop_reason and not attempt.program_started:
            # Stopped before its program ran (pending too long, its VM gone): not its fault.
            return AttemptEvent(
                attempt.attempt_id, at, Outcome.NOT_STARTED, None, attempt.stop_reason, key
            )
        if attempt.stop_reason and not (attempt.vm_lost and state == "COMPLETED"):
            return AttemptEvent(
                attempt.attempt_id, at, Outcome.KILLED, code, attempt.stop_reason, key
            )
        if not state:
            detail = f"Slurm no longer knows job {attempt.job_id} and it left no exit status"
            return AttemptEvent(attempt.attempt_id, at, Outcome.KILLED, None, detail, key)
        if state == "NODE_FAIL":
            return AttemptEvent(attempt.attempt_id, at, Outcome.KILLED, None, "node failed", key)
        if state in ("CANCELLED", "PREEMPTED", "DEADLINE"):
            return AttemptEvent(attempt.attempt_id, at, Outcome.KILLED, None, about, key)
        if not attempt.program_started:
            detail = f"{about} before its program started; see its log"
            return AttemptEvent(attempt.attempt_id, at, Outcome.START_FAILED, None, detail, key)
        if state == "COMPLETED":
            return AttemptEvent(attempt.attempt_id, at, Outcome.EXITED, 0, "", key)
        return AttemptEvent(attempt.attempt_id, at, Outcome.EXITED, code if code else 1, about, key)


def read_markers(
    attempts: Sequence[Attempt],
) -> list[tuple[float | None, tuple[int, float] | None]]:
    """Per attempt: when its program started (the marker's mtime) and its exit status,
    from files of its job's user that nobody else may write (attempt_files.py)."""
    return [
        (
            read_started(started_path(a.log_path), a.owner),
            read_exit_status(exit_status_path(a.log_path), a.owner),
        )
        for a in attempts
    ]
