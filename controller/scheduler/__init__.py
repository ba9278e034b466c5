"""The scheduler package: the daemon's pass loop and the parts of a pass.

`Scheduler` (loop.py) is the front class that the daemon, the simulator, admission
and the API use. Beside it: inputs.py (commands and protocols), events.py,
planning.py, actions.py (with `Backoff`), transitions.py, checkpoints.py
(`CheckpointTimer`), recovery.py and slurm_pools.py; loop.py's docstring says what
each owns. Migration candidates are the hopper's (controller/hopper.py).
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
