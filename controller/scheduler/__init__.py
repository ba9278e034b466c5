"""The scheduler package: the daemon's pass loop and what it is made of.

`Scheduler` (loop.py) is the front class that the daemon, the simulator, admission
and the API use; the rest of the package holds its parts.
"""

from controller.scheduler.loop import (
    CANCEL_CHUNK,
    Clock,
    IdSource,
    PoolPower,
    PoolRunEvent,
    Scheduler,
)

__all__ = ["CANCEL_CHUNK", "Clock", "IdSource", "PoolPower", "PoolRunEvent", "Scheduler"]
