"""Signals to an attempt's job: the checkpoint signal and its confirmation, and stops.

A checkpoint is USR1 to every process of the job (`scancel --full`) once its program
started, confirmed by a file appearing or being replaced in its checkpoint directory
on the shared filesystem. A stop (a cancel, a time limit, a job pending for too long,
its VM gone) is SIGTERM to the job's processes, then `scancel` after the grace period,
repeated until Slurm says the job ended; its end is reported by whoever sees it (the
shared files, squeue, a callback), never before: an attempt is over only when its job
can never run any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from controller.executors.attempt_files import checkpoint_fingerprint
from controller.executors.base import CheckpointEvent
from controller.slurm.commands import SlurmError, SlurmRefused, SlurmUnavailable
from controller.slurm.executor.state import Attempt, SlurmState
from controller.slurm.naming import job_name

log = logging.getLogger("spotbag.executors.slurm")

RESEND_S = 2.0  # a checkpoint signal sent this soon after the program's start is sent again
RESTOP_S = 5.0  # a stopped job that Slurm still has after this long is scancelled again


class JobSignals:
    """Checkpoint requests and stops of the tracked attempts (one task per attempt each)."""

    def __init__(self, state: SlurmState, kill_grace_s: float) -> None:
        self._state = state
        self._grace_s = kill_grace_s

    def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        attempt = self._state.attempts.get(attempt_id)
        if attempt is None or attempt.ended or attempt.stop_reason or attempt.checkpoint:
            log.debug("checkpoint of %s not asked: gone, stopping or under way", attempt_id)
            return
        if attempt.checkpoint_dir is None:  # not checkpointable: nothing to watch
            return
        attempt.checkpoint = asyncio.create_task(
            self._checkpoint(attempt, attempt.checkpoint_dir, timeout_s),
            name=f"checkpoint {attempt_id}",
        )

    async def _checkpoint(self, attempt: Attempt, directory: Path, timeout_s: float) -> None:
        """USR1 to every process of the job (`scancel --full`) once its program started,
        then watch its checkpoint directory for a file that appears or is replaced.

        A signal sent within a moment of the program's start may reach it before it
        installed its handler (it inherits "ignore" from the wrapper until then), and is
        lost without a trace; such a signal is sent once more after RESEND_S."""
        state = self._state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        requested_at = state.now()
        ok, detail = False, f"no checkpoint written within {timeout_s:g} s"
        try:
            while not attempt.program_started and not attempt.ended:
                if loop.time() >= deadline:
                    detail = "its program had not started"
                    return
                await asyncio.sleep(state.settings.file_poll_s)
            if attempt.ended:
                detail = "the attempt ended before it wrote the checkpoint"
                return
            before = await asyncio.to_thread(checkpoint_fingerprint, directory)
            requested_at = state.now()
            try:
                await state.tools.run("scancel", "--full", "--signal=USR1", attempt.job_id)
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
                        await state.tools.run("scancel", "--full", "--signal=USR1", attempt.job_id)
                await asyncio.sleep(state.settings.file_poll_s)
        finally:
            attempt.checkpoint = None
            log.debug("checkpoint of %s: %s", attempt.attempt_id, "written" if ok else detail)
            state.emit(CheckpointEvent(attempt.attempt_id, requested_at, state.now(), ok, detail))

    def cancel(self, attempt_id: str) -> None:
        """Stop an attempt the scheduler cancels; its end is reported as KILLED."""
        attempt = self._state.attempts.get(attempt_id)
        if attempt is not None and not attempt.stop_reason and not attempt.ended:
            self.stop(attempt, "cancelled")

    def stop(
        self, attempt: Attempt, reason: str, *, grace: bool = True, sent: bool = False
    ) -> None:
        """Stop the attempt's job; it ends (is reported) once Slurm says the job did.
        `grace`: a running program gets SIGTERM and the grace period first; `sent`: it
        was scancelled already (it is scancelled again if it lingers)."""
        if attempt.stopper is not None and not attempt.stopper.done():
            attempt.stop_reason = attempt.stop_reason or reason
            return
        attempt.stop_reason = reason
        attempt.stopper = asyncio.create_task(
            self._scancel(attempt, grace, sent), name=f"stop {attempt.attempt_id}"
        )

    async def _scancel(self, attempt: Attempt, grace: bool, sent: bool) -> None:
        """scancel the job (by name while its id is unknown: its submission's answer was
        lost, and it may exist), and again every RESTOP_S until Slurm says it has ended:
        a stop is done only when the job can never run any more. Slurm not answering
        only delays it."""
        state = self._state
        warned = False
        if sent and await self._ended_within(attempt, RESTOP_S):
            return
        while not attempt.ended and not state.closing:
            try:
                if not attempt.job_id:
                    name = job_name(state.controller_id, attempt.attempt_id)
                    await state.tools.run("scancel", f"--name={name}")
                else:
                    if grace and attempt.running_at is not None and self._grace_s > 0:
                        grace = False
                        await state.tools.run("scancel", "--full", "--signal=TERM", attempt.job_id)
                        if await self._ended_within(attempt, self._grace_s):
                            return
                    await state.tools.run("scancel", attempt.job_id)
            except SlurmRefused as exc:  # e.g. it is ending already: the watcher says
                log.debug("scancel of %s: %s", attempt.attempt_id, exc)
            except SlurmUnavailable as exc:
                if not warned:
                    log.warning(
                        "cannot stop %s (job %s) yet: %s; trying again",
                        attempt.attempt_id,
                        attempt.job_id or "not known yet",
                        exc,
                    )
                    warned = True
            state.wake.set()  # the watcher asks Slurm how it ended
            await self._ended_within(attempt, RESTOP_S)

    async def _ended_within(self, attempt: Attempt, seconds: float) -> bool:
        """Wait up to `seconds` for the attempt's end to be reported."""
        state = self._state
        for _ in range(max(1, int(seconds / state.settings.file_poll_s))):
            if attempt.ended or state.closing:
                return True
            await asyncio.sleep(state.settings.file_poll_s)
        return attempt.ended
