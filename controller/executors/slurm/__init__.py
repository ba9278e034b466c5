"""The Slurm executor: each attempt is one Slurm batch job pinned to its VM's node."""

from controller.executors.slurm.executor import SlurmExecutor, SlurmExecutorSettings

__all__ = ["SlurmExecutor", "SlurmExecutorSettings"]
