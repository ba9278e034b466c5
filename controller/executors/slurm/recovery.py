"""Recovery after a controller restart: Slurm jobs outlive the controller, so every
attempt Slurm still has is adopted again, those that ended meanwhile are reported
(from their exit status, else Slurm's final state), and only attempts neither Slurm
nor the shared files know are lost. Nodes of VMs that are gone are deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from controller.executors.base import LiveAttempt
from controller.executors.slurm.nodes import NodeManager
from controller.executors.slurm.state import (
    LIVE_STATES,
    RUNNING_STATES,
    Attempt,
    Node,
    SlurmState,
    read_markers,
)
from controller.executors.slurm.watch import JobRow, Watcher
from controller.slurm.commands import SlurmError, slurm_time

log = logging.getLogger("spotbag.executors.slurm")


async def recover(
    state: SlurmState,
    watcher: Watcher,
    nodes: NodeManager,
    attempts: Sequence[LiveAttempt],
    live_vm_ids: Sequence[str],
) -> set[str]:
    """Re-adopt the attempts the store says were live; the ones kept. When Slurm does
    not answer, every attempt is kept and the watcher settles them once it does."""
    for vm_id in live_vm_ids:
        state.nodes.setdefault(vm_id, Node(vm_id, state.node_of(vm_id), 0.0))
    for live in attempts:
        bag_job, _, number = live.attempt_id.rpartition(".")
        bag_id = bag_job.rpartition("-")[0]
        log_path = Path(state.log_path(bag_id, bag_job, int(number)))
        attempt = Attempt(
            live.attempt_id,
            live.vm_id,
            state.node_of(live.vm_id),
            log_path,
            state.checkpoint_dir(bag_id, bag_job),
            live.max_runtime_s,
            job_id=live.ref,
            submitted_at=live.started_at,
        )
        state.track(attempt)
    try:
        found = await watcher.jobs_by_name()
    except SlurmError as exc:
        log.warning("Slurm does not answer at recovery (%s): keeping every attempt", exc)
        state.unavailable = str(exc)
        watcher.ensure()
        return {a.attempt_id for a in attempts}
    kept: set[str] = set()
    ended: list[tuple[Attempt, str, str]] = []
    now = state.now()
    await cancel_orphans(state, found, {a.attempt_id: a.ref for a in attempts})
    for live in attempts:
        attempt = state.attempts[live.attempt_id]
        row = found.get(live.attempt_id)
        if row is not None and (not attempt.job_id or attempt.job_id == row[0]):
            job_id, job_state, reason, start, _ = row
            attempt.job_id = job_id
            kept.add(live.attempt_id)
            if job_state in RUNNING_STATES:  # its start marker says when its program began
                attempt.slurm_running_at = slurm_time(start) or now
            elif job_state not in LIVE_STATES:
                ended.append((attempt, job_state, reason))
            continue
        ((started_at, finished),) = await asyncio.to_thread(read_markers, [attempt.log_path])
        if finished is not None:  # it ran to its end while the controller was away
            kept.add(live.attempt_id)
            state.saw_marker(attempt, started_at)
            state.finish_with_exit(attempt, *finished)
        else:
            state.untrack(attempt)
    if ended:
        await watcher.finish_from_slurm(ended)
    await nodes.forget_gone(set(live_vm_ids))
    watcher.ensure()  # only now: it would settle attempts under our feet
    return kept


async def cancel_orphans(
    state: SlurmState, found: dict[str, JobRow], live: dict[str, str]
) -> list[str]:
    """Cancel this controller's jobs that Slurm may still run although their attempts
    are over (not among `live`, the live attempts and their job ids, "" when unknown):
    e.g. a submission that reached Slurm after the controller gave up on it. Returns
    the job ids cancelled."""

    def orphan(attempt_id: str, row: JobRow) -> bool:
        if row[1] not in LIVE_STATES or row[1] == "COMPLETING":
            return False
        job_id = live.get(attempt_id)
        return job_id is None or job_id not in ("", row[0])

    orphans = [row[0] for attempt_id, row in found.items() if orphan(attempt_id, row)]
    if not orphans:
        return []
    log.warning("cancelling %d Slurm job(s) of attempts that are over: %s", len(orphans), orphans)
    try:
        await state.tools.run("scancel", *orphans)
    except SlurmError as exc:
        log.warning("could not cancel them: %s", exc)
    return orphans
