"""Callbacks from slurmctld's hooks about the executor's jobs (controller/api,
slurm_hooks/): jobcomp gives a job's final state at once; the others (the epilog,
an allocation notice, a late or stale event) are noted and at most wake the watcher,
for squeue has the final word. Each callback's key is remembered, so that one sent
twice is taken once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from controller.executors.base import CallbackNoted
from controller.slurm.commands import exit_status
from controller.slurm.executor.state import LIVE_STATES, SlurmState, read_markers
from controller.slurm.naming import attempt_of_job


class Callbacks:
    """The callbacks taken since the controller started, and what each one means."""

    def __init__(self, state: SlurmState) -> None:
        self._state = state
        self._recent_keys: OrderedDict[str, None] = OrderedDict()  # callbacks taken

    def seen(self, key: str) -> bool:
        """Whether a callback with this key was taken since the controller started (its
        record in the store may still be on its way)."""
        return key in self._recent_keys

    def remember(self, key: str) -> None:
        self._recent_keys[key] = None
        while len(self._recent_keys) > 100_000:
            self._recent_keys.popitem(last=False)

    async def take(
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
        shared = self._state
        self.remember(key)
        at = shared.now() if at is None else at
        attempt_id = attempt_of_job(shared.controller_id, job_name_)
        if attempt_id is None:
            return ""
        if event == "jobcomp" and state not in LIVE_STATES:
            shared.settled(job_id)  # also when its attempt ended by its exit status
        attempt = shared.attempts.get(attempt_id)
        # Job ids are reused: an event for another job of the same name is stale.
        if attempt is None or attempt.ended or (attempt.job_id and attempt.job_id != job_id):
            shared.emit(CallbackNoted(key, at, event, job_name_))
            return "noted"
        attempt.job_id = attempt.job_id or job_id
        outcome = "noted"
        if event == "jobcomp" and state not in LIVE_STATES:
            ((started_at, finished),) = await asyncio.to_thread(read_markers, [attempt])
            if attempt.ended:  # the watcher saw its end meanwhile
                shared.emit(CallbackNoted(key, at, event, job_name_))
                return "noted"
            shared.saw_marker(attempt, started_at)
            if finished is not None:
                shared.finish_with_exit(attempt, finished[0], finished[1], key)
            else:
                code, sig = exit_status(exit_code)
                value = 128 + sig if sig else code
                shared.end(attempt, shared.slurm_end(attempt, state, "", value, key))
            return "applied"
        shared.emit(CallbackNoted(key, at, event, job_name_))
        if event == "epilog_slurmctld":  # only a wake-up: Slurm has the final word
            shared.wake.set()
        return outcome
