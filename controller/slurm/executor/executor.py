"""The Slurm executor's front: the Executor protocol (controller/executors/base.py) and
the daemon's other calls, each handed to the part that owns it.

The parts share one `SlurmState` (state.py): the attempts and nodes, the listeners,
Slurm's availability. Built here, in the order they need each other: the node
manager and the job signals need only the state; the watcher polls through the
node manager and stops attempts through the signals; submission and recovery look
for jobs and (re)start watching through the watcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from controller.executors.base import AttemptListener, AttemptSpec, LiveAttempt
from controller.executors.job_users import JobUsers
from controller.slurm.commands import SlurmTools
from controller.slurm.executor import recovery
from controller.slurm.executor.callbacks import Callbacks
from controller.slurm.executor.nodes import NodeManager
from controller.slurm.executor.signals import JobSignals
from controller.slurm.executor.state import SlurmExecutorSettings, SlurmState
from controller.slurm.executor.submission import Submitter
from controller.slurm.executor.watch import Watcher
from drivers.base import VmType


class SlurmExecutor:
    name = "slurm"
    joins_vms = True
    queues_attempts = True
    attempts_outlive_controller = True
    confirms_ends = True  # an attempt ends once squeue (or jobcomp) says its job did
    backlog_pass_interval_s = 0.0  # Slurm's queue is not watched between passes

    def __init__(
        self,
        settings: SlurmExecutorSettings,
        *,
        tools: SlurmTools,
        controller_id: str,
        now: Callable[[], float],
        kill_grace_s: float = 5.0,
        users: JobUsers | None = None,
    ) -> None:
        self.settings = settings
        self.queue_ahead = settings.queue_ahead
        self.tools = tools
        self._state = SlurmState(settings, tools, controller_id, now, users)
        self._nodes = self._state.nodes  # vm id -> its node (the tests look at it)
        self._node_manager = NodeManager(self._state)
        self._signals = JobSignals(self._state, kill_grace_s)
        self._watcher = Watcher(self._state, self._node_manager, self._signals.stop)
        self._submitter = Submitter(self._state, self._watcher)
        self._callbacks = Callbacks(self._state)

    # --- paths and names ----------------------------------------------------------

    def subscribe(self, listener: AttemptListener) -> None:
        self._state.listeners.append(listener)

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        return self._state.log_path(bag_id, job_id, number)

    def checkpoint_dir(self, bag_id: str, job_id: str) -> Path:
        return self._state.checkpoint_dir(bag_id, job_id)

    def node_of(self, vm_id: str) -> str:
        return self._state.node_of(vm_id)

    def job_user_problem(self, account: str) -> str | None:
        """Why `account`'s jobs could not run (no user they may run as), or None."""
        return self._state.users.problem(account)

    def bootstrap_values(self, vm_id: str, vm_type: VmType, pool_node: str = "") -> dict[str, str]:
        """What the VM's boot script needs to join as a dynamic node named after it, or
        as the power-saving node `pool_node` (declared in slurm.conf)."""
        return self._node_manager.bootstrap_values(vm_id, vm_type, pool_node)

    # --- VMs and their nodes ------------------------------------------------------

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        """Watch for the VM's node; a NodeEvent says when it is up."""
        self._node_manager.watch(vm_id, vm_type)
        self._watcher.ensure()
        self._state.wake.set()

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        """The VM is gone: cancel every job of its attempts (those queued there would
        otherwise wait, and run elsewhere once the node is deleted, or on the node itself
        should its slurmd register again: ReturnToService=2), then down the node (which
        ends what runs there at once, instead of after SlurmdTimeout). Each attempt is reported ended once Slurm
        says its job is (a program that started meanwhile is reported as started
        first); the node is deleted after that. A pool node is downed too (its users'
        jobs are requeued at once; a power-down alone waits for the dead slurmd to time
        out before it lets them go), then powered down by force, so that Slurm can
        resume it for the next job."""
        if pool_node:
            await self._node_manager.lose_pool_node(vm_id, pool_node)
            return
        for attempt in await self._node_manager.lose(vm_id):
            self._signals.stop(attempt, f"its VM {vm_id} is gone", grace=False, sent=True)
        await self._node_manager.down_lost(vm_id)
        self._watcher.ensure()
        self._state.wake.set()

    async def power_down(self, node: str, reason: str) -> None:
        await self._node_manager.power_down(node, reason)

    async def release_pool_node(self, node: str, reason: str) -> None:
        """Ask Slurm to power a pool node down once its jobs are done (POWER_DOWN_ASAP:
        drained, so nothing new starts on it); Slurm then runs SuspendProgram."""
        await self._node_manager.release_pool_node(node, reason)

    async def cancel_job(self, job_id: str, why: str) -> None:
        """Cancel somebody's Slurm job (a pool job its account cannot pay for), saying why
        in its comment (squeue -o %k, scontrol show job)."""
        await self._node_manager.cancel_job(job_id, why)

    async def job_limits(self, job_id: str) -> tuple[float | None, float | None]:
        """(CPUs, time limit in hours) Slurm gives a job; None for what it does not say
        (or an unlimited time)."""
        return await self._node_manager.job_limits(job_id)

    # --- attempts ------------------------------------------------------------------

    def enqueue(self, spec: AttemptSpec) -> bool:
        return False  # each start submits a Slurm job: `start`

    async def start(self, spec: AttemptSpec) -> str:
        """Submit the attempt as a Slurm job on its VM's node (submission.py); its job id,
        or "" when Slurm's answer was lost and the job is looked for later."""
        return await self._submitter.start(spec)

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        self._signals.signal_checkpoint(attempt_id, timeout_s)

    async def cancel(self, attempt_id: str) -> None:
        """SIGTERM to the job's processes now, `scancel` after the grace period; the
        end is reported as an event (KILLED)."""
        self._signals.cancel(attempt_id)

    async def poll(self) -> None:
        """Ask Slurm about the jobs and nodes this executor watches, and act on it."""
        await self._watcher.poll()

    # --- callbacks ------------------------------------------------------------------

    def seen(self, key: str) -> bool:
        """Whether a callback with this key was taken since the controller started (its
        record in the store may still be on its way)."""
        return self._callbacks.seen(key)

    def remember(self, key: str) -> None:
        self._callbacks.remember(key)

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
        """A callback from a slurmctld hook about one of this controller's jobs:
        "applied" (its end, reported at once), "noted", or "" when it is not about one
        of this controller's attempts (callbacks.py)."""
        return await self._callbacks.take(
            key=key,
            event=event,
            job_name_=job_name_,
            job_id=job_id,
            state=state,
            exit_code=exit_code,
            at=at,
        )

    # --- restart -----------------------------------------------------------------------

    async def recover(
        self, attempts: Sequence[LiveAttempt], live_vm_ids: Sequence[str] = ()
    ) -> set[str]:
        """Slurm jobs survive a controller restart: re-adopt every attempt Slurm still
        has; report those that ended meanwhile (from their exit status, else Slurm's
        final state); only attempts neither Slurm nor the shared files know are lost.
        Nodes of VMs that are gone are deleted. When Slurm does not answer, every
        attempt is kept and the watcher settles them once it does."""
        return await recovery.recover(
            self._state, self._watcher, self._node_manager, attempts, live_vm_ids
        )

    def vms_settling(self) -> set[str]:
        """VMs with a job whose program ended but whose batch script Slurm still runs."""
        return self._state.vms_settling()

    def backlogged(self) -> bool:
        return False  # passes are not spaced (backlog_pass_interval_s 0)

    async def shutdown(self) -> None:
        """Stop watching; the jobs run on (they outlive the controller)."""
        state = self._state
        state.closing = True
        state.wake.set()
        tasks = [t for t in (self._watcher.task,) if t is not None]
        tasks += [a.checkpoint for a in state.attempts.values() if a.checkpoint]
        tasks += [a.stopper for a in state.attempts.values() if a.stopper]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- what the daemon shows ----------------------------------------------------------

    @property
    def unavailable(self) -> str:
        """Why Slurm did not answer last ("" when it did)."""
        return self._state.unavailable

    def status(self) -> dict[str, object]:
        state = self._state
        return {
            "attempts": len(state.attempts),
            "nodes_ready": sum(1 for n in state.nodes.values() if n.ready),
            "nodes_waiting": sum(1 for n in state.nodes.values() if not n.ready and not n.lost),
            "slurm_unavailable": state.unavailable,
        }
