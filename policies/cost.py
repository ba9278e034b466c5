"""Attributing VM cost to the jobs that ran on it (interim rule for bag reports).

A job that holds part of a VM is charged the largest fraction it holds of any
resource: share = max(cpus / vm_cpus, gpus / vm_gpus, memory_gb / vm_memory_gb),
capped at 1. A job's VM-hours are elapsed_h × share, its cost VM-hours × price.
The fuller split-cost allocation of SPEC.md §7 (weights, unused capacity)
refines this rule.
"""

from __future__ import annotations

from policies.packing import Shape


def vm_share(job: Shape, vm: Shape) -> float:
    """Fraction of the VM a job holds: the largest fraction of any one resource."""
    fractions = [0.0]
    if vm.cpus > 0:
        fractions.append(job.cpus / vm.cpus)
    if vm.gpus > 0:
        fractions.append(job.gpus / vm.gpus)
    if vm.memory_gb > 0:
        fractions.append(job.memory_gb / vm.memory_gb)
    return min(1.0, max(fractions))
