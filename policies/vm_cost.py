"""The cost of every VM over its life, split among the attempts that shared it
(docs/design.md#cost-reports), for many VMs and attempts at once.

A VM bills from running to ended at its price p(t) (piecewise constant: its price,
changed by price samples). At each instant the attempts on it split the cost by the
split-cost-allocation method of policies/allocation.py with usage = reservation, under
which attempt j holds the fraction a_jr / A_r(t) of each resource r (A_r(t): what
the attempts running at t reserved of r) and resource r is the fraction
f_r = w_r·c_r / Σ_s w_s·c_s of the VM's cost. So attempt j costs

    cost_j = Σ_r a_jr · f_r · ∫_{start_j}^{end_j} p(t)·[A_r(t) > 0] / A_r(t) dt

and with cumulative integrals G_r(t) = ∫ p·[A_r>0]/A_r dt over each VM's events
(every attempt start and end, price change, the VM's start and end: one sort and one
cumulative sum over all VMs together), cost_j = Σ_r a_jr·f_r·(G_r(end_j) − G_r(start_j)).
The same integrals with p ≡ 1 give VM-hours and with the on-demand price the
on-demand counterfactual.

What no attempt holds is reported per VM, in three parts:
- idle: no attempt on the VM, for the first `idle_timeout_s` of each idle stretch
  (a stretch: a maximal interval of the VM's life with no attempt; booted and
  waiting for work, or waiting out the idle timeout after it);
- spare: the rest of each idle stretch (kept beyond the idle timeout: a hot spare);
- unallocated: attempts run but some resource is held by none of them (the GPUs
  under a CPU-only job: f_r of the cost), or the VM has nothing weighted (Σ w·c = 0).

So per VM, Σ attempts + idle + spare + unallocated = its cost (and its hours, and its
on-demand cost), to rounding. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from policies.allocation import DEFAULT_WEIGHTS, Weights

# Order of simultaneous events on one VM: the VM starts, then its price changes, then
# attempts end before others start (a slot handed over at one instant is never double
# booked), and the VM ends last.
_VM_START, _PRICE, _ATTEMPT_END, _ATTEMPT_START, _VM_END = range(5)


@dataclass(frozen=True, eq=False)
class VmCosts:
    # per attempt (A,)
    attempt_vm_h: np.ndarray  # VM-hours attributed to the attempt
    attempt_cost_usd: np.ndarray  # at the price the VM paid
    attempt_on_demand_usd: np.ndarray  # the same share at the VM's on-demand price
    # per VM (V,)
    life_h: np.ndarray  # billed life, hours
    cost_usd: np.ndarray  # ∫ price dt over the life
    on_demand_usd: np.ndarray  # life × on-demand price
    idle_h: np.ndarray
    idle_cost_usd: np.ndarray
    idle_on_demand_usd: np.ndarray
    spare_h: np.ndarray
    spare_cost_usd: np.ndarray
    spare_on_demand_usd: np.ndarray
    unallocated_h: np.ndarray
    unallocated_cost_usd: np.ndarray
    unallocated_on_demand_usd: np.ndarray


def split_vm_costs(
    vm_start_s: ArrayLike,
    vm_end_s: ArrayLike,
    vm_capacity: ArrayLike,
    vm_price_per_h: ArrayLike,
    vm_on_demand_per_h: ArrayLike,
    attempt_vm: ArrayLike,
    attempt_start_s: ArrayLike,
    attempt_end_s: ArrayLike,
    attempt_reserved: ArrayLike,
    *,
    weights: Weights | ArrayLike = DEFAULT_WEIGHTS,
    idle_timeout_s: float = 0.0,
    price_samples: tuple[ArrayLike, ArrayLike, ArrayLike] | None = None,
) -> VmCosts:
    """Split each VM's cost over its life among its attempts (see the module).

    VMs: start and end of the billed life (V,), capacity (V, 3) in
    allocation.RESOURCES order (cpu, memory_gb, gpu), the price paid and the
    on-demand price per hour (V,). Attempts: the VM index (A,), start and end (A,)
    (clipped to the VM's life; end <= start is an attempt of no length), what it
    reserved (A, 3). `price_samples` = (vm index, at_s, price_per_h): the paid price
    changes at at_s (before a VM's first sample its own price applies).
    Raises ValueError naming the argument at fault."""
    start = _floats("vm_start_s", vm_start_s, 1)
    end = _floats("vm_end_s", vm_end_s, 1)
    n_vms = start.shape[0]
    cap = _floats("vm_capacity", vm_capacity, 2, (n_vms, 3))
    paid = _floats("vm_price_per_h", vm_price_per_h, 1, (n_vms,))
    on_demand = _floats("vm_on_demand_per_h", vm_on_demand_per_h, 1, (n_vms,))
    _check_shape("vm_end_s", end, (n_vms,))
    if np.any(end < start):
        raise ValueError("vm_end_s: a VM ends before it starts")
    vm = _indices("attempt_vm", attempt_vm, n_vms)
    n_attempts = vm.shape[0]
    a_start = _floats("attempt_start_s", attempt_start_s, 1, (n_attempts,))
    a_end = _floats("attempt_end_s", attempt_end_s, 1, (n_attempts,))
    reserved = _floats("attempt_reserved", attempt_reserved, 2, (n_attempts, 3))
    w = weights.as_array() if isinstance(weights, Weights) else _floats("weights", weights, 1, (3,))
    if not (np.isfinite(idle_timeout_s) and idle_timeout_s >= 0):
        raise ValueError(f"idle_timeout_s must be a finite number >= 0, not {idle_timeout_s!r}")

    if n_vms == 0:  # no VM, so no attempt either: nothing to split
        empty = np.zeros(0)
        return VmCosts(*(empty,) * 15)

    # Attempts clipped to their VM's life; those of no length take no part.
    a_start = np.clip(a_start, start[vm], end[vm])
    a_end = np.clip(a_end, a_start, end[vm])
    live = np.flatnonzero(a_end > a_start)

    # Price changes within each VM's life (one at or before the start moves to the start).
    if price_samples is None:
        s_vm, s_at, s_price = np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    else:
        s_vm = _indices("price_samples[0]", price_samples[0], n_vms)
        s_at = _floats(
            "price_samples[1]", price_samples[1], 1, s_vm.shape, finite=True, signed=True
        )
        s_price = _floats("price_samples[2]", price_samples[2], 1, s_vm.shape)
        keep = s_at < end[s_vm]
        s_vm, s_at, s_price = s_vm[keep], s_at[keep], s_price[keep]

    # Every event of every VM: time, VM, kind, tie-break, change of reservations and
    # of counts (running attempts, and per resource the attempts holding some of it).
    ids = np.arange(n_vms)
    held = (reserved[live] > 0).astype(np.int64)
    times = np.concatenate([start, np.maximum(s_at, start[s_vm]), a_end[live], a_start[live], end])
    vms_of = np.concatenate([ids, s_vm, vm[live], vm[live], ids])
    kinds = np.repeat(
        [_VM_START, _PRICE, _ATTEMPT_END, _ATTEMPT_START, _VM_END],
        [n_vms, s_vm.size, live.size, live.size, n_vms],
    )
    tiebreak = np.concatenate([np.zeros(n_vms), s_at, np.zeros(2 * live.size + n_vms)])
    no_change = np.zeros((n_vms + s_vm.size, 3))
    amount = np.concatenate([no_change, -reserved[live], reserved[live], np.zeros((n_vms, 3))])
    holders = np.concatenate(
        [no_change.astype(np.int64), -held, held, np.zeros((n_vms, 3), np.int64)]
    )
    running = np.concatenate(
        [
            np.zeros(n_vms + s_vm.size, np.int64),
            -np.ones(live.size, np.int64),
            np.ones(live.size, np.int64),
            np.zeros(n_vms, np.int64),
        ]
    )
    price = np.concatenate([paid, s_price, np.full(2 * live.size + n_vms, np.nan)])
    order = np.lexsort((tiebreak, kinds, times, vms_of))
    position = np.empty(order.size, np.int64)
    position[order] = np.arange(order.size)
    times, vms_of, price = times[order], vms_of[order], price[order]
    n_events = order.size

    # State after each event, holding until the next event of the same VM. Counts
    # are integers (each VM's changes sum to 0), so one running sum serves every VM.
    running = np.cumsum(running[order])
    holders = np.cumsum(holders[order], axis=0)
    allocated = np.cumsum(amount[order], axis=0)
    first = np.flatnonzero(np.r_[True, vms_of[1:] != vms_of[:-1]])
    allocated -= allocated[first][np.cumsum(np.r_[True, vms_of[1:] != vms_of[:-1]]) - 1]
    filled = np.where(np.isnan(price), 0, np.arange(n_events))
    price = price[np.maximum.accumulate(filled)]  # each VM's start event has a price
    duration_h = np.zeros(n_events)
    same_vm = vms_of[1:] == vms_of[:-1]
    duration_h[:-1] = np.where(same_vm, times[1:] - times[:-1], 0.0) / 3600.0

    weighted = cap * w
    total_weight = weighted.sum(axis=1)
    fraction = np.divide(
        weighted,
        total_weight[:, None],
        out=np.zeros_like(weighted),
        where=total_weight[:, None] > 0,
    )  # f_r
    busy = running > 0
    od_price = on_demand[vms_of]

    # Attempts: Σ_r a_jr·f_r·(G_r(end) − G_r(start)) with G the running integrals.
    per_unit_h = np.divide(
        duration_h[:, None], allocated, out=np.zeros_like(allocated), where=holders > 0
    )
    integrals = np.zeros((n_events + 1, 3, 3))
    integrals[1:] = np.cumsum(
        np.stack([per_unit_h, per_unit_h * price[:, None], per_unit_h * od_price[:, None]], axis=1),
        axis=0,
    )
    begin = position[n_vms + s_vm.size + live.size + np.arange(live.size)]
    finish = position[n_vms + s_vm.size + np.arange(live.size)]
    spans = integrals[finish] - integrals[begin]  # (live, 3 measures, 3 resources)
    shares = reserved[live] * fraction[vm[live]]  # a_jr·f_r
    per_attempt = np.zeros((n_attempts, 3))
    per_attempt[live] = np.einsum("lmr,lr->lm", spans, shares)

    # Per VM: unallocated while busy, idle and spare while not.
    nobody = np.where(
        total_weight[vms_of] > 0, (fraction[vms_of] * (holders == 0)).sum(axis=1), 1.0
    )
    unallocated_h = np.where(busy, duration_h * nobody, 0.0)
    stretch_begins = ~busy & np.r_[True, busy[:-1] | ~same_vm]
    since = np.maximum.accumulate(np.where(stretch_begins, np.arange(n_events), 0))
    idle_elapsed_h = (times - times[since]) / 3600.0
    idle_h = np.where(busy, 0.0, np.clip(idle_timeout_s / 3600.0 - idle_elapsed_h, 0.0, duration_h))
    spare_h = np.where(busy, 0.0, duration_h - idle_h)

    def per_vm(values: np.ndarray) -> np.ndarray:
        return np.bincount(vms_of, values, minlength=n_vms)

    life_h = (end - start) / 3600.0
    return VmCosts(
        attempt_vm_h=per_attempt[:, 0],
        attempt_cost_usd=per_attempt[:, 1],
        attempt_on_demand_usd=per_attempt[:, 2],
        life_h=life_h,
        cost_usd=per_vm(duration_h * price),
        on_demand_usd=life_h * on_demand,
        idle_h=per_vm(idle_h),
        idle_cost_usd=per_vm(idle_h * price),
        idle_on_demand_usd=per_vm(idle_h * od_price),
        spare_h=per_vm(spare_h),
        spare_cost_usd=per_vm(spare_h * price),
        spare_on_demand_usd=per_vm(spare_h * od_price),
        unallocated_h=per_vm(unallocated_h),
        unallocated_cost_usd=per_vm(unallocated_h * price),
        unallocated_on_demand_usd=per_vm(unallocated_h * od_price),
    )


def _check_shape(name: str, values: np.ndarray, shape: tuple[int, ...]) -> None:
    if values.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {values.shape}")


def _floats(
    name: str,
    values: ArrayLike,
    ndim: int,
    shape: tuple[int, ...] | None = None,
    *,
    finite: bool = True,
    signed: bool = False,
) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if ndim == 2 and array.size == 0:
        array = array.reshape(0, 3)
    if array.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {array.shape}")
    if shape is not None:
        _check_shape(name, array, shape)
    if finite and not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: must be finite numbers")
    if not signed and np.any(array < 0):
        raise ValueError(f"{name}: must be >= 0")
    return array


def _indices(name: str, values: ArrayLike, n: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name}: must be a 1-D array of integer indices")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= n):
        raise ValueError(f"{name}: indices must be in [0, {n})")
    return array
