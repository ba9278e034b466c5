"""The scheduler package: the daemon's pass loop and the parts of a pass.

`Scheduler` (loop.py) is the front class that the daemon, the simulator, admission
and the API use, and the composition root of the rest: it builds the `World`
(world.py: the open bags, jobs, attempts and VMs, their indexes and every state change)
and hands it to its collaborators: `Events` (events.py), `Commands` (commands.py),
`Planning` (planning.py), `Actions` (actions.py, with `Backoff` and `Calls`),
`SlurmPools` (slurm_pools.py), `Recovery` (recovery.py) and `CheckpointTimer`
(checkpoints.py); loop.py's docstring says what each owns and who calls whom.
Migration candidates are the hopper's (controller/hopper.py).
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
