"""Recovery after a controller restart: Slurm jobs outlive the controller, so every
attempt Slurm still has is adopted again, those that ended meanwhile are reported
(from their exit status, else Slurm's final state), and only attempts neither Slurm
nor the shared files know are lost. Nodes of VMs that are gone are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from controller.executors.base import LiveAttempt
from controller.slurm.commands import SlurmError, slurm_time
from controller.slurm.executor.nodes import NodeManager
from controller.slurm.executor.state import (
    LIVE_STATES,
    RUNNING_STATES,
    Attempt,
    Node,
    SlurmState,
    read_markers,
)
from controller.slurm.executor.watch import Watcher
from controller.slurm.naming import job_name

log = logging.getLogger("spotbag.executors.slurm")


async def recover(
    state: SlurmState,
    watcher: Watcher,
    nodes: NodeManager,
    attempts: Sequence[LiveAttempt],
    live_vm_ids: Sequence[str],
) -> set[str]:
    """Re-adopt the attempts the store says were live; the ones kept. When Slurm does
    not answer, every attempt is kept and the watcher settles them once it does.

    After a failed scheduler pass this runs again while the executor watches: an
    attempt it already tracks is kept as it is (its stop or checkpoint tasks hold
    it), and one that ends meanwhile has been reported."""
    for vm_id in live_vm_ids:
        state.nodes.setdefault(vm_id, Node(vm_id, state.node_of(vm_id), 0.0))
    for live in attempts:
        if live.attempt_id in state.attempts or live.attempt_id in state.ended_ids:
            continue
        log_path, checkpoint_dir = state.paths_of(live.attempt_id)
        adopted = Attempt(
            live.attempt_id,
            live.vm_id,
            state.node_of(live.vm_id),
            log_path,
            checkpoint_dir,
            live.max_runtime_s,
            owner=state.users.owner(live.account),
            job_id=live.ref,
            submitted_at=live.started_at,
        )
        state.track(adopted)
    # An sbatch of the controller before this one may still be on its way (a crash
    # does not end its children): it would make a job after the look below.
    stopped = await asyncio.to_thread(stop_leftover_submissions, job_name(state.controller_id, ""))
    if stopped:
        log.warning("stopped %d submission(s) left by the previous controller", stopped)
    try:
        named = await watcher.named_jobs()
    except SlurmError as exc:
        log.warning("Slurm does not answer at recovery (%s): keeping every attempt", exc)
        state.unavailable = str(exc)
        watcher.ensure()
        return {a.attempt_id for a in attempts}
    kept: set[str] = set()
    ended: list[tuple[Attempt, str, str]] = []
    now = state.now()
    tracked = {a.attempt_id: a.job_id for a in state.attempts.values() if not a.ended}
    found = watcher.latest_owned(named)
    await watcher.cancel_orphans(named, {a.attempt_id: a.ref for a in attempts} | tracked)
    for live in attempts:
        attempt = state.attempts.get(live.attempt_id)
        if attempt is None or attempt.ended:  # reported ended meanwhile
            kept.add(live.attempt_id)
            continue
        row = found.get(live.attempt_id)
        if row is not None and (not attempt.job_id or attempt.job_id == row[0]):
            job_id, job_state, reason, start, _, _ = row
            attempt.job_id = job_id
            kept.add(live.attempt_id)
            if job_state in RUNNING_STATES:  # its start marker says when its program began
                attempt.slurm_running_at = slurm_time(start) or now
            elif job_state not in LIVE_STATES:
                ended.append((attempt, job_state, reason))
            continue
        ((started_at, finished),) = await asyncio.to_thread(read_markers, [attempt])
        if attempt.ended:
            kept.add(live.attempt_id)
            continue
        state.saw_marker(attempt, started_at)
        if finished is not None:  # it ran to its end while the controller was away
            kept.add(live.attempt_id)
            state.finish_with_exit(attempt, *finished)
        elif attempt.program_started:  # it ran, and Slurm has forgotten how it ended
            kept.add(live.attempt_id)
            state.end(attempt, state.slurm_end(attempt, "", "", None))
        else:
            state.untrack(attempt)
    if ended:
        await watcher.finish_from_slurm(ended)
    await nodes.forget_gone(set(live_vm_ids))
    watcher.ensure()  # only now: it would settle attempts under our feet
    return kept


def stop_leftover_submissions(name_prefix: str, wait_s: float = 5.0) -> int:
    """Kill this host's sbatch processes that submit jobs named `name_prefix...` (left
    running by a controller that died while it submitted), and wait until they are
    gone; how many there were. Killed before it reached slurmctld, a submission makes
    no job; after, its job is there to be found."""
    wanted = f"--job-name={name_prefix}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"sbatch" and any(a.startswith(wanted) for a in argv):
            found.append(int(entry.name))
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in found):
        time.sleep(0.01)
    return len(found)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
