"""Signals to an attempt's job: the checkpoint signal and its confirmation, and stops.

A checkpoint is USR1 to every process of the job (`scancel --full`) once its program
started, confirmed by a file appearing or being replaced in its checkpoint directory
on the shared filesystem. A stop (a cancel, a time limit, a job pending for too long)
is SIGTERM to the job's processes, then `scancel` after the grace period; its end is
reported by whoever sees it (the shared files, squeue, a callback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from controller.executors.attempt_files import checkpoint_fingerprint
from controller.executors.base import CheckpointEvent
from controller.executors.slurm.state import Attempt, SlurmState
from controller.slurm.commands import SlurmError

log = logging.getLogger("spotbag.executors.slurm")

RESEND_S = 2.0  # a checkpoint signal sent this soon after the program's start is sent again


class JobSignals:
    """Checkpoint requests and stops of the tracked attempts (one task per attempt each)."""

    def __init__(self, state: SlurmState, kill_grace_s: float) -> None:
        self._state = state
        self._grace_s = kill_grace_s

    def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        attempt = self._state.attempts.get(attempt_id)
        if attempt is None or attempt.ended or attempt.stop_reason or attempt.checkpoint:
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
            state.emit(CheckpointEvent(attempt.attempt_id, requested_at, state.now(), ok, detail))

    def cancel(self, attempt_id: str) -> None:
        """Stop an attempt the scheduler cancels; its end is reported as KILLED."""
        attempt = self._state.attempts.get(attempt_id)
        if attempt is not None and not attempt.stop_reason and not attempt.ended:
            self.stop(attempt, "cancelled")

    def stop(self, attempt: Attempt, reason: str) -> None:
        attempt.stop_reason = reason
        attempt.stopper = asyncio.create_task(
            self._scancel(attempt), name=f"stop {attempt.attempt_id}"
        )

    async def _scancel(self, attempt: Attempt) -> None:
        state = self._state
        while not attempt.job_id and not attempt.ended and not state.closing:
            await asyncio.sleep(state.settings.poll_interval_s)  # its submission is unknown yet
        if attempt.ended or state.closing:
            return
        try:
            if attempt.running_at is not None and self._grace_s > 0:
                await state.tools.run("scancel", "--full", "--signal=TERM", attempt.job_id)
                for _ in range(int(self._grace_s / state.settings.file_poll_s) + 1):
                    if attempt.ended:
                        return
                    await asyncio.sleep(state.settings.file_poll_s)
            await state.tools.run("scancel", attempt.job_id)
        except SlurmError as exc:
            log.warning("cancelling %s (job %s): %s", attempt.attempt_id, attempt.job_id, exc)
            attempt.stop_reason = ""  # the watcher tries again (timeouts) or the user does
        state.wake.set()
