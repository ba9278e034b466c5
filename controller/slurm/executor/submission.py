"""Submitting an attempt as a Slurm job, and what that job looks like.

`sbatch --parsable --no-requeue -p PARTITION -w NODE -J sb:CTL:ATTEMPT -c CPUS
--mem MB --time BACKSTOP --chdir DIR --output LOG --open-mode=append`, the script on
stdin, run with a scrubbed environment (controller/slurm/commands.py): the job gets
the system PATH, a UTF-8 locale, the SPOTBAG_* variables, its parameters and its
bag's `env`, and nothing of the daemon's. `--mem` is the job's share of the node's
real memory (the planner packs by the type's nominal memory; a VM has a bit less).
The script is the local executor's wrapper (controller/executors/attempt_files.py)
with two more steps: it notes on the shared filesystem when the program starts (a
checkpoint signal sent earlier would be lost silently), and it enters the bag's
workdir or fails (Slurm would fall back to /tmp).

When sbatch gets no answer, the job may exist, or come to exist: it is looked up by
its name until UNKNOWN_GRACE_S (watch.py) have passed, never given up on while Slurm
does not answer (it may run); new attempts are refused (ExecutorUnavailable) until
Slurm answers again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from pathlib import Path

from controller.bags.job_command import job_environment
from controller.executors.attempt_files import (
    IGNORE_CHECKPOINT_SIGNAL,
    WRAPPER_BODY,
    WRAPPER_BODY_INTO_GIVEN_FILE,
    exit_status_path,
    hand_over,
    started_path,
)
from controller.executors.base import AttemptSpec, ExecutorError, ExecutorUnavailable
from controller.executors.job_users import JobUser, JobUserError
from controller.slurm.commands import SlurmError, SlurmRefused, SlurmTools, SlurmUnavailable
from controller.slurm.executor.state import Attempt, Node, SlurmExecutorSettings, SlurmState
from controller.slurm.executor.watch import Watcher
from controller.slurm.naming import job_name

log = logging.getLogger("spotbag.executors.slurm")

# The jobs' PATH on the VMs: the system's, not the daemon's.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_TIME_MIN = 365 * 24 * 60


class Submitter:
    """Starts attempts as Slurm jobs on their VMs' nodes (the executor's `start`)."""

    def __init__(self, state: SlurmState, watcher: Watcher) -> None:
        self._state = state
        self._watcher = watcher
        self._made_dirs: OrderedDict[Path, None] = OrderedDict()  # log directories made

    async def start(self, spec: AttemptSpec) -> str:
        state = self._state
        if state.unavailable:
            raise ExecutorUnavailable(f"Slurm does not answer: {state.unavailable}")
        node = state.nodes.get(spec.vm_id)
        if node is None or not node.ready:
            raise ExecutorUnavailable(f"the node of VM {spec.vm_id} is not up in Slurm")
        log_path = Path(state.log_path(spec.bag_id, spec.job_id, spec.number))
        checkpoint_dir = state.checkpoint_dir(spec.bag_id, spec.job_id)
        try:
            user = state.users.for_account(spec.account)
        except JobUserError as exc:
            raise ExecutorError(str(exc)) from None
        if user is not None:
            # Its files are made for its user, where no job can make files (job_users.py).
            try:
                await asyncio.to_thread(
                    hand_over,
                    state.settings.shared_dir,
                    checkpoint_dir,
                    user,
                    markers=[started_path(log_path), exit_status_path(log_path)],
                    logs=[log_path],
                )
            except OSError as exc:
                raise ExecutorError(f"cannot prepare the shared files: {exc}") from None
        # Slurm opens the log before the script runs: its directory must exist (made once
        # per bag here; the script makes the job's checkpoint directory on the VM).
        elif log_path.parent not in self._made_dirs:
            try:
                await asyncio.to_thread(log_path.parent.mkdir, parents=True, exist_ok=True)
            except OSError as exc:
                raise ExecutorError(f"cannot make the shared log directory: {exc}") from None
            self._made_dirs[log_path.parent] = None
            while len(self._made_dirs) > 10_000:
                self._made_dirs.popitem(last=False)
        attempt = Attempt(
            spec.attempt_id,
            spec.vm_id,
            node.name,
            log_path,
            checkpoint_dir,
            spec.max_runtime_s,
            owner=state.users.daemon_uid if user is None else user.uid,
            submitted_at=state.now(),
        )
        # Tracked before sbatch, so that a submission whose answer is lost is found again.
        state.track(attempt)
        attempt.submitting = True
        try:
            out = await state.tools.run(
                "sbatch",
                *sbatch_args(state.settings, state.controller_id, spec, node, log_path, user),
                stdin=job_script(spec, node.name, log_path, checkpoint_dir, user).encode(),
                env=sbatch_environment(state.tools),
            )
        except SlurmRefused as exc:
            state.untrack(attempt)
            raise ExecutorError(f"Slurm refused the job: {exc}") from None
        except SlurmUnavailable as exc:
            if exc.maybe_done:  # what became of it is looked for now
                return await self._unknown_submission(attempt, exc)
            state.untrack(attempt)
            state.unavailable = str(exc)
            self._watcher.ensure()  # its polls notice when Slurm answers again
            raise ExecutorUnavailable(f"Slurm does not answer: {exc}") from None
        finally:
            attempt.submitting = False
        attempt.job_id = out.strip().split(";")[0]
        self._watcher.ensure()
        return attempt.job_id

    async def _unknown_submission(self, attempt: Attempt, error: SlurmUnavailable) -> str:
        """sbatch got no answer: the job may exist, or come to exist (its request may
        still wait in a busy slurmctld). Look for it by name; if it is not there (or
        Slurm does not answer), the attempt stays tracked without a job id, and the
        watcher keeps looking for it by name until UNKNOWN_GRACE_S have passed (it is
        then cancelled by name, and did not start)."""
        state = self._state
        state.unavailable = str(error)
        try:
            found = await self._watcher.jobs_by_name()
        except SlurmError:
            found = None
        else:
            state.unavailable = ""
        attempt.submitting = False
        job = found.get(attempt.attempt_id) if found is not None else None
        if job is not None and not attempt.ended and not attempt.job_id:
            attempt.job_id = job[0]
        if not attempt.job_id:
            log.warning(
                "submission of %s got no answer (%s): looking for its job by name",
                attempt.attempt_id,
                error,
            )
        self._watcher.ensure()
        return attempt.job_id


def sbatch_args(
    settings: SlurmExecutorSettings,
    controller_id: str,
    spec: AttemptSpec,
    node: Node,
    log_path: Path,
    user: JobUser | None = None,
) -> list[str]:
    """sbatch's arguments for an attempt: on its node, with its share of it, as its
    account's user (root's `--uid`) when it has one."""
    args = [
        "--parsable",
        "--no-requeue",
        f"--partition={settings.partition}",
        f"--nodelist={node.name}",
        f"--job-name={job_name(controller_id, spec.attempt_id)}",
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
    if user is not None:
        args += [f"--uid={user.uid}", f"--gid={user.gid}"]
    return args


def sbatch_environment(tools: SlurmTools) -> dict[str, str]:
    """The environment sbatch runs with (and the job inherits, --export=ALL)."""
    env = tools.environment()
    env["PATH"] = SYSTEM_PATH
    return env


def job_script(
    spec: AttemptSpec,
    node: str,
    log_path: Path,
    checkpoint_dir: Path,
    user: JobUser | None = None,
) -> str:
    """The batch script of an attempt: a check that it runs on its VM's node, its
    variables, its workdir, the start marker, then the wrapper that runs the program
    and writes its exit status (into the file made for it, when it runs as an
    account's user: `hand_over`).

    The check: slurmctld sends a job's launch to its node's address, and retries it for
    a while when the node does not answer. A VM that died with a job on its way leaves
    its address to the next VM the cloud starts there, whose slurmd would run the job
    (slurmctld then logs "Batch completion ... sent from wrong node"): a job that was
    cancelled with its VM, and whose retry may already run elsewhere."""
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
        f"# spotbag attempt {spec.attempt_id} (controller/slurm/executor/submission.py)",
        f'[ "$SLURMD_NODENAME" = {quote(node)} ] || {{ echo "spotbag: attempt '
        f'{spec.attempt_id} is for node {node}, not $SLURMD_NODENAME: not run" >&2; exit 1; }}',
        IGNORE_CHECKPOINT_SIGNAL.rstrip("\n"),
        *(f"export {name}={quote(value)}" for name, value in variables.items()),
    ]
    if spec.workdir:
        lines.append(
            f'cd {quote(spec.workdir)} || {{ echo "spotbag: cannot enter workdir '
            f'{spec.workdir} on $(hostname)" >&2; exit 1; }}'
        )
    started = started_path(log_path)
    lines += [
        '[ -d "$SPOTBAG_CHECKPOINT_DIR" ] || mkdir -p "$SPOTBAG_CHECKPOINT_DIR"',
        # From here on a checkpoint signal reaches the program.
        f'printf "%s\\n" "$SLURM_JOB_ID" > {quote(str(started))}',
        f"set -- {quote(spec.command)} {quote(str(exit_status_path(log_path)))}",
        WRAPPER_BODY if user is None else WRAPPER_BODY_INTO_GIVEN_FILE,
    ]
    return "\n".join(lines)


def quote(value: str) -> str:
    """`value` as one shell word."""
    return "'" + value.replace("'", "'\"'\"'") + "'"
