"""Fitting jobs onto VM types: how many jobs of one shape a VM holds, and which
type is the cheapest home for a job.

A shape is (cpus, gpus, memory_gb). A job fits a VM type when every dimension
fits; the number of copies is the minimum over dimensions of capacity // need.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

_new_tuple = tuple.__new__


class Shape(NamedTuple):
    """Resources one job needs, or one VM (type) offers.

    A NamedTuple rather than a frozen dataclass: the scheduler makes hundreds of
    thousands of these in a large simulation, and tuples are much cheaper to create.
    """

    cpus: int
    gpus: int
    memory_gb: float

    def fits_in(self, capacity: Shape) -> bool:
        # A small tolerance on memory keeps 0.1 + 0.2 GB from failing to fit 0.3 GB.
        return (
            self.cpus <= capacity.cpus
            and self.gpus <= capacity.gpus
            and self.memory_gb <= capacity.memory_gb + 1e-9
        )

    def minus(self, other: Shape, times: int = 1) -> Shape:
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (a third of the cost:
        # the scheduler does this at every placement and every attempt's end).
        return _new_tuple(
            Shape,
            (
                self[0] - other[0] * times,
                self[1] - other[1] * times,
                self[2] - other[2] * times,
            ),
        )

    def plus(self, other: Shape, times: int = 1) -> Shape:
        # `minus` spelt out (every attempt's end gives its room back).
        return _new_tuple(
            Shape,
            (
                self[0] + other[0] * times,
                self[1] + other[1] * times,
                self[2] + other[2] * times,
            ),
        )


def copies_that_fit(job: Shape, capacity: Shape) -> int:
    """How many jobs of shape `job` fit into `capacity` (0 when even one does not)."""
    if not job.fits_in(capacity):
        return 0
    counts = []
    if job.cpus > 0:
        counts.append(capacity.cpus // job.cpus)
    if job.gpus > 0:
        counts.append(capacity.gpus // job.gpus)
    if job.memory_gb > 0:
        counts.append(math.floor(capacity.memory_gb / job.memory_gb + 1e-9))
    return int(min(counts)) if counts else 1


@dataclass(frozen=True)
class PricedType:
    """A VM type as the planner sees it: its name, capacity and spot price per hour."""

    name: str
    capacity: Shape
    price_per_hour: float


def cheapest_type(
    job: Shape, types: Iterable[PricedType], allowed: Sequence[str] | None = None
) -> tuple[PricedType, int] | None:
    """The type with the lowest price per job slot that `job` fits, and its slot count.

    Price per slot = price_per_hour / copies_that_fit(job, type). Ties go to the
    smaller VM (fewer slots wasted when demand is short), then to the name, so
    the choice is deterministic. None when no allowed type fits.
    """
    best: tuple[float, int, str, PricedType] | None = None
    for vm_type in types:
        if allowed is not None and vm_type.name not in allowed:
            continue
        slots = copies_that_fit(job, vm_type.capacity)
        if slots == 0:
            continue
        key = (vm_type.price_per_hour / slots, slots, vm_type.name, vm_type)
        if best is None or key[:3] < best[:3]:
            best = key
    if best is None:
        return None
    return best[3], best[1]


def zone_allowed(zone: str, regions: Sequence[str] | None) -> bool:
    """True when `zone` lies in one of `regions` (a region matches its zones:
    "us-central1" allows "us-central1-c"); no regions means anywhere."""
    if not regions:
        return True
    return any(zone == r or zone.startswith(r + "-") for r in regions)
