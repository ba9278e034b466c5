"""Power-saving pools: Slurm users' own jobs on spot VMs that spotbag launches.

A pool is a partition of CLOUD nodes in slurm.conf (`[[slurm.pools]]`, rendered by
`spotbag slurm conf`). When Slurm wants one of its nodes for a job it runs the
ResumeProgram hook; spotbag launches a spot VM for that node (the type chosen by the
hopping policy among the pool's types), and the VM's slurmd joins under the node's
name. SuspendProgram (the node idled for SuspendTime) terminates it;
ResumeFailProgram (it did not join within ResumeTimeout) gives up on it. When the
cloud preempts a pool VM, spotbag powers the node down by force: Slurm requeues the
job, which resumes on another node.

Each run of a user's job on a pool is charged to the spotbag account named like its
Slurm account, or like its user when Slurm gives it none (`run_account`): at its start
(the slurmctld prolog) it reserves its CPUs × its time limit (the pool's
`reserve_hours` when unlimited), and a job its account cannot cover, or whose account
spotbag does not know, is cancelled with the reason in its comment (`[slurm]
unknown_accounts = "create"` creates unknown accounts with a set credit instead); at
its end (jobcomp) the time it ran is charged and the rest released. Runs are kept in
the store and appear in cost reports beside the bags that shared their VMs.

These VMs are Slurm's: the planner neither places spotbag's jobs on them nor ends
them on its own. One exception, the preemption model's: an idle pool VM on which the
reuse policy would no longer start a job of the pool's typical length (`job_hours`;
near a deadline, a fresh VM finishes sooner, docs/design.md#reuse) is handed back: spotbag asks
Slurm to power its node down when idle (POWER_DOWN_ASAP), Slurm runs SuspendProgram,
and the next job resumes the node on a fresh VM. Warm VMs the policy still trusts stay
until Slurm's SuspendTime. (A node Slurm suspended does not get its warm VM
back: its slurmd would have to register anew, which takes a restart on the VM, and
spotbag runs no agent there.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from controller.bags.spec import ACCOUNT_NAME
from controller.config import ConfigError, SlurmPoolConfig
from controller.slurm.commands import HostlistError, hostlist_expand
from controller.slurm.conf import PoolConf, pool_memory_mb
from drivers.base import VmType

# More nodes than a pool has a use for: a bound, so that a typo in the config
# ("spot-[0-99999999]") is refused at once rather than expanded for minutes.
MAX_POOL_NODES = 100_000

# Slurm's final job states as a run's attempt state (reports, the store).
RUN_STATES = {
    "COMPLETED": "succeeded",
    "NODE_FAIL": "preempted",
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "TIMEOUT": "failed",
}


@dataclass(frozen=True)
class Pool:
    partition: str
    nodes: tuple[str, ...]
    hostlist: str
    vm_types: tuple[str, ...]
    cpus: int
    memory_gb: float
    gpus: int
    reserve_hours: float
    job_hours: float = 1.0  # typical job length, model hours (the reuse policy's question)
    suspend_time_s: int = 300  # Slurm's SuspendTime for the pool (slurm.conf)
    resume_timeout_s: int = 600  # Slurm's ResumeTimeout for the pool (slurm.conf)

    @property
    def conf(self) -> PoolConf:
        return PoolConf(
            partition=self.partition,
            nodes=self.hostlist,
            cpus=self.cpus,
            memory_mb=pool_memory_mb(self.memory_gb),
            feature=self.partition,
            gpus=self.gpus,
            suspend_time_s=self.suspend_time_s,
            resume_timeout_s=self.resume_timeout_s,
        )


# What a Slurm job without an account is said to have: without slurmdbd
# (AccountingStorageType=accounting_storage/none) slurmctld gives the hooks the string
# "(null)" (SLURM_JOB_ACCOUNT, jobcomp's ACCOUNT); other setups may give nothing.
NO_NAME = frozenset({"", "(null)"})
_ACCOUNT_NAME = re.compile(ACCOUNT_NAME)


@dataclass(frozen=True)
class RunAccount:
    """The spotbag account a run of a Slurm user's job pays from, and how it was found
    (so that a refusal can say what was looked for, and what would help)."""

    name: str  # "" when Slurm named neither an account nor a user
    given: str  # the Slurm account as the hook sent it
    user: str
    by_user: bool  # Slurm gave no account: matched by the user name

    @property
    def valid(self) -> bool:
        """Whether it can be a spotbag account at all (the API's and the CLI's rule)."""
        return bool(_ACCOUNT_NAME.fullmatch(self.name))

    def unknown(self) -> str:
        """Why the run cannot be charged when spotbag has no such account: which account
        it needed, how that was matched, and the command that creates it."""
        if not self.name:
            return (
                "Slurm gave the job neither an account nor a user name, so spotbag has no "
                "account to charge"
            )
        if self.by_user:
            given = f"account {self.given!r} given" if self.given else "no account given"
            what = f"Slurm user {self.user} has no spotbag account ({given}, matched by user name)"
        else:
            what = (
                f"Slurm account {self.name!r} of user {self.user or '?'} is not a spotbag account"
            )
        if not self.valid:
            return f"{what}, and {self.name!r} cannot be one (letters, digits, _ . -; up to 64)"
        return (
            f"{what}; an admin creates it with `spotbag accounts create {self.name} --cpu-hours N`"
        )


def run_account(account: str, user: str) -> RunAccount:
    """Which account pays for a run: the job's Slurm account; when Slurm gives none
    (`NO_NAME`: no slurmdbd says "(null)"), its user's name. Never "(null)" itself: that
    would pool every user's jobs in one account that no limit applies to."""
    account, user = account.strip(), user.strip()
    if account not in NO_NAME:
        return RunAccount(account, account, user, by_user=False)
    return RunAccount("" if user in NO_NAME else user, account, user, by_user=True)


class PoolBook:
    """The configured pools, by node name and by partition, and what becomes of a run
    whose account spotbag does not know (`[slurm] unknown_accounts`)."""

    def __init__(
        self,
        pools: Sequence[SlurmPoolConfig],
        catalog: Sequence[VmType],
        *,
        unknown_accounts: str = "cancel",
        unknown_account_cpu_h: float = 0.0,
    ) -> None:
        self.unknown_accounts = unknown_accounts
        self.unknown_account_cpu_h = unknown_account_cpu_h
        types = {t.name: t for t in catalog}
        self.pools: list[Pool] = []
        self.by_node: dict[str, Pool] = {}
        self.by_partition: dict[str, Pool] = {}
        for config in pools:
            unknown = [t for t in config.vm_types if t not in types]
            if unknown:
                raise ConfigError(
                    f"[[slurm.pools]] {config.partition}: unknown VM types {', '.join(unknown)}"
                )
            first = types[config.vm_types[0]]
            smaller = [
                t
                for t in config.vm_types
                if (types[t].cpus, types[t].memory_gb, types[t].gpus)
                < (first.cpus, first.memory_gb, first.gpus)
            ]
            if smaller:
                raise ConfigError(
                    f"[[slurm.pools]] {config.partition}: {', '.join(smaller)} are smaller than "
                    f"{first.name}, whose size the pool's nodes declare"
                )
            try:
                nodes = tuple(hostlist_expand(config.nodes, limit=MAX_POOL_NODES))
            except HostlistError as exc:
                raise ConfigError(f"[[slurm.pools]] {config.partition}: {exc}") from None
            pool = Pool(
                config.partition,
                nodes,
                config.nodes,
                tuple(config.vm_types),
                first.cpus,
                first.memory_gb,
                first.gpus,
                config.reserve_hours,
                config.job_hours,
                config.suspend_time_s,
                config.resume_timeout_s,
            )
            if config.partition in self.by_partition:
                raise ConfigError(f"[[slurm.pools]]: partition {config.partition} twice")
            self.by_partition[config.partition] = pool
            for node in nodes:
                if node in self.by_node:
                    raise ConfigError(f"[[slurm.pools]]: node {node} is in two pools")
                self.by_node[node] = pool
            self.pools.append(pool)

    def __bool__(self) -> bool:
        return bool(self.pools)

    @property
    def partitions(self) -> list[str]:
        return list(self.by_partition)

    def credit_for_unknown(self, account: RunAccount) -> float | None:
        """The credit an account spotbag does not know is created with for a run
        (`unknown_accounts = "create"`); None: it is not created (the run is refused).
        Never unlimited, and never for a name that cannot be an account."""
        if self.unknown_accounts != "create" or not account.valid:
            return None
        return self.unknown_account_cpu_h


def run_key(job_id: str, restart: int, job_name: str) -> str:
    """The ledger reservation of one run of a Slurm user's job."""
    return f"slurm:{job_id}:{restart}:{job_name}"


def first_number(text: str) -> float | None:
    """The leading number of Slurm's CPU counts ("2", "2(x3)")."""
    digits = ""
    for char in text.strip():
        if not char.isdigit():
            break
        digits += char
    return float(digits) if digits else None
