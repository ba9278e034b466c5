"""Commands: what callers queued for the next pass (controller/scheduler/inputs.py),
carried out at its start, after the events.

- a bag admitted becomes a `BagRun` whose jobs wait as a range and one packed string
  of parameters (controller/waiting_jobs.py), the jobs past its account's credit held;
- a cancellation cancels at most CANCEL_CHUNK waiting jobs a pass (and queues itself
  again for the rest) and marks the bag's live attempts to be stopped;
- Slurm's power-saving and job-run reports go to the Slurm pools
  (controller/scheduler/slurm_pools.py).

After the commands, held jobs are admitted as far as their accounts can now reserve
for them (`admit_held`). `Commands` is given the scheduler's `World`
(controller/scheduler/world.py), the accounts, the inbox (a cancellation not finished
queues itself again) and the Slurm pools.
"""

from __future__ import annotations

import itertools

from controller.bags.waiting_jobs import FreshParams, HeldJobs, JobQueue
from controller.ledger import Accounts
from controller.scheduler.inputs import Command, Inbox, PoolPower, PoolRunEvent, _Admit, _Cancel
from controller.scheduler.runs import BagRun, shape_of
from controller.scheduler.slurm_pools import SlurmPools
from controller.scheduler.world import World
from controller.states import JobState
from controller.store import WriteBatch

CANCEL_CHUNK = 500  # waiting jobs cancelled per pass (~10-25 ms of the loop on a small VM)


class Commands:
    """Bags admitted and cancelled, and pool reports, at a pass's start (see the module
    docstring)."""

    def __init__(
        self, *, world: World, accounts: Accounts, inbox: Inbox, pools: SlurmPools
    ) -> None:
        self.world = world
        self.accounts = accounts
        self.inbox = inbox
        self.pools = pools

    def run(self, batch: WriteBatch, commands: list[Command], now: float) -> list[str]:
        cancels: list[str] = []
        for command in commands:
            if isinstance(command, _Admit):
                self._admit(command, batch, now)
            elif isinstance(command, _Cancel):
                cancels += self._cancel_bag(command.bag_id, batch, now)
            elif isinstance(command, PoolPower):
                self.pools.on_power(command, batch, now)
            elif isinstance(command, PoolRunEvent):
                self.pools.on_run(command, batch, now)
        return cancels

    def _admit(self, command: _Admit, batch: WriteBatch, now: float) -> None:
        if command.bag_id in self.world.bags:
            return  # already loaded from the store by a recovery
        bag = BagRun(
            id=command.bag_id,
            spec=command.spec,
            shape=shape_of(command.spec),
            # A range and the packed parameters: no object per job (waiting_jobs.py).
            queue=JobQueue(command.held_from),
            fresh=FreshParams(command.params_json),
            open_jobs=len(command.params_json),
            failed_jobs=0,
        )
        bag.deadline_at = command.spec.deadline_at(now)
        bag.submitted_at, bag.jobs_total = now, len(command.params_json)
        # Jobs past the account's credit wait, held: a range, not an entry per job.
        bag.held = HeldJobs(command.held_from, len(command.params_json))
        self.world.bags[bag.id] = bag
        self.world.budgets.open_bag(bag.id, command.spec.budget_usd)
        self.accounts.hold_range(
            bag.spec.account, bag.id, command.held_from, len(command.params_json)
        )

    def admit_held(self, batch: WriteBatch, now: float) -> None:
        """Jobs held for credit run, oldest first per account, as far as their accounts
        can now reserve for them."""
        for queue in self.accounts.held.values():
            while queue:
                bag_id, idx = queue[0]
                bag = self.world.bags.get(bag_id)
                if bag is None:
                    queue.drop_first_run()  # its bag is gone: none of the run can run
                    continue
                if idx not in bag.held:
                    queue.popleft()  # cancelled
                    continue
                job = self.world.jobs.get((bag_id, idx))
                number = (job.attempts if job is not None else 0) + 1
                entries = self.accounts.reserve_next(bag_id, idx, number, bag.spec)
                if entries is None:
                    break
                queue.popleft()
                del bag.held[idx]
                batch.ledger_entries(now, entries, "held job admitted")
                job = job or self.world.held_job(bag, idx)
                self.world.job_to(job, JobState.QUEUED, now, batch, "CPU-hours reserved")

    def _cancel_bag(self, bag_id: str, batch: WriteBatch, now: float) -> list[str]:
        bag = self.world.bags.get(bag_id)
        if bag is None:
            return []
        bag.cancel_requested = True  # nothing of it is placed any more
        # A pass cancels at most CANCEL_CHUNK waiting jobs and asks for another pass:
        # a bag of a million jobs never holds the event loop for long.
        budget = CANCEL_CHUNK
        while bag.queue and budget:
            idx = bag.queue.popleft()
            job = self.world.job_to_cancel(bag, idx, JobState.QUEUED)
            self.world.job_to(job, JobState.CANCELLED, now, batch, "cancelled by user")
            budget -= 1
        for idx in list(itertools.islice(bag.held, budget)):
            del bag.held[idx]
            job = self.world.job_to_cancel(bag, idx, JobState.HELD)
            self.world.job_to(job, JobState.CANCELLED, now, batch, "cancelled by user")
        if bag.queue or bag.held:
            self.inbox.commands.append(_Cancel(bag_id))
            self.inbox.wake.set()
        cancels = []
        for attempt in list(self.world.attempts.values()):
            if attempt.bag_id == bag_id and not attempt.cancelling:
                attempt.cancelling = True
                cancels.append(attempt.id)
                self.world.job_to(
                    self.world.jobs[(bag_id, attempt.idx)],
                    JobState.CANCELLED,
                    now,
                    batch,
                    "cancelled by user",
                )
        return cancels
