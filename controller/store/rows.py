"""The shapes of the rows the store's queries return, as TypedDicts.

They are plain dicts at run time (a TypedDict is only a type), so callers index
them as before. A row of a table has one key per column (`SELECT *`); the queries
that add to a row (a bag's job counts, a job's attempts, an account's sums)
return the extended shape declared here. Reads that return tuples (the report's
rows, price samples, VM core intervals) are typed in their signatures.
"""

from __future__ import annotations

from typing import Any, TypedDict


class BagRow(TypedDict):
    """A row of `bags`."""

    id: str
    account: str
    name: str
    spec: str  # the bag's spec, JSON
    state: str
    job_count: int
    created_at: float
    finished_at: float | None
    cancel_requested_at: float | None
    idempotency_key: str | None
    # usage of ended attempts, kept up to date with every attempt end
    attempts_ended: int
    preemptions: int
    attempt_s: float
    preempted_s: float
    request_hash: str
    checkpoints: int
    checkpoint_s: float
    lost_s: float


class LiveAttempt(TypedDict):
    """A running attempt of a bag (for the bag's attempt time so far)."""

    started_at: float


class BagWithCounts(BagRow):
    """A bag with its number of jobs in each state (`list_bags`)."""

    counts: dict[str, int]


class BagDetail(BagWithCounts):
    """A bag with its job counts and its live attempts (`get_bag`)."""

    live_attempts: list[LiveAttempt]


class JobRow(TypedDict):
    """A row of `jobs`."""

    bag_id: str
    idx: int
    params: str  # the job's parameters, JSON
    state: str
    attempts: int
    counted_attempts: int
    exit_code: int | None
    reason: str
    vm_id: str | None
    started_at: float | None
    ended_at: float | None
    runtime_s: float | None
    work_saved_s: float
    checkpoints: int


class AttemptRow(TypedDict):
    """A row of `attempts`."""

    bag_id: str
    idx: int
    number: int
    vm_id: str
    state: str
    started_at: float
    ended_at: float | None
    exit_code: int | None
    reason: str
    log_path: str
    ref: str  # where an executor runs it (the Slurm job id), or ''
    ran_at: float | None  # when its program began to run (None: it never did)


class JobAttempt(AttemptRow):
    """An attempt of a job, with its VM's type and provider id (None: no such VM)."""

    vm_type: str | None
    provider_id: str | None


class JobTransition(TypedDict):
    at: float
    from_state: str
    to_state: str
    reason: str


class JobCheckpoint(TypedDict):
    attempt: int
    requested_at: float
    at: float
    ok: int
    work_s: float
    vm_age_h: float
    detail: str


class JobDetail(JobRow):
    """A job with its attempts, transitions and checkpoints (`get_job`)."""

    attempt_list: list[JobAttempt]
    transitions: list[JobTransition]
    checkpoint_list: list[JobCheckpoint]


class VmRow(TypedDict):
    """A row of `vms`."""

    id: str
    provider_id: str
    driver: str
    vm_type: str
    zone: str
    spot: int
    state: str
    reason: str
    cpus: int
    gpus: int
    memory_gb: float
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    requested_at: float
    running_at: float | None
    ended_at: float | None
    time_scale: float
    ready_at: float | None
    pool_node: str
    notice_until: float | None


class LifetimeRow(TypedDict):
    """How long a VM lived, in model seconds, and whether it was preempted."""

    vm_type: str
    zone: str
    requested_at: float
    lifetime_s: float
    preempted: int


class AccountRow(TypedDict):
    """A row of `accounts`."""

    name: str
    unlimited: int
    created_at: float
    note: str


class AccountWithSums(AccountRow):
    """An account with the sum of its ledger entries of each kind."""

    sums: dict[str, float]


class LedgerEntryRow(TypedDict):
    """A row of `ledger`."""

    id: int
    at: float
    account: str
    kind: str  # credit, reserve, charge or release
    cpu_h: float
    key: str
    note: str


class LedgerSum(TypedDict):
    account: str
    kind: str
    cpu_h: float


class OpenReservation(TypedDict):
    key: str
    account: str
    cpu_h: float


class LedgerState(TypedDict):
    """What rebuilds the in-memory ledger (`ledger_state`)."""

    accounts: list[AccountRow]
    sums: list[LedgerSum]
    open: list[OpenReservation]


class TokenRow(TypedDict):
    """A row of `account_tokens`."""

    id: str
    account: str
    secret_sha256: str
    created_at: float
    revoked_at: float | None
    note: str


class HopRow(TypedDict):
    """A row of `hops`: one migration of the hopper."""

    id: int
    at: float
    vm_id: str
    from_type: str
    to_type: str
    policy: str
    price_from: float
    price_to: float
    index_price: float | None
    jobs: str  # [[bag_id, idx], ...], JSON
    reason: str


class ModelRow(TypedDict):
    """A learned preemption model, as ModelEntry.to_dict gives it."""

    id: int
    key: str
    model: str
    parameters: dict[str, Any]
    L: float | None
    n: int
    censored: int
    stats: dict[str, Any]
    fitted_at: float
    reason: str
    active: int
    source: str  # always "learned"


class SlurmRunRow(TypedDict):
    """A row of `slurm_runs`: a Slurm user's job run on a power-saving pool."""

    key: str  # the ledger reservation: slurm:job id:restart:job name
    job_id: str
    job_name: str
    restart: int
    user: str
    account: str
    partition: str
    node: str
    vm_id: str
    cpus: float
    reserved_cpu_h: float
    started_at: float
    ended_at: float | None
    state: str  # running, or the attempt state it ended in
    exit_code: int | None
    reason: str


class ActiveBag(TypedDict):
    """An active bag, as a restart recovers it."""

    id: str
    account: str
    spec: str
    created_at: float
    cancel_requested_at: float | None
    counts: dict[str, int]
    runtimes_s: list[float]  # the latest runtimes of its finished jobs, oldest first


class OpenJob(TypedDict):
    """A queued, held or running job of an active bag, as a restart recovers it."""

    bag_id: str
    idx: int
    params: str
    state: str
    attempts: int
    counted_attempts: int
    vm_id: str | None
    started_at: float | None
    work_saved_s: float
    checkpoints: int


class LiveAttemptRow(AttemptRow):
    """A starting or running attempt, with when its last checkpoint completed and how its
    VM ended, if it did (its executor had not yet confirmed the attempt's end)."""

    checkpointed_at: float | None
    vm_state: str | None
    vm_reason: str | None
    vm_ended_at: float | None


class ActiveState(TypedDict):
    """Everything not finished (`load_active`)."""

    bags: list[ActiveBag]
    jobs: list[OpenJob]
    attempts: list[LiveAttemptRow]
    vms: list[VmRow]
    slurm_runs: list[SlurmRunRow]  # the running ones


class TimelineAttempt(TypedDict):
    """An attempt as a bag's timeline draws it: on which VM, from when to when, how it ended."""

    idx: int
    number: int
    vm_id: str
    vm_type: str | None
    state: str
    started_at: float
    ended_at: float | None
    exit_code: int | None
    reason: str


class TimelineCheckpoint(TypedDict):
    """A checkpoint of one of a bag's attempts."""

    id: int
    idx: int
    attempt: int
    requested_at: float
    at: float
    ok: int
    work_s: float


class TimelineVm(TypedDict):
    """A VM a bag's attempts ran on, with when it came and went and why."""

    id: str
    vm_type: str
    zone: str
    spot: int
    state: str
    reason: str
    requested_at: float
    running_at: float | None
    ended_at: float | None
    notice_until: float | None


class BagTimeline(TypedDict):
    """A bag's attempts live at or after a time (the newest `limit`), their checkpoints
    and VMs (`bag_timeline`); `truncated`: older ones were left out."""

    attempts: list[TimelineAttempt]
    checkpoints: list[TimelineCheckpoint]
    vms: list[TimelineVm]
    truncated: bool
