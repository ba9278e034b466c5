"""Power-saving pools: Slurm users' jobs on spot VMs (controller/slurm/pools.py
describes the pools and holds their configuration and run keys).

Slurm powers pool nodes up and down (`PoolPower`): a resume launches a VM for the node
(its type chosen by `controller.planner.pool_vm_type`, under the hopping market if
any), a suspend or a failed resume terminates it. The prolog and jobcomp hooks report
each run of a user's job (`PoolRunEvent`): at its start CPU-hours are reserved in the
ledger for its time limit from the account `run_account` matches (a job its account
cannot pay for, or whose account spotbag does not know, is cancelled unless `[slurm]
unknown_accounts` creates it); at its end what it used is charged and the rest
released. Idle pool VMs that the reuse policy
would not start a typical job on (policies.reuse, `unfit_from_h`; docs/design.md#reuse) are
handed back to Slurm, so the next job gets a fresh VM.

`SlurmPools` is given the scheduler's `World` (controller/scheduler/world.py): pool VMs
are VMs of the scheduler (tracked, recorded and ended like the others, in the world's
`pool_vms` index) and runs are paid from the same accounts. It owns the pools'
configuration (`book`), the open runs, and what a pass decided for the acting half:
pool VMs to launch (taken by the pass, `take_launches`), VMs to terminate (handed to the
pass through the `terminate` callback), and Slurm jobs refused, nodes released and the
hooks' verdicts (carried out by `carry_out`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from controller.executors.base import Executor, PoolExecutor
from controller.ledger import Accounts, UnknownAccount
from controller.planner import Terminate, pool_vm_type
from controller.scheduler.calls import Calls
from controller.scheduler.inputs import IdSource, Inbox, PoolPower, PoolRunEvent
from controller.scheduler.runs import VmRun, capacity_of
from controller.scheduler.world import World
from controller.slurm.pools import RUN_STATES, PoolBook, run_account, run_key
from controller.store import WriteBatch
from controller.store.rows import SlurmRunRow
from drivers.base import VmState
from policies.ledger_rules import InsufficientCredit
from policies.packing import Shape

log = logging.getLogger("spotbag.scheduler")
# How much before the open run's prolog hook was sent a jobcomp's START may say it began
# and still be that run's (START is in whole seconds).
RUN_START_SLACK_S = 2.0


class SlurmPools:
    """Slurm's pool nodes and the runs on them (see the module docstring)."""

    def __init__(
        self,
        *,
        world: World,
        accounts: Accounts,
        executor: Executor,
        ids: IdSource,
        inbox: Inbox,
        calls: Calls,
        terminate: Callable[[Terminate], None],
    ) -> None:
        self.world = world
        self.accounts = accounts
        self.executor = executor
        self.ids = ids
        self.inbox = inbox
        self.calls = calls
        self._terminate = terminate  # a VM to terminate in this pass
        self.book = PoolBook((), ())  # power-saving pools (controller/slurm/pools.py)
        self.runs: dict[tuple[str, str], SlurmRunRow] = {}  # (job id, name) -> run
        # When each open run began as slurmctld's clock says (its prolog hook's sending),
        # which a jobcomp's START is compared with (`_older_runs_end`). Not kept across a
        # restart: the open runs then recovered are told apart from older ones no more.
        self._begun: dict[tuple[str, str], float] = {}
        self._launches: list[VmRun] = []
        self._refusals: list[tuple[str, str]] = []  # (Slurm job id, why) to cancel
        self._refused: dict[tuple[str, str], str] = {}  # (job id, name) -> why
        self._released: dict[str, str] = {}  # VM id -> why spotbag let it go
        self._releases: list[tuple[str, str]] = []  # (node, why) to power down
        self._verdicts: list[tuple[asyncio.Future[str], str]] = []  # told after this pass

    def load_runs(self, runs: list[SlurmRunRow]) -> None:
        """The open runs, as the store has them (recovery)."""
        self.runs = {(r["job_id"], r["job_name"]): r for r in runs}
        self._begun.clear()

    def forget(self) -> None:
        """Forget the open runs and the VMs let go (recovery rebuilds them)."""
        self.runs.clear()
        self._begun.clear()
        self._released.clear()

    def take_launches(self) -> list[VmRun]:
        """The pool VMs recorded PENDING this pass, for the acting half to launch."""
        launches, self._launches = self._launches, []
        return launches

    def has_decisions(self) -> bool:
        """Whether pool events decided something for `carry_out` to act on or answer."""
        return bool(self._refusals or self._releases or self._verdicts)

    async def carry_out(self) -> None:
        """Act on what pool events decided, before the pass's other actions: the Slurm
        jobs refused are cancelled and the pool nodes released powered down, then the
        hooks are told their verdicts."""
        # Only the Slurm executor has pools (controller/daemon.py), so refusals and
        # releases exist only with an executor that has these two calls.
        refusals, self._refusals = self._refusals, []
        releases, self._releases = self._releases, []
        if refusals or releases:
            pools = self.executor
            assert isinstance(pools, PoolExecutor), "pool work without a pool executor"
            for job_id, why in refusals:
                await self.calls.call(pools.cancel_job(job_id, why))
            for node, why in releases:
                await self.calls.call(pools.release_pool_node(node, why))
        verdicts, self._verdicts = self._verdicts, []
        for future, verdict in verdicts:  # after the refused were cancelled
            if not future.done():
                future.set_result(verdict)

    def pool_power(self, kind: str, nodes: Sequence[str]) -> int:
        """Slurm resumes, suspends or gave up on pool nodes; returns how many are ours."""
        ours = [n for n in nodes if n in self.book.by_node]
        for node in ours:
            self.inbox.commands.append(PoolPower(kind, node))
        if ours:
            self.inbox.wake.set()
        return len(ours)

    def pool_run(self, event: PoolRunEvent) -> asyncio.Future[str] | None:
        """A run of a Slurm user's job on a pool began or ended: a future of what was
        decided (see PoolRunEvent.verdict); None if it is not on a pool."""
        if event.partition not in self.book.by_partition:
            return None
        verdict = asyncio.get_running_loop().create_future()
        self.inbox.commands.append(dataclasses.replace(event, verdict=verdict))
        self.inbox.wake.set()
        return verdict

    def vm_of(self, node: str) -> VmRun | None:
        for vm_id in self.world.pool_vms:
            vm = self.world.vms[vm_id]
            if vm.pool_node == node and not vm.terminating:
                return vm
        return None

    def on_power(self, command: PoolPower, batch: WriteBatch, now: float) -> None:
        vm = self.vm_of(command.node)
        if command.kind == "resume":
            if vm is not None:
                return  # it is on its way already (a repeated resume)
            pool = self.book.by_node[command.node]
            name = pool_vm_type(
                self.world.market,
                Shape(pool.cpus, pool.gpus, pool.memory_gb),
                self.world.catalog_view,
                pool.vm_types,
            )
            if name is None:
                log.warning(
                    "no VM type of pool %s can be launched for %s", pool.partition, command.node
                )
                return
            vm_type = self.world.catalog[name]
            vm = VmRun(
                id=self.ids.new_vm_token(),
                vm_type=vm_type,
                state=VmState.PENDING,
                requested_at=now,
                zone=vm_type.zone,
                free=capacity_of(vm_type),
                pool_node=command.node,
            )
            self.world.assume_model(vm)
            self.world.track_vm(vm)
            batch.vm(vm.row(self.world.driver_name, self.world.time_scale))
            batch.transition(
                now, "vm", vm.id, "", VmState.PENDING, f"for Slurm node {command.node}"
            )
            self._launches.append(vm)
            return
        if vm is None:
            return
        why = (
            f"Slurm powered node {command.node} down"
            if command.kind == "suspend"
            else f"Slurm gave up on node {command.node} (it did not join in ResumeTimeout)"
        )
        if command.kind == "suspend" and vm.id in self._released:
            why += f" at spotbag's request: {self._released.pop(vm.id)}"
        vm.terminating = True
        vm.reason = why
        self._terminate(Terminate(vm.id, why))

    def release_unfit(self, now: float) -> float | None:
        """Idle pool VMs on which the reuse policy would not start a job of the pool's
        typical length are handed back to Slurm (powered down when idle), so that the
        next job gets a fresh VM. Returns when the next idle one turns unfit."""
        if not self.world.pool_vms:
            return None
        to_h = self.world.time_scale / 3600.0  # real seconds -> model hours
        busy = {run["node"] for run in self.runs.values()}
        wake_at: float | None = None
        for vm_id in self.world.pool_vms:
            vm = self.world.vms[vm_id]
            if (
                vm.state is not VmState.RUNNING
                or vm.terminating
                or vm.table is None
                or vm.id in self._released
                or vm.pool_node in busy
            ):
                continue
            job_h = self.book.by_node[vm.pool_node].job_hours
            age_h = max(0.0, now - vm.requested_at) * to_h
            unfit_h = vm.table.unfit_from_h(age_h, job_h)
            if unfit_h is None or vm.table.unfit_from_h(0.0, job_h) == 0.0:
                continue  # never unfit, or no better when fresh: keep it
            if unfit_h > age_h:
                at = vm.requested_at + unfit_h / to_h
                wake_at = at if wake_at is None else min(wake_at, at)
                continue
            why = (
                f"at {age_h:.1f} h its preemption model says a fresh VM does a "
                f"{job_h:g} h job sooner"
            )
            log.info("releasing idle pool node %s (VM %s): %s", vm.pool_node, vm.id, why)
            self._released[vm.id] = why
            self._releases.append((vm.pool_node, why))
        return wake_at

    def on_run(self, event: PoolRunEvent, batch: WriteBatch, now: float) -> None:
        """Reserve for a run at its start (cancelling a job its account cannot pay for),
        charge what it used at its end and release the rest."""
        pool = self.book.by_partition[event.partition]
        ident = (event.job_id, event.job_name)
        run = self.runs.get(ident)
        if event.kind == "start":
            if run is not None and run["restart"] >= event.restart:
                self._tell(event, "repeat")  # or out of order
                return
            if run is not None:  # Slurm starts a run only after the last one ended
                self._end_unreported(run, batch, now)
            cpus = event.cpus or pool.cpus
            reserved = cpus * (event.limit_h or pool.reserve_hours)
            key = run_key(event.job_id, event.restart, event.job_name)
            account, why = self._run_account(event, batch, now)
            if why is None:
                try:
                    entry = self.accounts.reserve_run(account, key, reserved)
                except InsufficientCredit as exc:
                    why = str(exc)
            if why is not None:
                self._refusals.append((event.job_id, why))
                self._refused[ident] = why
                self._tell(event, f"refused: {why}")
                log.warning("cancelling Slurm job %s on %s: %s", event.job_id, event.node, why)
                return
            self._tell(event, "reserved")
            batch.ledger_entries(now, [entry], f"Slurm job {event.job_id} started")
            vm = self.vm_of(event.node)
            run = {
                "key": key,
                "job_id": event.job_id,
                "job_name": event.job_name,
                "restart": event.restart,
                "user": event.user,
                "account": account,
                "partition": event.partition,
                "node": event.node,
                "vm_id": vm.id if vm is not None else "",
                "cpus": cpus,
                "reserved_cpu_h": reserved,
                "started_at": now,
                "ended_at": None,
                "state": "running",
                "exit_code": None,
                "reason": "",
            }
            self.runs[ident] = run
            if event.started_at is not None:
                self._begun[ident] = event.started_at
            batch.slurm_run(run)
            return
        started = event.started_at if event.started_at is not None else now
        ended = max(started, event.ended_at if event.ended_at is not None else now)
        state = RUN_STATES.get(event.state, "failed")
        # Told once written (`carry_out` answers after the pass's batch is): the hook
        # forgets an end only the store holds (controller/slurm/events.py).
        self._tell(event, "ended")
        if run is not None and self._older_runs_end(ident, event):
            return
        refused = self._refused.pop(ident, None)
        if run is None and refused is not None:  # cancelled before it ran: nothing to pay
            return
        if run is None:  # its start was never reported: charge what it used, at once
            cpus = event.cpus or pool.cpus
            key = run_key(event.job_id, -int(ended), event.job_name)
            reason = "its start was not reported"
            account, unknown = self._run_account(event, batch, now)
            if unknown is None:
                entries = self.accounts.charge_unreserved(account, key, cpus, ended - started)
            else:
                # It ran (or began to), which cannot be undone, and no account is made
                # up for it: the run is kept, uncharged, saying why, for an admin to see.
                used_h = cpus * (ended - started) / 3600.0
                reason += f", and {unknown}: {used_h:.4g} CPU-hours not charged"
                log.warning("Slurm job %s (%s): %s", event.job_id, event.state, reason)
                entries = []
            vm = self.vm_of(event.node)
            run = {
                "key": key,
                "job_id": event.job_id,
                "job_name": event.job_name,
                "restart": -1,
                "user": event.user,
                "account": account,
                "partition": event.partition,
                "node": event.node,
                "vm_id": vm.id if vm is not None else "",
                "cpus": cpus,
                "reserved_cpu_h": 0.0,
                # As the end sets them below (so that it is a whole row from here on).
                "started_at": started,
                "ended_at": ended,
                "state": state,
                "exit_code": event.exit_code,
                "reason": reason,
            }
        else:
            del self.runs[ident]
            self._begun.pop(ident, None)
            cpus = event.cpus or run["cpus"]
            if not run["vm_id"]:  # allocated before Slurm resumed its node
                vm = self.vm_of(event.node)
                run = run | {"vm_id": vm.id if vm is not None else ""}
            entries = self.accounts.settle_run(
                run["key"], cpus, ended - started, preempted=state == "preempted"
            )
        batch.ledger_entries(now, entries, f"Slurm job {event.job_id} {event.state.lower()}")
        ended_run = run | {
            "cpus": cpus,
            "started_at": started,
            "ended_at": ended,
            "state": state,
            "exit_code": event.exit_code,
        }
        batch.slurm_run(ended_run)

    def _older_runs_end(self, ident: tuple[str, str], event: PoolRunEvent) -> bool:
        """Whether this end is of a run before the open one: one that began (Slurm's
        START) before the open run did, come after the open run's start had settled it
        (`_end_unreported`: charged until then, the most it can have run). It must not
        end the open run. START is in whole seconds and a run's own START is at or after
        its allocation, when its prolog hook was sent, hence the slack."""
        begun = self._begun.get(ident)
        if begun is None or event.started_at is None:
            return False
        if event.started_at >= begun - RUN_START_SLACK_S:
            return False
        log.warning(
            "Slurm job %s: an end (%s) of a run that began at %.0f, before the open run "
            "(%.0f), came late: that run was settled when the open one started",
            event.job_id,
            event.state,
            event.started_at,
            begun,
        )
        return True

    def _end_unreported(self, run: SlurmRunRow, batch: WriteBatch, now: float) -> None:
        """A run whose end never came, now that the job's next run starts: settled as
        preempted (Slurm starts the next run of a job whose node failed), charged until
        this start (the most it can have run), its reservation's rest released. Only an
        end lost on its way comes here: the daemon answers the hook once an end is
        written (controller/slurm/events.py), as it did not before, when a daemon killed
        in between lost the end and left the run reserved for ever."""
        del self.runs[(run["job_id"], run["job_name"])]
        self._begun.pop((run["job_id"], run["job_name"]), None)
        reason = "its end was not reported: taken as preempted when its next run started"
        log.warning("Slurm job %s, run %s: %s", run["job_id"], run["restart"], reason)
        entries = self.accounts.settle_run(
            run["key"], run["cpus"], now - run["started_at"], preempted=True
        )
        batch.ledger_entries(now, entries, f"Slurm job {run['job_id']} ended unreported")
        batch.slurm_run(run | {"ended_at": now, "state": "preempted", "reason": reason})

    def _run_account(
        self, event: PoolRunEvent, batch: WriteBatch, now: float
    ) -> tuple[str, str | None]:
        """The account a run pays from (`run_account`: never "(null)"), and why it cannot
        when spotbag has no such account. `[slurm] unknown_accounts = "create"` creates
        it with its configured credit, in this pass's batch, whether or not that covers
        the run (an admin then sees it and can credit it)."""
        matched = run_account(event.account, event.user)
        credit = self.book.credit_for_unknown(matched)
        try:
            opened, entries = self.accounts.open_run_account(matched.name, now, credit)
        except UnknownAccount:
            return matched.name, matched.unknown()
        if opened is not None:
            log.info(
                "created account %s with %g CPU-hours for Slurm job %s of user %s "
                "([slurm] unknown_accounts = create)",
                matched.name,
                credit,
                event.job_id,
                event.user,
            )
            batch.account(opened)
            batch.ledger_entries(now, entries, f"account created for Slurm job {event.job_id}")
        return matched.name, None

    def _tell(self, event: PoolRunEvent, verdict: str) -> None:
        if event.verdict is not None:
            self._verdicts.append((event.verdict, verdict))
