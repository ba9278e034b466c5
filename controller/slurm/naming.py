"""Names that tie Slurm's objects to spotbag's, so each is found again from the other.

- A VM's node is `<prefix><vm id>` (sb-vm-3f9a0c21d7aa): derived, no lookup table.
- An attempt's job is named `sb:<controller id>:<attempt id>`. Slurm job ids restart
  after a state wipe and wrap at MaxJobId, so nothing is keyed on the id alone; the
  controller id keeps two controllers sharing a cluster apart.
- A callback's key is job name:job id:restart count:event (jobcomp:
  job name:job id:submit:end:jobcomp), unique even across reused job ids.
"""

from __future__ import annotations

JOB_PREFIX = "sb:"


def node_name(prefix: str, vm_id: str) -> str:
    return f"{prefix}{vm_id}"


def vm_of_node(prefix: str, node: str) -> str | None:
    """The VM id a node name carries, or None when it is not one of ours."""
    return node[len(prefix) :] if node.startswith(prefix) and len(node) > len(prefix) else None


def job_name(controller_id: str, attempt_id: str) -> str:
    return f"{JOB_PREFIX}{controller_id}:{attempt_id}"


def attempt_of_job(controller_id: str, name: str) -> str | None:
    """The attempt id a job name carries, or None when it is not this controller's."""
    mine = f"{JOB_PREFIX}{controller_id}:"
    return name[len(mine) :] if name.startswith(mine) and len(name) > len(mine) else None
