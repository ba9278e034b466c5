"""Cloud drivers behind one protocol (drivers/base.py), loaded lazily by name so
that a cloud's SDK is imported only when that cloud is used."""

from __future__ import annotations

import importlib

_REGISTRY = {
    "local": ("drivers.local", "LocalDriver"),
    "sim": ("drivers.sim", "SimDriver"),
    "aws": ("drivers.aws", "AwsDriver"),
    "gce": ("drivers.gce", "GceDriver"),
}


def driver_names() -> list[str]:
    return sorted(_REGISTRY)


def driver_class(name: str) -> type:
    """The driver class registered as `name`; ValueError names the known ones."""
    try:
        module_name, class_name = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown driver {name!r}; known: {', '.join(driver_names())}") from None
    return getattr(importlib.import_module(module_name), class_name)
