"""The sim driver: the local driver's timeline on a virtual clock.

Used by `spotbag simulate` and fast tests: no real time passes, so a fleet of
thousands of VMs over days of model time runs in seconds, deterministically for
a given seed (the lifetime sampler carries the seeded generator).
"""

from __future__ import annotations

from drivers.local import LocalDriver


class SimDriver(LocalDriver):
    name = "sim"
    id_prefix = "sim"
