"""The Slurm nodes of the executor's VMs, and the daemon's other calls about nodes.

VMs join the cluster as dynamic nodes named after them (controller/slurm/naming.py)
through their boot script (drivers/bootstrap.py, `bootstrap_values`). A VM takes
attempts once its node is up in Slurm (a `NodeEvent` from `sinfo`), not when its
cloud says it runs. A VM that is gone has its node downed at once (its jobs end with
NODE_FAIL) and deleted once Slurm lets go of it; so are nodes of this prefix whose
VMs nobody knows any more. Also here: powering power-saving pool nodes down, and
cancelling somebody's pool job or reading its limits.

A VM that hears its cloud's preemption notice (the notice watcher its boot script
starts: drivers/templates/notice_watch.py) drains its node with the reason "spot
notice: ends by <ISO time>" (or "spot rebalance: ..."): the poll reports that as a
`NodeNotice`, not as a broken node, and looks at the nodes that joined every
NODE_POLL_S so that a 30-s notice leaves most of its time to the jobs.
"""

from __future__ import annotations

import logging
import os
import pwd
import time
from datetime import datetime

from controller.executors.base import NodeEvent, NodeNotice
from controller.slurm.commands import (
    SlurmError,
    SlurmRefused,
    SlurmUnavailable,
    key_values,
    split_rows,
)
from controller.slurm.executor.state import Attempt, Node, SlurmState
from controller.slurm.naming import vm_of_node
from drivers.base import VmType

log = logging.getLogger("spotbag.executors.slurm")

# Node states (sinfo %T, without its flag suffixes) in which a node runs jobs.
NODE_UP_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
NODE_BROKEN_STATES = frozenset({"down", "drained", "draining", "fail", "failing", "inval"})
# How often nodes that joined are looked at (for notices; a preempted VM is the driver's
# to notice): one sinfo per 5 s. A little early rather than a poll late.
NODE_POLL_S = 5.0
NODE_POLL_EARLY_S = 1.0
DRAIN_STATES = frozenset({"drained", "draining", "drain"})
NOTICE_REASON = "spot notice: ends by "  # what the notice watcher writes
REBALANCE_REASON = "spot rebalance: "


def notice_end(reason: str, now: float) -> float | None:
    """When a node drained by the notice watcher says its VM ends ("spot notice: ends by
    2026-11-26T21:30:00Z"), epoch s; None if the reason is not a notice. A time that
    cannot be read counts as now: the VM may go at any moment."""
    if not reason.startswith(NOTICE_REASON):
        return None
    try:
        return datetime.fromisoformat(reason[len(NOTICE_REASON) :].strip()).timestamp()
    except ValueError:
        return now


class NodeManager:
    """The nodes of the executor's VMs: joining, watching, downing, deleting."""

    def __init__(self, state: SlurmState) -> None:
        self._state = state
        self._polled_at = float("-inf")  # time.monotonic() of the last sinfo
        user = pwd.getpwuid(os.getuid())
        self._user = (user.pw_name, user.pw_uid, user.pw_gid)

    def bootstrap_values(self, vm_id: str, vm_type: VmType, pool_node: str = "") -> dict[str, str]:
        """What the VM's boot script needs to join as a dynamic node named after it, or
        as the power-saving node `pool_node` (declared in slurm.conf)."""
        s = self._state.settings
        user, uid, gid = self._user
        values = {
            "SPOTBAG_SLURM_NODE": pool_node or self._state.node_of(vm_id),
            "SPOTBAG_SLURM_CONF_SERVER": s.conf_server,
            "SPOTBAG_SLURM_DYNAMIC": "0" if pool_node else "1",
            "SPOTBAG_SLURM_FEATURES": s.node_feature,
            "SPOTBAG_CPUS": str(vm_type.cpus),
            "SPOTBAG_MEMORY_MB": str(int(vm_type.memory_gb * 1024)),
            "SPOTBAG_GPUS": str(vm_type.gpus),
            "SPOTBAG_MUNGE_KEY": s.munge_key,
            "SPOTBAG_SHARED_DIR": str(s.shared_dir),
        }
        users = self._state.users
        if users.configured:
            # Jobs run as their accounts' users: the VM must know them by the same ids
            # (those this host knows now; a directory service on the image serves
            # accounts first used later).
            values["SPOTBAG_JOB_USERS"] = " ".join(
                f"{u.name}:{u.uid}:{u.gid}" for u in users.known()
            )
        else:
            # Jobs run as the daemon's user: the VM must know it by the same ids.
            values |= {
                "SPOTBAG_JOB_USER": user,
                "SPOTBAG_JOB_UID": str(uid),
                "SPOTBAG_JOB_GID": str(gid),
            }
        if s.munge_socket:
            values["SPOTBAG_MUNGE_SOCKET"] = s.munge_socket
        if s.shared_mount:
            values["SPOTBAG_SHARED_MOUNT"] = s.shared_mount
        return values

    def watch(self, vm_id: str, vm_type: VmType) -> None:
        """Watch for the VM's node (the watcher's polls say when it is up)."""
        state = self._state
        node = state.nodes.get(vm_id)
        if node is None:
            state.nodes[vm_id] = Node(vm_id, state.node_of(vm_id), vm_type.memory_gb)
            return
        node.memory_gb = node.memory_gb or vm_type.memory_gb  # a recovery did not know it
        if node.ready:  # up already (the scheduler rebuilt its world): say so again
            state.emit(NodeEvent(vm_id, state.now(), True, f"node {node.name} is up in Slurm"))

    async def lose_pool_node(self, vm_id: str, pool_node: str) -> None:
        """A pool node's VM is gone: down it (its users' jobs are requeued at once; a
        power-down alone waits for the dead slurmd to time out before it lets them go),
        then power it down by force, so that Slurm can resume it for the next job."""
        await self.down(Node(vm_id, pool_node, 0.0), "its spot VM is gone")
        await self.power_down(pool_node, "its spot VM is gone")

    async def lose(self, vm_id: str) -> list[Attempt]:
        """The VM is gone: its node takes nothing more, and its attempts (returned,
        marked) are to be stopped; each ends once Slurm confirms its job did. The node
        is deleted only then: Slurm would run a job pinned to a deleted node on any
        other node of the partition. Their jobs are cancelled at once, in one call (a
        stop per attempt follows up until each is over)."""
        state = self._state
        node = state.nodes.get(vm_id) or Node(vm_id, state.node_of(vm_id), 0.0)
        state.nodes[vm_id] = node
        node.lost, node.ready = True, False
        doomed = [a for a in state.attempts.values() if a.vm_id == vm_id and not a.ended]
        for attempt in doomed:
            attempt.vm_lost = True
        job_ids = [a.job_id for a in doomed if a.job_id]
        if job_ids:
            try:
                await state.tools.run("scancel", *job_ids)
            except SlurmError as exc:  # each attempt's stop tries again
                log.warning("could not cancel the jobs of lost VM %s: %s", vm_id, exc)
        return doomed

    async def down_lost(self, vm_id: str) -> None:
        """Down a lost VM's node: DOWN ends what still runs there with NODE_FAIL in well
        under a second, instead of after SlurmdTimeout."""
        node = self._state.nodes.get(vm_id)
        if node is not None and node.lost and not node.deleted:
            await self.down(node, "its spot VM is gone")

    async def power_down(self, node: str, reason: str) -> None:
        try:
            await self._state.tools.run(
                "scontrol",
                "update",
                f"nodename={node}",
                "state=POWER_DOWN_FORCE",
                f"reason={reason}",
            )
        except SlurmError as exc:
            log.warning("could not power node %s down: %s", node, exc)

    async def release_pool_node(self, node: str, reason: str) -> None:
        """Ask Slurm to power a pool node down once its jobs are done (POWER_DOWN_ASAP:
        drained, so nothing new starts on it); Slurm then runs SuspendProgram."""
        try:
            await self._state.tools.run(
                "scontrol",
                "update",
                f"nodename={node}",
                "state=POWER_DOWN_ASAP",
                f"reason={reason}",
            )
        except SlurmError as exc:
            log.warning("could not release node %s: %s", node, exc)

    async def cancel_job(self, job_id: str, why: str) -> None:
        """Cancel somebody's Slurm job (a pool job its account cannot pay for), saying why
        in its comment (squeue -o %k, scontrol show job)."""
        tools = self._state.tools
        try:
            await tools.run("scontrol", "update", f"jobid={job_id}", f"comment=spotbag: {why}")
            await tools.run("scancel", job_id)
        except SlurmError as exc:
            log.warning("could not cancel job %s (%s): %s", job_id, why, exc)

    async def job_limits(self, job_id: str) -> tuple[float | None, float | None]:
        """(CPUs, time limit in hours) Slurm gives a job; None for what it does not say
        (or an unlimited time)."""
        try:
            out = await self._state.tools.run("scontrol", "-o", "show", "job", job_id)
        except SlurmError:
            return None, None
        fields = key_values(out.strip())
        cpus = float(fields["NumCPUs"]) if fields.get("NumCPUs", "").isdigit() else None
        return cpus, limit_h(fields.get("TimeLimit", ""))

    async def down(self, node: Node, reason: str) -> None:
        try:
            await self._state.tools.run(
                "scontrol", "update", f"nodename={node.name}", "state=DOWN", f"reason={reason}"
            )
        except SlurmRefused as exc:
            if "Invalid node name" in str(exc):  # never joined, or deleted already
                node.deleted = True
            else:
                log.warning("could not down node %s: %s", node.name, exc)
        except SlurmUnavailable as exc:
            log.warning("could not down node %s (will retry): %s", node.name, exc)

    async def delete_lost(self) -> None:
        """Delete the nodes of lost VMs once no job of theirs can run any more (Slurm
        would run a job pinned to a deleted node elsewhere)."""
        state = self._state
        nodes = state.nodes
        waiting = {a.vm_id for a in state.attempts.values() if not a.ended}
        for vm_id, node in list(nodes.items()):
            if not node.lost or vm_id in waiting:
                continue
            if not node.deleted:
                try:
                    await self._state.tools.run("scontrol", "delete", f"nodename={node.name}")
                    node.deleted = True
                except SlurmRefused as exc:
                    if "Invalid node name" in str(exc):
                        node.deleted = True
                    elif "busy" in str(exc):
                        await self.down(node, "its spot VM is gone")
                    else:
                        log.warning("could not delete node %s: %s", node.name, exc)
            if node.deleted:
                del nodes[vm_id]

    async def poll(self) -> bool:
        """Notice nodes that joined or broke; False when none was asked about."""
        state = self._state
        watched = {n.name: n for n in state.nodes.values() if not n.lost}
        if not watched:
            return False
        # Nodes that joined are looked at less often: a broken one also shows in its
        # jobs (NODE_FAIL, pending), and a preempted VM is the driver's to notice.
        since_s = time.monotonic() - self._polled_at
        if all(n.ready for n in watched.values()) and since_s < NODE_POLL_S - NODE_POLL_EARLY_S:
            return False
        self._polled_at = time.monotonic()
        out = await state.tools.run(
            "sinfo", "-h", "-N", "-p", state.settings.partition, "-o", "%N|%T|%m|%E"
        )
        now = state.now()
        seen = set()
        for name, node_state, memory, reason in split_rows(out, 4):
            node = watched.get(name)
            if node is not None and node.lost:  # lost while sinfo ran
                continue
            base = node_state.rstrip("*~#%!$@^-")
            flags = node_state[len(base) :]
            if node is None:
                self._forget_if_dead(name, base, flags)
                continue
            if name in seen:
                continue
            seen.add(name)
            up = base in NODE_UP_STATES and not (set(flags) & set("*~#%!"))
            if up and not node.ready:
                node.ready = True
                node.real_memory_mb = int(memory) if memory.isdigit() else 0
                state.emit(
                    NodeEvent(node.vm_id, now, True, f"node {name} is {node_state} in Slurm")
                )
            elif node.ready and base in DRAIN_STATES and _is_notice(reason):
                self._noticed(node, reason, now)
            elif node.ready and base in NODE_BROKEN_STATES:
                node.ready = False
                detail = f"node {name} is {node_state} in Slurm" + (
                    f": {reason}" if reason and reason != "none" else ""
                )
                state.emit(NodeEvent(node.vm_id, now, False, detail))
        return True

    def _noticed(self, node: Node, reason: str, now: float) -> None:
        """The notice watcher drained the node: say so once per reason (a rebalance
        recommendation may be followed by a notice)."""
        if node.notice == reason:
            return
        node.notice = reason
        log.info("node %s: %s", node.name, reason)
        self._state.emit(NodeNotice(node.vm_id, now, notice_end(reason, now), reason))

    def _forget_if_dead(self, name: str, base: str, flags: str) -> None:
        """A node of this prefix whose VM this executor does not know, and which does not
        answer (a VM that ended while its slurmd re-registered): delete it. One that
        answers may be a VM still booting, whose driver has not said it runs."""
        nodes = self._state.nodes
        vm_id = vm_of_node(self._state.settings.node_prefix, name)
        if vm_id is None or not vm_id.startswith("vm-") or vm_id in nodes:
            return
        if "*" in flags or base in ("down", "unknown"):
            nodes[vm_id] = Node(vm_id, name, 0.0, lost=True)

    async def forget_gone(self, live_vm_ids: set[str]) -> None:
        """Down and delete this prefix's nodes whose VMs are gone (after a restart)."""
        state = self._state
        try:
            out = await state.tools.run(
                "sinfo", "-h", "-N", "-p", state.settings.partition, "-o", "%N"
            )
        except SlurmError as exc:
            log.warning("cannot list the partition's nodes: %s", exc)
            return
        for name in {line.strip() for line in out.splitlines() if line.strip()}:
            vm_id = vm_of_node(state.settings.node_prefix, name)
            if vm_id is not None and vm_id.startswith("vm-") and vm_id not in live_vm_ids:
                node = Node(vm_id, name, 0.0, lost=True)
                state.nodes[vm_id] = node
                await self.down(node, "its VM is gone (found after a controller restart)")


def _is_notice(reason: str) -> bool:
    return reason.startswith((NOTICE_REASON, REBALANCE_REASON))


# A job without a time limit that Slurm's backfill scheduler starts is shown with one of
# a year (backfill plans an infinite limit as YEAR_MINUTES and keeps it); the main
# scheduler leaves it UNLIMITED. A year or more is taken as no limit.
UNLIMITED_FROM_H = 365 * 24.0


def limit_h(text: str) -> float | None:
    """Slurm's time limit ("[days-]hours:minutes:seconds", "minutes", "UNLIMITED") in
    hours; None when unlimited (or a year and more: `UNLIMITED_FROM_H`)."""
    text = text.strip()
    if not text or text in ("UNLIMITED", "Partition_Limit", "NONE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":") if p.isdigit()]
    if not parts:
        return None
    if len(parts) == 1:  # minutes
        seconds = parts[0] * 60
    else:
        while len(parts) < 3:
            parts.insert(0, 0)
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    hours = (int(days or 0) * 86400 + seconds) / 3600.0
    return None if hours >= UNLIMITED_FROM_H else hours
