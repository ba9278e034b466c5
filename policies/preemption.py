"""VM lifetime (preemption) models and sampling from them.

A model answers "when does a VM of this kind die?" as a distribution of the
lifetime ℒ in hours. Every model here shares one small interface:

- `cdf(t_h)` / `sf(t_h)`: P(ℒ <= t) and P(ℒ > t);
- `expected_lifetime_h()`;
- `sample_h(rng, n)`: n lifetimes drawn with the caller's `numpy.random.Generator`.

`NoPreemption` never preempts. `Exponential` is the memoryless model (constant
hazard 1/MTTF), optionally with a hard deadline L after which every VM is
reclaimed (Google preemptible/spot VMs: L = 24 h; SPEC.md §2 point mass at L).
The bathtub model of SPEC.md §2 builds on this interface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoPreemption:
    """A VM that is never preempted (on-demand capacity, or preemption switched off)."""

    name = "none"

    def cdf(self, t_h):
        return np.zeros_like(np.asarray(t_h, dtype=float))

    def sf(self, t_h):
        return np.ones_like(np.asarray(t_h, dtype=float))

    def expected_lifetime_h(self) -> float:
        return math.inf

    def sample_h(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, math.inf)


@dataclass(frozen=True)
class Exponential:
    """Memoryless lifetimes: F(t) = 1 - exp(-t / mttf_h) for t < L, F(t) = 1 for t >= L.

    `max_lifetime_h` is the provider's deadline L (None: no deadline). With a
    deadline the mass exp(-L / mttf_h) sits at L exactly, so
    E[ℒ] = mttf_h · (1 - exp(-L / mttf_h)).
    """

    mttf_h: float
    max_lifetime_h: float | None = None
    name = "exponential"

    def __post_init__(self) -> None:
        if not self.mttf_h > 0:
            raise ValueError(f"mttf_h must be > 0, got {self.mttf_h}")
        if self.max_lifetime_h is not None and not self.max_lifetime_h > 0:
            raise ValueError(f"max_lifetime_h must be > 0, got {self.max_lifetime_h}")

    def cdf(self, t_h):
        t = np.asarray(t_h, dtype=float)
        out = -np.expm1(-np.maximum(t, 0.0) / self.mttf_h)
        if self.max_lifetime_h is not None:
            out = np.where(t >= self.max_lifetime_h, 1.0, out)
        return out

    def sf(self, t_h):
        return 1.0 - self.cdf(t_h)

    def expected_lifetime_h(self) -> float:
        if self.max_lifetime_h is None:
            return self.mttf_h
        return self.mttf_h * -math.expm1(-self.max_lifetime_h / self.mttf_h)

    def sample_h(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = rng.exponential(self.mttf_h, size=n)
        if self.max_lifetime_h is not None:
            draws = np.minimum(draws, self.max_lifetime_h)
        return draws


LifetimeModel = NoPreemption | Exponential


def lifetime_model(name: str, *, mttf_h: float, max_lifetime_h: float | None) -> LifetimeModel:
    """The model called `name` ("none" or "exponential") with its parameters."""
    if name == "none":
        return NoPreemption()
    if name == "exponential":
        return Exponential(mttf_h=mttf_h, max_lifetime_h=max_lifetime_h)
    raise ValueError(f"unknown preemption model {name!r}; known: none, exponential")
