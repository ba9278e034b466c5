"""Building drivers and the model book from configuration (the one place that knows
every driver's arguments)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import numpy as np

from controller.config import Config
from controller.model_book import ModelBook
from drivers import driver_class
from drivers.base import Driver, VmType


def make_model_book(
    config: Config, *, driver_name: str, boot_delay_s: float, time_scale: float
) -> ModelBook:
    """The models for this driver; a fresh VM costs the boot delay, in model hours."""
    model_keys = {t.name: t.model_key for t in config.vm_types}
    return ModelBook(
        config.preemption, driver_name, model_keys, launch_h=boot_delay_s * time_scale / 3600.0
    )


def make_driver(
    config: Config,
    *,
    name: str,
    now: Callable[[], float],
    call_at: Callable[[float, Callable[[], None]], Any],
    rng: np.random.Generator,
    boot_delay_s: float,
    time_scale: float,
    book: ModelBook,
) -> Driver:
    cls = driver_class(name)
    if name in ("local", "sim"):

        def lifetime_h(vm_type: VmType) -> float:
            """One lifetime (model hours) from the configured model for this type and moment."""
            when = dt.datetime.fromtimestamp(now(), dt.UTC)
            return float(book.configured(vm_type, when).model.sample_h(rng, 1)[0])

        return cls(
            config.catalog(),
            now=now,
            call_at=call_at,
            lifetime_h=lifetime_h,
            boot_delay_s=boot_delay_s,
            time_scale=time_scale,
        )
    raise ValueError(f"driver {name!r} cannot be built from this configuration")
