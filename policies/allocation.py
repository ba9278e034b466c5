"""Splitting a VM's cost among the jobs that shared it (docs/design.md#cost-reports).

The cloud's split-cost-allocation method (AWS "split cost allocation data" for
ECS tasks and EKS pods). Over one period (a VM-hour, or any other), a VM has a
capacity c_r of each resource r (vCPUs, GB of memory, GPUs) and cost C; job j
reserved and used some amount of each. With resource weights w_r (default GPU 9,
and the non-GPU unit split 9:1 between vCPU and memory: CPU 0.9, memory 0.1):

    u     = C / Σ_r w_r·c_r                  unit cost (a resource the VM lacks has no term)
    P_r   = c_r·u·w_r                        cost of resource r, Σ_r P_r = C
    a_jr  = max(reserved_jr, used_jr)        allocated amount (unknown usage: the reservation)
    A_r   = Σ_j a_jr                         allocated in all
    T_r   = max(c_r, A_r)                    total: the capacity, or the allocations beyond it
    s_jr  = a_jr / T_r                       split-usage ratio
    split_j  = Σ_r s_jr·P_r                  split cost
    ρ_r   = (T_r - A_r) / T_r = max(c_r - A_r, 0) / T_r   unused ratio (= 1 - Σ_j s_jr)
    U_r   = ρ_r·P_r                          cost of unused capacity
    share_j  = Σ_r s_jr / (1 - ρ_r) · U_r    = Σ_r (a_jr / A_r)·U_r, shared by utilisation

so each job pays split_j + share_j = Σ_r (a_jr / A_r)·P_r, and in exact arithmetic
Σ_j (split_j + share_j) + unallocated = C. `unallocated` (idle) is the unused
cost of each resource no job holds (A_r = 0, where the utilisation ratios are all
0 and the proportional rule has nothing to go by: with no jobs it is the whole
cost), plus C itself when the VM has nothing weighted to split by (Σ w_r·c_r = 0).
Over-allocated resources (A_r > c_r) have no unused cost: the ratios are taken of
A_r, so the jobs share P_r in proportion to what they held. A resource the VM
lacks (c_r = 0) costs nothing, whatever the jobs claim of it. Only the ratios of
the weights matter (AWS's CPU 9 : memory 1 gives the same split as 0.9 : 0.1).

`split_costs` works on arrays: capacity (..., R), cost (...), reserved and used
(..., J, R), any leading dimensions (e.g. many VM-hours at once). Jobs with
nothing allocated pay nothing and change nothing, so ragged batches can be padded
with rows of zeros. NaN in `used` means "not measured" (AWS: usage data
unavailable, the reservation is used instead). Amounts, costs and weights are
taken to be of ordinary magnitudes (w·c and C / Σ w·c neither underflow nor
overflow); then the parts add up to C to within a few units of rounding (every
part is non-negative). Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

RESOURCES = ("cpu", "memory", "gpu")  # the order of the last axis, with `Weights`


@dataclass(frozen=True)
class Weights:
    """Relative cost of one unit of each resource (one vCPU, one GB, one GPU)."""

    cpu: float = 0.9
    memory: float = 0.1
    gpu: float = 9.0

    def __post_init__(self) -> None:
        for name in RESOURCES:
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"weight of {name} must be a finite number >= 0, got {value!r}")

    def as_array(self) -> np.ndarray:
        """The weights in `RESOURCES` order."""
        return np.array([getattr(self, name) for name in RESOURCES], dtype=float)


DEFAULT_WEIGHTS = Weights()


@dataclass(frozen=True, eq=False)
class CostSplit:
    """One VM's (or a batch of VMs') cost split among its jobs; shapes as documented
    in the module, with B the leading (batch) dimensions, J jobs and R resources."""

    allocated: np.ndarray  # (B, J, R) a_jr = max(reserved, used)
    total: np.ndarray  # (B, R) T_r = max(capacity, Σ_j a_jr)
    unit_cost: np.ndarray  # (B,) u = C / Σ w·c (0 when the VM has nothing weighted)
    price: np.ndarray  # (B, R) u·w_r: one unit of each resource over the period
    resource_cost: np.ndarray  # (B, R) P_r = c_r·u·w_r
    unused_ratio: np.ndarray  # (B, R) ρ_r
    unused_cost: np.ndarray  # (B, R) U_r = ρ_r·P_r
    split_by_resource: np.ndarray  # (B, J, R) s_jr·P_r
    unused_share_by_resource: np.ndarray  # (B, J, R) (a_jr / A_r)·U_r
    unallocated: np.ndarray  # (B,) cost attributed to no job (idle)

    @cached_property
    def split(self) -> np.ndarray:
        """(B, J) each job's split cost."""
        return self.split_by_resource.sum(axis=-1)

    @cached_property
    def unused_share(self) -> np.ndarray:
        """(B, J) each job's share of the cost of unused capacity."""
        return self.unused_share_by_resource.sum(axis=-1)

    @cached_property
    def job_cost(self) -> np.ndarray:
        """(B, J) split cost plus unused share: what each job pays."""
        return (self.split_by_resource + self.unused_share_by_resource).sum(axis=-1)


def split_costs(
    capacity: ArrayLike,
    cost: ArrayLike,
    reserved: ArrayLike,
    used: ArrayLike | None = None,
    weights: Weights | ArrayLike = DEFAULT_WEIGHTS,
) -> CostSplit:
    """Split the cost of VMs among their jobs by the split-cost-allocation method.

    capacity (..., R) per resource; cost (...) of each VM for the period; reserved
    and used (..., J, R) per job (used None or NaN: not measured, the reservation
    counts); weights a `Weights` (R = 3, `RESOURCES` order) or an array (R,).
    Raises ValueError on negative or non-finite inputs or mismatched shapes."""
    cap = np.asarray(capacity, dtype=float)
    vm_cost = np.asarray(cost, dtype=float)
    res = np.asarray(reserved, dtype=float)
    w = weights.as_array() if isinstance(weights, Weights) else np.asarray(weights, dtype=float)
    if cap.ndim < 1 or res.ndim < 2 or w.ndim != 1:
        raise ValueError("capacity must be (..., R), reserved and used (..., J, R), weights (R,)")
    n_resources = cap.shape[-1]
    if res.shape[-1] != n_resources or w.shape[0] != n_resources:
        raise ValueError(
            f"resource axes differ: capacity {cap.shape}, reserved {res.shape}, weights {w.shape}"
        )
    for name, values in (("capacity", cap), ("cost", vm_cost), ("reserved", res), ("weights", w)):
        if not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError(f"{name} must be finite and >= 0")
    if used is None:
        alloc = res
    else:
        use = np.asarray(used, dtype=float)
        if not np.all(np.isnan(use) | (np.isfinite(use) & (use >= 0))):
            raise ValueError("used must be >= 0 and finite, or NaN (not measured)")
        alloc = np.fmax(res, use)  # fmax: a NaN (unmeasured) usage gives the reservation

    batch = np.broadcast_shapes(cap.shape[:-1], vm_cost.shape, alloc.shape[:-2])
    n_jobs = alloc.shape[-2]
    cap = np.broadcast_to(cap, (*batch, n_resources))
    vm_cost = np.broadcast_to(vm_cost, batch)
    alloc = np.broadcast_to(alloc, (*batch, n_jobs, n_resources)).copy()

    weighted = cap * w  # w_r·c_r
    denominator = weighted.sum(axis=-1)
    has_weight = denominator > 0
    unit_cost = _divide(vm_cost, denominator)
    # P_r = C·(w_r·c_r / Σ w·c): the fractions add up to 1, so the P_r add up to C.
    resource_cost = vm_cost[..., None] * _divide(weighted, denominator[..., None])

    held = alloc.sum(axis=-2)  # A_r
    total = np.maximum(cap, held)  # T_r
    split_by_resource = _divide(alloc, total[..., None, :]) * resource_cost[..., None, :]
    # ρ_r from the spare capacity itself, not 1 - Σ s_jr: no cancellation.
    unused_ratio = _divide(np.maximum(cap - held, 0.0), total)
    unused_cost = unused_ratio * resource_cost
    # s_jr / (1 - ρ_r) = (a_jr / T_r) / (A_r / T_r) = a_jr / A_r.
    unused_share_by_resource = _divide(alloc, held[..., None, :]) * unused_cost[..., None, :]
    nobody = np.where(held > 0, 0.0, unused_cost).sum(axis=-1)
    unallocated = nobody + np.where(has_weight, 0.0, vm_cost)

    return CostSplit(
        allocated=alloc,
        total=total,
        unit_cost=unit_cost,
        price=unit_cost[..., None] * w,
        resource_cost=resource_cost,
        unused_ratio=unused_ratio,
        unused_cost=unused_cost,
        split_by_resource=split_by_resource,
        unused_share_by_resource=unused_share_by_resource,
        unallocated=unallocated,
    )


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (shapes broadcast)."""
    numerator, denominator = np.broadcast_arrays(numerator, denominator)
    out = np.zeros(numerator.shape)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out
