"""The Slurm executor: each attempt is one Slurm batch job pinned to its VM's node.

VMs join the cluster as dynamic nodes named after them (controller/slurm/naming.py)
through their boot script (drivers/bootstrap.py, `bootstrap_values`). A VM takes
attempts once its node is up in Slurm (a `NodeEvent`), not when its cloud says it
runs. Slurm never retries on its own (`--no-requeue`): the scheduler does.

Submitting. `sbatch --parsable --no-requeue -p PARTITION -w NODE -J sb:CTL:ATTEMPT
-c CPUS --mem MB --time BACKSTOP --chdir DIR --output LOG --open-mode=append`, the
script on stdin, run with a scrubbed environment (controller/slurm/commands.py): the
job gets the system PATH, a UTF-8 locale, the SPOTBAG_* variables, its parameters
and its bag's `env`, and nothing of the daemon's. `--mem` is the job's share of the
node's real memory (the planner packs by the type's nominal memory; a VM has a bit
less). The script is the local executor's wrapper (controller/executors/
attempt_files.py) with two more steps: it notes on the shared filesystem when the
program starts (a checkpoint signal sent earlier would be lost silently), and it
enters the bag's workdir or fails (Slurm would fall back to /tmp).

Logs and checkpoints live in `shared_dir`, a directory the head node shares with
the VMs at the same path (NFS from the head node): the API serves logs from there,
checkpoints are confirmed by the files appearing there, and the wrapper's exit
status file there is the quickest sign of an attempt's end.

Watching, from three sources, all idempotent:
1. the shared files, every `file_poll_s`: the program started; it exited (and how);
2. `squeue` for the jobs it tracks: the truth after restarts and lost callbacks
   (the state, the start time, why a job pends), every `poll_interval_s` while
   something only Slurm can settle is open, QUIET_POLLS times less often otherwise
   (each call costs slurmctld a walk over every job it remembers); `sinfo` for the
   nodes of VMs it waits for (and, now and then, those it uses);
3. callbacks from slurmctld's hooks (controller/api, slurm_hooks/): jobcomp gives
   the final state at once; the epilog is a wake-up.

Ends without an exit status (node failure, a cancel, a time limit, a launch failure)
are mapped from Slurm's state: NODE_FAIL -> KILLED ("node failed": the scheduler
decides "preempted" from its VM), CANCELLED -> KILLED, TIMEOUT -> TIMED_OUT; a job
that ended before its program started -> START_FAILED; a job pending past
`pending_timeout_s` (its node never took it) is cancelled -> NOT_STARTED.

When Slurm does not answer, a submission whose fate is unknown is looked up by its
job name later, never given up on (it may run); new attempts are refused
(ExecutorUnavailable) until Slurm answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import pwd
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller.bagspec import job_environment
from controller.executors.attempt_files import (
    IGNORE_CHECKPOINT_SIGNAL,
    WRAPPER_BODY,
    checkpoint_fingerprint,
    end_event,
    exit_status_path,
    read_exit_status,
    started_path,
)
from controller.executors.base import (
    AttemptEvent,
    AttemptListener,
    AttemptSpec,
    AttemptStarted,
    CallbackNoted,
    CheckpointEvent,
    ExecutorError,
    ExecutorEvent,
    ExecutorUnavailable,
    LiveAttempt,
    NodeEvent,
    Outcome,
)
from controller.slurm.commands import (
    SlurmError,
    SlurmRefused,
    SlurmTools,
    SlurmUnavailable,
    exit_status,
    key_values,
    slurm_time,
    split_rows,
)
from controller.slurm.naming import attempt_of_job, job_name, node_name, vm_of_node
from drivers.base import VmType

log = logging.getLogger("spotbag.executors.slurm")

# The jobs' PATH on the VMs: the system's, not the daemon's.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
     "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "STAGE_OUT", "RESV_DEL_HOLD"}
)  # fmt: skip
RUNNING_STATES = frozenset({"CONFIGURING", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
# Node states (sinfo %T, without its flag suffixes) in which a node runs jobs.
NODE_UP_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
NODE_BROKEN_STATES = frozenset({"down", "drained", "draining", "fail", "failing", "inval"})
MAX_TIME_MIN = 365 * 24 * 60
# Why a job may pend on its node for a while without anything being wrong.
WAITING_REASONS = frozenset({"Resources", "Priority", "None", "BeginTime", "Dependency"})
RESEND_S = 2.0  # a checkpoint signal sent this soon after the program's start is sent again
NODE_POLL_EVERY = 10  # polls, once every node joined
QUIET_POLLS = 5  # squeue this many times less often when nothing needs it


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
class _Attempt:
    attempt_id: str
    vm_id: str
    node: str
    log_path: Path
    checkpoint_dir: Path | None
    max_runtime_s: float
    job_id: str = ""  # Slurm's id; "" while a submission's fate is unknown
    submitting: bool = False  # its sbatch has not answered yet (no need to look for it)
    submitted_at: float = 0.0
    running_at: float | None = None  # when Slurm ran it (reported once)
    program_started: bool = False  # its script got to the program: signals reach it
    program_started_at: float | None = None  # when (the marker's time)
    pending_reason: str = ""
    stop_reason: str = ""  # we are stopping it: why
    timed_out: bool = False
    ended: bool = False
    stopper: asyncio.Task | None = None
    checkpoint: asyncio.Task | None = None


@dataclass
class _Node:
    vm_id: str
    name: str
    memory_gb: float  # the VM type's (what the planner packs by)
    ready: bool = False
    real_memory_mb: int = 0  # what the node registered with
    lost: bool = False  # its VM is gone: down it and delete it
    deleted: bool = False
    attempts: set[str] = field(default_factory=set)


class SlurmExecutor:
    name = "slurm"
    joins_vms = True
    queues_attempts = True
    attempts_outlive_controller = True

    def __init__(
        self,
        settings: SlurmExecutorSettings,
        *,
        tools: SlurmTools,
        controller_id: str,
        now: Callable[[], float],
        kill_grace_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.queue_ahead = settings.queue_ahead
        self.tools = tools
        self._controller_id = controller_id
        self._now = now
        self._grace_s = kill_grace_s
        self._attempts: dict[str, _Attempt] = {}
        self._nodes: dict[str, _Node] = {}  # vm id -> its node
        self._listeners: list[AttemptListener] = []
        self._watcher: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._unavailable = ""  # why Slurm did not answer last time ("" when it did)
        self._recent_keys: OrderedDict[str, None] = OrderedDict()  # callbacks taken
        self._made_dirs: OrderedDict[Path, None] = OrderedDict()  # log directories made
        self._node_polls = 0
        user = pwd.getpwuid(os.getuid())
        self._user = (user.pw_name, user.pw_uid, user.pw_gid)

    # --- paths and names ----------------------------------------------------------

    def subscribe(self, listener: AttemptListener) -> None:
        self._listeners.append(listener)

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        return str(self.settings.shared_dir / "logs" / bag_id / f"{job_id}.{number}.log")

    def checkpoint_dir(self, bag_id: str, job_id: str) -> Path:
        return self.settings.shared_dir / "checkpoints" / bag_id / job_id

    def node_of(self, vm_id: str) -> str:
        return node_name(self.settings.node_prefix, vm_id)

    def bootstrap_values(self, vm_id: str, vm_type: VmType, pool_node: str = "") -> dict[str, str]:
        """What the VM's boot script needs to join as a dynamic node named after it, or
        as the power-saving node `pool_node` (declared in slurm.conf)."""
        s = self.settings
        user, uid, gid = self._user
        values = {
            "SPOTBAG_SLURM_NODE": pool_node or self.node_of(vm_id),
            "SPOTBAG_SLURM_CONF_SERVER": s.conf_server,
            "SPOTBAG_SLURM_DYNAMIC": "0" if pool_node else "1",
            "SPOTBAG_SLURM_FEATURES": s.node_feature,
            "SPOTBAG_CPUS": str(vm_type.cpus),
            "SPOTBAG_MEMORY_MB": str(int(vm_type.memory_gb * 1024)),
            "SPOTBAG_GPUS": str(vm_type.gpus),
            "SPOTBAG_MUNGE_KEY": s.munge_key,
            "SPOTBAG_SHARED_DIR": str(s.shared_dir),
            # Jobs run as the daemon's user: the VM must know it by the same ids.
            "SPOTBAG_JOB_USER": user,
            "SPOTBAG_JOB_UID": str(uid),
            "SPOTBAG_JOB_GID": str(gid),
        }
        if s.munge_socket:
            values["SPOTBAG_MUNGE_SOCKET"] = s.munge_socket
        if s.shared_mount:
            values["SPOTBAG_SHARED_MOUNT"] = s.shared_mount
        return values

    # --- VMs and their nodes ------------------------------------------------------

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        """Watch for the VM's node; a NodeEvent says when it is up."""
        node = self._nodes.get(vm_id)
        if node is None:
            self._nodes[vm_id] = _Node(vm_id, self.node_of(vm_id), vm_type.memory_gb)
        else:  # known since a recovery, which did not know its type
            node.memory_gb = node.memory_gb or vm_type.memory_gb
        self._ensure_watcher()
        self._wake.set()

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        """The VM is gone: tell Slurm at once (DOWN ends the node's jobs with NODE_FAIL
        in well under a second, instead of after SlurmdTimeout), forget its attempts
        (the scheduler ends them), and delete the node once Slurm lets go of it. A
        pool node is downed too (its users' jobs are requeued at once; a power-down
        alone waits for the dead slurmd to time out before it lets them go), then
        powered down by force, so that Slurm can resume it for the next job."""
        if pool_node:
            await self._down(_Node(vm_id, pool_node, 0.0), "its spot VM is gone")
            await self.power_down(pool_node, "its spot VM is gone")
            return
        node = self._nodes.get(vm_id) or _Node(vm_id, self.node_of(vm_id), 0.0)
        self._nodes[vm_id] = node
        node.lost, node.ready = True, False
        for attempt_id in list(node.attempts):
            attempt = self._attempts.pop(attempt_id, None)
            if attempt is not None:
                attempt.ended = True
        node.attempts.clear()
        await self._down(node, "its spot VM is gone")
        self._ensure_watcher()

    async def power_down(self, node: str, reason: str) -> None:
        try:
            await self.tools.run(
                "scontrol",
                "update",
                f"nodename={node}",
                "state=POWER_DOWN_FORCE",
                f"reason={reason}",
            )
        except SlurmError as exc:
            log.warning("could not power node %s down: %s", node, exc)

    async def release_pool_node(self, node: str, reason: str) -> None:
        """Ask Slurm to power a pool node down once its jobs are done (POWER_DOWN_ASAP:
        drained, so nothing new starts on it); Slurm then runs SuspendProgram."""
        try:
            await self.tools.run(
                "scontrol",
                "update",
                f"nodename={node}",
                "state=POWER_DOWN_ASAP",
                f"reason={reason}",
            )
        except SlurmError as exc:
            log.warning("could not release node %s: %s", node, exc)

    async def cancel_job(self, job_id: str, why: str) -> None:
        """Cancel somebody's Slurm job (a pool job its account cannot pay for), saying why
        in its comment (squeue -o %k, scontrol show job)."""
        try:
            await self.tools.run("scontrol", "update", f"jobid={job_id}", f"comment=spotbag: {why}")
            await self.tools.run("scancel", job_id)
        except SlurmError as exc:
            log.warning("could not cancel job %s (%s): %s", job_id, why, exc)

    async def job_limits(self, job_id: str) -> tuple[float | None, float | None]:
        """(CPUs, time limit in hours) Slurm gives a job; None for what it does not say
        (or an unlimited time)."""
        try:
            out = await self.tools.run("scontrol", "-o", "show", "job", job_id)
        except SlurmError:
            return None, None
        fields = key_values(out.strip())
        cpus = float(fields["NumCPUs"]) if fields.get("NumCPUs", "").isdigit() else None
        return cpus, _limit_h(fields.get("TimeLimit", ""))

    async def _down(self, node: _Node, reason: str) -> None:
        try:
            await self.tools.run(
                "scontrol", "update", f"nodename={node.name}", "state=DOWN", f"reason={reason}"
            )
        except SlurmRefused as exc:
            if "Invalid node name" in str(exc):  # never joined, or deleted already
                node.deleted = True
            else:
                log.warning("could not down node %s: %s", node.name, exc)
        except SlurmUnavailable as exc:
            log.warning("could not down node %s (will retry): %s", node.name, exc)

    async def _delete_lost_nodes(self) -> None:
        for vm_id, node in list(self._nodes.items()):
            if not node.lost:
                continue
            if not node.deleted:
                try:
                    await self.tools.run("scontrol", "delete", f"nodename={node.name}")
                    node.deleted = True
                except SlurmRefused as exc:
                    if "Invalid node name" in str(exc):
                        node.deleted = True
                    elif "busy" in str(exc):
                        await self._down(node, "its spot VM is gone")
                    else:
                        log.warning("could not delete node %s: %s", node.name, exc)
            if node.deleted:
                del self._nodes[vm_id]

    # --- attempts ------------------------------------------------------------------

    async def start(self, spec: AttemptSpec) -> str:
        if self._unavailable:
            raise ExecutorUnavailable(f"Slurm does not answer: {self._unavailable}")
        node = self._nodes.get(spec.vm_id)
        if node is None or not node.ready:
            raise ExecutorUnavailable(f"the node of VM {spec.vm_id} is not up in Slurm")
        log_path = Path(self.log_path(spec.bag_id, spec.job_id, spec.number))
        checkpoint_dir = self.checkpoint_dir(spec.bag_id, spec.job_id)
        # Slurm opens the log before the script runs: its directory must exist (made once
        # per bag here; the script makes the job's checkpoint directory on the VM).
        if log_path.parent not in self._made_dirs:
            try:
                await asyncio.to_thread(log_path.parent.mkdir, parents=True, exist_ok=True)
            except OSError as exc:
                raise ExecutorError(f"cannot make the shared log directory: {exc}") from None
            self._made_dirs[log_path.parent] = None
            while len(self._made_dirs) > 10_000:
                self._made_dirs.popitem(last=False)
        attempt = _Attempt(
            spec.attempt_id,
            spec.vm_id,
            node.name,
            log_path,
            checkpoint_dir,
            spec.max_runtime_s,
            submitted_at=self._now(),
        )
        # Tracked before sbatch, so that a submission whose answer is lost is found again.
        self._track(attempt)
        attempt.submitting = True
        try:
            out = await self.tools.run(
                "sbatch",
                *self._sbatch_args(spec, node, log_path),
                stdin=self._script(spec, log_path, checkpoint_dir).encode(),
                env=self._job_environment(),
            )
        except SlurmRefused as exc:
            self._untrack(attempt)
            raise ExecutorError(f"Slurm refused the job: {exc}") from None
        except SlurmUnavailable as exc:
            attempt.submitting = False  # what became of it is looked for now
            if exc.maybe_done:
                return await self._unknown_submission(attempt, exc)
            self._untrack(attempt)
            self._unavailable = str(exc)
            self._ensure_watcher()  # its polls notice when Slurm answers again
            raise ExecutorUnavailable(f"Slurm does not answer: {exc}") from None
        finally:
            attempt.submitting = False
        attempt.job_id = out.strip().split(";")[0]
        self._ensure_watcher()
        return attempt.job_id

    async def _unknown_submission(self, attempt: _Attempt, error: SlurmUnavailable) -> str:
        """sbatch got no answer: the job may exist. Look for it by name; if Slurm
        answers that it has none, the attempt did not start; if Slurm does not answer,
        the attempt stays tracked and the next poll that gets an answer decides."""
        self._unavailable = str(error)
        try:
            found = await self._jobs_by_name()
        except SlurmError:
            log.warning(
                "submission of %s unknown (Slurm down): will look again", attempt.attempt_id
            )
            self._ensure_watcher()
            return ""
        self._unavailable = ""
        job = found.get(attempt.attempt_id)
        if job is None:
            self._untrack(attempt)
            raise ExecutorUnavailable(f"Slurm did not take the job: {error}") from None
        attempt.job_id = job[0]
        self._ensure_watcher()
        return attempt.job_id

    def _sbatch_args(self, spec: AttemptSpec, node: _Node, log_path: Path) -> list[str]:
        args = [
            "--parsable",
            "--no-requeue",
            f"--partition={self.settings.partition}",
            f"--nodelist={node.name}",
            f"--job-name={job_name(self._controller_id, spec.attempt_id)}",
            f"--cpus-per-task={max(1, spec.cpus)}",
            f"--time={min(MAX_TIME_MIN, math.ceil(spec.max_runtime_s / 60) + 1)}",
            # A missing --chdir makes Slurm fall back to /tmp; the script enters the
            # workdir itself and fails if it cannot.
            f"--chdir={spec.workdir or '/tmp'}",
            f"--output={log_path}",
            "--open-mode=append",
            "--export=ALL",  # of the scrubbed environment sbatch runs with
        ]
        if node.real_memory_mb and node.memory_gb > 0:
            share = min(1.0, spec.memory_gb / node.memory_gb)
            args.append(f"--mem={max(1, int(node.real_memory_mb * share))}")
        if spec.gpus:
            args.append(f"--gres=gpu:{spec.gpus}")
        return args

    def _job_environment(self) -> dict[str, str]:
        env = self.tools.environment()
        env["PATH"] = SYSTEM_PATH
        return env

    def _script(self, spec: AttemptSpec, log_path: Path, checkpoint_dir: Path) -> str:
        variables = job_environment(
            bag_id=spec.bag_id,
            job_id=spec.job_id,
            attempt=spec.number,
            checkpoint_dir=str(checkpoint_dir),
            params=spec.params,
            extra=spec.env,
        )
        lines = [
            "#!/bin/sh",
            f"# spotbag attempt {spec.attempt_id} (controller/executors/slurm.py)",
            IGNORE_CHECKPOINT_SIGNAL.rstrip("\n"),
            *(f"export {name}={_quote(value)}" for name, value in variables.items()),
        ]
        if spec.workdir:
            lines.append(
                f'cd {_quote(spec.workdir)} || {{ echo "spotbag: cannot enter workdir '
                f'{spec.workdir} on $(hostname)" >&2; exit 1; }}'
            )
        started = started_path(log_path)
        lines += [
            '[ -d "$SPOTBAG_CHECKPOINT_DIR" ] || mkdir -p "$SPOTBAG_CHECKPOINT_DIR"',
            # From here on a checkpoint signal reaches the program.
            f'printf "%s\\n" "$SLURM_JOB_ID" > {_quote(str(started))}',
            f"set -- {_quote(spec.command)} {_quote(str(exit_status_path(log_path)))}",
            WRAPPER_BODY,
        ]
        return "\n".join(lines)

    def _track(self, attempt: _Attempt) -> None:
        self._attempts[attempt.attempt_id] = attempt
        node = self._nodes.get(attempt.vm_id)
        if node is not None:
            node.attempts.add(attempt.attempt_id)

    def _untrack(self, attempt: _Attempt) -> None:
        self._attempts.pop(attempt.attempt_id, None)
        node = self._nodes.get(attempt.vm_id)
        if node is not None:
            node.attempts.discard(attempt.attempt_id)

    def _emit(self, event: ExecutorEvent) -> None:
        for listener in self._listeners:
            listener(event)

    def _end(self, attempt: _Attempt, event: AttemptEvent) -> None:
        """Report an attempt's end, once."""
        if attempt.ended:
            return
        attempt.ended = True
        self._untrack(attempt)
        self._emit(event)

    def _started(self, attempt: _Attempt, at: float, key: str = "") -> None:
        if attempt.running_at is None and not attempt.ended:
            attempt.running_at = at
            self._emit(AttemptStarted(attempt.attempt_id, at, key))

    # --- checkpoints, cancels --------------------------------------------------------

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        attempt = self._attempts.get(attempt_id)
        if attempt is None or attempt.ended or attempt.stop_reason or attempt.checkpoint:
            return
        if attempt.checkpoint_dir is None:  # not checkpointable: nothing to watch
            return
        attempt.checkpoint = asyncio.create_task(
            self._checkpoint(attempt, attempt.checkpoint_dir, timeout_s),
            name=f"checkpoint {attempt_id}",
        )

    async def _checkpoint(self, attempt: _Attempt, directory: Path, timeout_s: float) -> None:
        """USR1 to every process of the job (`scancel --full`) once its program started,
        then watch its checkpoint directory for a file that appears or is replaced.

        A signal sent within a moment of the program's start may reach it before it
        installed its handler (it inherits "ignore" from the wrapper until then), and is
        lost without a trace; such a signal is sent once more after RESEND_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        requested_at = self._now()
        ok, detail = False, f"no checkpoint written within {timeout_s:g} s"
        try:
            while not attempt.program_started and not attempt.ended:
                if loop.time() >= deadline:
                    detail = "its program had not started"
                    return
                await asyncio.sleep(self.settings.file_poll_s)
            if attempt.ended:
                detail = "the attempt ended before it wrote the checkpoint"
                return
            before = await asyncio.to_thread(checkpoint_fingerprint, directory)
            requested_at = self._now()
            try:
                await self.tools.run("scancel", "--full", "--signal=USR1", attempt.job_id)
            except SlurmError as exc:
                detail = f"could not signal it: {exc}"
                return
            started_at = attempt.program_started_at or requested_at
            resend_at = loop.time() + RESEND_S if requested_at - started_at < RESEND_S else None
            while True:
                if await asyncio.to_thread(checkpoint_fingerprint, directory) != before:
                    ok, detail = True, ""
                    return
                if attempt.ended:
                    detail = "the attempt ended before it wrote the checkpoint"
                    return
                if loop.time() >= deadline:
                    return
                if resend_at is not None and loop.time() >= resend_at:
                    resend_at = None
                    with contextlib.suppress(SlurmError):
                        await self.tools.run("scancel", "--full", "--signal=USR1", attempt.job_id)
                await asyncio.sleep(self.settings.file_poll_s)
        finally:
            attempt.checkpoint = None
            self._emit(CheckpointEvent(attempt.attempt_id, requested_at, self._now(), ok, detail))

    async def cancel(self, attempt_id: str) -> None:
        """SIGTERM to the job's processes now, `scancel` after the grace period; the
        end is reported as an event (KILLED)."""
        attempt = self._attempts.get(attempt_id)
        if attempt is not None and not attempt.stop_reason and not attempt.ended:
            self._stop(attempt, "cancelled")

    def _stop(self, attempt: _Attempt, reason: str) -> None:
        attempt.stop_reason = reason
        attempt.stopper = asyncio.create_task(
            self._scancel(attempt), name=f"stop {attempt.attempt_id}"
        )

    async def _scancel(self, attempt: _Attempt) -> None:
        while not attempt.job_id and not attempt.ended and not self._closing:
            await asyncio.sleep(self.settings.poll_interval_s)  # its submission is unknown yet
        if attempt.ended or self._closing:
            return
        try:
            if attempt.running_at is not None and self._grace_s > 0:
                await self.tools.run("scancel", "--full", "--signal=TERM", attempt.job_id)
                for _ in range(int(self._grace_s / self.settings.file_poll_s) + 1):
                    if attempt.ended:
                        return
                    await asyncio.sleep(self.settings.file_poll_s)
            await self.tools.run("scancel", attempt.job_id)
        except SlurmError as exc:
            log.warning("cancelling %s (job %s): %s", attempt.attempt_id, attempt.job_id, exc)
            attempt.stop_reason = ""  # the watcher tries again (timeouts) or the user does
        self._wake.set()

    # --- watching --------------------------------------------------------------------

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._closing = False
            self._watcher = asyncio.create_task(self._watch(), name="slurm watcher")

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        last_poll = 0.0
        while not self._closing:
            try:
                await self._check_files()
                self._check_timeouts()
                interval = self.settings.poll_interval_s
                if not self._needs_slurms_word():
                    interval *= QUIET_POLLS
                if self._wake.is_set() or loop.time() - last_poll >= interval:
                    self._wake.clear()
                    last_poll = loop.time()
                    await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching Slurm failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.file_poll_s)

    def _needs_slurms_word(self) -> bool:
        """Whether something only squeue can settle is open: a submission whose fate is
        unknown, a stop under way, a job pending for long, a node waiting to join, or
        Slurm not answering. Otherwise the shared files and the callbacks report starts
        and ends, and squeue is asked QUIET_POLLS times less often."""
        if self._unavailable:
            return True
        if any(not n.ready and not n.lost for n in self._nodes.values()):
            return True
        patience = self.settings.pending_timeout_s / 4
        now = self._now()
        return any(
            not a.job_id
            or a.stop_reason
            or (a.running_at is None and now - a.submitted_at > patience)
            for a in self._attempts.values()
            if not a.ended
        )

    async def _check_files(self) -> None:
        watched = [a for a in self._attempts.values() if not a.ended and a.job_id]
        if not watched:
            return
        seen = await asyncio.to_thread(_read_markers, [a.log_path for a in watched])
        for attempt, (started_at, finished) in zip(watched, seen, strict=True):
            if started_at is not None and not attempt.program_started:
                attempt.program_started = True
                attempt.program_started_at = started_at
                self._started(attempt, started_at)
            if finished is not None:
                self._finish_with_exit(attempt, *finished)

    def _finish_with_exit(self, attempt: _Attempt, code: int, at: float, key: str = "") -> None:
        event = end_event(
            attempt.attempt_id,
            attempt.max_runtime_s,
            code,
            attempt.stop_reason,
            attempt.timed_out,
            at,
        )
        self._end(attempt, event._replace(key=key))

    def _check_timeouts(self) -> None:
        now = self._now()
        for attempt in list(self._attempts.values()):
            if (
                attempt.running_at is not None
                and not attempt.ended
                and not attempt.stop_reason
                and now - attempt.running_at > attempt.max_runtime_s
            ):
                attempt.timed_out = True
                self._stop(attempt, "timed out")

    async def poll(self) -> None:
        """Ask Slurm about the jobs and nodes this executor watches, and act on it."""
        try:
            asked = await self._poll_jobs()
            asked = await self._poll_nodes() or asked
            await self._delete_lost_nodes()
            if not asked:  # nothing to ask about: is it there at all?
                await self.tools.run("scontrol", "ping")
        except SlurmUnavailable as exc:
            if not self._unavailable:
                log.warning("Slurm does not answer: %s", exc)
            self._unavailable = str(exc)
            return
        if self._unavailable:
            log.info("Slurm answers again")
        self._unavailable = ""

    async def _poll_jobs(self) -> bool:
        """Settle the tracked jobs by squeue; False when there were none to ask about."""
        tracked = [a for a in self._attempts.values() if not a.ended]
        if not tracked:
            return False
        # Submissions whose answer was lost are looked for by name (all of this
        # controller's jobs Slurm keeps: costly on a busy cluster, so not for the ones
        # whose sbatch is still on its way).
        unknown = [a for a in tracked if not a.job_id and not a.submitting]
        rows: dict[str, tuple[str, str, str, str, str]] = {}  # attempt id -> row
        if unknown:
            rows.update(await self._jobs_by_name())
            for attempt in unknown:
                found = rows.get(attempt.attempt_id)
                if found is not None:
                    attempt.job_id = found[0]
                else:
                    self._end(
                        attempt,
                        AttemptEvent(
                            attempt.attempt_id,
                            self._now(),
                            Outcome.NOT_STARTED,
                            None,
                            "Slurm never took the job (its submission got no answer)",
                        ),
                    )
        ids = [a.job_id for a in tracked if a.job_id and not a.ended]
        if ids:
            out = await self.tools.run(
                "squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%S|%j"
            )
            for job_id, state, reason, start, name in split_rows(out, 5):
                attempt_id = attempt_of_job(self._controller_id, name)
                if attempt_id is not None:
                    rows[attempt_id] = (job_id, state, reason, start, name)
        now = self._now()
        finished: list[tuple[_Attempt, str, str]] = []
        for attempt in tracked:
            if attempt.ended or not attempt.job_id:
                continue
            row = rows.get(attempt.attempt_id)
            if row is None or row[0] != attempt.job_id:
                finished.append((attempt, "", ""))  # Slurm forgot it (past MinJobAge)
                continue
            _, state, reason, start, _ = row
            if state == "PENDING":
                attempt.pending_reason = reason
                waited = now - attempt.submitted_at
                # Waiting for a slot of a healthy node (queued ahead) is no reason to give up.
                stuck = reason.split(",")[0].strip() not in WAITING_REASONS
                if stuck and waited > self.settings.pending_timeout_s and not attempt.stop_reason:
                    log.warning(
                        "%s pends in Slurm since %.0f s (%s): giving up on it",
                        attempt.attempt_id,
                        waited,
                        reason,
                    )
                    self._stop(attempt, f"pending in Slurm for {waited:.0f} s ({reason})")
                continue
            if state in RUNNING_STATES:
                self._started(attempt, slurm_time(start) or now)
            elif state not in LIVE_STATES:
                finished.append((attempt, state, reason))
        if finished:
            await self._finish_from_slurm(finished)
        return True

    async def _jobs_by_name(self) -> dict[str, tuple[str, str, str, str, str]]:
        """This controller's jobs Slurm knows, by attempt id (the latest id wins)."""
        out = await self.tools.run("squeue", "-h", "--me", "-t", "all", "-o", "%i|%T|%r|%S|%j")
        found: dict[str, tuple[str, str, str, str, str]] = {}
        for job_id, state, reason, start, name in split_rows(out, 5):
            attempt_id = attempt_of_job(self._controller_id, name)
            if attempt_id is not None:
                previous = found.get(attempt_id)
                if previous is None or int(job_id) > int(previous[0]):
                    found[attempt_id] = (job_id, state, reason, start, name)
        return found

    async def _finish_from_slurm(self, ended: list[tuple[_Attempt, str, str]]) -> None:
        """Jobs Slurm has ended (or forgotten): their exit status if their wrapper wrote
        one, else what Slurm says (SLURM.md's state mapping)."""
        markers = await asyncio.to_thread(_read_markers, [a.log_path for a, _, _ in ended])
        for (attempt, state, reason), (started_at, finished) in zip(ended, markers, strict=True):
            if started_at is not None:
                attempt.program_started = True
            if finished is not None:
                self._finish_with_exit(attempt, *finished)
                continue
            code = None
            if state == "FAILED" and attempt.program_started:
                code = await self._exit_code(attempt.job_id)
            self._end(attempt, self._slurm_end(attempt, state, reason, code))

    async def _exit_code(self, job_id: str) -> int | None:
        try:
            out = await self.tools.run("scontrol", "-o", "show", "job", job_id)
        except SlurmError:
            return None
        code, sig = exit_status(key_values(out.strip()).get("ExitCode", "0:0"))
        return 128 + sig if sig else code

    def _slurm_end(
        self, attempt: _Attempt, state: str, reason: str, code: int | None, key: str = ""
    ) -> AttemptEvent:
        """An end without an exit status file, from Slurm's final state."""
        at = self._now()
        about = f"Slurm: {state}" + (f" ({reason})" if reason and reason != "None" else "")
        if attempt.timed_out or state == "TIMEOUT":
            detail = f"exceeded max_runtime_s={attempt.max_runtime_s:g}"
            return AttemptEvent(attempt.attempt_id, at, Outcome.TIMED_OUT, code, detail, key)
        if attempt.stop_reason.startswith("pending in Slurm"):
            return AttemptEvent(
                attempt.attempt_id, at, Outcome.NOT_STARTED, None, attempt.stop_reason, key
            )
        if attempt.stop_reason:
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

    async def _poll_nodes(self) -> bool:
        """Notice nodes that joined or broke; False when none was asked about."""
        watched = {n.name: n for n in self._nodes.values() if not n.lost}
        if not watched:
            return False
        # Nodes that joined are looked at less often: a broken one also shows in its
        # jobs (NODE_FAIL, pending), and a preempted VM is the driver's to notice.
        self._node_polls += 1
        if all(n.ready for n in watched.values()) and self._node_polls % NODE_POLL_EVERY:
            return False
        out = await self.tools.run(
            "sinfo", "-h", "-N", "-p", self.settings.partition, "-o", "%N|%T|%m|%E"
        )
        now = self._now()
        seen = set()
        for name, state, memory, reason in split_rows(out, 4):
            node = watched.get(name)
            base = state.rstrip("*~#%!$@^-")
            flags = state[len(base) :]
            if node is None:
                self._forget_if_dead(name, base, flags)
                continue
            if name in seen:
                continue
            seen.add(name)
            up = base in NODE_UP_STATES and not (set(flags) & set("*~#%!"))
            if up and not node.ready:
                node.ready = True
                node.real_memory_mb = int(memory) if memory.isdigit() else 0
                self._emit(NodeEvent(node.vm_id, now, True, f"node {name} is {state} in Slurm"))
            elif node.ready and base in NODE_BROKEN_STATES:
                node.ready = False
                detail = f"node {name} is {state} in Slurm" + (
                    f": {reason}" if reason and reason != "none" else ""
                )
                self._emit(NodeEvent(node.vm_id, now, False, detail))
        return True

    def _forget_if_dead(self, name: str, base: str, flags: str) -> None:
        """A node of this prefix whose VM this executor does not know, and which does not
        answer (a VM that ended while its slurmd re-registered): delete it. One that
        answers may be a VM still booting, whose driver has not said it runs."""
        vm_id = vm_of_node(self.settings.node_prefix, name)
        if vm_id is None or not vm_id.startswith("vm-") or vm_id in self._nodes:
            return
        if "*" in flags or base in ("down", "unknown"):
            self._nodes[vm_id] = _Node(vm_id, name, 0.0, lost=True)

    # --- callbacks ------------------------------------------------------------------

    def seen(self, key: str) -> bool:
        """Whether a callback with this key was taken since the controller started (its
        record in the store may still be on its way)."""
        return key in self._recent_keys

    def remember(self, key: str) -> None:
        self._recent_keys[key] = None
        while len(self._recent_keys) > 100_000:
            self._recent_keys.popitem(last=False)

    async def take_callback(
        self,
        *,
        key: str,
        event: str,
        job_name_: str,
        job_id: str,
        state: str = "",
        exit_code: str = "",
        at: float | None = None,
    ) -> str:
        """A callback from a slurmctld hook about one of this controller's jobs. Its end
        (jobcomp: the final state) is reported at once, with the key ("applied");
        anything else wakes the watcher and is noted with its key ("noted": a late
        end, an allocation notice, a stale job id). "" when it is not about one of
        this controller's attempts."""
        self.remember(key)
        at = self._now() if at is None else at
        attempt_id = attempt_of_job(self._controller_id, job_name_)
        if attempt_id is None:
            return ""
        attempt = self._attempts.get(attempt_id)
        # Job ids are reused: an event for another job of the same name is stale.
        if attempt is None or attempt.ended or (attempt.job_id and attempt.job_id != job_id):
            self._emit(CallbackNoted(key, at, event, job_name_))
            return "noted"
        attempt.job_id = attempt.job_id or job_id
        outcome = "noted"
        if event == "jobcomp" and state not in LIVE_STATES:
            ((started_at, finished),) = await asyncio.to_thread(_read_markers, [attempt.log_path])
            if attempt.ended:  # the watcher saw its end meanwhile
                self._emit(CallbackNoted(key, at, event, job_name_))
                return "noted"
            if finished is not None:
                attempt.program_started = True
                self._finish_with_exit(attempt, finished[0], finished[1], key)
            else:
                code, sig = exit_status(exit_code)
                attempt.program_started = attempt.program_started or started_at is not None
                value = 128 + sig if sig else code
                self._end(attempt, self._slurm_end(attempt, state, "", value, key))
            return "applied"
        self._emit(CallbackNoted(key, at, event, job_name_))
        if event == "epilog_slurmctld":  # only a wake-up: Slurm has the final word
            self._wake.set()
        return outcome

    # --- restart -----------------------------------------------------------------------

    async def recover(
        self, attempts: Sequence[LiveAttempt], live_vm_ids: Sequence[str] = ()
    ) -> set[str]:
        """Slurm jobs survive a controller restart: re-adopt every attempt Slurm still
        has; report those that ended meanwhile (from their exit status, else Slurm's
        final state); only attempts neither Slurm nor the shared files know are lost.
        Nodes of VMs that are gone are deleted. When Slurm does not answer, every
        attempt is kept and the watcher settles them once it does."""
        for vm_id in live_vm_ids:
            self._nodes.setdefault(vm_id, _Node(vm_id, self.node_of(vm_id), 0.0))
        for live in attempts:
            bag_job, _, number = live.attempt_id.rpartition(".")
            bag_id = bag_job.rpartition("-")[0]
            log_path = Path(self.log_path(bag_id, bag_job, int(number)))
            attempt = _Attempt(
                live.attempt_id,
                live.vm_id,
                self.node_of(live.vm_id),
                log_path,
                self.checkpoint_dir(bag_id, bag_job),
                live.max_runtime_s,
                job_id=live.ref,
                submitted_at=live.started_at,
            )
            self._track(attempt)
        try:
            found = await self._jobs_by_name()
        except SlurmError as exc:
            log.warning("Slurm does not answer at recovery (%s): keeping every attempt", exc)
            self._unavailable = str(exc)
            self._ensure_watcher()
            return {a.attempt_id for a in attempts}
        kept: set[str] = set()
        ended: list[tuple[_Attempt, str, str]] = []
        now = self._now()
        for live in attempts:
            attempt = self._attempts[live.attempt_id]
            row = found.get(live.attempt_id)
            if row is not None and (not attempt.job_id or attempt.job_id == row[0]):
                job_id, state, reason, start, _ = row
                attempt.job_id = job_id
                kept.add(live.attempt_id)
                if state in RUNNING_STATES:
                    self._started(attempt, slurm_time(start) or now)
                elif state not in LIVE_STATES:
                    ended.append((attempt, state, reason))
                continue
            finished = await asyncio.to_thread(read_exit_status, exit_status_path(attempt.log_path))
            if finished is not None:
                kept.add(live.attempt_id)
                self._finish_with_exit(attempt, *finished)
            else:
                self._untrack(attempt)
        if ended:
            await self._finish_from_slurm(ended)
        await self._forget_gone_nodes(set(live_vm_ids))
        self._ensure_watcher()  # only now: it would settle attempts under our feet
        return kept

    async def _forget_gone_nodes(self, live_vm_ids: set[str]) -> None:
        """Down and delete this prefix's nodes whose VMs are gone."""
        try:
            out = await self.tools.run(
                "sinfo", "-h", "-N", "-p", self.settings.partition, "-o", "%N"
            )
        except SlurmError as exc:
            log.warning("cannot list the partition's nodes: %s", exc)
            return
        for name in {line.strip() for line in out.splitlines() if line.strip()}:
            vm_id = vm_of_node(self.settings.node_prefix, name)
            if vm_id is not None and vm_id.startswith("vm-") and vm_id not in live_vm_ids:
                node = _Node(vm_id, name, 0.0, lost=True)
                self._nodes[vm_id] = node
                await self._down(node, "its VM is gone (found after a controller restart)")

    async def shutdown(self) -> None:
        """Stop watching; the jobs run on (they outlive the controller)."""
        self._closing = True
        self._wake.set()
        tasks = [t for t in (self._watcher,) if t is not None]
        tasks += [a.checkpoint for a in self._attempts.values() if a.checkpoint]
        tasks += [a.stopper for a in self._attempts.values() if a.stopper]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- what the daemon shows ----------------------------------------------------------

    @property
    def unavailable(self) -> str:
        """Why Slurm did not answer last ("" when it did)."""
        return self._unavailable

    def status(self) -> dict[str, object]:
        return {
            "attempts": len(self._attempts),
            "nodes_ready": sum(1 for n in self._nodes.values() if n.ready),
            "nodes_waiting": sum(1 for n in self._nodes.values() if not n.ready and not n.lost),
            "slurm_unavailable": self._unavailable,
        }


def _limit_h(text: str) -> float | None:
    """Slurm's time limit ("[days-]hours:minutes:seconds", "minutes", "UNLIMITED") in hours."""
    text = text.strip()
    if not text or text in ("UNLIMITED", "Partition_Limit", "NONE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":") if p.isdigit()]
    if not parts:
        return None
    if len(parts) == 1:  # minutes
        seconds = parts[0] * 60
    else:
        while len(parts) < 3:
            parts.insert(0, 0)
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return (int(days or 0) * 86400 + seconds) / 3600.0


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _read_markers(log_paths: Sequence[Path]) -> list[tuple[float | None, tuple[int, float] | None]]:
    """Per attempt: when its program started (the marker's mtime) and its exit status."""
    found = []
    for log_path in log_paths:
        try:
            started_at: float | None = started_path(log_path).stat().st_mtime
        except OSError:
            started_at = None
        found.append((started_at, read_exit_status(exit_status_path(log_path))))
    return found
