"""The scheduler's in-memory records of what is open: bags and their queues, jobs,
attempts and VMs. They mirror rows in the store; the scheduler's `World`
(controller/scheduler/world.py) holds them, and only the scheduler changes them.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.bags.spec import BagSpec
from controller.bags.waiting_jobs import FreshParams, HeldJobs, JobQueue
from controller.preemption.model_book import Belief
from controller.states import AttemptState, JobState
from controller.store import job_id_of
from drivers.base import VmState, VmType
from policies.packing import Shape
from policies.reuse import ReuseTable
from policies.runtime_estimate import runtime_estimate_s

RECENT_ENDS = 200  # job ends a bag's pace is measured over
RECENT_RUNTIMES = 1000  # successful jobs' runtimes a bag's runtime estimate is taken from
MIN_SCALED_JOBS = 5  # successes with their own estimates before those are scaled


def shape_of(spec: BagSpec) -> Shape:
    r = spec.resources
    return Shape(r.cpus, r.gpus, r.memory_gb)


def capacity_of(vm_type: VmType) -> Shape:
    return Shape(vm_type.cpus, vm_type.gpus, vm_type.memory_gb)


class RecentRuntimes:
    """The runtimes of a bag's latest `RECENT_RUNTIMES` successful jobs, oldest first
    (`order`) and ascending (`ascending`): the estimate reads a quantile of them every 50
    successes, and keeping them sorted costs a bisection and a short move per success
    instead of a sort of 1,000 values (or numpy's quantile of a copy) each time."""

    __slots__ = ("ascending", "order")

    def __init__(self) -> None:
        self.order: deque[float] = deque()
        self.ascending: list[float] = []

    def append(self, runtime_s: float) -> None:
        if len(self.order) == RECENT_RUNTIMES:
            oldest = self.order.popleft()
            # The last of its equals: with equal runtimes (a bag of identical jobs) the
            # list's end, not its start, whose deletion moves every other value along.
            del self.ascending[bisect_right(self.ascending, oldest) - 1]
        self.order.append(runtime_s)
        insort(self.ascending, runtime_s)

    def extend(self, runtimes_s: Iterable[float]) -> None:
        for runtime_s in runtimes_s:
            self.append(runtime_s)

    def __len__(self) -> int:
        return len(self.order)


@dataclass(slots=True)
class BagRun:
    id: str
    spec: BagSpec
    shape: Shape
    queue: JobQueue  # job indexes waiting for a slot, next first
    fresh: FreshParams  # params (compact JSON) of waiting jobs that never ran (no JobRun yet)
    open_jobs: int  # jobs not yet finished
    failed_jobs: int
    cancelled_jobs: int = 0
    cancel_requested: bool = False
    live_attempts: int = 0  # a bag ends only when its jobs have ended and its processes stopped
    held: HeldJobs = field(default_factory=HeldJobs)  # jobs waiting for credit, in order
    runtimes_s: RecentRuntimes = field(default_factory=RecentRuntimes)  # recent successes
    # When its last jobs finished (succeeded or failed): its recent pace (scheduler/waiting.py).
    recent_ends: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_ENDS))
    runtime_estimate_s: float = 0.0  # see policies.runtime_estimate
    successes: int = 0
    # With `estimated_runtime_param`: the runtimes of the jobs that succeeded since the
    # daemon started and their estimates, summed: each job's estimate is scaled by
    # their ratio (`estimate_scale`).
    estimated_jobs: int = 0
    estimated_runtime_sum_s: float = 0.0
    estimated_estimate_sum_s: float = 0.0
    deadline_at: float | None = None  # epoch s (docs/design.md#deadlines); None: none
    submitted_at: float = 0.0  # epoch s: where Uniform Progress's line starts
    jobs_total: int = 0  # every job of the bag (Uniform Progress's C counts them all)
    allowed_types: tuple[str, ...] | None = field(init=False)  # resources.vm_types
    regions: tuple[str, ...] | None = field(init=False)  # resources.regions

    def __post_init__(self) -> None:
        resources = self.spec.resources
        self.allowed_types = tuple(resources.vm_types) if resources.vm_types else None
        self.regions = tuple(resources.regions) if resources.regions else None
        self.refresh_estimate()

    def refresh_estimate(self) -> None:
        self.runtime_estimate_s = runtime_estimate_s(
            self.runtimes_s.ascending,
            self.spec.estimated_runtime_s,
            self.spec.max_runtime_s,
            ascending=True,
        )

    def job_succeeded(self, runtime_s: float, params: dict[str, Any] | None = None) -> None:
        """Learn from a finished job (re-estimating now and then, not after every job)."""
        self.runtimes_s.append(runtime_s)
        self.successes += 1
        if self.successes <= 20 or self.successes % 50 == 0:
            self.refresh_estimate()
        if params is None or not self.spec.estimated_runtime_param:
            return
        estimate_s = self.job_estimate_s(params)
        if estimate_s is not None:
            self.estimated_jobs += 1
            self.estimated_runtime_sum_s += runtime_s
            self.estimated_estimate_sum_s += estimate_s

    def job_estimate_s(self, params: dict[str, Any]) -> float | None:
        """The job's own estimated runtime (its `estimated_runtime_param`), unscaled;
        None: the bag has none (or the job lacks it)."""
        name = self.spec.estimated_runtime_param
        value = params.get(name) if name else None
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def estimate_scale(self) -> float:
        """What the jobs' own estimates are multiplied by: Σ runtime / Σ estimate of the
        jobs that succeeded with one (a ratio estimator: right when the estimates are
        right up to a factor, whatever order the jobs run in), once MIN_SCALED_JOBS have;
        1 before (the estimates as given)."""
        if self.estimated_jobs < MIN_SCALED_JOBS or self.estimated_estimate_sum_s <= 0:
            return 1.0
        return self.estimated_runtime_sum_s / self.estimated_estimate_sum_s

    @property
    def done(self) -> bool:
        return self.open_jobs == 0 and self.live_attempts == 0


@dataclass(slots=True)
class JobRun:
    bag_id: str
    idx: int
    params: dict[str, Any]
    state: JobState
    attempts: int = 0  # attempts made, LOST ones included (numbers them)
    counted: int = 0  # attempts that count toward max_attempts
    vm_id: str | None = None
    started_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    work_saved_s: float = 0.0  # runtime its last checkpoint holds: a retry resumes there
    checkpoints: int = 0
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = job_id_of(self.bag_id, self.idx)


@dataclass(slots=True)
class AttemptRun:
    bag_id: str
    idx: int
    number: int
    vm_id: str
    state: AttemptState
    started_at: float
    log_path: str
    shape: Shape
    ref: str = ""  # the executor's reference (the Slurm job id)
    ran_at: float | None = None  # when its program began to run (None: not yet, or never)
    cancelling: bool = False
    # Checkpoints. Work is measured in seconds of the job's runtime: `saved_s` is what
    # the job had saved at `mark_at` (the attempt's start, or its last checkpoint), so
    # the work done by time x is saved_s + (x - mark_at) and a preemption loses x - mark_at.
    saved_s: float = 0.0
    mark_at: float = 0.0
    due_at: float | None = None  # when the scheduler next signals (or reviews) it
    signalled_at: float | None = None  # a checkpoint asked for and not yet confirmed
    missed_checkpoints: int = 0  # in a row; the job is left alone after a few
    migrating: str = ""  # why the hopper moves it: checkpoint, stop, run again elsewhere
    # Its VM is gone (why, and when), but its executor has not yet confirmed that it can
    # never run any more (executors that `confirm_ends`): it ends when that comes.
    vm_gone: str = ""
    vm_gone_at: float = 0.0
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = f"{job_id_of(self.bag_id, self.idx)}.{self.number}"
        self.mark_at = self.mark_at or self.started_at


@dataclass(slots=True)
class VmRun:
    id: str  # the launch token
    vm_type: VmType
    state: VmState
    requested_at: float
    spot: bool = True
    zone: str = ""
    provider_id: str = ""
    reason: str = ""
    running_at: float | None = None
    ended_at: float | None = None
    free: Shape = field(default_factory=lambda: Shape(0, 0, 0.0))
    attempts: dict[str, None] = field(default_factory=dict)  # ordered set of attempt ids
    idle_since: float | None = None
    terminating: bool = False
    draining: str = ""  # why no new job is placed on it (the hopper moves its jobs away)
    notice_until: float | None = None  # a preemption notice: the provider takes it by then
    # Joined the executor's cluster (a Slurm node registered): only then does it take
    # attempts. Always true for executors that do not join VMs.
    ready: bool = True
    ready_at: float | None = None
    # It had joined before a controller restart, and is waited for to be seen joined again
    # since then (its boot timeout counts from there, not from its launch).
    rejoin_since: float | None = None
    pool_node: str = ""  # the Slurm power-saving node it serves ("" for spotbag's own VMs)
    belief: Belief | None = None  # the preemption model assumed for it
    table: ReuseTable | None = None  # reuse decisions under that model (None: always reuse)
    capacity: Shape = field(init=False)

    def __post_init__(self) -> None:
        self.capacity = capacity_of(self.vm_type)

    @property
    def released_by_slurm(self) -> bool:
        """A pool VM being terminated because Slurm let go of its node (suspended it, or
        gave up on it): Slurm needs telling nothing more when it is gone. Any other pool
        VM that is gone has its node downed and powered down, so that Slurm requeues its
        users' jobs at once."""
        return bool(self.pool_node) and self.terminating

    def row(self, driver: str, time_scale: float = 1.0) -> dict[str, Any]:
        t = self.vm_type
        return {
            "id": self.id,
            "provider_id": self.provider_id,
            "driver": driver,
            "vm_type": t.name,
            "zone": self.zone,
            "spot": int(self.spot),
            "state": str(self.state),
            "reason": self.reason,
            "cpus": t.cpus,
            "gpus": t.gpus,
            "memory_gb": t.memory_gb,
            "spot_price_per_hour": t.spot_price_per_hour,
            "on_demand_price_per_hour": t.on_demand_price_per_hour,
            "requested_at": self.requested_at,
            "running_at": self.running_at,
            "ended_at": self.ended_at,
            "time_scale": time_scale,
            "ready_at": self.ready_at,
            "pool_node": self.pool_node,
            "notice_until": self.notice_until,
        }
