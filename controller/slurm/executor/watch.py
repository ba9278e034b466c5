"""Watching the attempts and nodes: the shared files often, Slurm when it must say.

Three sources, all idempotent (callbacks.py has the third):
1. the shared files, every `file_poll_s`: the program started; it exited (and how);
2. `squeue` for the jobs it tracks: the truth after restarts and lost callbacks
   (the state, the start time, why a job pends), every `poll_interval_s` while
   something only Slurm can settle is open, QUIET_POLLS times less often otherwise
   (each call costs slurmctld a walk over every job it remembers); `sinfo` for the
   nodes of VMs it waits for (and, now and then, those it uses; nodes.py);
3. callbacks from slurmctld's hooks.

Ends without an exit status (node failure, a cancel, a time limit, a launch failure)
are mapped from Slurm's state (state.py, `SlurmState.slurm_end`); a job pending past
`pending_timeout_s` (its node never took it) is stopped -> NOT_STARTED; an attempt
past its max runtime is stopped -> TIMED_OUT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controller.executors.attempt_files import exit_status_path, read_exit_status, started_path
from controller.executors.base import AttemptEvent, Outcome
from controller.slurm.commands import (
    SlurmError,
    SlurmRefused,
    SlurmUnavailable,
    exit_status,
    key_values,
    slurm_time,
    split_rows,
)
from controller.slurm.executor.nodes import NodeManager
from controller.slurm.executor.state import (
    LIVE_STATES,
    RUNNING_STATES,
    SCRIPT_RUNNING_STATES,
    Attempt,
    SlurmState,
    read_markers,
)
from controller.slurm.naming import attempt_of_job, job_name

log = logging.getLogger("spotbag.executors.slurm")

# Why a job may pend on its node for a while without anything being wrong.
WAITING_REASONS = frozenset({"Resources", "Priority", "None", "BeginTime", "Dependency"})
QUIET_POLLS = 5  # squeue this many times less often when nothing needs it
# How long a job may run in Slurm without its start marker before its start is taken
# from Slurm (the shared directory is then not what the VMs see).
MARKER_PATIENCE_S = 60.0
# How long a submission that got no answer is looked for by its job's name before it is
# taken as never made (its request may wait in a busy slurmctld after sbatch gave up).
UNKNOWN_GRACE_S = 60.0
SQUEUE_IDS = 2000  # job ids per squeue -j (one argument may not exceed 128 KiB)
ORPHAN_SWEEP_S = 30.0  # how often all of this controller's jobs are looked at for orphans

# A job as squeue shows it: id, state, reason, start time, name, its user's uid (asked
# for with the name last: a name may hold "|").
JobRow = tuple[str, str, str, str, str, str]
JOB_FORMAT = "%i|%T|%r|%S|%U|%j"


def job_rows(out: str) -> list[JobRow]:
    """squeue's JOB_FORMAT lines as JobRows."""
    return [(r[0], r[1], r[2], r[3], r[5], r[4]) for r in split_rows(out, 6)]


class Watcher:
    """The watching task, and the squeue/sinfo poll that is the source of truth.

    `stop` stops an attempt (signals.py) that timed out or pends for too long."""

    def __init__(
        self,
        state: SlurmState,
        nodes: NodeManager,
        stop: Callable[[Attempt, str], None],
    ) -> None:
        self._state = state
        self._nodes = nodes
        self._stop = stop
        self.task: asyncio.Task | None = None
        self.orphans_swept_at = 0.0  # the event loop's time of the last look for orphans

    def ensure(self) -> None:
        """Start watching, unless it already does."""
        if self.task is None or self.task.done():
            self._state.closing = False
            self.task = asyncio.create_task(self._watch(), name="slurm watcher")

    async def _watch(self) -> None:
        state = self._state
        loop = asyncio.get_running_loop()
        last_poll = 0.0
        while not state.closing:
            try:
                await self._check_files()
                self._check_timeouts()
                interval = state.settings.poll_interval_s
                if not self._needs_slurms_word():
                    interval *= QUIET_POLLS
                if state.wake.is_set() or loop.time() - last_poll >= interval:
                    state.wake.clear()
                    last_poll = loop.time()
                    await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching Slurm failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.wake.wait(), state.settings.file_poll_s)

    def _needs_slurms_word(self) -> bool:
        """Whether something only squeue can settle is open: a submission whose fate is
        unknown, a stop under way, a job pending for long, a node waiting to join, or
        Slurm not answering. Otherwise the shared files and the callbacks report starts
        and ends, and squeue is asked QUIET_POLLS times less often."""
        state = self._state
        if state.unavailable or state.settling:
            return True
        if any(not n.ready and not n.lost for n in state.nodes.values()):
            return True
        patience = state.settings.pending_timeout_s / 4
        now = state.now()
        return any(
            not a.job_id
            or a.stop_reason
            or (a.running_at is None and now - a.submitted_at > patience)
            for a in state.attempts.values()
            if not a.ended
        )

    async def _check_files(self) -> None:
        state = self._state
        watched = [a for a in state.attempts.values() if not a.ended and a.job_id]
        if not watched:
            return
        seen = await asyncio.to_thread(read_markers, watched)
        for attempt, (started_at, finished) in zip(watched, seen, strict=True):
            state.saw_marker(attempt, started_at)
            if attempt.program_started and not attempt.ended:
                state.started(attempt, attempt.program_started_at or state.now())
            if finished is not None:
                # Ended for the scheduler now (its slot is free); its VM stays until
                # squeue says the job did (`_poll_settling`).
                state.finish_with_exit(attempt, *finished, confirmed=False)
                state.wake.set()

    def _check_timeouts(self) -> None:
        state = self._state
        now = state.now()
        for attempt in list(state.attempts.values()):
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
        state = self._state
        try:
            asked = await self._poll_jobs()
            asked = await self._poll_settling() or asked
            asked = await self._nodes.poll() or asked
            await self._sweep_orphans()
            await self._nodes.delete_lost()
            if not asked:  # nothing to ask about: is it there at all?
                await state.tools.run("scontrol", "ping")
        except SlurmUnavailable as exc:
            if not state.unavailable:
                log.warning("Slurm does not answer: %s", exc)
            state.unavailable = str(exc)
            return
        if state.unavailable:
            log.info("Slurm answers again")
        state.unavailable = ""

    async def _poll_jobs(self) -> bool:
        """Settle the tracked jobs by squeue; False when there were none to ask about.

        Only what a query asked about is judged by its answer: an attempt whose sbatch
        answers while squeue runs was not in the question, and its absence from the
        answer says nothing (it would otherwise be taken for a job Slurm forgot)."""
        state = self._state
        tracked = [a for a in state.attempts.values() if not a.ended]
        if not tracked:
            return False
        # Submissions whose answer was lost are looked for by name (all of this
        # controller's jobs Slurm keeps: costly on a busy cluster, so not for the ones
        # whose sbatch is still on its way).
        unknown = [a for a in tracked if not a.job_id and not a.submitting]
        if unknown:
            found = await self.jobs_by_name()
            for attempt in unknown:
                if attempt.ended or attempt.job_id:  # settled while squeue ran
                    continue
                row = found.get(attempt.attempt_id)
                if row is not None:
                    attempt.job_id = row[0]
                elif state.now() - attempt.submitted_at > UNKNOWN_GRACE_S:
                    await self._give_up_submission(attempt)
        asked = {a.attempt_id: a.job_id for a in tracked if a.job_id and not a.ended}
        rows = await self._job_rows(list(asked.values())) if asked else {}
        now = state.now()
        finished: list[tuple[Attempt, str, str]] = []
        for attempt in tracked:
            job_id = asked.get(attempt.attempt_id)
            if job_id is None or attempt.ended or attempt.job_id != job_id:
                continue  # not asked about, or settled while squeue ran
            row = rows.get(attempt.attempt_id)
            if row is None or row[0] != job_id:
                finished.append((attempt, "", ""))  # Slurm forgot it (past MinJobAge)
                continue
            _, job_state, reason, start, _, _ = row
            if job_state == "PENDING":
                self._pending(attempt, reason, now)
            elif job_state in RUNNING_STATES:
                self._running(attempt, slurm_time(start) or now, now)
            elif job_state not in LIVE_STATES:
                finished.append((attempt, job_state, reason))
        if finished:
            await self.finish_from_slurm(finished)
        return True

    async def _poll_settling(self) -> bool:
        """The jobs whose attempts ended by their exit status: settled once squeue shows
        their batch script ended (or forgets them). False when there were none."""
        state = self._state
        if not state.settling:
            return False
        job_ids = list(state.settling)
        rows = await self._job_rows(job_ids)
        running = {row[0] for row in rows.values() if row[1] in SCRIPT_RUNNING_STATES}
        for job_id in job_ids:
            if job_id not in running:
                state.settled(job_id)
        return True

    async def _give_up_submission(self, attempt: Attempt) -> None:
        """A submission that got no answer, and whose job Slurm has not shown for
        UNKNOWN_GRACE_S: cancelled by name (should its request be handled yet), it did
        not start. (A job that comes later still is an orphan: `_sweep_orphans`.)"""
        state = self._state
        name = job_name(state.controller_id, attempt.attempt_id)
        await state.tools.run("scancel", f"--name={name}")
        if attempt.ended or attempt.job_id:
            return
        state.end(
            attempt,
            AttemptEvent(
                attempt.attempt_id,
                state.now(),
                Outcome.NOT_STARTED,
                None,
                "Slurm never took the job (its submission got no answer)",
            ),
        )

    async def _job_rows(self, job_ids: list[str]) -> dict[str, JobRow]:
        """squeue's rows of these jobs, by attempt id (jobs Slurm forgot are absent);
        asked SQUEUE_IDS at a time (one argument may not exceed 128 KiB)."""
        state = self._state
        rows: dict[str, JobRow] = {}
        for first in range(0, len(job_ids), SQUEUE_IDS):
            chunk = ",".join(job_ids[first : first + SQUEUE_IDS])
            try:
                out = await state.tools.run(
                    "squeue", "-h", "-t", "all", "-j", chunk, "-o", JOB_FORMAT
                )
            except SlurmRefused as exc:
                if "Invalid job id" not in str(exc):  # squeue's answer when it knows none
                    raise
                out = ""
            for row in job_rows(out):
                attempt_id = attempt_of_job(state.controller_id, row[4])
                if attempt_id is not None:
                    rows[attempt_id] = row
        return rows

    def _pending(self, attempt: Attempt, reason: str, now: float) -> None:
        state = self._state
        attempt.pending_reason = reason
        waited = now - attempt.submitted_at
        # Waiting for a slot of a healthy node (queued ahead) is no reason to give up.
        stuck = reason.split(",")[0].strip() not in WAITING_REASONS
        if stuck and waited > state.settings.pending_timeout_s and not attempt.stop_reason:
            log.warning(
                "%s pends in Slurm since %.0f s (%s): giving up on it",
                attempt.attempt_id,
                waited,
                reason,
            )
            self._stop(attempt, f"pending in Slurm for {waited:.0f} s ({reason})")

    def _running(self, attempt: Attempt, since: float, now: float) -> None:
        """Slurm runs the job: its program's start is reported when its marker appears
        (Slurm says RUNNING before the batch script runs, and a job killed in between
        never ran its program). A marker that never comes means the shared directory
        is not shared with the VMs: the start is then taken from Slurm, late."""
        attempt.slurm_running_at = attempt.slurm_running_at or since
        if attempt.program_started or attempt.running_at is not None:
            return
        if now - attempt.slurm_running_at > MARKER_PATIENCE_S:
            log.warning(
                "%s runs in Slurm since %.0f s but its start marker %s is not there: is "
                "the shared directory shared with the VMs?",
                attempt.attempt_id,
                now - attempt.slurm_running_at,
                started_path(attempt.log_path),
            )
            self._state.started(attempt, attempt.slurm_running_at)

    async def cancel_orphans(
        self, named: list[tuple[str, JobRow]], live: dict[str, str]
    ) -> list[str]:
        """Cancel this controller's jobs (`named`: `named_jobs`) that Slurm may still
        run although their attempts are over: not among `live` (the live attempts and
        their job ids, "" when unknown), or another job of a live attempt's name, or
        one its user does not run (a job may name itself after another account's
        attempt). E.g. a submission that reached Slurm after the controller had given
        up on it. A job whose program has written its exit status (in a file of the
        job's user) is ending by itself. Returns the job ids cancelled."""
        state = self._state
        self.orphans_swept_at = asyncio.get_running_loop().time()

        def orphan(attempt_id: str, row: JobRow) -> bool:
            if row[1] not in LIVE_STATES or row[1] == "COMPLETING":
                return False
            job_id = live.get(attempt_id)
            return (
                job_id is None or job_id not in ("", row[0]) or not state.owns(attempt_id, row[5])
            )

        suspects = [(a, row) for a, row in named if orphan(a, row)]
        if not suspects:
            return []
        exited = await asyncio.to_thread(
            lambda: [
                row[5].isdigit()
                and read_exit_status(exit_status_path(state.paths_of(a)[0]), int(row[5]))
                is not None
                for a, row in suspects
            ]
        )
        orphans = [row[0] for (_, row), done in zip(suspects, exited, strict=True) if not done]
        if not orphans:
            return []
        log.warning(
            "cancelling %d Slurm job(s) of attempts that are over: %s", len(orphans), orphans
        )
        try:
            await state.tools.run("scancel", *orphans)
        except SlurmError as exc:
            log.warning("could not cancel them: %s", exc)
        return orphans

    async def _sweep_orphans(self) -> None:
        """Now and then (ORPHAN_SWEEP_S), look for orphans among all of this controller's
        jobs (a safety net: each attempt's own job is watched and stopped by id)."""
        if asyncio.get_running_loop().time() - self.orphans_swept_at < ORPHAN_SWEEP_S:
            return
        # Live before or after the question: an attempt that ends while squeue runs may
        # be shown live in its answer, and one that starts meanwhile may be in it too.
        live = self._live_attempts()
        named = await self.named_jobs()
        await self.cancel_orphans(named, live | self._live_attempts())

    def _live_attempts(self) -> dict[str, str]:
        return {a.attempt_id: a.job_id for a in self._state.attempts.values() if not a.ended}

    async def jobs_by_name(self) -> dict[str, JobRow]:
        """This controller's jobs Slurm knows, by attempt id: of each attempt, the
        latest job its own user runs (`latest_owned`)."""
        return self.latest_owned(await self.named_jobs())

    async def named_jobs(self) -> list[tuple[str, JobRow]]:
        """Every job Slurm knows, of the users this executor's jobs run as, that is
        named after one of this controller's attempts: (attempt id, its row)."""
        state = self._state
        out = await state.tools.run(
            "squeue", "-h", *state.squeue_users(), "-t", "all", "-o", JOB_FORMAT
        )
        named = []
        for row in job_rows(out):
            attempt_id = attempt_of_job(state.controller_id, row[4])
            if attempt_id is not None:
                named.append((attempt_id, row))
        return named

    def latest_owned(self, named: list[tuple[str, JobRow]]) -> dict[str, JobRow]:
        """Of each attempt, the job with the highest id among those run by the attempt's
        own user (`SlurmState.owns`): a job of another account, named after it, is not
        its job."""
        found: dict[str, JobRow] = {}
        for attempt_id, row in named:
            if not self._state.owns(attempt_id, row[5]):
                continue
            previous = found.get(attempt_id)
            if previous is None or int(row[0]) > int(previous[0]):
                found[attempt_id] = row
        return found

    async def finish_from_slurm(self, ended: list[tuple[Attempt, str, str]]) -> None:
        """Jobs Slurm has ended (or forgotten): their exit status if their wrapper wrote
        one, else what Slurm says (SLURM.md's state mapping)."""
        state = self._state
        markers = await asyncio.to_thread(read_markers, [a for a, _, _ in ended])
        for (attempt, job_state, reason), (started_at, finished) in zip(
            ended, markers, strict=True
        ):
            state.saw_marker(attempt, started_at)
            if finished is not None:
                state.finish_with_exit(attempt, *finished)
                continue
            code = None
            if job_state == "FAILED" and attempt.program_started:
                code = await self._exit_code(attempt.job_id)
            state.end(attempt, state.slurm_end(attempt, job_state, reason, code))

    async def _exit_code(self, job_id: str) -> int | None:
        try:
            out = await self._state.tools.run("scontrol", "-o", "show", "job", job_id)
        except SlurmError:
            return None
        code, sig = exit_status(key_values(out.strip()).get("ExitCode", "0:0"))
        return 128 + sig if sig else code
