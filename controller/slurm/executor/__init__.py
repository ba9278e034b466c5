"""The Slurm executor: each attempt is one Slurm batch job pinned to its VM's node.

VMs join the cluster as dynamic nodes named after them and take attempts once their
node is up in Slurm, not when their cloud says they run. Slurm never retries on its
own (`--no-requeue`): the scheduler does. Jobs outlive the controller: a restart
adopts them again.

Logs and checkpoints live in `shared_dir`, a directory the head node shares with
the VMs at the same path (NFS from the head node): the API serves logs from there,
checkpoints are confirmed by the files appearing there, and the wrapper's exit
status file there is the quickest sign of an attempt's end. Starts and ends are
watched from three sources, all idempotent: those files, `squeue` (the truth), and
callbacks from slurmctld's hooks. When Slurm does not answer, new attempts are
refused (ExecutorUnavailable) and nothing is given up on until it answers again.

The parts:
- executor.py: `SlurmExecutor`, the front (the Executor protocol and the daemon's
  other calls), which builds the parts below around one shared state;
- state.py: the settings, the tracked attempts and nodes, reporting starts and ends
  once, and ends read from Slurm's final state;
- submission.py: what an attempt's Slurm job looks like (name, sbatch arguments,
  script, environment) and submitting it, lost answers included;
- watch.py: the watching task, the shared files and the squeue poll that settles jobs;
- callbacks.py: callbacks from the hooks;
- signals.py: checkpoint signals and their confirmation, stops (cancel, time limit);
- nodes.py: the VMs' nodes (joining, readiness, downing and deleting) and the calls
  about pool nodes and other users' jobs;
- recovery.py: re-adopting attempts after a controller restart.
"""

from controller.slurm.executor.executor import SlurmExecutor
from controller.slurm.executor.state import SlurmExecutorSettings

__all__ = ["SlurmExecutor", "SlurmExecutorSettings"]
