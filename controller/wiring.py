"""Building drivers from configuration (the one place that knows every driver's arguments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from controller.config import Config, PreemptionConfig
from drivers import driver_class
from drivers.base import Driver, VmType
from policies.preemption import lifetime_model


def lifetime_sampler(
    settings: PreemptionConfig, rng: np.random.Generator
) -> Callable[[VmType], float]:
    """Draw one VM lifetime (model hours) per call from the configured model."""
    model = lifetime_model(
        settings.model, mttf_h=settings.mttf_h, max_lifetime_h=settings.max_lifetime_h
    )

    def sample(vm_type: VmType) -> float:
        return float(model.sample_h(rng, 1)[0])

    return sample


def make_driver(
    config: Config,
    *,
    name: str,
    now: Callable[[], float],
    call_at: Callable[[float, Callable[[], None]], Any],
    rng: np.random.Generator,
    boot_delay_s: float,
    time_scale: float,
) -> Driver:
    cls = driver_class(name)
    if name in ("local", "sim"):
        return cls(
            config.catalog(),
            now=now,
            call_at=call_at,
            lifetime_h=lifetime_sampler(config.preemption, rng),
            boot_delay_s=boot_delay_s,
            time_scale=time_scale,
        )
    raise ValueError(f"driver {name!r} cannot be built from this configuration")
